"""Which part of Hearth's model load crashes, and how the worker's process differs from a plain
one that loads the same model. Every variant loads MODEL through the worker's own bootstrap
(hearth.runner.boot: rung, backend, model with every layer offloaded, context, canary decode),
in a process of its own, so a crash costs only that variant:

  raw                    llama.cpp's C API with its defaults (no Hearth code at all)
  plain                  the bootstrap in a plain process, with the worker's process set-up
  plain-no-setup         ... without it (stdout buffering, SIG_IGN, faulthandler)
  plain-server-first     the server stack imported first (the old worker's order), set-up on
  plain-server-first-no-setup
  worker                 the model worker as the server starts it (hearth.fleet.process)
  worker-server-first    the worker with the server stack imported before its bootstrap
  worker-no-setup        the worker without its process set-up
  worker-gdb             the worker under gdb (cuda-gdb where gdb is missing): every thread's
                         native stack at a crash
  plain-pre-llama3, worker-pre-llama3   MODEL with tokenizer.ggml.pre set to llama3 (no
                         std::regex in the tokenizer), given by --pre-llama3 PATH

    python3 scripts/device/load_probe.py MODEL [--out DIR] [--gpu-layers N] [--pre-llama3 PATH]
        [--only V,V] [--timeout S]
      each variant: OUT/VARIANT.log (all its output; a worker's whole start-up output), OUT/dump/
      VARIANT/ (hearth.runner.snapshot before and after the load: libraries in load order,
      signal dispositions, modules, /proc/PID/maps), OUT/summary.md (ok, or the signal, per
      variant) and OUT/compare.md (worker against plain, side by side)
    python3 scripts/device/load_probe.py MODEL --variant NAME   one variant in this process
"""

from __future__ import annotations

import argparse
import json
import os
import runpy
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

ADDON = Path(__file__).resolve().parents[2] / "addon"
sys.path.insert(0, str(ADDON))
# What the worker imported before llama.cpp until it had a bootstrap of its own.
SERVER_STACK = ("asyncio", "ssl", "numpy", "pydantic", "aiohttp", "hearth.fleet.runtime",
                "hearth.engine", "hearth.server")
WORKER_MODULE = "hearth.runner"


def cfg_for(model: str, gpu_layers: int) -> dict:
    from dataclasses import asdict

    from hearth.shared.protocol import ContextParams

    return {"model": model, "embedding_model": "", "n_gpu_layers": gpu_layers, "use_mmap": True,
            "verbose": True, "context": asdict(ContextParams(n_ctx=2048, n_seq_max=2)),
            "embed_batch": 2048, "skip": []}


def server_stack() -> None:
    import importlib

    for name in SERVER_STACK:
        try:
            importlib.import_module(name)
        except ImportError as e:  # a module this machine lacks: say so, go on
            print(f"(not importable: {name}: {e})", file=sys.stderr)


def raw(model: str, gpu_layers: int) -> None:
    import llama_cpp as L

    L.llama_backend_init()
    p = L.llama_model_default_params()
    p.n_gpu_layers = 2**31 - 1 if gpu_layers < 0 else gpu_layers
    m = L.llama_model_load_from_file(model.encode(), p)
    assert m, "no model"
    ctx = L.llama_init_from_model(m, L.llama_context_default_params())
    assert ctx, "no context"
    tok = (L.llama_token * 1)(1)
    assert L.llama_decode(ctx, L.llama_batch_get_one(tok, 1)) == 0, "decode failed"


def plain(model: str, gpu_layers: int, setup: bool, server_first: bool) -> None:
    """The bootstrap in a plain process of its own (plain_load.py), its outcome ours."""
    cmd = [sys.executable, str(Path(__file__).with_name("plain_load.py")),
           json.dumps(cfg_for(model, gpu_layers)), *([] if setup else ["--no-setup"]),
           *(["--server-first"] if server_first else [])]
    rc = subprocess.run(cmd).returncode
    if rc < 0:
        sys.exit(f"outcome: {signal.Signals(-rc).name}")
    if rc:
        sys.exit(f"outcome: exit {rc}")


def worker(model: str, gpu_layers: int, wrapper: list[str]) -> None:
    import logging
    import shlex

    from hearth.fleet.process import WRAPPER_ENV, WorkerProcess

    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    if wrapper:
        os.environ[WRAPPER_ENV] = shlex.join(wrapper)
    w = WorkerProcess(cfg_for(model, gpu_layers), 120.0)
    try:
        info = w.wait_ready(240.0)
        print("worker ready:", info["rung"], info["backends"], file=sys.stderr)
    except BaseException as e:  # the worker's start-up output, whole, then the outcome
        print(f"--- the worker's output until it died:\n{getattr(e, 'output', '')}\n---",
              file=sys.stderr)
        print(f"outcome: worker {type(e).__name__}: {e}", file=sys.stderr)
        sys.exit(3)
    finally:
        w.kill()


