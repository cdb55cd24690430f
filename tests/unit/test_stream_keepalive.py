"""A streamed answer that is silent for a while (a long prompt on a slow CPU, a tool call held
until it is whole) carries keepalive comments, so clients that give up on a silent socket
(Home Assistant's integration: 300 s) wait for it; frames still come in order, none lost."""

from __future__ import annotations

import asyncio

from hearth.api import http

KEEP = b": keepalive\n\n"


def test_silence_is_filled_with_keepalives_and_every_frame_still_comes(monkeypatch):
    monkeypatch.setattr(http, "KEEPALIVE_S", 0.01)

    async def run() -> list[bytes]:
        go = asyncio.Event()

        async def frames():
            yield b"first"
            await go.wait()  # silent until the consumer has seen a keepalive
            yield b"second"
            yield b"third"

        out = []
        async for frame in http._kept_alive(frames(), KEEP):
            out.append(frame)
            if frame == KEEP:
                go.set()
        return out

    out = asyncio.run(run())
    assert [f for f in out if f != KEEP] == [b"first", b"second", b"third"]
    assert out.index(KEEP) == 1  # in the silence, not before the first frame


def test_a_client_leaving_closes_the_source_and_its_pending_read(monkeypatch):
    monkeypatch.setattr(http, "KEEPALIVE_S", 0.01)

    async def run() -> tuple[list[bytes], bool]:
        closed = asyncio.Event()

        async def frames():
            try:
                for i in range(3):
                    yield b"%d" % i
                await asyncio.Event().wait()  # never ends: the client leaves first
            finally:
                closed.set()

        kept = http._kept_alive(frames(), KEEP)
        got = [await anext(kept) for _ in range(4)]  # the fourth: a keepalive, a read pending
        await kept.aclose()  # the client left
        await asyncio.wait_for(closed.wait(), 5)
        return got, closed.is_set()

    assert asyncio.run(run()) == ([b"0", b"1", b"2", KEEP], True)
