"""Does the wake word keep a voice turn's first token at idle while a summary prefills? (issue 45)

One server, several rounds of fresh seeded prompts; each round, in rotating order:

  idle       a voice turn alone;
  load       a background summary (~2,000 fresh tokens, few answer tokens) starts; once
             /v1/queue shows it running (prefilling), the speech-to-text delay (``--stt-s``)
             passes, then the voice turn is sent;
  signal     as load, but when the summary is prefilling the satellite "goes listening": the
             reservation Home Assistant makes (``POST /v1/reservations``, the agent's system
             prompt as ``warm``), then after the STT delay the voice turn from that satellite.

A voice turn is sent as Home Assistant sends one: the same system prompt every time (cached
after the un-timed warm-up turn), a short command, ``priority: voice``, ``X-Hearth-Satellite``,
streamed. Its TTFT is timed client-side from the send to the first content token (the server's
``hearth.ttft_ms`` is kept beside it). The summary's own time to its end is the cost to
background work. llama.cpp's llama-server (same model, same pool; it has no classes and no
reservations) is the anchor row: idle and load only.

Usage: python bench/wake_word.py [--url URL | --model GGUF] [--rounds 8] [--stt-s 1.0]
       [--summary-tokens 2000] [--no-llama-server] [--label NAME] [--out bench/results]
       (without --url it starts Hearth and llama-server on the model: the embedded SmolLM2
       by default; with --url, --llama-url names a running llama-server for the anchor row)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from hearth.fleet.sse import data_json  # noqa: E402

SATELLITE = "assist_satellite.kitchen_satellite"
# What a Home Assistant agent's system prompt looks like (instructions, then the exposed
# entities): the same in every turn, so its prefix is cached.
SYSTEM = (
    "You are a voice assistant for Home Assistant. Answer questions about the world truthfully. "
    "Answer in plain text. Keep it simple and to the point. When controlling Home Assistant "
    "always call the intent tools. Use HassTurnOn to lock and HassTurnOff to unlock a lock. "
    "When controlling a device, prefer passing just name and domain. When controlling an area, "
    "prefer passing just area name and domain. Current time is 18:42:07. Today's date is "
    "2026-12-05.\nStatic Context: An overview of the areas and the devices in this smart home:\n"
    + "\n".join(f"- names: {room.title()} {dev}\n  domain: {dom}\n  state: '{st}'\n"
                f"  areas: {room.title()}"
                for room in ("kitchen", "living room", "bedroom", "hall", "office", "garage")
                for dev, dom, st in (("Light", "light", "off"), ("Blinds", "cover", "open"),
                                     ("Thermostat", "climate", "heat")))
)
# One command, after a fresh number: every turn's uncached part is the same few tokens (turns
# with different commands each find a different share of their words cached, and that alone
# moved an idle turn between 0.2 and 0.8 s on the 1.5B).
COMMAND = "({:04d}) Turn on the kitchen light."
SUBJECTS = ["The family", "The neighbour", "Grandmother", "The school", "The plumber", "Our dog",
            "The council", "The heating engineer", "My brother", "The garden club"]
VERBS = ["discussed", "postponed", "reported", "planned", "cancelled", "booked", "questioned",
         "paid for", "repaired", "forgot"]
OBJECTS = ["the boiler service", "the school run", "the weekend trip", "the roof tiles",
           "the electricity bill", "the birthday party", "the broken fence", "the new sofa",
           "the football match", "the dentist appointment", "the bin collection",
           "the solar panels"]
WHEN = ["on Monday", "last night", "after lunch", "before the holidays", "in the rain",
        "at the meeting", "twice this week", "without telling anyone"]
MODES = ("idle", "load", "signal")


def voice_body(rng: random.Random) -> dict[str, Any]:
    command = COMMAND.format(rng.randrange(10000))
    return {"messages": [{"role": "system", "content": SYSTEM},
                         {"role": "user", "content": command}],
            "max_tokens": 16, "temperature": 0, "stream": True, "user": SATELLITE}


def summary_body(rng: random.Random, tokens: int) -> dict[str, Any]:
    """A fresh text of about ``tokens`` tokens (about 1.3 per word) to summarise: no prefix of
    it is cached anywhere."""
    sentences = [f"Household log {rng.getrandbits(48):x}."]
    words = 0
    while words < tokens / 1.3:
        s = (f"{rng.choice(SUBJECTS)} {rng.choice(VERBS)} {rng.choice(OBJECTS)} "
             f"{rng.choice(WHEN)}, costing {rng.randint(2, 900)} pounds.")
        sentences.append(s)
        words += len(s.split())
    return {"messages": [{"role": "user", "content": "Summarise this log in one sentence:\n"
                          + " ".join(sentences)}],
            "max_tokens": 8, "temperature": 0, "ignore_eos": True, "stream": True,
            "user": "summaries"}


class Target:
    """One server: Hearth (classes, reservations) or llama-server (neither)."""

    def __init__(self, name: str, url: str, hearth: bool):
        self.name, self.url, self.hearth = name, url.rstrip("/"), hearth

    async def stream(self, http: aiohttp.ClientSession, body: dict[str, Any], cls: str,
                     satellite: str | None = None, first: asyncio.Event | None = None
                     ) -> dict[str, Any]:
        body = {**body, "stream_options": {"include_usage": True}}
        headers = {}
        if self.hearth:
            body["priority"] = cls
            if satellite:
                headers["X-Hearth-Satellite"] = satellite
        t0 = time.monotonic()
        ttft, usage, timing = None, {}, {}
        async with http.post(self.url + "/v1/chat/completions", json=body,
                             headers=headers) as r:
            if r.status != 200:
                raise RuntimeError(f"{self.name}: HTTP {r.status}: {(await r.text())[:300]}")
            async for chunk in data_json(r.content):
                if ttft is None and any((c.get("delta") or {}).get("content")
                                        for c in chunk.get("choices") or []):
                    ttft = time.monotonic() - t0
                    if first is not None:
                        first.set()
                usage = chunk.get("usage") or usage
                timing = chunk.get("hearth") or timing
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
        return {"ttft_ms": None if ttft is None else 1000 * ttft,
                "e2e_s": time.monotonic() - t0, "server_ttft_ms": timing.get("ttft_ms"),
                "server_queue_ms": timing.get("queue_ms"),
                "prompt_tokens": usage.get("prompt_tokens"), "cached_tokens": cached}

    async def get(self, http: aiohttp.ClientSession, path: str) -> Any:
        async with http.get(self.url + path) as r:
            return await r.json() if r.status == 200 else None

    async def running_background(self, http: aiohttp.ClientSession) -> bool:
        """Whether the summary has been admitted (its prompt is being computed)."""
        if self.hearth:
            q = await self.get(http, "/v1/queue")
            return bool(q and q["running"].get("background"))
        slots = await self.get(http, "/slots")  # llama-server's slots, when it serves them
        return slots is None or any(s.get("is_processing") for s in slots)

    async def idle(self, http: aiohttp.ClientSession, within_s: float = 120.0) -> None:
        """Wait until nothing runs or waits (a previous mode's work is over)."""
        deadline = time.monotonic() + within_s
        while time.monotonic() < deadline:
            if not self.hearth:
                return  # every request of a mode is awaited; llama-server has nothing behind
            q = await self.get(http, "/v1/queue")
            if q and not any(q["running"].values()) and not any(q["waiting"].values()):
                return
            await asyncio.sleep(0.05)
        raise TimeoutError(f"{self.name} not idle after {within_s} s")

    async def reserve(self, http: aiohttp.ClientSession) -> dict[str, Any]:
        """The call Home Assistant makes when the satellite goes listening
        (custom_components/hearth/reservations.py): the agent's prompt as the warm body."""
        body = {"model": None, "satellite": SATELLITE, "ttl_s": None,
                "warm": {"messages": [{"role": "system", "content": SYSTEM}],
                         "priority": "voice"}}
        async with http.post(self.url + "/v1/reservations", json=body) as r:
            if r.status != 200:
                raise RuntimeError(f"reservation: HTTP {r.status}: {(await r.text())[:300]}")
            return await r.json()


def session() -> aiohttp.ClientSession:
    # A fresh connection per request: llama-server closes a connection after a stream.
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True),
                                 timeout=aiohttp.ClientTimeout(total=900))


