"""Which part of Hearth's model load crashes on a GPU build: each variant loads MODEL with every
layer offloaded, makes a context and decodes one token, in a process of its own, and the table
says which variants lived. The variants differ from llama.cpp's plain defaults one step at a
time, up to Hearth's own adapter as its model worker calls it.

    python3 scripts/device/load_probe.py MODEL [VARIANT]   (no VARIANT: all, as a table)
"""

from __future__ import annotations

import faulthandler
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "addon"))


def _raw(path: str, hearth_params: bool) -> None:
    import llama_cpp as L

    L.llama_backend_init()
    p = L.llama_model_default_params()
    p.n_gpu_layers = 2**31 - 1 if hearth_params else -1
    if hearth_params:
        p.load_mode = L.LLAMA_LOAD_MODE_MMAP
        p.use_extra_bufts = True
    model = L.llama_model_load_from_file(path.encode(), p)
    assert model, "no model"
    cp = L.llama_context_default_params()
    cp.n_ctx = 512
    ctx = L.llama_init_from_model(model, cp)
    assert ctx, "no context"
    tok = (L.llama_token * 1)(1)
    assert L.llama_decode(ctx, L.llama_batch_get_one(tok, 1)) == 0, "decode failed"


def _hearth(path: str, verbose: bool = False, log_set: bool = True,
            dynamic: bool = True, fault_handler: bool = False) -> None:
    from hearth import llama_backends
    from hearth.backend import LlamaBackend
    from hearth.llama_adapter import ContextParams, Model, init_backend

    if fault_handler:
        faulthandler.enable(all_threads=True)
    if verbose:
        logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    if not log_set:
        llama_backends.L.llama_log_set = lambda *a: None
    if not dynamic:
        llama_backends._load_dynamic_backends = lambda variant: None
    init_backend(verbose=verbose)
    print("backends:", llama_backends.backend_names(), file=sys.stderr)
    model = Model(path, n_gpu_layers=-1)
    b = LlamaBackend(model, ContextParams(n_ctx=2048, n_seq_max=2))
    token = model.tokenize("Hearth warms up.", add_special=False)[0]
    assert b.decode([token], [0], [0], [True]) == 0, "decode failed"


def _worker_setup(imports: bool, signals: bool) -> None:
    """What the worker does before its model load, apart from the load itself: its imports
    (the runtime's, pydantic's among them) and its signal handling."""
    if imports:
        import hearth.runner.serve  # noqa: F401
    if signals:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        faulthandler.enable(all_threads=True)
        faulthandler.register(signal.SIGUSR1, all_threads=True)


def _worker_cfg(path: str, verbose: bool) -> dict:
    """A worker's start-up settings as the runtime sends them: every layer offloaded, a small
    context."""
    from dataclasses import asdict

    from hearth.runner.protocol import ContextParams

    return {"model": path, "embedding_model": "", "n_gpu_layers": -1, "use_mmap": True,
            "verbose": verbose, "context": asdict(ContextParams(n_ctx=2048, n_seq_max=2)),
            "embed_batch": 2048, "skip": []}


def _runner(path: str) -> None:
    """The worker's own load (hearth.runner.serve.Runner.load) in this process, its channels a
    socket pair whose far ends a thread drains."""
    import socket
    from multiprocessing.connection import Connection

    from hearth.runner.protocol import AbortFlag
    from hearth.runner.serve import Runner

    pairs = [socket.socketpair() for _ in range(2)]
    ours = [Connection(a.detach()) for a, _ in pairs]
    theirs = [Connection(b.detach()) for _, b in pairs]

    def drain() -> None:
        while True:
            try:
                print("runner sent:", str(theirs[0].recv())[:200], file=sys.stderr)
            except (EOFError, OSError):
                return

    threading.Thread(target=drain, daemon=True).start()
    cfg = {**_worker_cfg(path, verbose=True), "abort_path": AbortFlag().path}
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    Runner(ours[0], ours[1], cfg).load()