def launch(how: str, command: list[str]) -> None:
    """Run as a worker's wrapper: prepare as ``how`` says, then the worker's own module in
    this process (``command`` is ``python -m hearth.runner FD FD``)."""
    if how == "server-first":
        server_stack()
    elif how == "no-setup":
        from hearth.runner import boot

        boot.set_up_process = lambda: None
    at = command.index("-m")
    sys.argv = [command[at + 1], *command[at + 2:]]
    runpy.run_module(command[at + 1], run_name="__main__", alter_sys=True)


def debugger() -> list[str]:
    gdb = shutil.which("gdb") or shutil.which("cuda-gdb")
    if not gdb:
        return []
    return [gdb, "-q", "-batch", "-ex", "set pagination off", "-ex", "run",
            "-ex", "thread apply all bt", "-ex", "info sharedlibrary", "--args"]


def variants(a: argparse.Namespace) -> dict[str, object]:
    me = [sys.executable, str(Path(__file__).resolve())]
    pre = a.pre_llama3 or ""
    return {
        "raw": lambda: raw(a.model, a.gpu_layers),
        "plain": lambda: plain(a.model, a.gpu_layers, True, False),
        "plain-no-setup": lambda: plain(a.model, a.gpu_layers, False, False),
        "plain-server-first": lambda: plain(a.model, a.gpu_layers, True, True),
        "plain-server-first-no-setup": lambda: plain(a.model, a.gpu_layers, False, True),
        "worker": lambda: worker(a.model, a.gpu_layers, []),
        "worker-server-first": lambda: worker(a.model, a.gpu_layers,
                                              [*me, "--launch", "server-first", "--"]),
        "worker-no-setup": lambda: worker(a.model, a.gpu_layers,
                                          [*me, "--launch", "no-setup", "--"]),
        "worker-gdb": lambda: worker(a.model, a.gpu_layers, debugger()) if debugger() else
        sys.exit("skipped: neither gdb nor cuda-gdb here"),
        "plain-pre-llama3": lambda: plain(pre, a.gpu_layers, True, False) if pre else
        sys.exit("skipped: no --pre-llama3 model"),
        "worker-pre-llama3": lambda: worker(pre, a.gpu_layers, []) if pre else
        sys.exit("skipped: no --pre-llama3 model"),
    }


def outcome(rc: int, text: str) -> str:
    said = [ln for ln in text.splitlines() if ln.startswith(("outcome:", "skipped:"))]
    if said:
        return said[-1].removeprefix("outcome: ")
    if rc == 0:
        return "ok"
    if rc == -999:
        return "timed out"
    if rc < 0:
        return signal.Signals(-rc).name
    return f"exit {rc}"


def run_all(a: argparse.Namespace) -> int:
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    names = a.only.split(",") if a.only else list(variants(a))
    rows = []
    for name in names:
        dump = out / "dump" / name
        shutil.rmtree(dump, ignore_errors=True)
        env = {**os.environ, "HEARTH_BOOT_DUMP": str(dump), "PYTHONUNBUFFERED": "1"}
        cmd = [sys.executable, __file__, a.model, "--variant", name, "--gpu-layers",
               str(a.gpu_layers), *(["--pre-llama3", a.pre_llama3] if a.pre_llama3 else [])]
        t0 = time.monotonic()
        try:
            run = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 text=True, errors="replace", env=env, timeout=a.timeout)
            rc, text = run.returncode, run.stdout
        except subprocess.TimeoutExpired as e:
            rc = -999
            text = (e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes)
                    else e.stdout or "") + "\n(timed out)"
        (out / f"{name}.log").write_text(text)
        seen = outcome(rc, text)
        rows.append((name, seen, time.monotonic() - t0))
        print(f"{name}: {seen} ({time.monotonic() - t0:.1f} s)", file=sys.stderr)
    lines = ["| variant | outcome | s |", "|---|---|---:|"]
    lines += [f"| {n} | {o} | {s:.1f} |" for n, o, s in rows]
    (out / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    from probe_compare import compare

    (out / "compare.md").write_text(compare(out / "dump"))
    return 0


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--launch":
        launch(sys.argv[2], sys.argv[sys.argv.index("--") + 1:])
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--variant", default="")
    ap.add_argument("--out", default="probe")
    ap.add_argument("--gpu-layers", type=int, default=-1, help="-1: every layer")
    ap.add_argument("--pre-llama3", default="", help="MODEL with tokenizer.ggml.pre=llama3")
    ap.add_argument("--only", default="", help="comma-separated variants (default all)")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds per variant")
    a = ap.parse_args()
    if a.variant:
        variants(a)[a.variant]()  # type: ignore[operator]
        print("outcome: ok", file=sys.stderr)
        return 0
    return run_all(a)


if __name__ == "__main__":
    sys.exit(main())
