"""The engine's thread, and the bridge from its events to asyncio."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable

from ..requests import Event, Request
from .core import EngineCore

log = logging.getLogger("hearth.engine")


class Engine:
    """Runs an :class:`EngineCore` in its own thread."""

    def __init__(self, core: EngineCore,
                 on_death: Callable[[BaseException], None] | None = None):
        self.core = core
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.error: BaseException | None = None
        self.on_death = on_death  # told after the requests have their errors

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="hearth-engine", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        core = self.core
        try:
            while not self._stop.is_set():
                if not core.has_work():
                    core.wakeup.wait(0.5)
                    core.wakeup.clear()
                    continue
                if not core.step():
                    core.wakeup.wait(0.01)
                    core.wakeup.clear()
        except BaseException as e:
            self.error = e
            log.exception("engine thread died")
            self.core.fail_all(f"engine stopped: {e}")
            if self.on_death is not None:
                self.on_death(e)

    def stop(self, timeout: float = 10.0) -> bool:
        """Stop the thread; a decode under way is aborted first. Returns whether the thread
        has ended (only then may the context be freed)."""
        self._stop.set()
        self.core.b.request_abort()
        self.core.wakeup.set()
        if self._thread is not None:
            self._thread.join(timeout=timeout)
            return not self._thread.is_alive()
        return True

    def submit(self, r: Request) -> Request:
        return self.core.submit(r)

    def cancel(self, request_id: int) -> None:
        self.core.cancel(request_id)


class AsyncStream:
    """Bridges engine events to asyncio: the engine thread never blocks on a consumer."""

    def __init__(self, loop: asyncio.AbstractEventLoop | None = None):
        self.loop = loop or asyncio.get_running_loop()
        self.queue: asyncio.Queue[list[Event]] = asyncio.Queue()

    def __call__(self, events: list[Event]) -> None:
        self.loop.call_soon_threadsafe(self.queue.put_nowait, events)

    async def events(self) -> AsyncIterator[Event]:
        while True:
            for ev in await self.queue.get():
                yield ev
                if ev.kind in ("done", "error"):
                    return


def monotonic() -> float:
    return time.monotonic()
