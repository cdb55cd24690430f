"""The server's side of a model's worker process (:mod:`hearth.runner`): starting it, the
two channels to it, its watchdog, and, when it dies, what killed it."""

from __future__ import annotations

import collections
import contextlib
import itertools
import logging
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
from concurrent.futures import Future
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from ..engine.base import WorkerLost
from ..shared.protocol import AbortFlag

log = logging.getLogger("hearth.worker")
WRAPPER_ENV = "HEARTH_WORKER_WRAPPER"
# The most of a starting worker's output kept whole for the report of its death (its last
# bytes: where it died); every line is in the log as it comes.
STARTUP_OUTPUT_BYTES = 1 << 20

_SIGNALS = {
    signal.SIGSEGV: "a segmentation fault",
    signal.SIGILL: "an illegal instruction (a CPU kernel this CPU cannot run)",
    signal.SIGABRT: "an abort (a failed assertion in llama.cpp?)",
    signal.SIGKILL: "SIGKILL (the kernel's out-of-memory killer, or the watchdog)",
    signal.SIGBUS: "a bus error",
    signal.SIGFPE: "an arithmetic fault",
}


class WorkerFailed(RuntimeError):
    """The worker refused to start for a reason that is not a crash (a missing file, a model
    it cannot serve): restarting would not help."""


class WorkerError(RuntimeError):
    """One call failed inside a live worker (a grammar llama.cpp refuses, ...)."""


