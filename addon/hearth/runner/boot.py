"""The one load path of llama.cpp in Hearth: the model worker (``python -m hearth.runner``),
the tests that run llama.cpp in their own process and ``scripts/device/load_probe.py`` all load
a model through :func:`load`, so a probe cannot drift from the worker.

Order, the same everywhere:

1. this module is the worker's first import, and it imports llama.cpp's adapter first. Nothing
   of the server stack (asyncio, aiohttp, pydantic, OpenSSL, the engine, the runtime) is in the
   process when the model loads: the worker must load llama.cpp's native code the way a plain
   process does (a worker that imported the server stack first crashed in llama.cpp's model load
   on an NVIDIA H200 while a plain process did not);
2. :func:`set_up_process` (the worker and the probe; not a test runner, whose Ctrl-C and signal
   handling are its own): native stdout line-buffered, SIGINT and SIGTERM ignored, faulthandler
   on. It runs *before* the load, because a crash in the load is the one whose Python stack
   matters most, and a Ctrl-C to the process group during a long load is the server's to handle;
3. the CPU rung: the first of :func:`~hearth.llama.llama_backends.cpu_rungs` not skipped (the
   supervisor's skip list: rungs that crashed here), told to the caller before anything runs on
   it, so a crash is charged to that rung;
4. the backend on that rung, the model(s) with the rung's extra buffers, the context;
5. the canary decode: a CPU that reports instructions it cannot run dies here, not mid-request.
"""

from __future__ import annotations

import ctypes
import faulthandler
import signal
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..llama.backend import LlamaBackend
from ..llama.llama_adapter import ContextParams, Model
from ..llama.llama_backends import NO_EXTRA, cpu_rungs, init_backend
from ..shared.protocol import AbortFlag
from . import faults, snapshot

_rung: str | None = None  # the rung this process's backend was initialised on


def set_up_process() -> None:
    """The process set-up of a model worker, in one place (see the module's order, step 2)."""
    # Native prints (llama.cpp's, a GPU driver's) go to stdout, which the server reads into its
    # log: line-buffered, so a crash loses none of them.
    libc = ctypes.CDLL(None)
    libc.setvbuf(ctypes.c_void_p.in_dll(libc, "stdout"), None, 1, 0)  # 1: _IOLBF
    # The server decides when its workers stop (after saving their prefixes): a Ctrl-C or a
    # SIGTERM sent to the whole process group is the server's to handle.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    # Where it died, in the log: each thread's Python stack on a fatal signal (the signal
    # still ends the process), and on SIGUSR1, which the watchdog sends before its SIGKILL.
    faulthandler.enable(all_threads=True)
    faulthandler.register(signal.SIGUSR1, all_threads=True)


def choose_rung(skip: list[str] | tuple[str, ...] = ()) -> tuple[str, list[str]]:
    """The rung to run on (the first not skipped; the last when all are) and the ladder."""
    rungs = cpu_rungs()
    return next((r for r in rungs if r not in skip), rungs[-1]), rungs


def extra_buffers(rung: str) -> bool:
    """Whether llama.cpp's extra buffer types (AMX, repacked weights) are on at this rung."""
    return not rung.endswith(NO_EXTRA)


def start_backend(rung: str, verbose: bool = False) -> None:
    """llama.cpp's backends, once per process, on ``rung``."""
    global _rung
    init_backend(verbose=verbose, rung=rung)
    _rung = _rung or rung


def open_model(path: Any, n_gpu_layers: int = 0, use_mmap: bool = True) -> Model:
    """A model loaded with the extra buffers of the rung this process started on."""
    if _rung is None:
        raise RuntimeError("start_backend first: the rung decides how models load")
    return Model(path, n_gpu_layers=n_gpu_layers, use_mmap=use_mmap,
                 extra_buffers=extra_buffers(_rung))


def unservable(model: Any) -> str | None:
    """Why the engine cannot serve this model correctly, or None. Recurrent and hybrid models
    (Mamba, RWKV, Jamba, ...) keep a state per sequence that cannot be copied for a range or
    cut at a position, which the prefix cache and preemption do all the time."""
    if model.is_recurrent or model.is_hybrid:
        kind = "a recurrent" if model.is_recurrent else "a hybrid (attention + recurrent)"
        return (f"{kind} model: Hearth shares and trims each sequence's KV cache, which such "
                "models' memory does not allow; serve a transformer model")
    return None


def canary(model: Model, backend: LlamaBackend, rung: str) -> int:
    """One decode of one token on sequence 0, removed again; returns the token."""
    token = model.tokenize("Hearth warms up.", add_special=False)[0]
    faults.at_canary(rung)
    if backend.decode([token], [0], [0], [True]) != 0:
        raise RuntimeError("the canary decode failed")
    backend.seq_rm(0)
    return token


@dataclass
class Loaded:
    rung: str
    rungs: list[str]
    model: Model
    backend: LlamaBackend
    abort: AbortFlag
    canary_token: int
    embed_model: Model | None = None

    def close(self) -> None:
        """For an in-process user (tests, the probe); a worker just exits."""
        self.backend.close()
        for m in {id(m): m for m in (self.model, self.embed_model) if m}.values():
            m.close()
        self.abort.close()


def load(cfg: dict[str, Any], tell: Callable[[tuple], None] = lambda msg: None) -> Loaded:
    """Load ``cfg``'s model(s) as a worker does (its start message: model, embedding_model,
    n_gpu_layers, use_mmap, verbose, context, embed_batch, skip, abort_path) and pass the
    canary. ``tell`` gets ``("rung", rung)`` before anything runs on it. Raises for what is
    not a crash (a missing file, a model Hearth cannot serve)."""
    rung, rungs = choose_rung(cfg.get("skip", ()))
    tell(("rung", rung))
    start_backend(rung, verbose=cfg.get("verbose", False))
    snapshot.dump("loading")
    gpu, mmap = cfg.get("n_gpu_layers", 0), cfg.get("use_mmap", True)
    model = open_model(cfg["model"], n_gpu_layers=gpu, use_mmap=mmap)
    if reason := unservable(model):
        model.close()
        raise ValueError(f"{model.path.name}: {reason}")
    embed_model = None
    if cfg.get("embedding_model"):
        embed_model = open_model(cfg["embedding_model"], n_gpu_layers=gpu, use_mmap=mmap)
    abort = AbortFlag(cfg.get("abort_path"))
    backend = LlamaBackend(model, ContextParams(**cfg.get("context", {})),
                           embed_model=embed_model, embed_batch=cfg.get("embed_batch", 2048),
                           abort_flag=abort.array)
    token = canary(model, backend, rung)
    snapshot.dump("loaded")
    return Loaded(rung, rungs, model, backend, abort, token, embed_model)
