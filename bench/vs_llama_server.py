"""Hearth against llama.cpp's own llama-server, over HTTP, in one run on this machine.

Both servers load the same GGUF with the same pool (16,384 cells shared by 8 sequences), batch
(512) and micro-batch (128); llama-server is built from the llama.cpp that the installed
llama-cpp-python vendors (scripts/build_llama_server), so the kernels are the same. Both stay
up for the whole run; each scenario runs on one while the other idles, in interleaved rounds:

  1. voice TTFT while three ~1,500-token summaries stream, against voice TTFT idle;
  2. the longest gap running chat streams see while a ~1,500-token chat prompt arrives;
  3. aggregate generated tokens/s of 8 concurrent streaming chats (median of the rounds).

Usage: python bench/vs_llama_server.py [--quick] [--rounds N] [--model PATH]
       [--gpu-layers N] [--out bench/results]   (make bench-vs MODEL=qwen1.5b: a household model)

--gpu-layers offloads that many layers on both servers (-1: all), for a CUDA or Vulkan build of
llama-cpp-python and a llama-server built the same way (HEARTH_LLAMA_SERVER names its binary).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import statistics
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from hearth_server import HearthServer  # noqa: E402
from llama_server import LlamaServer  # noqa: E402

from hearth.fleet.models import packaged_model  # noqa: E402
from hearth.fleet.sse import data_json  # noqa: E402

POOL = {"n_ctx": 16384, "n_parallel": 8, "n_batch": 512, "n_ubatch": 128}
VOICE_SYSTEM = "You are a voice assistant. Be brief."
COMMANDS = ["Turn on the kitchen light.", "Turn off the hall light.", "Is the door locked?",
            "Set the heating to twenty degrees.", "Dim the bedroom lamp.", "Open the garage."]


def document(d: int, approx_tokens: int = 1500) -> str:
    """Distinct for every ``d`` from its first word: no prompt cache serves one from another."""
    words: list[str] = []
    i = 0
    while len(words) < approx_tokens * 0.75:
        words += (f"Note {d}.{i}: the family discussed the garden, the heating bill, the school "
                  f"run and the weekend plans in detail.").split()
        i += 1
    return f"Document {d}. Summarise it:\n" + " ".join(words)


class Client:
    def __init__(self, name: str, url: str, hearth: bool):
        self.name, self.url, self.hearth = name, url, hearth
        self.flowing: asyncio.Semaphore | None = None  # released once a stream has 10 tokens

    async def stream(self, http: aiohttp.ClientSession, messages: list[dict], cls: str,
                     max_tokens: int, times: list[float] | None = None) -> dict:
        """One streamed chat completion; returns its TTFT, token times and usage."""
        body = {"messages": messages, "stream": True, "max_tokens": max_tokens,
                "temperature": 0, "ignore_eos": True, "stream_options": {"include_usage": True}}
        if self.hearth:
            body["priority"] = cls
        t0 = time.monotonic()
        got: list[float] = [] if times is None else times
        flowing = self.flowing
        usage = {}
        async with http.post(self.url + "/v1/chat/completions", json=body) as r:
            if r.status != 200:
                raise RuntimeError(f"{self.name}: HTTP {r.status}: {(await r.text())[:200]}")
            async for chunk in data_json(r.content):
                for ch in chunk.get("choices") or []:
                    if (ch.get("delta") or {}).get("content"):
                        got.append(time.monotonic())
                        if flowing is not None and len(got) == 10:
                            flowing.release()
                usage = chunk.get("usage") or usage
        return {"ttft": got[0] - t0 if got else float("nan"), "t0": t0, "times": got,
                "completion_tokens": usage.get("completion_tokens", len(got))}


def session() -> aiohttp.ClientSession:
    # A fresh connection per request: llama-server closes a connection after a stream, and a
    # pooled one would then fail the next request.
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True),
                                 timeout=aiohttp.ClientTimeout(total=900))


def voice_msgs(i: int) -> list[dict]:
    return [{"role": "system", "content": VOICE_SYSTEM},
            {"role": "user", "content": f"{COMMANDS[i % len(COMMANDS)]} (request {i})"}]


async def voice_under_load(c: Client, n: int, rnd: int) -> dict:
    async with session() as http:
        idle = [(await c.stream(http, voice_msgs(1000 * rnd + i), "voice", 8))["ttft"]
                for i in range(n)]
        docs = [asyncio.create_task(c.stream(
            http, [{"role": "user", "content": document(10 * rnd + d)}], "background", 150))
            for d in range(3)]
        loaded = []
        for i in range(n):
            await asyncio.sleep(0.35)
            if all(t.done() for t in docs):
                break
            loaded.append((await c.stream(http, voice_msgs(1000 * rnd + 100 + i), "voice",
                                          8))["ttft"])
        await asyncio.gather(*docs)
    return {"idle_p50_ms": 1000 * statistics.median(idle),
            "loaded_p50_ms": 1000 * statistics.median(loaded) if loaded else None,
            "loaded_max_ms": 1000 * max(loaded) if loaded else None, "n_loaded": len(loaded)}


async def stall_on_long_prompt(c: Client, rnd: int) -> dict:
    """Four chats stream; a long chat prompt arrives: the longest gap between two tokens of the
    running chats while its prefill runs, against their gaps before it."""
    c.flowing = asyncio.Semaphore(0)
    async with session() as http:
        streams: list[list[float]] = [[] for _ in range(4)]
        tasks = [asyncio.create_task(c.stream(
            http, [{"role": "user", "content": f"Tell me a long story about room {i} "
                                                f"(round {rnd})."}],
            "chat", 160, times=streams[i])) for i in range(4)]
        for _ in streams:
            await c.flowing.acquire()
        c.flowing = None
        arrive = time.monotonic()
        long = await c.stream(http, [{"role": "user", "content": document(10 * rnd + 9)}],
                              "chat", 4)
        first = long["t0"] + long["ttft"]
        await asyncio.gather(*tasks)

    def gaps(lo: float, hi: float) -> list[float]:
        return [b - a for s in streams for a, b in itertools.pairwise(s) if lo <= b <= hi]
    before = gaps(0.0, arrive)
    during = gaps(arrive, first)
    return {"long_prompt_ttft_ms": 1000 * long["ttft"],
            "gap_before_p50_ms": 1000 * statistics.median(before),
            "gap_during_max_ms": 1000 * max(during, default=0.0)}


async def chat_throughput(c: Client, max_tokens: int, rnd: int = 0) -> float:
    async with session() as http:
        t0 = time.monotonic()
        outs = await asyncio.gather(*(c.stream(
            http, [{"role": "user", "content": f"Tell me about topic number {i} (round {rnd})."}],
            "chat", max_tokens) for i in range(8)))
        return sum(o["completion_tokens"] for o in outs) / (time.monotonic() - t0)


def write_run(folder: Path, data: object, lines: list[str], data_name: str = "results.json"
              ) -> None:
    """A run's folder: its data as JSON and its table (``lines``), which is also printed."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / data_name).write_text(json.dumps(data, indent=1))
    (folder / "table.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def throughput_table(results: dict[str, dict], model: Path, rounds: int, out: Path) -> int:
    """The 8-chat throughput of each round and their medians (``--throughput-only``)."""
    rates = {name: [x["chat_tokens_per_s"] for x in r["rounds"]] for name, r in results.items()}
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    h, ls = (statistics.median(rates[n]) for n in ("hearth", "llama-server"))
    lines = [f"# 8-chat throughput, Hearth against llama-server — {stamp}", "",
             f"Command: `python bench/vs_llama_server.py --throughput-only --model {model.name}"
             f" --rounds {rounds}`; interleaved rounds.", "",
             "| server | tok/s per round | median |", "|---|---|---:|"]
    lines += [f"| {n} | {', '.join(f'{v:.1f}' for v in rates[n])} | "
              f"{statistics.median(rates[n]):.1f} |" for n in rates]
    lines += ["", f"Hearth/llama-server: {h / ls:.2f}×."]
    write_run(out / f"throughput-vs-llama-server-{stamp}", results, lines)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 4)")
    ap.add_argument("--model", default="", help="GGUF both servers load (default embedded)")
    ap.add_argument("--gpu-layers", type=int, default=0, help="layers offloaded (-1: all)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    ap.add_argument("--throughput-only", action="store_true",
                    help="only the 8-chat throughput, more rounds of it (its spread is wide)")
    args = ap.parse_args(argv)
    rounds = args.rounds or (2 if args.quick else 4)
    n_voice, max_tokens = (4, 64) if args.quick else (8, 128)
    model = Path(args.model) if args.model else packaged_model()
    results: dict[str, dict] = {"hearth": {"rounds": []}, "llama-server": {"rounds": []}}
    with tempfile.TemporaryDirectory(prefix="hearth-vs-") as tmp, \
            HearthServer("--n-ctx", str(POOL["n_ctx"]), "--n-parallel", str(POOL["n_parallel"]),
                         "--n-batch", str(POOL["n_batch"]), "--n-ubatch", str(POOL["n_ubatch"]),
                         "--model", str(model), "--n-gpu-layers", str(args.gpu_layers),
                         data_dir=Path(tmp)) as hearth, \
            LlamaServer(model, "-c", str(POOL["n_ctx"]), "-np", str(POOL["n_parallel"]),
                        "-b", str(POOL["n_batch"]), "-ub", str(POOL["n_ubatch"]),
                        "-ngl", str(args.gpu_layers if args.gpu_layers >= 0 else 999),
                        "--kv-unified") as llama:
        clients = [Client("hearth", hearth.url, True), Client("llama-server", llama.url, False)]
        for k in range(rounds):
            for c in clients if k % 2 == 0 else clients[::-1]:
                print(f"round {k + 1}/{rounds}: {c.name}", file=sys.stderr)
                if args.throughput_only:
                    results[c.name]["rounds"].append(
                        {"chat_tokens_per_s": asyncio.run(chat_throughput(c, max_tokens, k))})
                    continue
                results[c.name]["rounds"].append({
                    "voice": asyncio.run(voice_under_load(c, n_voice, k)),
                    "stall": asyncio.run(stall_on_long_prompt(c, k)),
                    "chat_tokens_per_s": asyncio.run(chat_throughput(c, max_tokens, k))})
    if args.throughput_only:
        return throughput_table(results, model, rounds, Path(args.out))
    for r in results.values():
        rs = r["rounds"]
        r["voice_idle_p50_ms"] = statistics.median(x["voice"]["idle_p50_ms"] for x in rs)
        r["voice_loaded_p50_ms"] = statistics.median(
            x["voice"]["loaded_p50_ms"] for x in rs if x["voice"]["loaded_p50_ms"] is not None)
        r["voice_ratio"] = r["voice_loaded_p50_ms"] / r["voice_idle_p50_ms"]
        r["voice_loaded_max_ms"] = max(x["voice"]["loaded_max_ms"] or 0.0 for x in rs)
        r["stall_max_ms"] = statistics.median(x["stall"]["gap_during_max_ms"] for x in rs)
        r["long_ttft_s"] = statistics.median(x["stall"]["long_prompt_ttft_ms"] for x in rs) / 1000
        r["gap_before_ms"] = statistics.median(x["stall"]["gap_before_p50_ms"] for x in rs)
        r["chat_tokens_per_s"] = statistics.median(x["chat_tokens_per_s"] for x in rs)
    h, ls = results["hearth"], results["llama-server"]
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    lines = [f"# Hearth against llama-server — {stamp}", "",
             f"Command: `python bench/vs_llama_server.py{' --quick' if args.quick else ''}"
             f"{f' --model {model.name}' if args.model else ''}"
             f"{f' --gpu-layers {args.gpu_layers}' if args.gpu_layers else ''}`; "
             f"{rounds} interleaved rounds, medians shown; model {model.name}; pool "
             f"{POOL['n_ctx']} cells, {POOL['n_parallel']} sequences.", "",
             "| server | voice TTFT idle (ms) | under 3 summaries (ms) | ratio | worst (ms) | "
             "chat gap before "
             "(ms) | longest gap as a long prompt arrives (ms) | its TTFT (s) | 8 chats tok/s |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, r in results.items():
        lines.append(f"| {name} | {r['voice_idle_p50_ms']:.0f} | {r['voice_loaded_p50_ms']:.0f} "
                     f"| {r['voice_ratio']:.1f}× | {r['voice_loaded_max_ms']:.0f} | "
                     f"{r['gap_before_ms']:.0f} | "
                     f"{r['stall_max_ms']:.0f} | {r['long_ttft_s']:.1f} | "
                     f"{r['chat_tokens_per_s']:.1f} |")
    voice = h["voice_loaded_p50_ms"] / ls["voice_loaded_p50_ms"]
    stall = h["stall_max_ms"] / ls["stall_max_ms"]
    lines += ["", f"Hearth/llama-server: voice under load {voice:.2f}× the time, longest "
              f"stall {stall:.2f}×, "
              f"8-chat throughput {h['chat_tokens_per_s'] / ls['chat_tokens_per_s']:.2f}×."]
    write_run(Path(args.out) / f"vs-llama-server-{stamp}", results, lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
