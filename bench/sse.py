"""The JSON chunks of an OpenAI-style streamed answer (server-sent events), for the benchmarks
that time streams over aiohttp."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp


async def chunks(response: aiohttp.ClientResponse) -> AsyncIterator[dict[str, Any]]:
    """Each ``data:`` line's JSON, as it arrives, until ``[DONE]`` or the stream's end."""
    async for raw in response.content:
        line = raw.strip()
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]":
            return
        yield json.loads(data)
