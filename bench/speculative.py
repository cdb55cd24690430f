"""Does a draft model speed up voice answers on this machine? (issue 30)

Speculative decoding drafts a few tokens with a small model (Qwen2.5-Coder-0.5B, the same
tokenizer) and checks them with the large one (1.5B) in one batch; it pays when checking k
tokens costs little more than decoding one, which holds where decoding is memory-bound (GPUs)
and is what this measures on a CPU. It runs llama.cpp's own implementation (llama-server, built
from the vendored llama.cpp: ``--spec-type draft-simple``) with and without the draft on the
same voice-sized questions, greedy, one at a time, in interleaved rounds, and records the
decode rate, end-to-end time and the draft's acceptance. Hearth itself drafts nothing yet:
this decides whether it should.

Usage: python bench/speculative.py [--rounds N] [--drafts 3,5] [--out bench/results]
       (the models: make models)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import urllib.request
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

sys.path.insert(0, str(ROOT / "bench"))

from llama_server import LlamaServer  # noqa: E402
from vs_llama_server import write_run  # noqa: E402

MODELS = Path.home() / ".cache" / "hearth" / "models"
TARGET = MODELS / "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
DRAFT = MODELS / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
SYSTEM = "You are the voice assistant of a smart home. Answer in one or two short sentences."
QUESTIONS = ["What is the capital of France?", "Tell me a short fact about the moon.",
             "How many minutes are in three hours?", "Describe a sunny day at 22 degrees.",
             "What should I wear when it is raining?", "Why is the sky blue?"]


def ask(url: str, question: str) -> dict:
    body = {"messages": [{"role": "system", "content": SYSTEM},
                         {"role": "user", "content": question}],
            "max_tokens": 80, "temperature": 0}
    req = urllib.request.Request(url + "/v1/chat/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    t0 = time.monotonic()
    with urllib.request.urlopen(req, timeout=600) as r:
        out = json.load(r)
    timings = out.get("timings", {})
    return {"e2e_s": time.monotonic() - t0, "tokens": out["usage"]["completion_tokens"],
            "decode_tok_s": timings.get("predicted_per_second"),
            "drafted": timings.get("draft_n", 0), "accepted": timings.get("draft_n_accepted", 0),
            "text": out["choices"][0]["message"]["content"]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--drafts", default="3,5", help="draft lengths to try (--spec-draft-n-max)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    args = ap.parse_args(argv)
    for m in (TARGET, DRAFT):
        if not m.exists():
            sys.exit(f"{m} is missing: make models")
    common = ("-c", "4096", "-np", "1", "-t", "2")
    setups = {"no draft": ()} | {
        f"0.5B draft, up to {n}": ("-md", str(DRAFT), "--spec-type", "draft-simple",
                                   "--spec-draft-n-max", n) for n in args.drafts.split(",")}
    runs: dict[str, list[dict]] = {name: [] for name in setups}
    for k in range(args.rounds):
        for name, extra in (list(setups.items()) if k % 2 == 0 else list(setups.items())[::-1]):
            print(f"round {k + 1}/{args.rounds}: {name}", file=sys.stderr)
            with LlamaServer(TARGET, *common, *extra) as srv:
                ask(srv.url, "Hello.")  # the first decode's warm-up
                runs[name] += [ask(srv.url, q) for q in QUESTIONS]
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    lines = [f"# Speculative decoding on this machine — {stamp}", "",
             f"Command: `python bench/speculative.py --rounds {args.rounds} --drafts "
             f"{args.drafts}`; llama-server, {TARGET.name}, {len(QUESTIONS)} voice questions "
             "a round, greedy, 80 tokens at most.", "",
             "| setup | decode tok/s (median) | answer e2e p50 | draft accepted | vs no draft |",
             "|---|---:|---:|---:|---:|"]
    base = statistics.median(r["e2e_s"] for r in runs["no draft"])
    for name, rs in runs.items():
        drafted = sum(r["drafted"] or 0 for r in rs)
        accepted = sum(r["accepted"] or 0 for r in rs)
        e2e = statistics.median(r["e2e_s"] for r in rs)
        rate = statistics.median(r["decode_tok_s"] or 0 for r in rs)
        share = f"{accepted}/{drafted} ({accepted / drafted:.0%})" if drafted else "–"
        lines.append(f"| {name} | {rate:.1f} | {e2e:.2f} s | {share} | {base / e2e:.2f}× |")
    write_run(Path(args.out) / f"speculative-{stamp}", runs, lines, "runs.json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
