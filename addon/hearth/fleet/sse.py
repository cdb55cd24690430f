"""Reading an OpenAI-style streamed answer (server-sent events): the JSON of each ``data:``
line, as it arrives. A remote worker's streams are read with it, and so are the benchmarks'."""

from __future__ import annotations

import json
from collections.abc import AsyncIterable, AsyncIterator
from typing import Any


async def data_json(lines: AsyncIterable[bytes]) -> AsyncIterator[dict[str, Any]]:
    """Each ``data:`` line's JSON until ``[DONE]`` or the stream's end; comments (Hearth's
    ``: queued`` places) and blank lines are skipped. Raises ValueError on a line that is not
    JSON."""
    async for raw in lines:
        line = raw.strip()
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]":
            return
        yield json.loads(data)