async def one_mode(t: Target, mode: str, rng: random.Random, args: argparse.Namespace
                   ) -> dict[str, Any]:
    async with session() as http:
        await t.idle(http)
        voice = voice_body(rng)
        if mode == "idle":
            return {"voice": await t.stream(http, voice, "voice", SATELLITE)}
        first = asyncio.Event()
        summary = asyncio.create_task(t.stream(http, summary_body(rng, args.summary_tokens),
                                               "background", first=first))
        deadline = time.monotonic() + 60
        while not await t.running_background(http):  # admitted: its prefill is under way
            if summary.done() or time.monotonic() > deadline:
                raise RuntimeError(f"{t.name}: the summary never showed as running")
            await asyncio.sleep(0.01)
        listening = time.monotonic()  # the satellite hears its wake word now
        row: dict[str, Any] = {}
        if mode == "signal":
            row["reservation"] = await t.reserve(http)
            row["reserve_ms"] = 1000 * (time.monotonic() - listening)
        await asyncio.sleep(max(0.0, listening + args.stt_s - time.monotonic()))  # STT
        row["summary_prefilling_at_voice"] = not first.is_set()
        row["voice"] = await t.stream(http, voice, "voice", SATELLITE)
        row["summary"] = await summary
        return row


def pct(xs: list[float], q: float) -> float | None:
    xs = sorted(x for x in xs if x is not None)
    return xs[max(0, math.ceil(q * len(xs)) - 1)] if xs else None


