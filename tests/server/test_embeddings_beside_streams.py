"""The real model: a voice reply keeps streaming while a large embedding request runs."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest

pytestmark = pytest.mark.model


async def _stream_and_embed(url: str) -> tuple[list[float], float, float]:
    """Stream a long voice reply; once it flows, send 200 inputs to embed. Returns the
    arrival times of the reply's tokens and the embedding request's start and end."""
    times: list[float] = []
    window: dict[str, float] = {}
    flowing = asyncio.Event()
    body = {"messages": [{"role": "user", "content": "Tell me a long story about a lamp."}],
            "stream": True, "max_tokens": 400, "ignore_eos": True, "priority": "voice"}
    texts = [f"Household note {i}: the kitchen light was left on in room {i % 7}."
             for i in range(200)]

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
        async def stream() -> None:
            async with session.post(url + "/v1/chat/completions", json=body) as r:
                assert r.status == 200
                async for line in r.content:
                    if line.startswith(b"data: ") and b'"content"' in line:
                        times.append(time.monotonic())
                        if len(times) >= 5:
                            flowing.set()

        async def embed() -> None:
            await flowing.wait()
            window["start"] = time.monotonic()
            async with session.post(url + "/v1/embeddings", json={"input": texts}) as r:
                assert r.status == 200
                assert len((await r.json())["data"]) == 200
            window["end"] = time.monotonic()

        await asyncio.gather(stream(), embed())
    return times, window["start"], window["end"]


def test_a_voice_stream_keeps_flowing_while_200_inputs_are_embedded(server):
    """Tokens keep arriving all through the embedding request (it once froze every stream
    until the last input was embedded), and the embeddings still finish."""
    times, start, end = asyncio.run(_stream_and_embed(server.url))
    during = [t for t in times if start <= t <= end]
    # The embedding request takes many decodes; the stream must have moved all through it:
    # tokens in each third of its lifetime, not only around its end.
    thirds = [sum(1 for t in during if start + k * (end - start) / 3 <= t
                  < start + (k + 1) * (end - start) / 3) for k in range(3)]
    assert all(n > 0 for n in thirds), (thirds, end - start)
