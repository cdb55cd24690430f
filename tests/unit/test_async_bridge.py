"""The bridge from the engine thread to asyncio: every event arrives, in order, with fewer
wake-ups of the loop than posts."""

from __future__ import annotations

import asyncio
import threading

from hearth.engine import AsyncStream
from hearth.shared.requests import Event


def test_events_from_another_thread_arrive_whole_and_in_order_with_batched_wakeups():
    async def main() -> tuple[list[list[str]], int]:
        loop = asyncio.get_running_loop()
        wakeups = 0
        real = loop.call_soon_threadsafe

        def counting(cb, *args, **kw):
            nonlocal wakeups
            wakeups += 1
            return real(cb, *args, **kw)

        loop.call_soon_threadsafe = counting  # type: ignore[method-assign]
        streams = [AsyncStream() for _ in range(8)]

        def engine() -> None:  # 200 iterations, each flushing one token to every stream
            for i in range(200):
                for s in streams:
                    s([Event("token", text=str(i))])
            for s in streams:
                s([Event("done", finish_reason="stop")])

        t = threading.Thread(target=engine)
        t.start()

        async def collect(s: AsyncStream) -> list[str]:
            return [ev.text async for ev in s.events() if ev.kind == "token"]

        got = await asyncio.gather(*(collect(s) for s in streams))
        t.join()
        return got, wakeups

    got, wakeups = asyncio.run(main())
    assert all(g == [str(i) for i in range(200)] for g in got)
    assert wakeups < 8 * 201  # one per batch, not one per post
