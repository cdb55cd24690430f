"""Does a draft model speed up voice answers on this machine? (issue 30)

Speculative decoding drafts a few tokens with a small model (Qwen2.5-Coder-0.5B, the same
tokenizer) and checks them with the large one (1.5B) in one batch; it pays when checking k
tokens costs little more than decoding one, which holds where decoding is memory-bound (GPUs)
and is what this measures on a CPU. It runs llama.cpp's own implementation (llama-server, built
from the vendored llama.cpp: ``--spec-type draft-simple``) with and without the draft on the
same voice-sized questions, greedy, one at a time, in interleaved rounds, and records the
decode rate, end-to-end time and the draft's acceptance; then Hearth the same way, its voice
class with and without its own draft (``--draft-model``, :mod:`hearth.engine.drafts`): as
many guesses as its measurements say pay, and (``--draft-policy always``) every voice decode.

Usage: python bench/speculative.py [--rounds N] [--drafts 3,5] [--out bench/results]
       (the models: make models)
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time
import urllib.request
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

sys.path.insert(0, str(ROOT / "bench"))

from hearth_server import HearthServer  # noqa: E402
from llama_server import LlamaServer  # noqa: E402
from vs_llama_server import write_run  # noqa: E402

MODELS = Path.home() / ".cache" / "hearth" / "models"
TARGET = MODELS / "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
DRAFT = MODELS / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
SYSTEM = "You are the voice assistant of a smart home. Answer in one or two short sentences."
QUESTIONS = ["What is the capital of France?", "Tell me a short fact about the moon.",
             "How many minutes are in three hours?", "Describe a sunny day at 22 degrees.",
             "What should I wear when it is raining?", "Why is the sky blue?"]


def _chat(url: str, question: str, **extra) -> tuple[dict, float]:
    """One voice-sized question, greedy: the answer and its end-to-end seconds."""
    body = {"messages": [{"role": "system", "content": SYSTEM},
                         {"role": "user", "content": question}],
            "max_tokens": 80, "temperature": 0, **extra}
    req = urllib.request.Request(url + "/v1/chat/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    t0 = time.monotonic()
    with urllib.request.urlopen(req, timeout=600) as r:
        out = json.load(r)
    return out, time.monotonic() - t0


def ask(url: str, question: str) -> dict:
    out, e2e = _chat(url, question)
    timings = out.get("timings", {})
    return {"e2e_s": e2e, "tokens": out["usage"]["completion_tokens"],
            "decode_tok_s": timings.get("predicted_per_second"),
            "drafted": timings.get("draft_n", 0), "accepted": timings.get("draft_n_accepted", 0),
            "text": out["choices"][0]["message"]["content"]}


def drafts(url: str) -> tuple[float, float]:
    """Hearth's (drafted, accepted) tokens so far, from /metrics."""
    with urllib.request.urlopen(url + "/metrics") as r:
        text = r.read().decode()
    found = {m[0]: float(m[1]) for m in
             re.findall(r"^hearth_(drafted_tokens|accepted_drafts)_total (\S+)$", text, re.M)}
    return found.get("drafted_tokens", 0.0), found.get("accepted_drafts", 0.0)


def ask_hearth(url: str, question: str) -> dict:
    """One voice question to Hearth, as :func:`ask` asks llama-server."""
    before = drafts(url)
    out, e2e = _chat(url, question, priority="voice")
    after = drafts(url)
    n, timing = out["usage"]["completion_tokens"], out.get("hearth", {})
    decoding = (timing.get("e2e_ms", 0) - timing.get("ttft_ms", 0)) / 1000
    return {"e2e_s": e2e, "tokens": n, "decode_tok_s": (n - 1) / decoding if decoding > 0
            else None, "drafted": int(after[0] - before[0]),
            "accepted": int(after[1] - before[1]), "text": out["choices"][0]["message"]["content"]}


def _served(name: str, extra: tuple[str, ...]) -> list[dict]:
    """The questions asked of one server: llama-server, or Hearth for a setup so named."""
    if name.startswith("Hearth"):
        with HearthServer("--model", str(TARGET), "--n-ctx", "4096", "--n-parallel", "1",
                          "--n-threads", "2", *extra) as srv:
            ask_hearth(srv.url, "Hello.")  # the first decode's warm-up, as for llama-server
            return [ask_hearth(srv.url, q) for q in QUESTIONS]
    with LlamaServer(TARGET, "-c", "4096", "-np", "1", "-t", "2", *extra) as srv:
        ask(srv.url, "Hello.")
        return [ask(srv.url, q) for q in QUESTIONS]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--drafts", default="3,5", help="draft lengths to try (--spec-draft-n-max)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    args = ap.parse_args(argv)
    for m in (TARGET, DRAFT):
        if not m.exists():
            sys.exit(f"{m} is missing: make models")
    lengths = args.drafts.split(",")
    setups: dict[str, tuple[str, ...]] = {"no draft": ()} | {
        f"0.5B draft, up to {n}": ("-md", str(DRAFT), "--spec-type", "draft-simple",
                                   "--spec-draft-n-max", n) for n in lengths}
    setups |= {"Hearth, no draft": ()}
    for n in lengths:
        draft = ("--draft-model", str(DRAFT), "--draft-tokens", n)
        setups[f"Hearth, 0.5B draft, up to {n}"] = draft  # as many as pay
        setups[f"Hearth, 0.5B draft, {n} every voice decode"] = (*draft, "--draft-policy",
                                                                "always")
    runs: dict[str, list[dict]] = {name: [] for name in setups}
    for k in range(args.rounds):
        for name, extra in (list(setups.items()) if k % 2 == 0 else list(setups.items())[::-1]):
            print(f"round {k + 1}/{args.rounds}: {name}", file=sys.stderr)
            runs[name] += _served(name, extra)
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    lines = [f"# Speculative decoding on this machine — {stamp}", "",
             f"Command: `python bench/speculative.py --rounds {args.rounds} --drafts "
             f"{args.drafts}`; llama-server and Hearth (voice class), {TARGET.name}, "
             f"{len(QUESTIONS)} voice questions a round, greedy, 80 tokens at most. "
             "Each row against its own server's row without a draft.", "",
             "| setup | decode tok/s (median) | answer e2e p50 | draft accepted | vs no draft |",
             "|---|---:|---:|---:|---:|"]
    for name, rs in runs.items():
        base = statistics.median(
            r["e2e_s"] for r in runs["Hearth, no draft" if name.startswith("Hearth")
                                     else "no draft"])
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