class WorkerProcess:
    """One started worker. The engine thread alone uses :meth:`call`; any thread may use
    :meth:`service` and :attr:`abort`."""

    _ids = itertools.count(1)

    def __init__(self, cfg: dict[str, Any], watchdog_s: float):
        self.watchdog_s = watchdog_s
        self.abort = AbortFlag()
        eng_ours, eng_theirs = socket.socketpair()
        svc_ours, svc_theirs = socket.socketpair()
        package_root = str(Path(__file__).resolve().parents[2])
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH"))
                                            if p)
        fds = (eng_theirs.fileno(), svc_theirs.fileno())
        # A command the worker runs under (nice, taskset, an emulator for a CPU test).
        wrapper = shlex.split(os.environ.get(WRAPPER_ENV, ""))
        self.proc = subprocess.Popen(
            [*wrapper, sys.executable, "-m", "hearth.runner", *map(str, fds)], pass_fds=fds,
            # stdout too: llama.cpp's and a GPU driver's native prints, a debugger's report
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            env=env)
        eng_theirs.close()
        svc_theirs.close()
        self.pid = self.proc.pid
        self.eng = Connection(eng_ours.detach())
        self.svc = Connection(svc_ours.detach())
        self.tail: collections.deque[str] = collections.deque(maxlen=12)
        self.ready = False  # once the canary passed: output from then on is not kept
        self._startup: collections.deque[str] = collections.deque()  # its output until ready
        self._startup_bytes = 0
        self._startup_dropped = 0  # lines dropped from the front past STARTUP_OUTPUT_BYTES
        self.rung: str | None = None
        self.info: dict[str, Any] = {}
        self.lost: WorkerLost | None = None
        self.stopping = False
        self._engine_op: str | None = None
        self.on_lost: Any = None  # called (from the service reader) when the worker is gone
        self._pending: dict[int, Future] = {}
        self._svc_lock = threading.Lock()
        self._lost_lock = threading.Lock()
        self._reader = threading.Thread(target=self._read_output, name="hearth-worker-log",
                                        daemon=True)
        self._reader.start()
        self.eng.send({**cfg, "abort_path": self.abort.path})

    # -- start ------------------------------------------------------------------------------
    def wait_ready(self, timeout: float) -> dict[str, Any]:
        """Wait for the worker's canary to pass. Raises WorkerLost if it died on the way (its
        rung is known once it said it), WorkerFailed if it refused."""
        while True:
            kind, value = self._recv(timeout, "starting")
            if kind == "rung":
                self.rung = value
            elif kind == "failed":
                self.kill()
                raise WorkerFailed(value)
            else:
                self.info = value
                self.ready = True
                self.abort.close()  # both have it mapped: no file outlives a killed server
                threading.Thread(target=self._read_service, name="hearth-worker-replies",
                                 daemon=True).start()
                return value

    # -- calls ------------------------------------------------------------------------------
    def call(self, deferred: list[tuple], op: str, *args: Any, timeout: float | None = None
             ) -> Any:
        if self.lost is not None:
            raise self.lost
        self._engine_op = op  # what the worker was doing, whichever channel sees it die
        try:
            self.eng.send((deferred, op, args))
        except OSError:
            raise self._gone(op) from None
        kind, value = self._recv(timeout or self.watchdog_s, op)
        self._engine_op = None
        if kind == "err":
            raise WorkerError(value)
        return value

    def _recv(self, timeout: float, during: str) -> Any:
        try:
            ready = self.eng.poll(timeout)
            if ready:
                return self.eng.recv()
        except (EOFError, OSError):
            raise self._gone(during) from None
        if self.proc.poll() is None:  # its threads' stacks to the log, then the kill
            self.proc.send_signal(signal.SIGUSR1)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=1.0)
        self.kill()
        raise self._gone(during, hung=timeout)

    def service(self, op: str, *args: Any, timeout: float = 120.0) -> Any:
        """A call any thread may make (tokenizing, checking a grammar)."""
        if self.lost is not None:
            raise self.lost
        fut: Future = Future()
        mid = next(self._ids)
        with self._svc_lock:
            self._pending[mid] = fut
            try:
                self.svc.send((mid, op, args))
            except OSError:
                self._pending.pop(mid, None)
                raise self._gone(op) from None
        kind, value = fut.result(timeout)
        if kind == "err":
            raise WorkerError(value)
        return value

    def _read_service(self) -> None:
        while True:
            try:
                mid, kind, value = self.svc.recv()
            except (EOFError, OSError):
                if self.stopping:
                    return
                lost = self._gone("serving")
                with self._svc_lock:
                    pending, self._pending = self._pending, {}
                for fut in pending.values():
                    fut.set_exception(lost)
                if self.on_lost is not None:
                    self.on_lost()
                return
            with self._svc_lock:
                fut = self._pending.pop(mid, None)
            if fut is not None:
                fut.set_result((kind, value))

    # -- death ------------------------------------------------------------------------------
    def _gone(self, during: str, hung: float | None = None) -> WorkerLost:
        with self._lost_lock:
            if self.lost is not None:
                return self.lost
            during = self._engine_op or during
            try:
                rc = self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.kill()
                rc = self.proc.wait()
            sig = -rc if rc < 0 else None
            output = ""
            if not self.ready:  # its whole start-up output: the reader gets to its end first
                self._reader.join(timeout=5)
                output = self.startup_output()
            if hung is not None:
                cause = f"hung: no answer for {hung:.0f} s (killed by the watchdog)"
            elif sig is not None:
                name = signal.Signals(sig).name
                cause = f"{name}: {_SIGNALS.get(signal.Signals(sig), 'killed by a signal')}"
            else:
                cause = f"exited with status {rc}"
            detail = next((line for line in reversed(self.tail)
                           if any(k in line for k in ("GGML_ASSERT", "error", "Error", "abort"))),
                          "")
            if detail:
                cause += f" — {detail[:300]}"
            self.lost = WorkerLost(cause, signal=sig, during=during, rung=self.rung,
                                   blame=self.abort.blame,
                                   suspect=hung is not None or sig != signal.SIGKILL,
                                   output=output)
            log.error("the model's worker (pid %d) died while %s: %s", self.pid, during, cause)
            if output:
                log.error("its output from its start (%d lines):\n%s", output.count("\n") + 1,
                          output)
            return self.lost

    def _read_output(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            line = raw.decode("utf-8", "replace").rstrip()
            if line:
                self.tail.append(line)
                log.info("worker %d: %s", self.pid, line)
                if not self.ready:
                    self._keep(line)

    def _keep(self, line: str) -> None:
        self._startup.append(line)
        self._startup_bytes += len(line) + 1
        while self._startup_bytes > STARTUP_OUTPUT_BYTES and len(self._startup) > 1:
            self._startup_bytes -= len(self._startup.popleft()) + 1
            self._startup_dropped += 1

    def startup_output(self) -> str:
        """What the worker wrote (stderr and stdout) from its start until ready, at most
        STARTUP_OUTPUT_BYTES of its last lines."""
        lines = list(self._startup)
        if self._startup_dropped:
            lines.insert(0, f"[{self._startup_dropped} earlier lines left out]")
        return "\n".join(lines)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()

    def stop(self, timeout: float = 10.0) -> None:
        """Ask the worker to exit (the engine thread has stopped); kill it if it will not."""
        self.stopping = True
        if self.lost is None and timeout > 0:
            with contextlib.suppress(WorkerLost, WorkerError):
                self.call([], "exit", timeout=timeout)
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            self.proc.wait()
        self.abort.close()
        for conn in (self.eng, self.svc):
            conn.close()
