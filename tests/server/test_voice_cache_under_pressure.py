"""The real model on a small KV pool: a voice satellite's cached system prompt survives a flood
of one-off background prompts and an embedding job, and a warm-up caches it before the first
turn."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from hearth_server import HearthServer

# 30 prompts of 1,000+ tokens take minutes of prefill on a 2-core CPU.
pytestmark = [pytest.mark.model, pytest.mark.timeout(1200)]

SYSTEM = ("You are the voice assistant of a Home Assistant household. Answer in one short "
          "sentence. Exposed entities:\n"
          + "\n".join(f"- light.room_{i} ('Room {i} light', area {i % 9}): off" for i in range(60)))


@pytest.fixture(scope="module")
def small_server(tmp_path_factory):
    """A pool of 4,096 cells for 4 sequences and 4 cached prefixes: four 1,000-token prompts
    beside the system prompt do not fit, so the flood must wait or evict. Background prompts
    prefill in whole batches while no one waits (the flood's speed, not what is tested)."""
    data = tmp_path_factory.mktemp("hearth-small")
    with HearthServer("--n-ctx", "4096", "--n-parallel", "4", "--prefix-cache-entries", "4",
                      "--relax-prefill-bound", data_dir=data) as s:
        yield s


def _voice(content: str) -> dict:
    return {"messages": [{"role": "system", "content": SYSTEM},
                         {"role": "user", "content": content}],
            "max_tokens": 8, "temperature": 0, "priority": "voice"}


async def _post(session, url: str, path: str, body: dict) -> dict:
    async with session.post(url + path, json=body) as r:
        assert r.status == 200, await r.text()
        return await r.json()


async def _queue(session, url: str) -> dict:
    async with session.get(url + "/v1/queue") as r:
        return (await r.json())["prefix_cache"]


async def _flood(session, url: str, n: int) -> list[int]:
    """``n`` one-off background prompts of 1,000+ tokens (each a different document, never
    asked again) and an embedding job beside them. Returns their prompt lengths."""
    async def one_off(i: int) -> int:
        doc = " ".join(f"Paragraph {i}.{k}: the meter read {i * 31 + k} units." for k in
                       range(66))
        body = {"messages": [{"role": "user", "content": f"Summarise: {doc}"}],
                "max_tokens": 4, "temperature": 0, "priority": "background"}
        return (await _post(session, url, "/v1/chat/completions", body))["usage"]["prompt_tokens"]

    async def embed() -> None:
        texts = [f"Note {i}: the garage door was opened at {i % 24}:00." for i in range(60)]
        await _post(session, url, "/v1/embeddings", {"input": texts})

    *lengths, _ = await asyncio.gather(*(one_off(i) for i in range(n)), embed())
    return lengths


async def _scenario(url: str) -> tuple[dict, dict, dict, dict, list[int]]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=1800)) as session:
        warmed = await _post(session, url, "/v1/cache/warm",
                             {"messages": [{"role": "system", "content": SYSTEM}]})
        first = await _post(session, url, "/v1/chat/completions",
                            _voice("Turn on the kitchen light."))
        lengths = await _flood(session, url, 30)
        stats = await _queue(session, url)
        again = await _post(session, url, "/v1/chat/completions",
                            _voice("Turn on the kitchen light."))
    return warmed, first, again, stats, lengths


def test_a_warmed_voice_prompt_survives_a_flood_of_one_off_prompts(small_server):
    warmed, first, again, stats, lengths = asyncio.run(_scenario(small_server.url))
    assert warmed["class"] == "voice" and warmed["computed_tokens"] == warmed["prompt_tokens"]
    # The warm-up rendered the system prompt and the assistant's header; a turn shares all of
    # it but the role of the next message.
    system_len = warmed["prompt_tokens"] - 3
    assert system_len > 900
    assert first["usage"]["prompt_tokens_details"]["cached_tokens"] >= system_len
    assert min(lengths) >= 1000
    assert stats["evictions"] > 0, "the flood put the cache under pressure"
    assert stats["warm_ups"] == 1
    voice = stats["by_class"]["voice"]
    assert voice["entries"] >= 1 and voice["kept"] == voice["entries"]
    assert voice["hit_rate"] == 1.0 and voice["oldest_s"] is not None
    # The same turn again: the whole system prompt, and the turn itself, come from the cache.
    cached = again["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached >= again["usage"]["prompt_tokens"] - 1, (cached, again["usage"])


def test_a_warm_up_of_a_cached_prompt_computes_nothing_and_bad_input_is_a_400(small_server):
    async def go():
        async with aiohttp.ClientSession() as session:
            url = small_server.url
            body = {"messages": [{"role": "system", "content": "Be brief. " * 40}],
                    "priority": "chat"}
            a = await _post(session, url, "/v1/cache/warm", body)
            b = await _post(session, url, "/v1/cache/warm", body)
            async with session.post(url + "/v1/cache/warm",
                                    json={**body, "priority": "urgent"}) as r:
                bad_class = (r.status, await r.json())
            async with session.post(url + "/v1/cache/warm", json={"messages": []}) as r:
                empty = r.status
        return a, b, bad_class, empty
    a, b, bad_class, empty = asyncio.run(go())
    assert a["class"] == b["class"] == "chat"
    assert b["cached_tokens"] == b["prompt_tokens"] - 1 and b["computed_tokens"] == 1
    assert bad_class[0] == 400 and bad_class[1]["error"]["param"] == "priority"
    assert empty == 400
