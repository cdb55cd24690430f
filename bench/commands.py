"""The command benchmark: household utterances through Home Assistant, scored by what happened.

    make bench-commands [MODEL=path.gguf] [ARGS="--modes local,model --busy 2"]

Starts the demo (a Home Assistant with three template lights in three areas, the Hearth
integration and a Hearth pipeline) on a Hearth server running MODEL (default: the embedded
SmolLM2-135M), or uses a running demo (``--ha-url``). Each case of
bench/commands/utterances-v1.yaml sets the lights, sends its text through the Assist pipeline
(``assist_pipeline/run``, as a satellite sends it after speech-to-text) and passes when the
lights end as it expects: the entity states are scored, not the text. Modes: ``local`` (the
pipeline prefers Home Assistant's own intents and hands the rest to Hearth, the recommended
set-up) and ``model`` (every turn goes to the model). ``--busy N`` keeps N background jobs
running on the server meanwhile. Results: bench/results/commands-<time>/{results.json,summary.md}
(cases.jsonl: each case as it ends, with the calls the model made and what the server did for
it: requests, summed time to first token and e2e, tokens generated).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import socket
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts" / "demo"))
sys.path.insert(0, str(ROOT / "bench"))

from hearth_demo.haclient import HomeAssistantClient  # noqa: E402
from hearth_demo.stack import (  # noqa: E402
    AGENT_ID,
    PIPELINE_NAME,
    DemoSettings,
    DemoStack,
    pipeline_fields,
)
from household.metrics import percentile  # noqa: E402

CASES = ROOT / "bench" / "commands" / "utterances-v1.yaml"
TOLERANCE_PCT = 2  # brightness is stored 0-255: 50 % comes back as 49.8 %
JOB = {"messages": [{"role": "user", "content": "Write a long story about a lighthouse."}],
       "max_tokens": 400, "temperature": 0.7}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def light_value(state: dict[str, Any]) -> str | int:
    """'off', or the brightness in percent when on."""
    if state["state"] != "on":
        return "off"
    brightness = state["attributes"].get("brightness")
    return round(brightness * 100 / 255) if brightness is not None else 100


def matches(want: str | int, got: str | int) -> bool:
    if want == "on":
        return got != "off"
    if want == "off":
        return got == "off"
    return got != "off" and abs(int(got) - int(want)) <= TOLERANCE_PCT


# The server's histograms (summed over classes) whose change over a case says what the server
# did for it: requests and their time to first token, tokens (one more than the gaps), e2e.
SERVER_FIGURES = {"hearth_time_to_first_token_seconds": "ttft",
                  "hearth_inter_token_latency_seconds": "gaps",
                  "hearth_e2e_request_latency_seconds": "e2e"}


async def server_figures(session: aiohttp.ClientSession, server_url: str) -> dict[str, float]:
    """Counts and sums of the server's latency histograms, from its /metrics."""
    async with session.get(server_url + "/metrics") as r:
        text = await r.text()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if (name := SERVER_FIGURES.get(family.name)) is None:
            continue
        for sample in family.samples:
            for suffix in ("_count", "_sum"):
                if sample.name.endswith(suffix):
                    key = name + suffix
                    out[key] = out.get(key, 0.0) + sample.value
    return out


