"""Engine performance on this machine with the real model (in-process, no HTTP).

Measures what the Engine issue asks for:
  1. voice TTFT while three ~1,500-token summaries run, against idle voice TTFT, in
     ``hearth`` and ``fifo`` modes (and what the prefill bound costs background throughput);
  2. aggregate decode tokens/s with 8 concurrent chats against a bare batched decode loop on the
     same context, and the engine's Python time per iteration;
  3. warm vs cold TTFT with a ~1,200-token Home-Assistant-style system prompt;
  4. an uncached voice prompt of that size while chats stream: its TTFT against alone, and the
     longest gap the chats see between two tokens meanwhile;
  5. ``host``: the engine's own time per iteration (its backend's calls left out) with 0, 60 and
     250 requests waiting, on the simulated backend (no model): 8 streams holding every slot,
     and a churn of short turns on shared system prompts (admission and the prefix cache busy).

Usage: python bench/engine_bench.py [--quick] [--only SCENARIO ...] [--out bench/results]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from datetime import datetime
from pathlib import Path

import numpy as np
from engine_host_cost import host_rows, host_table

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from llama_in_process import open_model

from hearth.chat.prompts import ChatFormatter
from hearth.engine import Engine, EngineConfig, EngineCore
from hearth.llama.backend import LlamaBackend
from hearth.llama.llama_adapter import ContextParams
from hearth.llama.llama_sampling import Sampler
from hearth.policy.scheduler import PolicyConfig, class_rank
from hearth.shared.requests import Request, SamplingParams

GREEDY = SamplingParams(temperature=0.0)


class Sink:
    def __init__(self) -> None:
        self.done = threading.Event()
        self.last = None

    def __call__(self, evs) -> None:
        for e in evs:
            if e.kind in ("done", "error"):
                self.last = e
                self.done.set()


def p(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q)) if values else float("nan")


def ha_system_prompt(n_devices: int) -> str:
    lines = [f"- light.room_{i} ('Room {i} light', area {i % 9}): off" for i in range(n_devices)]
    return ("You are a voice assistant for Home Assistant. Answer in one short sentence. "
            "Exposed entities:\n" + "\n".join(lines))


class Bench:
    def __init__(self, quick: bool):
        self.model = open_model()
        self.fmt = ChatFormatter(self.model.chat_template())
        self.quick = quick

    def tokens(self, user: str, system: str | None = None) -> list[int]:
        msgs = ([{"role": "system", "content": system}] if system else []) + \
            [{"role": "user", "content": user}]
        return self.model.tokenize(self.fmt.render(msgs), add_special=False)

    def engine(self, mode: str, latency_ms: float = 60, relax: bool = False,
               prefix_cache: bool = True, n_parallel: int = 8) -> tuple[Engine, LlamaBackend]:
        entries = 8 if prefix_cache else 0
        b = LlamaBackend(self.model, ContextParams(n_ctx=16384, n_seq_max=n_parallel + entries,
                                                   n_batch=512, n_ubatch=128))
        core = EngineCore(b, PolicyConfig(mode=mode, n_parallel=n_parallel),
                          EngineConfig(latency_target_s=latency_ms / 1000,
                                       relax_prefill_bound=relax, prefix_cache=prefix_cache,
                                       prefix_cache_entries=entries))
        core.calibrate(self.model.tokenize("warm", add_special=False)[0])
        e = Engine(core)
        e.start()
        return e, b

    def run(self, e: Engine, prompt: list[int], cls: str, max_tokens: int,
            ignore_eos: bool = True) -> tuple[Request, Sink]:
        s = Sink()
        r = Request(prompt=prompt, rank=class_rank(cls), sink=s, max_tokens=max_tokens,
                    sampling=GREEDY, ignore_eos=ignore_eos)
        e.submit(r)
        return r, s

    # -- 1. voice under background load ----------------------------------------------------
    def voice_commands(self, n: int) -> list[list[int]]:
        cmds = ["Turn on the kitchen light.", "Turn off the hall light.", "Is the door locked?",
                "Set the heating to twenty degrees.", "What is the temperature outside?",
                "Turn on the porch light.", "Dim the bedroom lamp.", "Open the garage.",
                "Close the blinds.", "Start the vacuum.", "Lock the front door.",
                "Turn off all lights."]
        return [self.tokens(cmds[i % len(cmds)] + f" (request {i})",
                            system="You are a voice assistant. Be brief.") for i in range(n)]

    def documents(self, n: int, approx_tokens: int) -> list[list[int]]:
        docs = []
        for d in range(n):
            words = []
            i = 0
            while len(words) < approx_tokens * 0.75:
                words += (f"Note {d}.{i}: the family discussed the garden, the heating bill, "
                          f"the school run and the weekend plans in detail.").split()
                i += 1
            docs.append(self.tokens("Summarise this document:\n" + " ".join(words)))
        return docs

    def voice_under_load(self, mode: str, relax: bool = False) -> dict:
        n_voice = 6 if self.quick else 12
        e, b = self.engine(mode, relax=relax, prefix_cache=False)
        try:
            idle = []
            for v in self.voice_commands(n_voice):
                r, s = self.run(e, v, "voice", 8)
                s.done.wait(60)
                idle.append(r.first_token_at - r.arrival)
            docs = self.documents(3, 1500)
            t0 = time.monotonic()
            bgs = [self.run(e, d, "background", 150) for d in docs]
            loaded = []
            for v in self.voice_commands(n_voice):
                time.sleep(0.35)
                if all(s.done.is_set() for _, s in bgs):
                    break
                r, s = self.run(e, v, "voice", 8)
                s.done.wait(120)
                loaded.append(r.first_token_at - r.arrival)
            for _, s in bgs:
                s.done.wait(600)
            bg_time = max(r.finished_at for r, _ in bgs) - t0
            bg_tokens = sum(r.n_generated + len(r.prompt) for r, _ in bgs)
            stats = e.core.stats
            return {
                "mode": mode + (" (relaxed bound)" if relax else ""),
                "prompt_tokens_per_doc": [len(d) for d in docs],
                "idle_voice_ttft_ms": {"p50": 1000 * p(idle, 50), "p95": 1000 * p(idle, 95)},
                "loaded_voice_ttft_ms": {"p50": 1000 * p(loaded, 50),
                                         "p95": 1000 * p(loaded, 95),
                                         "n": len(loaded)},
                "ratio_p95": p(loaded, 95) / p(idle, 95),
                "background_seconds": bg_time,
                "background_tokens_per_s": bg_tokens / bg_time,
                "aborted_iterations": stats.aborted_iterations,
                "preemptions": stats.preemptions,
            }
        finally:
            e.stop()
            b.close()

    # -- 2. decode throughput and Python overhead ------------------------------------------
    def bare_decode_loop(self, prompts: list[list[int]], steps: int) -> float:
        """tokens/s of a plain loop: one llama_decode of 8 tokens + 8 samplings per step."""
        b = LlamaBackend(self.model, ContextParams(n_ctx=16384, n_seq_max=8, n_batch=512,
                                                   n_ubatch=128))
        ctx = b.ctx
        try:
            toks, pos, seqs, outs = [], [], [], []
            for s, pr in enumerate(prompts):
                toks += pr
                pos += range(len(pr))
                seqs += [s] * len(pr)
                outs += [False] * (len(pr) - 1) + [True]
            for i in range(0, len(toks), 512):
                assert ctx.decode(toks[i:i + 512], pos[i:i + 512], seqs[i:i + 512],
                                  outs[i:i + 512]) == 0
            samplers = [Sampler(self.model, GREEDY) for _ in prompts]
            n_past = [len(pr) for pr in prompts]
            last = [pr[-1] for pr in prompts]
            t0 = time.perf_counter()
            for _ in range(steps):
                assert ctx.decode(last, n_past, list(range(len(prompts))),
                                  [True] * len(prompts)) == 0
                last = [samplers[i].sample(ctx, i) for i in range(len(prompts))]
                n_past = [x + 1 for x in n_past]
            dt = time.perf_counter() - t0
            return steps * len(prompts) / dt
        finally:
            b.close()

    def decode_throughput(self, waiting: int = 0) -> dict:
        """8 chats decoding; with ``waiting`` background requests queued behind the full slots
        (they cannot be admitted meanwhile), to show host time does not grow with the queue."""
        steps = 48 if self.quick else 128
        prompts = [self.tokens(f"Tell me about topic number {i}.") for i in range(8)]
        bare = self.bare_decode_loop(prompts, steps)
        e, b = self.engine("hearth", prefix_cache=False)
        core = e.core
        timings: list[tuple[float, float]] = []  # (iteration seconds, decode seconds)
        orig_step, orig_decode = core.step, core.b.decode
        box = {"decode": 0.0}

        def timed_decode(*a):
            t = time.perf_counter()
            try:
                return orig_decode(*a)
            finally:
                box["decode"] += time.perf_counter() - t

        def timed_step():
            box["decode"] = 0.0
            t = time.perf_counter()
            did = orig_step()
            if did and core.running and all(r.remaining == 1 for r in core.running):
                timings.append((time.perf_counter() - t, box["decode"]))
            return did

        core.b.decode = timed_decode
        core.step = timed_step
        try:
            reqs = [self.run(e, pr, "chat", steps + 8) for pr in prompts]
            while sum(1 for r, _ in reqs if r.n_generated) < len(reqs):
                time.sleep(0.01)  # all eight hold their slots before the queue fills
            queued = [self.run(e, prompts[i % 8], "background", 1) for i in range(waiting)]
            for _, s in reqs:
                s.done.wait(600)
            for _, s in queued:
                s.done.wait(600)
        finally:
            e.stop()
            b.close()
        full = [t for t, _ in timings if t > 0]
        engine_tps = 8 * len(full) / sum(full)
        overhead = [(t - d) / t for t, d in timings if t > 0]
        return {"waiting": waiting,
                "bare_decode_tokens_per_s": bare, "engine_decode_tokens_per_s": engine_tps,
                "ratio": engine_tps / bare, "iterations_measured": len(full),
                "python_overhead_share_mean": statistics.mean(overhead),
                "python_overhead_ms_mean": 1000 * statistics.mean(t - d for t, d in timings)}

    # -- 3. warm vs cold TTFT with a long system prompt ------------------------------------
    def prefix_cache(self) -> dict:
        system = ha_system_prompt(60)
        e, b = self.engine("hearth", prefix_cache=True)
        try:
            cold_p = self.tokens("Turn on the kitchen light.", system=system)
            r1, s1 = self.run(e, cold_p, "voice", 4)
            s1.done.wait(60)
            warm = []
            for i, cmd in enumerate(["What time is it?", "Turn off room 3.", "Lock up."]):
                r, s = self.run(e, self.tokens(cmd + f" #{i}", system=system), "voice", 4)
                s.done.wait(60)
                warm.append((r.first_token_at - r.arrival, r.cached_tokens, len(r.prompt)))
            cold = r1.first_token_at - r1.arrival
            return {"system_prompt_tokens": len(cold_p), "cold_ttft_ms": 1000 * cold,
                    "warm_ttft_ms": [1000 * w for w, _, _ in warm],
                    "warm_cached_share": [c / n for _, c, n in warm],
                    "ratio": statistics.mean(w for w, _, _ in warm) / cold}
        finally:
            e.stop()
            b.close()

    # -- 4. an uncached voice prompt while chats stream -------------------------------------
    def voice_beside_streams(self) -> dict:
        """A voice request whose ~1,200-token system prompt is not cached arrives while four
        chats stream: its TTFT against the same prompt alone, and the longest gap the chats
        see between two tokens meanwhile."""
        system = ha_system_prompt(60)
        e, b = self.engine("hearth", prefix_cache=False)
        rounds = []
        try:
            for i, cmd in enumerate(["Turn on the kitchen light.", "Is the door locked?",
                                     "Dim the bedroom lamp."][: 2 if self.quick else 3]):
                voice = self.tokens(f"{cmd} #{i}", system=system)
                r, s = self.run(e, voice, "voice", 4)
                s.done.wait(120)
                solo = r.first_token_at - r.arrival
                chats = [self.run(e, self.tokens(f"Tell me a long story about topic {i}.{j}"),
                                  "chat", 2000) for j in range(4)]
                while not all(c.n_generated >= 3 for c, _ in chats):
                    time.sleep(0.01)
                v, vs = self.run(e, voice, "voice", 4)
                vs.done.wait(120)
                gaps = []
                for c, _ in chats:
                    e.cancel(c.id)
                    t = c.first_token_at
                    for g in list(c.itl):
                        if v.arrival <= t + g and t <= v.first_token_at:
                            gaps.append(g)
                        t += g
                for _, cs in chats:
                    cs.done.wait(60)
                rounds.append({"voice_prompt_tokens": len(voice), "solo_ttft_ms": 1000 * solo,
                               "ttft_ms": 1000 * (v.first_token_at - v.arrival),
                               "max_chat_gap_ms": 1000 * max(gaps, default=float("nan"))})
        finally:
            e.stop()
            b.close()
        return {"rounds": rounds,
                "ttft_ratio_mean": statistics.mean(x["ttft_ms"] / x["solo_ttft_ms"]
                                                   for x in rounds),
                "max_chat_gap_ms": max(x["max_chat_gap_ms"] for x in rounds)}


def markdown(res: dict) -> str:
    out: list[str] = []
    if res.get("voice_under_load"):
        out += ["| scenario | idle voice TTFT p95 | loaded voice TTFT p95 | ratio | background "
                "tok/s (prompt+gen) | aborted iterations |", "|---|---|---|---|---|---|"]
        for v in res["voice_under_load"]:
            out.append(f"| {v['mode']} | {v['idle_voice_ttft_ms']['p95']:.0f} ms | "
                       f"{v['loaded_voice_ttft_ms']['p95']:.0f} ms | {v['ratio_p95']:.2f}× | "
                       f"{v['background_tokens_per_s']:.0f} | {v['aborted_iterations']} |")
        out.append("")
    for d in res.get("decode") or []:
        out.append(f"Decode, 8 concurrent chats, {d['waiting']} requests waiting: engine "
                   f"{d['engine_decode_tokens_per_s']:.1f} tok/s, bare loop "
                   f"{d['bare_decode_tokens_per_s']:.1f} tok/s ({100 * d['ratio']:.1f} %); "
                   f"Python time per iteration {d['python_overhead_ms_mean']:.2f} ms "
                   f"({100 * d['python_overhead_share_mean']:.1f} % of the iteration).")
    if c := res.get("prefix_cache"):
        warm = ", ".join(f"{w:.0f}" for w in c["warm_ttft_ms"])
        out.append(f"Prefix cache, {c['system_prompt_tokens']}-token system prompt: cold TTFT "
                   f"{c['cold_ttft_ms']:.0f} ms, warm {warm} ms ({100 * c['ratio']:.1f} % of "
                   f"cold).")
    if vb := res.get("voice_beside_streams"):
        beside = ", ".join(f"{x['ttft_ms']:.0f}" for x in vb["rounds"])
        alone = ", ".join(f"{x['solo_ttft_ms']:.0f}" for x in vb["rounds"])
        out.append(f"Uncached voice prompt ({vb['rounds'][0]['voice_prompt_tokens']} tokens) "
                   f"while 4 chats stream: TTFT {beside} ms vs alone {alone} ms "
                   f"({vb['ttft_ratio_mean']:.2f}×); longest gap between two chat tokens "
                   f"meanwhile {vb['max_chat_gap_ms']:.0f} ms.")
    if h := res.get("host"):
        out += host_table(h)
    return "\n".join(out)


SCENARIOS = ("voice_under_load", "decode", "prefix_cache", "voice_beside_streams", "host")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", choices=SCENARIOS, action="append",
                    help="run only this scenario (repeatable)")
    ap.add_argument("--out", default="bench/results")
    args = ap.parse_args()
    wanted = args.only or SCENARIOS
    res: dict = {"when": datetime.now().isoformat(timespec="seconds"), "quick": args.quick}
    if "host" in wanted:
        print("host cost per iteration …", file=sys.stderr)
        res["host"] = host_rows()
    b = Bench(args.quick) if set(wanted) - {"host"} else None
    if "voice_under_load" in wanted:
        assert b is not None
        res["voice_under_load"] = []
        for mode, relax in (("hearth", False), ("hearth", True), ("fifo", False)):
            print(f"voice under load: {mode}{' relaxed' if relax else ''} …", file=sys.stderr)
            res["voice_under_load"].append(b.voice_under_load(mode, relax))
    if "decode" in wanted:
        print("decode throughput …", file=sys.stderr)
        res["decode"] = [b.decode_throughput(waiting=n) for n in (0, 60)]
    if "prefix_cache" in wanted:
        print("prefix cache …", file=sys.stderr)
        res["prefix_cache"] = b.prefix_cache()
    if "voice_beside_streams" in wanted:
        print("uncached voice beside streams …", file=sys.stderr)
        res["voice_beside_streams"] = b.voice_beside_streams()
    out = Path(args.out) / ("engine-" + datetime.now().strftime("%Y%m%d-%H%M%S"))
    out.mkdir(parents=True, exist_ok=True)
    (out / "engine.json").write_text(json.dumps(res, indent=2))
    md = markdown(res)
    (out / "engine.md").write_text(md + "\n")
    print(md)
    print(f"\nwritten to {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