def med(xs: list[Any]) -> float | None:
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    v = [r["voice"] for r in rows]
    s = [r["summary"] for r in rows if "summary" in r]
    out = {"n": len(rows), "ttft_p50_ms": med([x["ttft_ms"] for x in v]),
           "ttft_p90_ms": pct([x["ttft_ms"] for x in v], 0.9),
           "server_ttft_p50_ms": med([x["server_ttft_ms"] for x in v]),
           "voice_cached_tokens_p50": med([x["cached_tokens"] for x in v]),
           "voice_prompt_tokens": med([x["prompt_tokens"] for x in v])}
    if s:
        out |= {"summary_e2e_p50_s": med([x["e2e_s"] for x in s]),
                "summary_prompt_tokens_p50": med([x["prompt_tokens"] for x in s]),
                "summary_prefilling_at_voice": sum(r["summary_prefilling_at_voice"]
                                                   for r in rows)}
    return out


async def bench(t: Target, args: argparse.Namespace) -> dict[str, Any]:
    modes = MODES if t.hearth else MODES[:2]
    rng = random.Random(args.seed)
    async with session() as http:  # un-timed: the voice prefix cached, a summary computed
        await t.stream(http, voice_body(rng), "voice", SATELLITE)
        await t.stream(http, summary_body(rng, 200), "background")
    rows: dict[str, list[dict[str, Any]]] = {m: [] for m in modes}
    for k in range(args.rounds):
        order = modes[k % len(modes):] + modes[:k % len(modes)]
        for mode in order:
            rows[mode].append(await one_mode(t, mode, random.Random(
                f"{args.seed}-{k}-{mode}"), args))
            r = rows[mode][-1]
            print(f"{t.name} round {k + 1}/{args.rounds} {mode}: voice TTFT "
                  f"{r['voice']['ttft_ms']:.0f} ms" + (
                      f", summary {r['summary']['e2e_s']:.1f} s (prefilling at voice: "
                      f"{r['summary_prefilling_at_voice']})" if "summary" in r else ""),
                  file=sys.stderr)
    out = {m: summarise(rows[m]) for m in modes}
    idle = out["idle"]["ttft_p50_ms"]
    for m in modes:
        p50 = out[m]["ttft_p50_ms"]
        out[m]["ratio_to_idle"] = p50 / idle if p50 and idle else None
    return {"modes": out, "rounds": rows}


def machine() -> str:
    cpu = platform.processor() or "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} cores ({platform.system()} {platform.machine()})"


def fmt_load(xs: list[float]) -> str:
    return ", ".join(f"{x:.1f}" for x in xs)