def server_share(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """What the server did during one case: its requests, their summed time to first token
    and e2e, and the tokens they generated."""
    d = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
    requests = d.get("e2e_count", 0.0)
    return {"requests": int(requests), "ttft_s": round(d.get("ttft_sum", 0.0), 3),
            "tokens": int(d.get("gaps_count", 0.0) + requests),
            "e2e_s": round(d.get("e2e_sum", 0.0), 3)}


class Bench:
    def __init__(self, ha: HomeAssistantClient, spec: dict[str, Any], log: Path | None = None,
                 server: tuple[aiohttp.ClientSession, str] | None = None):
        self.ha, self.spec, self.log, self.server = ha, spec, log, server
        self.lights = [f"light.{name}" for name in spec["lights"]]

    async def figures(self) -> dict[str, float]:
        return await server_figures(*self.server) if self.server else {}

    async def states(self) -> dict[str, str | int]:
        return {e.split(".", 1)[1]: light_value(await self.ha.state(e)) for e in self.lights}

    async def set_lights(self, setup: dict[str, str | int]) -> None:
        for entity in self.lights:
            want = setup.get(entity.split(".", 1)[1], "off")
            if want == "off":
                await self.ha.post("/api/services/light/turn_off", {"entity_id": entity})
            else:
                pct = 100 if want == "on" else int(want)
                await self.ha.post("/api/services/light/turn_on",
                                   {"entity_id": entity, "brightness_pct": pct})

    async def pipeline(self, prefer_local: bool) -> str:
        listing = await self.ha.ws("assist_pipeline/pipeline/list")
        pipeline = next(p for p in listing["pipelines"] if p["name"] == PIPELINE_NAME)
        await self.ha.ws("assist_pipeline/pipeline/update", pipeline_id=pipeline["id"],
                         **pipeline_fields(prefer_local))
        return pipeline["id"]

    async def run_mode(self, mode: str, say) -> list[dict[str, Any]]:
        pipeline_id = await self.pipeline(prefer_local=mode == "local")
        conversations: dict[str, str | None] = {}
        results = []
        for case in self.spec["cases"]:
            # a follow-up continues its conversation from the lights as that turn left them
            conversation = conversations.get(case["after"]) if "after" in case else None
            if "after" not in case:
                await self.set_lights(case.get("setup") or {})
            before = await self.states()
            figures = await self.figures()
            t0 = time.monotonic()
            try:
                turn = await self.ha.pipeline_turn(case["text"], pipeline_id,
                                                   conversation_id=conversation, timeout_s=300)
                error = None
            except Exception as err:  # a failed turn scores as failed, the run goes on
                turn, error = {"speech": "", "conversation_id": None, "local": False}, str(err)
            seconds = time.monotonic() - t0
            server = server_share(figures, await self.figures()) if self.server else None
            conversations[case["id"]] = turn["conversation_id"]
            after = await self.states()
            expected = {**before, **case["expect"]}
            passed = error is None and all(matches(expected[k], after[k]) for k in after)
            results.append({"mode": mode, "id": case["id"], "kind": case["kind"],
                            "text": case["text"], "passed": passed, "local": turn["local"],
                            "answer_ok": answered_right(case.get("answer"), turn["speech"]),
                            "seconds": round(seconds, 3), "speech": turn["speech"][:200],
                            "calls": turn.get("calls", []), "wrote": turn.get("wrote", ""),
                            "server": server,
                            "before": before, "after": after, "error": error})
            if self.log:  # each case as it ends, so a run stopped early still shows its turns
                with self.log.open("a") as f:
                    f.write(json.dumps(results[-1]) + "\n")
            say(f"[{mode}] {'PASS' if passed else 'fail'} {seconds:6.2f}s "
                f"{'local' if turn['local'] else 'model'} {case['text']!r} -> {after}")
        return results


async def keep_busy(server_url: str, n: int, stop: asyncio.Event) -> None:
    """Keep ``n`` background jobs queued or running on the Hearth server."""
    async with aiohttp.ClientSession() as session:
        running: list[str] = []
        while not stop.is_set():
            alive = []
            for job_id in running:
                async with session.get(f"{server_url}/v1/jobs/{job_id}") as r:
                    if (await r.json())["status"] in ("queued", "running"):
                        alive.append(job_id)
            running = alive
            while len(running) < n:
                async with session.post(f"{server_url}/v1/jobs", json={"request": JOB}) as r:
                    running.append((await r.json())["id"])
            await asyncio.sleep(1)


def _words(text: str) -> str:
    return " ".join(re.findall(r"[^\W_]+", text.lower()))


GUIDANCE_END = _words("To act, answer with the tool call alone, not with an explanation of it.")
# What the agent says itself when the model's answer had no words (English).
_AGENT_STRINGS = json.loads((ROOT / "custom_components/hearth/strings.json").read_text())
NO_WORDS = {_words(_AGENT_STRINGS["exceptions"][key]["message"])
            for key in ("no_answer", "tools_unanswered")}


def no_answer(result: dict[str, Any]) -> bool:
    """Whether the turn's last words say nothing: a tool call described in words, the user's
    words or the agent guidance's last sentence repeated, markup alone, or the agent's own
    words for an answer that had none ("The model used its tools but gave no answer.")."""
    said = result.get("speech") or ""
    return (_words(said) in (_words(result["text"]), GUIDANCE_END, *NO_WORDS)
            or bool(re.search(r"intent__|\bHass[A-Z]\w+|GetLiveContext", said))
            or said.strip().startswith("<"))


def answered_right(answer: dict[str, str] | None, said: str) -> bool | None:
    """Whether a question's spoken answer says what its case's ``answer`` wants (None: the
    case checks no answer)."""
    if not answer:
        return None
    if said.lstrip().casefold().startswith("live context"):
        return False  # the tool's result read out, not an answer
    return bool(re.search(answer["says"], said, re.I)) and not (
        "not" in answer and re.search(answer["not"], said, re.I))


def summary(results: list[dict[str, Any]], model: str, busy: int,
            server_args: list[str] | None = None) -> str:
    kinds = list(dict.fromkeys(r["kind"] for r in results))
    flags = f"; server flags: `{' '.join(server_args)}`" if server_args else ""
    lines = [f"Model: `{model}`; background jobs running: {busy}; cases: "
             f"{CASES.relative_to(ROOT)}{flags}", "",
             "| mode | passed | " + " | ".join(kinds) + " | handled locally | local turn p50 / "
             "p95 | model turn p50 / p95 |",
             "|---|---|" + "---|" * len(kinds) + "---|---|---|"]
    for mode in dict.fromkeys(r["mode"] for r in results):
        rows = [r for r in results if r["mode"] == mode]
        by_kind = Counter(r["kind"] for r in rows if r["passed"])
        total = Counter(r["kind"] for r in rows)
        local = [r["seconds"] for r in rows if r["local"]]
        model_t = [r["seconds"] for r in rows if not r["local"]]

        def span(v: list[float]) -> str:
            return "–" if not v else f"{percentile(v, 50):.2f} / {percentile(v, 95):.2f} s"

        lines.append(f"| {mode} | {sum(r['passed'] for r in rows)}/{len(rows)} | "
                     + " | ".join(f"{by_kind[k]}/{total[k]}" for k in kinds)
                     + f" | {len(local)} | {span(local)} | {span(model_t)} |")
    # The table scores the lights, not the words: a model answer that says nothing is counted
    # apart (a call described instead of made, the user's words or the guidance's repeated,
    # markup alone).
    said_nothing = [r for r in results if not r["local"] and no_answer(r)]
    answered = Counter(r["mode"] for r in results if not r["local"])
    lines += ["", "Model answers that said nothing: " + ", ".join(
        f"{mode} {sum(r['mode'] == mode for r in said_nothing)} of {n}"
        for mode, n in answered.items())]
    lines += [f"- [{r['mode']}] {r['id']} {r['text']!r}: said {r['speech'][:80]!r}"
              for r in said_nothing]
    # The lights cannot tell a wrong answer to a question ("72 degrees" unread): its words can.
    checked = [r for r in results if r.get("answer_ok") is not None]
    if checked:
        lines += ["", "Questions answered right: " + ", ".join(
            f"{mode} {sum(r['answer_ok'] for r in checked if r['mode'] == mode)} of "
            f"{sum(r['mode'] == mode for r in checked)}"
            for mode in dict.fromkeys(r["mode"] for r in checked))]
        lines += [f"- [{r['mode']}] {r['id']} {r['text']!r}: said {r['speech'][:100]!r}"
                  for r in checked if not r["answer_ok"]]
    failed = [r for r in results if not r["passed"]]
    if failed:  # what the model did and said where a case failed, to read beside the table
        lines += ["", "Failed cases:", ""]
        for r in failed:
            did = "; ".join(r.get("calls") or ()) or "no call"
            lines.append(f"- [{r['mode']}] {r['id']} {r['text']!r}: {did}; said "
                         f"{r['speech'][:100]!r}{'; ' + r['error'] if r['error'] else ''}")
    return "\n".join(lines) + "\n"


async def bench(args: argparse.Namespace, ha_url: str, server_url: str, say) -> list[dict]:
    spec = yaml.safe_load(CASES.read_text())
    if args.cases:
        wanted = set(args.cases.split(","))
        wanted |= {c["after"] for c in spec["cases"] if c["id"] in wanted and "after" in c}
        spec["cases"] = [c for c in spec["cases"] if c["id"] in wanted]
    async with aiohttp.ClientSession() as session:
        ha = HomeAssistantClient(ha_url, session)
        await ha.login(args.username, args.password)
        stop = asyncio.Event()
        busy = asyncio.create_task(keep_busy(server_url, args.busy, stop)) if args.busy else None
        try:
            args.out.mkdir(parents=True, exist_ok=True)
            b = Bench(ha, spec, log=args.out / "cases.jsonl", server=(session, server_url))
            results = []
            for mode in args.modes.split(","):
                results += await b.run_mode(mode, say)
            return results
        finally:
            stop.set()
            if busy:
                await asyncio.gather(busy, return_exceptions=True)
            await ha.close()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="", help="GGUF for the Hearth server (default embedded)")
    p.add_argument("--modes", default="local,model", help="local, model or both")
    p.add_argument("--busy", type=int, default=0, help="background jobs kept running")
    p.add_argument("--cases", default="",
                   help="only these case ids, comma-separated (with the cases they follow up)")
    p.add_argument("--ha-url", help="use this running demo instead of starting one")
    p.add_argument("--server-arg", action="append", default=[],
                   help="a flag for the Hearth server, e.g. --server-arg=--no-constrain-tool-calls")
    p.add_argument("--server-url", default="http://127.0.0.1:8080")
    p.add_argument("--username", default="hearth")
    p.add_argument("--password", default="hearth-demo")
    stamp = time.strftime("%Y%m%d-%H%M%S")
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / f"commands-{stamp}")
    args = p.parse_args()

    def say(line: str) -> None:
        print(line, flush=True)

    stack = None
    if args.ha_url:
        ha_url, server_url = args.ha_url, args.server_url
    else:
        settings = DemoSettings(run_dir=Path(tempfile.mkdtemp(prefix="hearth-commands-")),
                                server_port=free_port(), ha_port=free_port(), say=say,
                                server_args=(["--model", args.model] if args.model else [])
                                + args.server_arg)
        stack = DemoStack(settings)
        stack.start()
        ha_url, server_url = settings.ha_url, settings.server_url
    try:
        with urllib.request.urlopen(server_url + "/v1/models", timeout=30) as r:
            model = json.loads(r.read())["data"][0]["id"]
        results = asyncio.run(bench(args, ha_url, server_url, say))
    finally:
        if stack:
            stack.stop()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(
        {"model": model, "agent": AGENT_ID, "busy": args.busy, "cases": str(CASES.name),
         "server_args": args.server_arg, "results": results}, indent=1))
    text = summary(results, model, args.busy, args.server_arg)
    (args.out / "summary.md").write_text(text)
    print(text)
    print(f"results: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
