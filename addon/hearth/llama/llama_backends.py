"""llama.cpp's backends (part of the thin adapter): initialising them once, choosing the CPU
variant a worker runs, and naming what is in use.

A build with GGML_BACKEND_DL (the add-on image, and the dev set-up's wheel) carries the CPU
backend as one library per instruction-set level and picks the best this CPU reports. A CPU can
report more than it runs: llama.cpp's AMX kernel dies on some VMs that report AMX. So a worker
may be told to skip rungs of a ladder (:func:`cpu_rungs`), each dropping as little as it can:
the best variant; the next variant down with its extra buffer types (repacked weights: a third
of the speed) kept, which leaves only AMX behind (only the best x86 variant has it); then the
best and each lower variant without extra buffers. A native build has one variant, ``native``,
and so two rungs: with and without extra buffers.
"""

from __future__ import annotations

import ctypes
import logging
import threading
from pathlib import Path

import llama_cpp as L

from ..policy.cpu_ladder import NO_EXTRA as NO_EXTRA  # the worker names rungs with it
from ..policy.cpu_ladder import extra_buffers as extra_buffers
from ..policy.cpu_ladder import ladder, rung_variant

log = logging.getLogger(__name__)


_init_lock = threading.Lock()
_initialised = False
_log_callback = None  # kept referenced: llama.cpp calls it for the life of the process
_variant: str | None = None  # the CPU variant loaded, in a build that has several


class LlamaError(RuntimeError):
    pass


def _lib_dir() -> Path:
    return Path(L.__file__).parent / "lib"


def _libggml() -> ctypes.CDLL:
    """ggml's functions as libllama is bound to them. The wheel ships libggml.so and
    libggml.so.0 as two copies of one file: opening either by name could load a second ggml,
    with its own (empty) backend registry; lookups through libllama's handle cannot."""
    return L.llama_cpp._lib


def _registered() -> int:
    count = _libggml().ggml_backend_reg_count
    count.restype = ctypes.c_size_t
    return int(count())


def cpu_variants() -> list[tuple[str, Path]]:
    """The CPU variants this build carries that this CPU says it runs, best first (each
    library scores itself, as ggml's own loader asks it to); [] for a build with the CPU
    backend compiled in."""
    scored = []
    for path in _lib_dir().glob("libggml-cpu-*.so"):
        try:
            score = ctypes.CDLL(str(path)).ggml_backend_score
        except (OSError, AttributeError):
            continue
        score.restype = ctypes.c_int
        if (s := score()) > 0:
            scored.append((s, path.name.removeprefix("libggml-cpu-").removesuffix(".so"), path))
    return [(name, path) for _, name, path in sorted(scored, reverse=True)]


def cpu_rungs() -> list[str]:
    """The ladder a worker walks down after a crash at start or an illegal instruction."""
    return ladder([n for n, _ in cpu_variants()] or ["native"])


def init_backend(verbose: bool = False, rung: str | None = None) -> None:
    """Initialise llama.cpp once, on the CPU variant of ``rung`` (None: the best); silence its
    native log unless ``verbose``."""
    global _initialised, _log_callback
    with _init_lock:
        if _initialised:
            return
        if verbose:
            def forward(level: int, text: bytes, _data: ctypes.c_void_p) -> None:
                log.info("llama.cpp: %s", text.decode("utf-8", "replace").rstrip())
        else:
            def forward(level: int, text: bytes, _data: ctypes.c_void_p) -> None:
                return None
        _log_callback = L.llama_log_callback(forward)
        L.llama_log_set(_log_callback, ctypes.c_void_p(0))
        _load_dynamic_backends(rung_variant(rung) if rung else None)
        L.llama_backend_init()
        _initialised = True


def _load_dynamic_backends(variant: str | None) -> None:
    """A build with GGML_BACKEND_DL registers no backend by itself: load the chosen CPU
    variant (else ggml's best) and every other backend (GPUs) from the package's lib folder."""
    try:
        ggml = _libggml()
        load_all = ggml.ggml_backend_load_all_from_path
        load = ggml.ggml_backend_load
    except (OSError, AttributeError):
        return
    global _variant
    if _registered():
        return  # a build with its backends compiled in: nothing to choose
    found = cpu_variants()
    paths = dict(found)
    _variant = variant if variant in paths else (found[0][0] if found else None)
    if variant in paths:
        load.argtypes, load.restype = [ctypes.c_char_p], ctypes.c_void_p
        load(str(paths[variant]).encode())
        for other in sorted(_lib_dir().glob("libggml-*.so")):
            if not other.name.startswith(("libggml-cpu", "libggml-base")):
                load(str(other).encode())  # a GPU backend without a device registers nothing
    else:
        load_all.argtypes = [ctypes.c_char_p]
        load_all(str(_lib_dir()).encode())
    if _registered() == 0:
        raise LlamaError("llama.cpp found no backend it can run on this CPU")


def cpu_variant() -> str:
    """The CPU variant in use: a library's name, or ``native`` for a build with one."""
    return _variant or "native"


def backend_names() -> list[str]:
    """The llama.cpp backends in use: the CPU's with the variant chosen at run time where
    there is one (``CPU (libggml-cpu-haswell.so)``), a GPU backend's with its devices
    (``Vulkan (Intel(R) Arc(tm) Graphics)``, or ``Vulkan (no device)``: the model runs on
    the CPU)."""
    ggml = _libggml()
    for fn, res, args in (
            ("ggml_backend_reg_count", ctypes.c_size_t, []),
            ("ggml_backend_reg_get", ctypes.c_void_p, [ctypes.c_size_t]),
            ("ggml_backend_reg_name", ctypes.c_char_p, [ctypes.c_void_p]),
            ("ggml_backend_reg_dev_count", ctypes.c_size_t, [ctypes.c_void_p]),
            ("ggml_backend_reg_dev_get", ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_size_t]),
            ("ggml_backend_dev_description", ctypes.c_char_p, [ctypes.c_void_p])):
        getattr(ggml, fn).restype = res
        getattr(ggml, fn).argtypes = args
    names = []
    for i in range(ggml.ggml_backend_reg_count()):
        reg = ggml.ggml_backend_reg_get(i)
        name = ggml.ggml_backend_reg_name(reg).decode()
        if name == "CPU":
            names.append(f"CPU (libggml-cpu-{_variant}.so)" if _variant else "CPU")
            continue
        devices = [ggml.ggml_backend_dev_description(ggml.ggml_backend_reg_dev_get(reg, d))
                   .decode(errors="replace") for d in range(ggml.ggml_backend_reg_dev_count(reg))]
        names.append(f"{name} ({', '.join(devices) or 'no device'})")
    return names
