"""The server's side of a load that yields to other models' voice and chat work
(:mod:`hearth.policy.load_yield` decides; this module acts): the worker is started with its
load phase at the lowest CPU priority (:mod:`hearth.runner.low_priority`), a thread stops and
continues it (SIGSTOP, SIGCONT) as the rule says, and once the load is over, or boosted, the
worker is told to serve at its own priority.

Stopping the whole worker is safe here: while a model loads, only its loading thread talks to
its worker (the engine thread and the service channel start once it is ready), and that
thread only waits for an answer, within a timeout far longer than a pause; the worker holds
nothing the server needs meanwhile. A stopped worker is continued before anything stops it
(the server closing, the load ending or failing)."""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

from ..engine.arbiter import best_rank
from ..policy.load_yield import IDLE_RANK, LoadClock, LoadYield

log = logging.getLogger("hearth.worker")

POLL_S = 0.01  # how often the rule is asked again while a model loads


class LoadTurn:
    """One load of one model. ``own`` gives the best class waiting for the model loaded,
    ``others`` the best class of each other model's running and waiting work."""

    def __init__(self, rule: LoadYield, own: Callable[[], int],
                 others: Callable[[], list[int]], watchdog_s: float = 120.0):
        # A call's watchdog must never see a pause: a pause stays well inside it.
        if rule.max_pause_s > watchdog_s / 4:
            rule = LoadYield(rule.enabled, watchdog_s / 4, rule.min_run_s, rule.boost_after_s)
        self.rule, self.own, self.others = rule, own, others
        self.clock = LoadClock(rule)
        self.low = rule.low_priority(own(), serving=bool(others()))
        self.sup: Any = None
        self._stopped: Any = None  # the WorkerProcess this turn has stopped, if any
        self._raised: Any = None  # the WorkerProcess told to serve at its own priority
        self._done = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    # -- the loading thread's side ------------------------------------------------------------
    def begin(self, sup: Any) -> None:
        """Before the model's first worker starts: its load phase runs low, and is paused."""
        self.sup = sup
        if self.low:
            sup.cfg = {**sup.cfg, "load_priority": "low"}
        self._thread = threading.Thread(target=self._watch, name="hearth-load-turn",
                                        daemon=True)
        self._thread.start()

    def before_call(self, worker: Any) -> None:
        """Before each engine call of the load (calibration, restore): a boosted load's
        worker leaves the lowest priority now."""
        if self.low and self.clock.boosted and self._raised is not worker:
            self._raised = worker
            log.info("worker %d leaves the lowest priority: %s", worker.pid, self.clock.why)
            worker.call([], "normal_priority")

    def finish(self, backend: Any = None) -> None:
        """The load is over (``backend``: it ended well, the worker serves from now on at its
        own priority) or failed. Idempotent; restarts after a crash start at normal."""
        self._done.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        self._set(None, False)
        self.clock.end(time.monotonic())
        if self.sup is not None:
            self.sup.cfg.pop("load_priority", None)
        if backend is not None:
            backend.before_call = None
            if self.low and self._raised is not backend.worker:
                self._raised = backend.worker
                backend.flush()
                backend.worker.call([], "normal_priority")

    # -- the turn's own thread ----------------------------------------------------------------
    def _watch(self) -> None:
        while not self._done.wait(POLL_S):
            sup = self.sup
            if sup.closing:  # a stop kills or asks the worker to exit: it must be running
                break
            try:
                pause = self.clock.step(self.own(), self.others(), time.monotonic())
            except Exception:  # the rule's inputs read from other threads: never stop here
                log.exception("the load's turn could not be decided; it runs")
                pause = False
            self._set(sup.starting or sup.worker, pause)
        self._set(None, False)

    def _set(self, worker: Any, pause: bool) -> None:
        with self._lock:
            old = self._stopped
            if pause and worker is not None and worker is old:
                return
            if old is not None:
                self._signal(old, signal.SIGCONT)
                self._stopped = None
            if pause and worker is not None:
                self._signal(worker, signal.SIGSTOP)
                self._stopped = worker

    @staticmethod
    def _signal(worker: Any, sig: int) -> None:
        with contextlib.suppress(OSError):  # gone: a no-op once reaped, else ESRCH
            worker.proc.send_signal(sig)

    def report(self) -> dict[str, Any]:
        now = time.monotonic()
        sup = self.sup
        w = (sup.starting or sup.worker) if sup is not None else None
        return {"pid": w.pid if w is not None else None, "low_priority": self.low,
                "paused": self.clock.paused_since is not None,
                "pauses": self.clock.pauses, "paused_s": round(self.clock.held_s(now), 3),
                "boosted": self.clock.why}


def turn_for(fleet: Any, w: Any) -> LoadTurn | None:
    """The turn of a load of ``w`` in ``fleet``: None with one model, or arbitration off
    (each model has its own accelerator: nothing to yield)."""
    if fleet.arbiter is None or not fleet.arbiter.rule.enabled:
        return None

    def own() -> int:
        return min(list(w.waiting_ranks), default=IDLE_RANK)

    def others() -> list[int]:
        return [best_rank(x.rt.core) for x in list(fleet.workers.values())
                if x is not w and not x.remote and x.rt.state == "ready"
                and x.rt.core is not None]

    return LoadTurn(LoadYield(), own, others, fleet.settings.worker_watchdog_s)
