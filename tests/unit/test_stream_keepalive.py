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


def test_a_waiting_stream_says_where_it_stands_when_that_changes(monkeypatch):
    """``: queued`` comments while the request waits: at once, then only on a change and at
    most one each STATUS_S; none once it runs (issue 45)."""
    monkeypatch.setattr(http, "STATUS_S", 0.05)
    monkeypatch.setattr(http, "STATUS_TICK_S", 0.01)
    places = [b": queued position=2 eta_s=3.0\n\n"] * 3 + \
        [b": queued position=1 eta_s=1.0\n\n"] * 20 + [None] * 1000

    async def run() -> list[bytes]:
        it = iter(places)

        async def frames():
            await asyncio.sleep(0.4)  # waits, then answers
            yield b"token"

        return [f async for f in http._kept_alive(frames(), KEEP, lambda: next(it))]

    out = asyncio.run(run())
    assert out == [b": queued position=2 eta_s=3.0\n\n", b": queued position=1 eta_s=1.0\n\n",
                   b"token"]
