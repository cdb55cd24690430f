"""The real model on a small KV pool: a voice satellite's cached system prompt survives a flood
of one-off background prompts and an embedding job."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from hearth_server import HearthServer

pytestmark = pytest.mark.model

SYSTEM = ("You are the voice assistant of a Home Assistant household. Answer in one short "
          "sentence. Exposed entities:\n"
          + "\n".join(f"- light.room_{i} ('Room {i} light', area {i % 9}): off" for i in range(40)))


@pytest.fixture(scope="module")
def small_server(tmp_path_factory):
    """A pool of 2,048 cells for 4 sequences and 4 cached prefixes: the flood cannot all stay."""
    data = tmp_path_factory.mktemp("hearth-small")
    with HearthServer("--n-ctx", "2048", "--n-parallel", "4", "--prefix-cache-entries", "4",
                      data_dir=data) as s:
        yield s


async def _chat(session, url: str, content: str, priority: str, system: str | None = None,
                max_tokens: int = 8) -> dict:
    messages = [{"role": "system", "content": system}] if system else []
    body = {"messages": [*messages, {"role": "user", "content": content}],
            "max_tokens": max_tokens, "temperature": 0, "priority": priority}
    async with session.post(url + "/v1/chat/completions", json=body) as r:
        assert r.status == 200, await r.text()
        return await r.json()


async def _scenario(url: str) -> tuple[dict, dict, int]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=900)) as session:
        first = await _chat(session, url, "Turn on the kitchen light.", "voice", SYSTEM)
        await _chat(session, url, "Is the hall light on?", "voice", SYSTEM)  # the prefix serves

        async def one_off(i: int) -> None:  # each a different document: never asked again
            doc = " ".join(f"Paragraph {i}.{k}: the meter read {i * 31 + k} units." for k in
                           range(25))
            await _chat(session, url, f"Summarise: {doc}", "background", max_tokens=16)

        async def embed() -> None:
            texts = [f"Note {i}: the garage door was opened at {i % 24}:00." for i in range(60)]
            async with session.post(url + "/v1/embeddings", json={"input": texts}) as r:
                assert r.status == 200

        await asyncio.gather(*(one_off(i) for i in range(10)), embed())
        async with session.get(url + "/v1/queue") as r:
            evictions = (await r.json())["prefix_cache"]["evictions"]
        turn = await _chat(session, url, "Turn off the bedroom light.", "voice", SYSTEM)
    return first, turn, evictions


def test_a_voice_system_prompt_survives_a_flood_of_one_off_prompts(small_server):
    first, turn, evictions = asyncio.run(_scenario(small_server.url))
    assert evictions > 0, "the flood put the cache under pressure"
    prompt = first["usage"]["prompt_tokens"]
    cached = turn["usage"]["prompt_tokens_details"]["cached_tokens"]
    # The system prompt and the chat template's head: all but the new question's tokens.
    assert cached >= prompt - 16, (cached, prompt)
