"""The worker's load phase at the lowest CPU priority (:mod:`hearth.policy.load_yield`).

Linux keeps a scheduling policy and a nice value per thread, and a thread's new threads
(llama.cpp's compute threads) inherit them. Nice 19, not SCHED_IDLE: an idle-class load ranks
below every other process on the machine and crawled whenever anything else ran (110 s for a
load of seconds); at nice 19 it still yields to the serving workers by far. Going back up from
nice 19 needs a privilege a Home Assistant add-on does not have, so the worker never lowers a
thread that will serve: the load, and every engine call until the server says the load is over,
run in one thread of their own that lowers itself first and ends with the load. The calls after
it run in the worker's main thread at its own priority."""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

NICE_LOWEST = 19


def lower_this_thread() -> dict[str, Any]:
    """Nice 19 for the calling thread, as far as the system allows; what was set, for the
    log."""
    tid = threading.get_native_id()
    done: dict[str, Any] = {"tid": tid}
    try:
        os.setpriority(os.PRIO_PROCESS, tid, NICE_LOWEST)
        done["nice"] = NICE_LOWEST
    except (AttributeError, OSError) as e:
        done["nice_error"] = str(e)
    return done


class LowPriorityThread:
    """Runs calls one at a time in a thread at the lowest priority; :meth:`close` lets the
    thread end (it may be called from that thread)."""

    def __init__(self) -> None:
        self._calls: queue.SimpleQueue = queue.SimpleQueue()
        self.lowered: dict[str, Any] = {}
        self.thread = threading.Thread(target=self._run, name="hearth-worker-load",
                                       daemon=True)
        self.thread.start()

    def _run(self) -> None:
        self.lowered = lower_this_thread()
        while True:
            item = self._calls.get()
            if item is None:
                return
            fut, fn, args = item
            try:
                fut.set_result(fn(*args))
            except BaseException as e:  # the caller's to raise, in its own thread
                fut.set_exception(e)

    def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        fut: Future = Future()
        self._calls.put((fut, fn, args))
        return fut.result()

    def close(self) -> None:
        self._calls.put(None)
