"""What a process that loads llama.cpp looks like from inside, for comparing the worker with a
plain process: its native libraries in the order the dynamic loader loaded them, its signal
dispositions (the kernel's and Python's), the Python modules it holds, and its memory map.

:mod:`.boot` writes one snapshot before the model load and one after the canary decode when
``HEARTH_BOOT_DUMP`` names a folder (tests and ``scripts/device/load_probe.py``); nothing here
runs otherwise.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

DUMP_ENV = "HEARTH_BOOT_DUMP"
# The dispositions compared: what the worker's set-up changes and what llama.cpp or a GPU
# driver might install a handler for.
SIGNALS = ("SIGINT", "SIGTERM", "SIGUSR1", "SIGUSR2", "SIGSEGV", "SIGILL", "SIGABRT", "SIGBUS",
           "SIGFPE", "SIGPIPE", "SIGCHLD")


class _PhdrInfo(ctypes.Structure):
    _fields_ = (("addr", ctypes.c_void_p), ("name", ctypes.c_char_p))  # the rest unread


_CALLBACK = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(_PhdrInfo), ctypes.c_size_t,
                             ctypes.c_void_p)


def loaded_libraries() -> list[str]:
    """Every shared object in this process, in the loader's order (the order they were
    loaded), each as its real path; the main program (an empty name) left out."""
    names: list[str] = []

    def visit(info: Any, _size: int, _data: Any) -> int:
        raw = info.contents.name
        if raw:
            names.append(os.path.realpath(raw.decode(errors="replace")))
        return 0

    ctypes.CDLL(None).dl_iterate_phdr(_CALLBACK(visit), None)
    return names


def _mask(status: str, key: str) -> set[str]:
    line = next((ln for ln in status.splitlines() if ln.startswith(key + ":")), f"{key}:\t0")
    bits = int(line.split(":", 1)[1].strip(), 16)
    return {signal.Signals(n).name for n in range(1, 65)
            if bits >> (n - 1) & 1 and n in signal.Signals._value2member_map_}


def signal_dispositions() -> dict[str, str]:
    """Each of :data:`SIGNALS` as the kernel sees it (``ignored``, ``caught`` or ``default``,
    from /proc/self/status: faulthandler's handlers are caught there though Python does not
    know them) and, after a slash, as Python's ``signal.getsignal`` does."""
    status = Path("/proc/self/status").read_text()
    ignored, caught = _mask(status, "SigIgn"), _mask(status, "SigCgt")
    out = {}
    for name in SIGNALS:
        kernel = "ignored" if name in ignored else "caught" if name in caught else "default"
        handler = signal.getsignal(getattr(signal, name))
        py = {signal.SIG_IGN: "SIG_IGN", signal.SIG_DFL: "SIG_DFL", None: "native"}.get(
            handler, getattr(handler, "__qualname__", "handler"))  # type: ignore[arg-type]
        out[name] = f"{kernel}/{py}"
    return out


def take(point: str) -> dict[str, Any]:
    return {"point": point, "pid": os.getpid(), "argv": sys.argv,
            "executable": sys.executable, "libraries": loaded_libraries(),
            "signals": signal_dispositions(), "modules": sorted(sys.modules)}


def dump(point: str) -> None:
    """Write this process's snapshot at ``point`` (``loading``: just before the model load;
    ``loaded``: after the canary) into the folder ``HEARTH_BOOT_DUMP`` names, as
    ``PID-POINT.json`` and ``PID-POINT.maps``; nothing when it names none."""
    folder = os.environ.get(DUMP_ENV)
    if not folder:
        return
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"{os.getpid()}-{point}"
    stem.with_suffix(".json").write_text(json.dumps(take(point), indent=1))
    stem.with_suffix(".maps").write_text(Path("/proc/self/maps").read_text())
