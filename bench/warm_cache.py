"""Does the voice prompt stay warm? Hearth against llama.cpp's llama-server, in one run.

1. Restart: a satellite's ~1,050-token system prompt (instructions and 55 exposed entities).
   The first voice turn on a fresh server (cold), the next one (warm), and the first one after
   the server is stopped with SIGTERM and started again (Hearth: restored from data_dir;
   llama-server keeps nothing across a restart). Also Hearth's save and restore times and the
   store's size on disk.
2. Flood: the same satellite's turn after each burst of four one-off ~900-token background
   prompts through a 4,096-cell pool of 4 sequences (they and the voice prompt do not fit):
   voice TTFT p50/p95 for Hearth, Hearth in fifo mode with no kept share (recency and hits
   only) and llama-server.

Usage: python bench/warm_cache.py [--rounds N] [--bursts N] [--model PATH] [--entities N]
       [--out bench/results]   (--entities 150: a ~3,000-token prompt, a large household's)
"""

from __future__ import annotations

import argparse
import asyncio
import re
import signal
import statistics
import sys
import tempfile
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))

from hearth_server import HearthServer  # noqa: E402
from llama_server import LlamaServer  # noqa: E402
from vs_llama_server import COMMANDS, Client, session, write_run  # noqa: E402

from hearth.fleet.models import packaged_model  # noqa: E402

POOL = ("-c", "4096", "-np", "4", "-b", "512", "-ub", "128", "--kv-unified")
HEARTH_POOL = ("--n-ctx", "4096", "--n-parallel", "4", "--n-batch", "512", "--n-ubatch", "128",
               "--prefix-cache-entries", "4")
HEARTH_MODEL: tuple[str, ...] = ()  # --model for the Hearth servers; the embedded one when empty


def system_prompt(entities: int) -> str:
    return ("You are the voice assistant of a Home Assistant household. Answer in one short "
            "sentence. Exposed entities:\n"
            + "\n".join(f"- light.room_{i} ('Room {i} light', area {i % 9}): off"
                        for i in range(entities)))


SYSTEM = system_prompt(55)


def voice(i: int) -> list[dict]:
    return [{"role": "system", "content": SYSTEM},
            {"role": "user", "content": f"{COMMANDS[i % len(COMMANDS)]} (turn {i})"}]


def one_off(d: int) -> list[dict]:
    doc = " ".join(f"Reading {d}.{k}: the meter showed {d * 37 + k} units at noon." for k in
                   range(38))
    return [{"role": "user", "content": f"Log {d}. Summarise it: {doc}"}]


async def ttft(c: Client, i: int) -> float:
    async with session() as http:
        return 1000 * (await c.stream(http, voice(i), "voice", 4))["ttft"]


async def burst(c: Client, first: int, n: int) -> None:
    async with session() as http:
        await asyncio.gather(*(c.stream(http, one_off(first + d), "background", 8)
                               for d in range(n)))


def restart_round(model: Path, k: int) -> dict:
    out: dict = {}
    with tempfile.TemporaryDirectory(prefix="hearth-warm-") as tmp:
        data = Path(tmp)
        first = HearthServer(*HEARTH_POOL, *HEARTH_MODEL, data_dir=data).start()
        c = Client("hearth", first.url, True)
        out["hearth_cold"] = asyncio.run(ttft(c, 100 * k))
        out["hearth_warm"] = asyncio.run(ttft(c, 100 * k + 1))
        first.stop(signal.SIGTERM)
        saved = re.findall(r"saved (\d+) cached prefixes \(([\d.]+) MB\) .* in (\d+) ms",
                           first.log())
        out["saved"], out["saved_mb"], out["save_ms"] = (int(saved[-1][0]), float(saved[-1][1]),
                                                         int(saved[-1][2]))
        second = HearthServer(*HEARTH_POOL, *HEARTH_MODEL, data_dir=data).start()
        try:
            out["hearth_restored"] = asyncio.run(ttft(Client("hearth", second.url, True),
                                                      100 * k + 2))
            out["restore_ms"] = second.get("/v1/queue")[1]["prefix_cache"]["store"]["restore_ms"]
        finally:
            second.stop()
    llama = LlamaServer(model, *POOL).start()
    c = Client("llama-server", llama.url, False)
    out["llama_cold"] = asyncio.run(ttft(c, 100 * k))
    out["llama_warm"] = asyncio.run(ttft(c, 100 * k + 1))
    llama.stop()
    llama = LlamaServer(model, *POOL).start()
    out["llama_restarted"] = asyncio.run(ttft(Client("llama-server", llama.url, False),
                                              100 * k + 2))
    llama.stop()
    return out


