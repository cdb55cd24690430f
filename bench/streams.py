"""Hearth against llama-server at several numbers of concurrent streams, over HTTP, on one model
(the first GPU run's benchmark: scripts/device/first_gpu_run.py).

For each number N of streams, on each server in turn (both stay up, interleaved): one voice
request idle, then N chats stream ``--tokens`` tokens each with ``ignore_eos`` (so every stream
runs its full length whatever the weights say) and, once they all flow, voice requests one after
another while they run. Reported per (server, N): generated tokens/s of the N chats together,
their TTFT (median and worst), voice TTFT idle and under the load (median).

    python bench/streams.py --model GGUF [--gpu-layers -1] [--streams 1,8,32] [--tokens 128]
        [--out DIR]      (HEARTH_LLAMA_SERVER names llama-server's binary; --no-llama-server:
                          Hearth alone)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))

from hearth_server import HearthServer  # noqa: E402
from llama_server import LlamaServer  # noqa: E402
from vs_llama_server import Client, session, voice_msgs  # noqa: E402

N_CTX_PER_STREAM = 512  # a chat prompt (~30 tokens) and its tokens, with room


async def one_level(c: Client, n: int, tokens: int, n_voice: int, rnd: int) -> dict:
    c.flowing = asyncio.Semaphore(0)
    async with session() as http:
        idle = (await c.stream(http, voice_msgs(10_000 * rnd + 1), "voice", 8))["ttft"]
        t0 = time.monotonic()
        tasks = [asyncio.create_task(c.stream(
            http, [{"role": "user", "content": f"Tell me about topic {i} (level {n}, "
                                                f"round {rnd})."}], "chat", tokens))
            for i in range(n)]
        # Voice under load once every chat streams (its 10th token), while they still do.
        flowing = asyncio.gather(*(c.flowing.acquire() for _ in range(n)))
        await asyncio.wait([flowing, asyncio.gather(*tasks)],
                           return_when=asyncio.FIRST_COMPLETED)
        c.flowing = None
        loaded = []
        for v in range(n_voice):
            if all(t.done() for t in tasks):
                break
            loaded.append((await c.stream(http, voice_msgs(10_000 * rnd + 100 + v), "voice",
                                          8))["ttft"])
        outs = await asyncio.gather(*tasks)
        wall = time.monotonic() - t0
        flowing.cancel()
    ttfts = [o["ttft"] for o in outs]
    return {"streams": n, "tokens_per_s": sum(o["completion_tokens"] for o in outs) / wall,
            "ttft_p50_ms": 1000 * statistics.median(ttfts), "ttft_max_ms": 1000 * max(ttfts),
            "voice_idle_ms": 1000 * idle,
            "voice_loaded_p50_ms": 1000 * statistics.median(loaded) if loaded else None,
            "n_voice_loaded": len(loaded)}


def table(results: dict[str, list[dict]], title: str) -> list[str]:
    lines = [f"# {title}", "", "| server | streams | tok/s | TTFT p50 (ms) | TTFT max (ms) | "
             "voice TTFT idle (ms) | voice TTFT under load (ms) |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for name, rows in results.items():
        for r in rows:
            loaded = r["voice_loaded_p50_ms"]
            lines.append(f"| {name} | {r['streams']} | {r['tokens_per_s']:.1f} | "
                         f"{r['ttft_p50_ms']:.0f} | {r['ttft_max_ms']:.0f} | "
                         f"{r['voice_idle_ms']:.0f} | "
                         f"{'-' if loaded is None else f'{loaded:.0f}'} |")
    if len(results) == 2:
        h, ls = results["hearth"], results["llama-server"]
        ratios = [f"{a['streams']}: {a['tokens_per_s'] / b['tokens_per_s']:.2f}x"
                  for a, b in zip(h, ls, strict=True)]
        lines += ["", "Hearth/llama-server tok/s by streams: " + ", ".join(ratios)]
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--gpu-layers", type=int, default=-1, help="layers offloaded (-1: all)")
    ap.add_argument("--streams", default="1,8,32")
    ap.add_argument("--tokens", type=int, default=128, help="tokens each chat generates")
    ap.add_argument("--voice", type=int, default=3, help="voice requests under each load")
    ap.add_argument("--no-llama-server", action="store_true")
    ap.add_argument("--title", default="Concurrent streams, Hearth against llama-server")
    ap.add_argument("--out", default="")
    a = ap.parse_args(argv)
    levels = [int(n) for n in a.streams.split(",")]
    top = max(levels)
    n_ctx, model = N_CTX_PER_STREAM * top, Path(a.model)
    results: dict[str, list[dict]] = {"hearth": []}
    with tempfile.TemporaryDirectory(prefix="hearth-streams-") as tmp, ExitStack() as stack:
        servers = [("hearth", stack.enter_context(HearthServer(
            "--n-ctx", str(n_ctx), "--n-parallel", str(top), "--model", str(model),
            "--n-gpu-layers", str(a.gpu_layers), data_dir=Path(tmp))), True)]
        if not a.no_llama_server:
            results["llama-server"] = []
            servers.append(("llama-server", stack.enter_context(LlamaServer(
                model, "-c", str(n_ctx), "-np", str(top), "--kv-unified",
                "-ngl", str(a.gpu_layers if a.gpu_layers >= 0 else 999))), False))
        clients = [Client(name, srv.url, hearth) for name, srv, hearth in servers]
        for k, n in enumerate(levels):
            for c in clients if k % 2 == 0 else clients[::-1]:
                print(f"{c.name}: {n} streams", file=sys.stderr)
                results[c.name].append(asyncio.run(one_level(c, n, a.tokens, a.voice, k)))
    lines = table(results, a.title)
    lines += ["", f"Model {model.name}, {a.tokens} tokens a chat (ignore_eos), "
              f"{a.gpu_layers} GPU layers, {top} sequences of {N_CTX_PER_STREAM} cells."]
    print("\n".join(lines))
    if a.out:
        out = Path(a.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "results.json").write_text(json.dumps(results, indent=1))
        (out / "table.md").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