def write(results: dict[str, Any], args: argparse.Namespace, model: str, argv: list[str]
          ) -> Path:
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    label = args.label if args.label is not None else (Path(args.model).stem
                                                       if args.model else "")
    out = Path(args.out) / f"wake-word-{stamp}{'-' + label if label else ''}"
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    names = {"idle": "idle", "load": "summary prefilling, no signal",
             "signal": "summary prefilling, wake-word reservation"}
    f = "{:.0f}".format
    lines = [f"# Voice TTFT on the wake word — {stamp}", "",
             f"Command: `python bench/wake_word.py {' '.join(argv)}`", "",
             f"Machine: {machine()}; load average (1, 5, 15 min) before "
             f"{fmt_load(results['load_average']['before'])}, after "
             f"{fmt_load(results['load_average']['after'])}. Model: {model}. "
             f"{args.rounds} rounds, STT delay "
             f"{args.stt_s} s, summaries of ~{args.summary_tokens} fresh tokens (8 answer "
             "tokens); modes in rotating order, medians and p90 over rounds.", "",
             "| server | mode | voice TTFT p50 (ms) | p90 (ms) | × idle | server's TTFT p50 "
             "(ms) | summary's time to its end p50 (s) | summary still prefilling at the "
             "voice turn |", "|---|---|---:|---:|---:|---:|---:|---:|"]
    for server, r in results["servers"].items():
        for m, x in r["modes"].items():
            def g(k: str, fmt: Any = f, x: dict[str, Any] = x) -> str:
                return "—" if x.get(k) is None else fmt(x[k])
            lines.append(
                f"| {server} | {names[m]} | {g('ttft_p50_ms')} | {g('ttft_p90_ms')} | "
                f"{g('ratio_to_idle', '{:.2f}×'.format)} | {g('server_ttft_p50_ms')} | "
                f"{g('summary_e2e_p50_s', '{:.2f}'.format)} | "
                + (f"{x['summary_prefilling_at_voice']}/{x['n']}" if m != "idle" else "—")
                + " |")
    lines.append("")
    for server, r in results["servers"].items():
        x = r["modes"]["idle"]
        lines.append(f"{server}: the voice prompt {x['voice_prompt_tokens']} tokens, "
                     f"{x['voice_cached_tokens_p50']} of them cached (idle p50).")
    goal = results["goal"]
    if goal["ratio"] is not None:
        lines += ["", f"Issue 45's goal, voice TTFT with the signal ≤ 1.05× idle: "
                  f"{goal['ratio']:.2f}× — {'met' if goal['met'] else 'not met'}"
                  " (the goal is set for qwen2.5-coder-1.5b)."]
    text = "\n".join(lines) + "\n"
    (out / "README.md").write_text(text)
    print(text)
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--url", help="a running Hearth server (else one is started)")
    ap.add_argument("--llama-url", help="with --url: a running llama-server for the anchor")
    ap.add_argument("--model", default="", help="GGUF both servers load (default embedded)")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--stt-s", type=float, default=1.0, help="speech-to-text delay (s)")
    ap.add_argument("--summary-tokens", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=45)
    ap.add_argument("--no-llama-server", action="store_true", help="skip the anchor row")
    ap.add_argument("--label", default=None, help="results folder suffix (default: model)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    args = ap.parse_args(argv)
    servers: dict[str, Any] = {}
    load_before = os.getloadavg()  # a busy machine's numbers say little: the README shows it
    if args.url:
        model = args.model or "(the server's)"
        servers["hearth"] = asyncio.run(bench(Target("hearth", args.url, True), args))
        if args.llama_url and not args.no_llama_server:
            servers["llama-server"] = asyncio.run(
                bench(Target("llama-server", args.llama_url, False), args))
    else:
        from hearth_server import HearthServer
        from llama_server import LlamaServer
        from vs_llama_server import POOL

        from hearth.fleet.models import packaged_model
        path = Path(args.model) if args.model else packaged_model()
        model = path.name
        with tempfile.TemporaryDirectory(prefix="hearth-wake-") as tmp:
            srv = HearthServer(
                "--n-ctx", str(POOL["n_ctx"]), "--n-parallel", str(POOL["n_parallel"]),
                "--n-batch", str(POOL["n_batch"]), "--n-ubatch", str(POOL["n_ubatch"]),
                "--model", str(path), data_dir=Path(tmp))
            try:  # a 1.5B's load and calibration on a busy 2-core machine pass 2 minutes
                srv.start(timeout=900)
                servers["hearth"] = asyncio.run(bench(Target("hearth", srv.url, True), args))
            finally:
                srv.stop()
        if not args.no_llama_server:  # one server up at a time: they share the cores
            with LlamaServer(path, "-c", str(POOL["n_ctx"]), "-np", str(POOL["n_parallel"]),
                             "-b", str(POOL["n_batch"]), "-ub", str(POOL["n_ubatch"]),
                             "--kv-unified") as llama:
                servers["llama-server"] = asyncio.run(
                    bench(Target("llama-server", llama.url, False), args))
    h = servers["hearth"]["modes"]
    ratio = h["signal"]["ratio_to_idle"]
    results = {"model": model, "machine": machine(), "args": vars(args), "servers": servers,
               "load_average": {"before": load_before, "after": os.getloadavg()},
               "goal": {"ratio": ratio, "met": ratio is not None and ratio <= 1.05}}
    write(results, args, model, argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