def flood(c: Client, bursts: int, per_burst: int) -> list[float]:
    asyncio.run(ttft(c, 0))  # the satellite's first turn: its prompt is now cached
    times = []
    for b in range(bursts):
        asyncio.run(burst(c, 1000 + per_burst * b, per_burst))
        times.append(asyncio.run(ttft(c, b + 1)))
    return times


def restart_lines(restarts: list[dict], med: Callable[[str], float]) -> list[str]:
    """The restart rounds' table (none with ``--rounds 0``)."""
    if not restarts:
        return []
    return ["## First voice TTFT around a restart (ms)", "",
            "| server | cold | warm | after a restart |", "|---|---:|---:|---:|",
            f"| hearth | {med('hearth_cold'):.0f} | {med('hearth_warm'):.0f} | "
            f"{med('hearth_restored'):.0f} (restored) |",
            f"| llama-server | {med('llama_cold'):.0f} | {med('llama_warm'):.0f} | "
            f"{med('llama_restarted'):.0f} |", "",
            f"Hearth saved {restarts[0]['saved']} prefixes ({med('saved_mb'):.1f} MB on disk) "
            f"in {med('save_ms'):.0f} ms when stopped, and restored them in "
            f"{med('restore_ms'):.0f} ms before saying it was ready.", ""]


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3, help="restart rounds (0: the floods only)")
    ap.add_argument("--bursts", type=int, default=6, help="floods before a voice turn")
    ap.add_argument("--per-burst", type=int, default=4, help="one-off prompts per flood")
    ap.add_argument("--model", default="", help="GGUF both servers load (default embedded)")
    ap.add_argument("--entities", type=int, default=55,
                    help="exposed entities in the system prompt (55: ~1,050 tokens, 150: "
                    "~2,950)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    args = ap.parse_args(argv)
    global SYSTEM, HEARTH_MODEL
    SYSTEM = system_prompt(args.entities)
    model = Path(args.model) if args.model else packaged_model()
    HEARTH_MODEL = ("--model", str(model)) if args.model else ()
    restarts = []
    for k in range(args.rounds):
        print(f"restart round {k + 1}/{args.rounds}", file=sys.stderr)
        restarts.append(restart_round(model, k))
    floods: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="hearth-flood-") as tmp:
        for name, extra in (("hearth", ()), ("hearth fifo, no kept share",
                                             ("--policy", "fifo", "--prefix-cache-kept-share",
                                              "0"))):
            print(f"flood: {name}", file=sys.stderr)
            with HearthServer(*HEARTH_POOL, *HEARTH_MODEL, *extra, data_dir=Path(tmp) / name) as s:
                floods[name] = flood(Client("hearth", s.url, True), args.bursts, args.per_burst)
    print("flood: llama-server", file=sys.stderr)
    with LlamaServer(model, *POOL) as llama:
        floods["llama-server"] = flood(Client("llama-server", llama.url, False), args.bursts,
                                       args.per_burst)

    def med(key: str) -> float:
        return statistics.median(r[key] for r in restarts)

    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    cmd = "python bench/warm_cache.py" + "".join(
        f" --{k.replace('_', '-')} {v}" for k, v in vars(args).items()
        if k != "out" and v != ap.get_default(k))
    lines = [f"# Warm voice prompts — {stamp}", "",
             f"Command: `{cmd}`; model {model.name}; a {len(SYSTEM)}-character system prompt "
             f"({args.entities} exposed entities; 55 are about 1,050 tokens, 150 about 2,950 "
             "with Qwen2.5's tokenizer); medians of the rounds.", "",
             *restart_lines(restarts, med)]
    lines += [f"## Voice TTFT after each flood of {args.per_burst} one-off background prompts "
              f"({args.bursts} floods, ms)", "",
              "| server | p50 | p95 | worst |", "|---|---:|---:|---:|"]
    for name, times in floods.items():
        lines.append(f"| {name} | {pct(times, 0.5):.0f} | {pct(times, 0.95):.0f} | "
                     f"{max(times):.0f} |")
    write_run(Path(args.out) / f"warm-cache-{stamp}", {"restarts": restarts, "floods": floods},
              lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
