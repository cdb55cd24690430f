"""How fast this build of llama.cpp runs a model on this CPU, through the worker's own load
path (hearth.runner.boot): one prompt batch and single-token decodes, on each CPU rung the
build offers (or the one named), with the thread count given. Meant to compare builds (the dev
venv's native build against the image's CPU variants, issue 47) on one machine, in one run.

Usage: python bench/cpu_speed.py [--model GGUF] [--rung RUNG] [--threads N] [--prompt 512]
       [--decodes 64] [--repeat 3]
Prints one JSON line per rung: the rung, the variant library, the backends, and the median
seconds of the prompt batch and milliseconds per decoded token.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "addon"))

from hearth.runner import boot  # noqa: E402  (first: llama.cpp before the rest)
from hearth.shared.protocol import ContextParams  # noqa: E402


def measure(model: str, rung: str | None, threads: int, prompt: int, decodes: int,
            repeat: int) -> dict:
    from hearth.llama.llama_backends import backend_names, cpu_rungs, cpu_variant

    skip = [r for r in cpu_rungs() if rung is not None and r != rung]
    ctx = ContextParams(n_ctx=prompt + decodes + 16, n_seq_max=1, n_batch=prompt,
                        n_ubatch=min(prompt, 512), n_threads=threads)
    t0 = time.monotonic()
    loaded = boot.load({"model": model, "context": asdict(ctx), "skip": skip})
    load_s = time.monotonic() - t0
    b, tok = loaded.backend, loaded.canary_token
    batch_s, decode_ms = [], []
    for _ in range(repeat):
        b.seq_rm(0)
        t = time.monotonic()
        assert b.decode([tok] * prompt, list(range(prompt)), [0] * prompt,
                        [False] * (prompt - 1) + [True]) == 0
        batch_s.append(time.monotonic() - t)
        t = time.monotonic()
        for i in range(decodes):
            assert b.decode([tok], [prompt + i], [0], [True]) == 0
        decode_ms.append(1000 * (time.monotonic() - t) / decodes)
    out = {"rung": loaded.rung, "variant": cpu_variant(), "backends": backend_names(),
           "threads": threads, "load_s": round(load_s, 2), "prompt_tokens": prompt,
           "batch_s": round(statistics.median(batch_s), 3),
           "prompt_tok_s": round(prompt / statistics.median(batch_s), 1),
           "decode_ms": round(statistics.median(decode_ms), 2)}
    loaded.close()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", help="a GGUF (default: the packaged SmolLM2)")
    ap.add_argument("--rung", help="only this rung (default: the first one the CPU runs)")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--decodes", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    if a.model is None:
        from hearth.fleet.models import packaged_model

        a.model = str(packaged_model())
    print(json.dumps({"model": Path(a.model).name, **measure(
        a.model, a.rung, a.threads, a.prompt, a.decodes, a.repeat)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
