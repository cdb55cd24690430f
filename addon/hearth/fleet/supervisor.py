"""Supervising one model's worker process: starting it on a CPU rung that runs, restarting it
with backoff when it dies, remembering what killed it, and quarantining a request that was in
flight at two deaths (design §5c)."""

from __future__ import annotations

import collections
import hashlib
import json
import logging
import signal
import threading
import time
from importlib import metadata
from pathlib import Path
from typing import Any

from ..engine.base import RequestError, WorkerLost
from ..policy.cpu_ladder import step_down
from ..shared.requests import Request
from .process import WorkerProcess

log = logging.getLogger("hearth.worker")

BACKOFF_S = (1.0, 2.0, 4.0, 8.0, 16.0, 30.0)  # before each restart while crashes follow
CALM_S = 60.0  # a crash this long after the last one starts the backoff again
START_TRIES = 8  # starts in a row that may crash before a load is given up
STRIKES = 2  # deaths a request may be in flight for
DEGRADED_S = 300.0  # how long /health says degraded after a worker's crash
CRASHED_TWICE = "the model's worker crashed on this request twice"
CRASH_LOGS = 5  # the newest start-up outputs of workers that died before ready, kept whole


def fingerprint(r: Request) -> str:
    """Who a request is, across retries: its prompt and what shapes its sampling."""
    s = r.sampling
    raw = json.dumps([r.kind, r.prompt, s.grammar, s.grammar_trigger], separators=(",", ":"))
    return hashlib.sha256(raw.encode()).hexdigest()[:32]


class Quarantine:
    """Requests that were in flight when a worker died, counted by fingerprint, kept on disk
    so a durable job that kills its worker cannot do it again after a server restart."""

    def __init__(self, path: Path | None, limit: int = 1000):
        self.path = path
        self.limit = limit
        self._strikes: collections.OrderedDict[str, int] = collections.OrderedDict()
        self._lock = threading.Lock()
        if path is not None and path.is_file():
            try:
                self._strikes.update(json.loads(path.read_text()))
            except (OSError, ValueError):
                log.warning("ignoring an unreadable quarantine file %s", path)

    def check(self, r: Request) -> None:
        """Raise the quarantine's error for a request that killed its worker twice."""
        with self._lock:
            if self._strikes.get(fingerprint(r), 0) >= STRIKES:
                raise RequestError(CRASHED_TWICE, status=422, code="worker_crashed_twice")

    def strike(self, r: Request) -> int:
        key = fingerprint(r)
        with self._lock:
            n = self._strikes.pop(key, 0) + 1
            self._strikes[key] = n  # newest last: the oldest go first past the limit
            while len(self._strikes) > self.limit:
                self._strikes.popitem(last=False)
            self._save()
        return n

    def __len__(self) -> int:
        return sum(1 for n in self._strikes.values() if n >= STRIKES)

    def _save(self) -> None:
        if self.path is None:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps(self._strikes))
            tmp.replace(self.path)
        except OSError:
            log.exception("could not save the quarantine to %s", self.path)


