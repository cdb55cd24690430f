"""A model's worker process (``python -m hearth.runner FD FD``): it alone loads llama.cpp,
holds the model and its context, and answers the server's channels. When it dies, whatever
killed it (a segfault, an illegal instruction, an abort, the OOM killer) kills only it.

Before its model is loaded it holds only what :mod:`.boot` (llama.cpp's adapter, first) and its
channels need: what it serves with (:mod:`.serve`) is imported after the load, so the load sees
the process a plain one would (``scripts/device/load_probe.py`` compares the two).
"""

from __future__ import annotations

from . import boot  # isort: skip (first: llama.cpp before anything else)

import logging
import os
import sys
import time
from multiprocessing.connection import Connection

from .low_priority import LowPriorityThread

log = logging.getLogger("hearth.worker")


def main(argv: list[str]) -> int:
    boot.set_up_process()
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(levelname)s %(name)s: %(message)s")
    engine, service = Connection(int(argv[0])), Connection(int(argv[1]))
    cfg = engine.recv()
    t0 = time.monotonic()
    # The server's "low": the load phase yields to the other models' work, in a thread of
    # its own at the lowest priority (see the module), until the server says it is over.
    low = LowPriorityThread() if cfg.get("load_priority") == "low" else None
    call = low.call if low is not None else (lambda fn, *args: fn(*args))
    try:
        loaded = call(boot.load, cfg, engine.send)
        from .serve import Runner  # after the load (see the module)

        runner = Runner(engine, service, cfg, loaded, low=low)
        call(runner.ready)
    except Exception as e:  # not a crash: the server reports it and does not restart
        engine.send(("failed", str(e)))
        return 0
    log.info("worker %d ready in %.1f s", os.getpid(), time.monotonic() - t0)
    runner.serve()
    return 0
