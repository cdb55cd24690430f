"""Queue health pushed as server-sent events: ``GET /v1/queue/events``.

Each event is ``event: queue`` with the JSON body ``GET /v1/queue`` answers: one when the client
connects, then one whenever that body changes, at most one a second, and a keepalive comment
while nothing changes, so a client (Home Assistant's coordinator) keeps one connection open
instead of polling ``/v1/queue``.

A route of its own rather than an opt-in on ``/v1/events``: the job stream is a log, each event
numbered and replayed from ``Last-Event-ID`` to a client that reconnects, while queue health is a
state where only the latest value counts and nothing is replayed. Apart, the job stream keeps its
numbering and its clients see no new event type; each stream can be followed alone.

One :class:`QueueFeed` per application samples the body once a second while anyone listens
(however many do) and wakes the subscribers when it changed; a slow subscriber skips to the
latest body rather than queueing old ones.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from functools import partial
from typing import Any

from aiohttp import web

from .http import CLOSING, FLEET, JOBS, KEEPALIVE_S, SSE_KEEPALIVE, ready

log = logging.getLogger(__name__)

QUEUE_EVENTS_PATH = "/v1/queue/events"
FEATURE = "queue_events"  # named in /health's features by a server that has the route
TICK_S = 1.0  # how often the feed samples the body: the most events a second


async def queue_body(app: web.Application) -> dict[str, Any]:
    """The body of ``GET /v1/queue``: the voice model's queue (the household's headline),
    every model's residency, jobs."""
    fleet = app[FLEET]
    rt = fleet.primary.rt
    out: dict[str, Any] = {"model": rt.model_id, "policy": fleet.settings.policy}
    core = rt.core
    if core is not None and rt.state == "ready":
        with core.lock:
            state = core.queue_state()
        out.update(state, **core.stats.snapshot(core.b.now()))
    out.update(fleet.report())
    out["worker"] = out["models"].get(fleet.primary.name, {}).get("worker")
    out["jobs"] = await asyncio.to_thread(app[JOBS].store.counts)
    return out


def _encode(body: dict[str, Any]) -> bytes:
    return json.dumps(body, separators=(",", ":")).encode()


class QueueFeed:
    """Samples the queue body while anyone subscribes; ``version`` counts the changes."""

    def __init__(self, app: web.Application, tick_s: float = TICK_S) -> None:
        self.app = app
        self.tick_s = tick_s
        self.body = b""
        self.version = 0
        self.changed = asyncio.Condition()
        self.subscribers = 0
        self.closed = False
        self._task: asyncio.Task[None] | None = None

    async def sample(self) -> bytes:
        """Read the body now; a change wakes the subscribers."""
        body = _encode(await queue_body(self.app))
        if body != self.body:
            self.body = body
            self.version += 1
            async with self.changed:
                self.changed.notify_all()
        return body

    async def _run(self) -> None:
        while self.subscribers and not self.closed:
            await asyncio.sleep(self.tick_s)
            try:
                await self.sample()
            except Exception:  # a bad sample must not end the feed for every subscriber
                log.exception("cannot read the queue health")

    def past(self, version: int) -> bool:
        """Whether the body changed since ``version`` (or the feed closed)."""
        return self.version != version or self.closed

    def join(self) -> None:
        self.subscribers += 1
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name="hearth queue feed")

    def leave(self) -> None:
        self.subscribers -= 1  # the sampler stops at its next tick when this was the last

    async def close(self) -> None:
        """End the streams (the server is stopping) instead of holding the shutdown."""
        self.closed = True
        if self._task is not None:
            self._task.cancel()
        async with self.changed:
            self.changed.notify_all()


FEED = web.AppKey("queue_feed", QueueFeed)


async def queue_events(request: web.Request) -> web.StreamResponse:
    """Queue health as SSE: the body now, then each change (at most one a second)."""
    ready(request)
    feed = request.app[FEED]
    closing = request.app[CLOSING]
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                       "Cache-Control": "no-cache"})
    await resp.prepare(request)
    feed.join()
    try:
        sent = await feed.sample()  # fresh for this client, not up to a tick old
        seen = feed.version
        await resp.write(b"event: queue\ndata: " + sent + b"\n\n")
        sent_at = time.monotonic()
        while not (closing.is_set() or feed.closed):
            if request.transport is None or request.transport.is_closing():
                break  # the client left
            async with feed.changed:
                try:
                    await asyncio.wait_for(
                        feed.changed.wait_for(partial(feed.past, seen)), KEEPALIVE_S)
                except TimeoutError:
                    await resp.write(SSE_KEEPALIVE)
                    continue
            if feed.closed or closing.is_set():
                break
            # A client that connected mid-tick may see the feed catch up within a second.
            if (wait := sent_at + feed.tick_s - time.monotonic()) > 0:
                await asyncio.sleep(wait)
            seen = feed.version
            if feed.body != sent:
                sent = feed.body
                await resp.write(b"event: queue\ndata: " + sent + b"\n\n")
                sent_at = time.monotonic()
    except ConnectionResetError:
        pass  # the client left mid-write
    finally:
        feed.leave()
    return resp


def install(app: web.Application) -> None:
    """Add the route and its feed to the application."""
    feed = QueueFeed(app)
    app[FEED] = feed
    app.router.add_get(QUEUE_EVENTS_PATH, queue_events)

    async def close(_app: web.Application) -> None:
        await feed.close()

    app.on_shutdown.append(close)