class Supervisor:
    """Starts and restarts one model's worker process. ``cfg`` is the worker's start
    message; ``state_dir`` keeps the CPU rungs that crashed on this machine, and the
    quarantine."""

    def __init__(self, cfg: dict[str, Any], state_dir: Path, watchdog_s: float,
                 start_timeout_s: float = 600.0):
        self.cfg = cfg
        self.watchdog_s = watchdog_s
        self.start_timeout_s = start_timeout_s
        self._rungs_file = state_dir / "cpu-rungs.json"
        self._crash_logs = state_dir / "worker-crashes"
        self._n_crash_logs = 0
        self.skip: list[str] = []
        self.skip_why: dict[str, str] = {}  # each skipped rung's crash, as it was seen
        self._load_skip()
        self.quarantine = Quarantine(state_dir / "quarantine.json")
        self.state = "starting"  # starting | serving | restarting | failed
        self.worker: WorkerProcess | None = None
        self.starting: WorkerProcess | None = None  # one being started (killed by a stop)
        self.closing = False  # set by the stop: deaths from here on are its doing
        self.crashes: collections.deque[dict[str, Any]] = collections.deque(maxlen=10)
        self.restarts = 0
        self.failures_in_row = 0  # deaths since a worker last served a while
        self.boundary: Any = None  # the engine backend's Boundary, once it has one

    # -- starting ---------------------------------------------------------------------------
    def start(self) -> WorkerProcess:
        """A worker that passed its canary, walking down the CPU ladder past rungs that
        crash. Raises WorkerFailed (not a crash) or RuntimeError (crashed at every start)."""
        last: WorkerLost | None = None
        for _ in range(START_TRIES):
            if self.closing:
                raise RuntimeError("the model is being stopped")
            w = self.starting = WorkerProcess({**self.cfg, "skip": list(self.skip)},
                                              self.watchdog_s)
            try:
                w.wait_ready(self.start_timeout_s)
            except WorkerLost as lost:
                w.stop()
                self.crashed(lost, at_start=True)
                last = lost
                continue
            except BaseException:
                w.stop()
                raise
            finally:
                self.starting = None
            old, self.worker = self.worker, w
            if old is not None:
                old.stop()
            log.info("worker %d serves on CPU rung %s (%s)", w.pid, w.info["rung"],
                     ", ".join(w.info["backends"]))
            return w
        raise RuntimeError(f"the model's worker crashed at every start: {last}")

    def crashed(self, lost: WorkerLost, at_start: bool = False, requests: int = 0) -> None:
        """Record a death. A crash at start (the canary or the calibration decodes) or an
        illegal instruction at any time moves the next start one rung down."""
        if self.closing:
            return  # killed by the stop: not the CPU's fault, nor a request's
        now = time.time()
        if self.crashes and now - self.crashes[-1]["at"] > CALM_S:
            self.failures_in_row = 0  # it had served a while: back to the shortest backoff
        self.failures_in_row += 1
        steps = bool(lost.rung and (at_start or lost.signal == signal.SIGILL)
                     and lost.rung not in self.skip)
        # A crash at start that moves the worker down a rung costs no request: once a lower
        # rung serves, the service is ready on it (the step-down is reported, not degraded).
        self.crashes.append({"at": now, "cause": lost.cause, "during": lost.during,
                             "rung": lost.rung, "requests_failed": requests,
                             "pid": self.worker.pid if self.worker else None,
                             "step_down": steps and at_start,
                             "output_log": self._keep_output(lost, now)})
        if steps:
            assert lost.rung is not None
            self.skip.append(lost.rung)
            self.skip_why[lost.rung] = lost.cause
            log.warning("CPU rung %s crashed (%s): the next start skips it", lost.rung,
                        lost.cause)
            self._save_skip()

    def _keep_output(self, lost: WorkerLost, now: float) -> str | None:
        """A worker that died before it was ready: its whole output from its start, in a file
        of its own (the newest CRASH_LOGS kept), with its cause; the file's path, or None for a
        worker that had been ready. Its start is quiet (no fault handler while it loads, as a
        plain process), so a crash at the canary may leave only the cause."""
        if lost.during != "starting" and not lost.output:
            return None
        try:
            self._crash_logs.mkdir(parents=True, exist_ok=True)
            stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
            self._n_crash_logs += 1  # in the name: several in one second sort in order
            path = self._crash_logs / f"{stamp}-{self._n_crash_logs:04d}-{lost.rung}.log"
            path.write_text(f"{lost.cause}\n(while {lost.during})\n\n"
                            f"{lost.output or '(the worker wrote nothing)'}\n")
            for old in sorted(self._crash_logs.glob("*.log"))[:-CRASH_LOGS]:
                old.unlink()
            return str(path)
        except OSError:
            log.exception("could not keep the worker's output")
            return None

    def backoff(self) -> float:
        return BACKOFF_S[min(self.failures_in_row, len(BACKOFF_S)) - 1] \
            if self.failures_in_row else 0.0

    # -- what /health and /v1/queue show ------------------------------------------------------
    def report(self) -> dict[str, Any]:
        w = self.worker
        rung = w.info.get("rung") if w else None
        return {"state": self.state, "pid": w.pid if w and w.lost is None else None,
                "cpu_rung": rung, "cpu_variant": w.info.get("cpu_variant") if w else None,
                "rungs_skipped": list(self.skip), "restarts": self.restarts,
                "step_down": step_down(rung, w.info.get("rungs", []) if w else [],
                                       self.skip, self.skip_why),
                "last_crash": self.crashes[-1] if self.crashes else None,
                "crashes": len(self.crashes), "quarantined": len(self.quarantine),
                "boundary": self.boundary.report() if self.boundary else None}

    def problem(self, now: float | None = None) -> str | None:
        """Why this worker degrades the service: restarting or failed, or a crash within
        the last DEGRADED_S (so the household sees it happened); None when all is well."""
        last = self.crashes[-1] if self.crashes else None
        if self.state in ("restarting", "failed"):
            cause = last["cause"] if last else "unknown"
            return f"worker {self.state} after a crash: {cause}"
        real = next((c for c in reversed(self.crashes) if not c.get("step_down")), None)
        if real and (now or time.time()) - real["at"] < DEGRADED_S:
            return f"worker restarted after a crash: {real['cause']}"
        return None

    # -- the rungs that crashed here, across server restarts ------------------------------------
    def _key(self) -> str:
        """This CPU and this llama.cpp build: an update of llama-cpp-python (whose kernels may
        no longer crash here) tries the best rung again."""
        try:
            with open("/proc/cpuinfo") as f:
                flags = next((line for line in f if line.startswith("flags")), "")
        except OSError:
            flags = ""
        try:
            build = metadata.version("llama-cpp-python")
        except metadata.PackageNotFoundError:
            build = ""
        return hashlib.sha256(f"{flags}|{build}".encode()).hexdigest()[:16]

    def _load_skip(self) -> None:
        try:
            saved = json.loads(self._rungs_file.read_text()).get(self._key(), [])
        except (OSError, ValueError, AttributeError):
            return
        if isinstance(saved, list):  # written before the crashes' causes were kept
            saved = {"skip": saved, "why": {}}
        if isinstance(saved, dict):
            self.skip = [r for r in saved.get("skip", []) if isinstance(r, str)]
            why = saved.get("why")
            self.skip_why = {k: v for k, v in why.items() if isinstance(v, str)} \
                if isinstance(why, dict) else {}

    def _save_skip(self) -> None:
        try:
            self._rungs_file.parent.mkdir(parents=True, exist_ok=True)
            self._rungs_file.write_text(json.dumps(
                {self._key(): {"skip": self.skip, "why": self.skip_why}}))
        except OSError:
            log.exception("could not save the CPU rungs that crashed")
