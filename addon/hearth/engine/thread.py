"""The engine's thread, and the bridge from its events to asyncio."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import weakref
from collections.abc import AsyncIterator, Callable
from typing import ClassVar

from ..shared.requests import Event, Request
from .base import WorkerLost
from .core import EngineCore

log = logging.getLogger("hearth.engine")


class Engine:
    """Runs an :class:`EngineCore` in its own thread."""

    def __init__(self, core: EngineCore,
                 on_death: Callable[[BaseException], None] | None = None,
                 on_worker_lost: Callable[[WorkerLost, list[Request], list[Request],
                                           threading.Event], None] | None = None):
        self.core = core
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.error: BaseException | None = None
        self.on_death = on_death  # told after the requests have their errors
        # Told, in this thread, when the backend's worker process died, with the requests it
        # was serving and the suspects among them; returns once a new worker serves (or the
        # engine is stopping).
        self.on_worker_lost = on_worker_lost
        self.admit_check: Callable[[Request], None] | None = None  # may refuse a submission

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="hearth-engine", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        core = self.core
        check = getattr(core.b, "check", None)  # a worker process's backend: still alive?
        try:
            while not self._stop.is_set():
                try:
                    if check is not None:
                        check()
                    self._iteration()
                except WorkerLost as lost:
                    if self.on_worker_lost is None:
                        raise
                    self.on_worker_lost(lost, *core.worker_lost(lost), self._stop)
        except BaseException as e:
            self.error = e
            log.exception("engine thread died")
            self.core.fail_all(f"engine stopped: {e}")
            if self.on_death is not None:
                self.on_death(e)

    def _iteration(self) -> None:
        core = self.core
        if not core.has_work():
            if not core.idle():
                core.wakeup.wait(0.5)
                core.wakeup.clear()
            return
        if core.arbiter is not None:
            core.arbiter.pause(core, self._stop)  # another model's voice goes first
        if not core.step():
            core.wakeup.wait(0.01)
            core.wakeup.clear()

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
        if self.admit_check is not None:
            self.admit_check(r)
        return self.core.submit(r)

    def cancel(self, request_id: int) -> None:
        self.core.cancel(request_id)


class _LoopBridge:
    """Hands events from the engine thread to one event loop with one wake-up per batch, not
    one per request: each wake-up is a write to the loop's self-pipe, and with 8 streams it was
    the engine thread's largest cost after llama_decode."""

    _bridges: ClassVar[weakref.WeakKeyDictionary] = weakref.WeakKeyDictionary()
    _bridges_lock = threading.Lock()

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self._loop = weakref.ref(loop)  # the registry's value must not keep its key alive
        self._lock = threading.Lock()
        self._pending: list[tuple[asyncio.Queue, list[Event]]] = []

    @classmethod
    def of(cls, loop: asyncio.AbstractEventLoop) -> _LoopBridge:
        with cls._bridges_lock:
            b = cls._bridges.get(loop)
            if b is None:
                b = cls._bridges[loop] = cls(loop)
            return b

    def post(self, queue: asyncio.Queue, events: list[Event]) -> None:
        with self._lock:
            self._pending.append((queue, events))
            if len(self._pending) > 1:
                return  # a wake-up is already on its way and will take these too
        loop = self._loop()
        try:
            if loop is None:
                raise RuntimeError("the loop is gone")
            loop.call_soon_threadsafe(self._drain)
        except RuntimeError:  # the loop has closed: nobody is listening any more
            with self._lock:
                self._pending.clear()

    def _drain(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, []
        for queue, events in pending:
            queue.put_nowait(events)


class AsyncStream:
    """Bridges engine events to asyncio: the engine thread never blocks on a consumer."""

    def __init__(self, loop: asyncio.AbstractEventLoop | None = None):
        self.loop = loop or asyncio.get_running_loop()
        self.queue: asyncio.Queue[list[Event]] = asyncio.Queue()
        self._bridge = _LoopBridge.of(self.loop)

    def __call__(self, events: list[Event]) -> None:
        self._bridge.post(self.queue, events)

    async def events(self) -> AsyncIterator[Event]:
        while True:
            for ev in await self.queue.get():
                yield ev
                if ev.kind in ("done", "error"):
                    return


def monotonic() -> float:
    return time.monotonic()
