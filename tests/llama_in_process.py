"""llama.cpp in the test process, on a CPU rung that survives: every test (and bench) that runs
llama.cpp in its own process opens its models here.

The first use walks down the CPU ladder the way the server does, in worker processes (the
supervisor's own walk: a rung whose canary crashes is skipped), so on a CPU whose best rung
dies (llama.cpp's AMX kernel on some CPUs that report AMX) only a worker dies, never the test
process. Then this process loads through the worker's own bootstrap (hearth.runner.boot) on the
rung found, canary included, without the worker's signal set-up (a test runner's signals are
its own).
"""

from __future__ import annotations

import functools
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

from hearth.fleet.models import packaged_model
from hearth.runner import boot
from hearth.shared.protocol import ContextParams


def worker_cfg(model: Path | str | None = None, **kw: Any) -> dict[str, Any]:
    """A worker's start message for ``model`` (the packaged SmolLM2): a small context."""
    return {"model": str(model or packaged_model()), "embedding_model": "", "n_gpu_layers": 0,
            "use_mmap": True, "verbose": False,
            "context": asdict(ContextParams(n_ctx=1024, n_seq_max=2, n_threads=2)),
            "embed_batch": 2048, "skip": [], **kw}


@functools.cache
def surviving_rung(model: Path | str | None = None) -> tuple[str, list[str]]:
    """The rung a worker process serves on after the supervisor's walk, and the rungs it
    skipped (a fresh state folder: nothing remembered from earlier runs). Tests that start
    workers of their own give them this skip list, as the server would."""
    from hearth.fleet.supervisor import Supervisor

    with tempfile.TemporaryDirectory(prefix="hearth-rung-") as state:
        sup = Supervisor(worker_cfg(model), Path(state), watchdog_s=60.0, start_timeout_s=120.0)
        worker = sup.start()
        worker.stop()
        return worker.info["rung"], list(sup.skip)


def skipped_rungs() -> list[str]:
    """The rungs the server's walk skips on this CPU (a worker's ``skip``)."""
    return list(surviving_rung()[1])


@functools.cache
def rung() -> str:
    """This process's rung: found once (see the module), then the in-process bootstrap's
    canary on it."""
    found, skipped = surviving_rung()
    loaded = boot.load(worker_cfg(skip=skipped))
    assert loaded.rung == found, (loaded.rung, found)
    loaded.close()
    return found


def open_model(path: Path | str | None = None, **kw: Any):
    """A model (the packaged SmolLM2 by default) loaded in this process on :func:`rung`."""
    rung()
    return boot.open_model(path or packaged_model(), **kw)
