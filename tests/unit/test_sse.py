"""The reader of streamed answers (hearth.fleet.sse: a remote worker's streams, the
benchmarks'): the JSON of each data line, in order, skipping comments (Hearth's queue places)
and blank lines, and nothing after [DONE]."""

from __future__ import annotations

import asyncio

from hearth.fleet.sse import data_json


async def _lines(*lines: bytes):
    for line in lines:
        yield line


def test_chunks_are_the_data_lines_up_to_done():
    lines = _lines(
        b": queued position=2 eta_s=1.5\n", b"\n", b'data: {"a": 1}\n', b"\n",
        b'data:{"b": [2]}\r\n', b"data: [DONE]\n", b'data: {"late": true}\n')

    async def read() -> list:
        return [c async for c in data_json(lines)]

    assert asyncio.run(read()) == [{"a": 1}, {"b": [2]}]