def _worker(path: str, verbose: bool = False, wrapper: str = "", thread: bool = False) -> None:
    """The model worker as the server starts it (its own process, two socket channels, stderr
    read into the log), optionally under a wrapper command (a debugger) or from a thread."""
    from hearth.fleet.process import WRAPPER_ENV, WorkerProcess

    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    if wrapper:
        os.environ[WRAPPER_ENV] = wrapper
    cfg = _worker_cfg(path, verbose)
    failed: list[BaseException] = []

    def start() -> None:
        w = WorkerProcess(cfg, 60.0)
        try:
            print("worker:", w.wait_ready(120.0)["backends"], file=sys.stderr)
        except BaseException as e:  # reported by the caller
            failed.append(e)
        finally:
            w.kill()

    if thread:
        t = threading.Thread(target=start)
        t.start()
        t.join()
    else:
        start()
    if failed:
        raise failed[0]


VARIANTS = {
    "raw": lambda p: _raw(p, False),
    "raw-hearth-params": lambda p: _raw(p, True),
    "hearth": lambda p: _hearth(p),
    "hearth-verbose": lambda p: _hearth(p, verbose=True),
    "hearth-no-log-callback": lambda p: _hearth(p, log_set=False),
    "hearth-no-backend-loading": lambda p: _hearth(p, dynamic=False),
    "hearth-faulthandler": lambda p: _hearth(p, fault_handler=True),
    "hearth-after-worker-imports": lambda p: (_worker_setup(True, False), _hearth(p)),
    "hearth-after-worker-signals": lambda p: (_worker_setup(False, True), _hearth(p)),
    "hearth-after-both": lambda p: (_worker_setup(True, True), _hearth(p)),
    "runner-in-process": _runner,
    "worker": lambda p: _worker(p),
    "worker-from-thread": lambda p: _worker(p, thread=True),
    "worker-verbose": lambda p: _worker(p, verbose=True),
    "worker-env-minimal": lambda p: _worker(p, wrapper=(
        f"env -i PATH=/usr/bin:/bin LD_LIBRARY_PATH={os.environ.get('LD_LIBRARY_PATH', '')} "
        f"PYTHONPATH={os.environ.get('PYTHONPATH', '')}")),
    "worker-stdio": lambda p: _worker(p, wrapper="sh -c 'exec \"$@\" </dev/null 2>/tmp/w.err' sh"),
    # gdb writes to stdout, which the server sends to /dev/null: send it to stderr, the log
    "worker-gdb": lambda p: _worker(p, wrapper=(
        "sh -c 'exec cuda-gdb -q -batch -ex run -ex bt -ex \"info sharedlibrary\" "
        "--args \"$@\" 1>&2' sh")),
}


def main() -> int:
    model = sys.argv[1]
    if len(sys.argv) > 2:
        VARIANTS[sys.argv[2]](model)
        print("ok", file=sys.stderr)
        return 0
    rows = []
    for name in VARIANTS:
        t0 = time.monotonic()
        try:
            run = subprocess.run([sys.executable, __file__, model, name], capture_output=True,
                                 text=True, timeout=150)
        except subprocess.TimeoutExpired as e:
            err = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else ""
            run = subprocess.CompletedProcess(e.cmd, -999, "", err + "\n(timed out)")
        tail = [ln for ln in run.stderr.splitlines() if ln.strip()][-3:]
        if name == "worker-stdio" and os.path.exists("/tmp/w.err"):
            run.stderr += Path("/tmp/w.err").read_text()[-3000:]
        rows.append((name, run.returncode, time.monotonic() - t0, " | ".join(tail)[-300:]))
        print(f"--- {name}: rc {run.returncode}\n{run.stderr[-3000:]}", file=sys.stderr)
    print("| variant | exit | s | last lines |\n|---|---:|---:|---|")
    for name, rc, s, tail in rows:
        print(f"| {name} | {rc} | {s:.1f} | {tail} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
