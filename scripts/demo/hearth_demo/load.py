"""A household's mix of work, sent through the demo Home Assistant so the dashboard moves.

- voice: turns through the Hearth Assist pipeline naming a device, as a satellite sends them
  (Hearth classes them ``voice``);
- chat: typed turns through the conversation REST API (``chat``);
- background: ``hearth.submit_job`` summaries (``background`` jobs on the server).

Bounded: a fixed number of requests per kind and an overall deadline; only 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from .haclient import HAError, HomeAssistantClient
from .stack import AGENT_ID, PIPELINE_NAME

VOICE_LINES = [
    "Turn on the kitchen light.",
    "Is the porch light on?",
    "Switch off the living room lamp.",
    "What is the temperature in the living room?",
    "Turn off all the lights.",
    "Turn on the porch light please.",
]
CHAT_LINES = [
    "Suggest a quick dinner I can cook tonight.",
    "Write a two-line poem about a warm fireplace.",
    "What should I check before going on holiday?",
]
DOCUMENT = (
    "Household notes for the week. Monday: the boiler service is booked for 9am, someone must be "
    "home. Tuesday: recycling collection, put the blue bin out the night before. Wednesday: the "
    "kids have swimming at 5pm and need their kit. Thursday: the grocery delivery arrives between "
    "6 and 7pm. Friday: grandma visits for dinner; she does not eat fish. Weekend: clean the "
    "gutters if the weather is dry, and water the garden on Sunday evening. "
)


@dataclass
class LoadResult:
    voice: list[float] = field(default_factory=list)  # seconds per turn
    chat: list[float] = field(default_factory=list)
    jobs: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def report(self) -> str:
        def stats(xs: list[float]) -> str:
            if not xs:
                return "none"
            xs = sorted(xs)
            return f"{len(xs)} done, median {xs[len(xs) // 2]:.1f}s, max {xs[-1]:.1f}s"

        lines = [f"voice turns : {stats(self.voice)}", f"chat turns  : {stats(self.chat)}",
                 f"jobs queued : {len(self.jobs)}"]
        if self.errors:
            lines.append(f"errors      : {len(self.errors)} (first: {self.errors[0]})")
        return "\n".join(lines)


async def _client(session: aiohttp.ClientSession, url: str, username: str,
                  password: str) -> HomeAssistantClient:
    ha = HomeAssistantClient(url, session)
    await ha.login(username, password)
    return ha


async def run_load(ha_url: str, username: str, password: str, *, voice: int = 6, chat: int = 2,
                   jobs: int = 3, duration: float = 120.0, job_tokens: int = 256,
                   say: Any = print, seed: int | None = None,
                   voice_lines: list[str] | None = None) -> LoadResult:
    """Send ``voice`` voice turns (from ``voice_lines``, default VOICE_LINES), ``chat`` typed
    turns and ``jobs`` background jobs, spread over at most ``duration`` seconds; waits for the
    turns (not the jobs) to finish."""
    rng = random.Random(seed)
    result = LoadResult()
    deadline = time.monotonic() + duration
    async with aiohttp.ClientSession() as session:
        main = await _client(session, ha_url, username, password)
        try:
            entries = await main.get("/api/config/config_entries/entry?domain=hearth")
            entry_id = next(e["entry_id"] for e in entries if e["state"] == "loaded")
            pipelines = await main.ws("assist_pipeline/pipeline/list")
            pipeline_id = next(p["id"] for p in pipelines["pipelines"]
                               if p["name"] == PIPELINE_NAME)
            # The Hearth server's device stands in for the satellite the turn comes from.
            devices = await main.ws("config/device_registry/list")
            device_id = next((d["id"] for d in devices
                              if entry_id in (d.get("config_entries") or [])), None)

            async def submit_jobs() -> None:
                for i in range(jobs):
                    if time.monotonic() > deadline:
                        return
                    try:
                        answer = await main.post(
                            "/api/services/hearth/submit_job?return_response",
                            {"config_entry_id": entry_id, "text": DOCUMENT * 3,
                             "instructions": "Write a detailed day-by-day summary of this "
                                             "week's household notes, with advice for each day.",
                             "max_tokens": job_tokens, "tag": f"demo_summary_{i}"},
                        )
                        job_id = answer["service_response"]["job_id"]
                        result.jobs.append(job_id)
                        say(f"[load] background job {job_id} queued")
                    except (HAError, aiohttp.ClientError, TimeoutError, KeyError) as err:
                        result.errors.append(f"job: {err}")
                    await asyncio.sleep(rng.uniform(2, 6))

            async def turns(kind: str, n: int, lines: list[str], ask: Any,
                            samples: list[float], pause: tuple[float, float]) -> None:
                """Up to ``n`` turns of one kind before the deadline, each answer timed."""
                for _ in range(n):
                    remaining = deadline - time.monotonic()
                    if remaining < 5:
                        return
                    text = rng.choice(lines)
                    t0 = time.monotonic()
                    try:
                        speech = await ask(text, min(120, remaining))
                        elapsed = time.monotonic() - t0
                        samples.append(elapsed)
                        say(f"[load] {kind:<6} {elapsed:5.1f}s  {text!r} -> {_short(speech)!r}")
                    except (HAError, aiohttp.ClientError, TimeoutError, KeyError) as err:
                        result.errors.append(f"{kind}: {err}")
                    await asyncio.sleep(rng.uniform(*pause))

            async def voice_turns() -> None:
                ws_client = await _client(session, ha_url, username, password)
                try:
                    await turns("voice", voice, voice_lines or VOICE_LINES,
                                lambda text, timeout_s: ws_client.voice_turn(
                                    text, pipeline_id, device_id, timeout_s=timeout_s),
                                result.voice, (1, 4))
                finally:
                    await ws_client.close()

            async def ask_chat(text: str, timeout_s: float) -> str:
                answer = await main.converse(text, AGENT_ID, timeout_s=timeout_s)
                return answer["response"]["speech"]["plain"]["speech"]

            async def chat_turns() -> None:
                await asyncio.sleep(rng.uniform(1, 3))
                await turns("chat", chat, CHAT_LINES, ask_chat, result.chat, (2, 5))

            async with asyncio.timeout(duration + 30):
                await asyncio.gather(submit_jobs(), voice_turns(), chat_turns())
        finally:
            await main.close()
    return result


def _short(text: str, limit: int = 70) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"
