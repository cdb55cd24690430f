"""Queue health pushed over SSE (GET /v1/queue/events, issue 29): the body /v1/queue answers on
connecting, a later event after a request changed it, no flood, and a stop that the open stream
does not hold up."""

from __future__ import annotations

import asyncio
import json
import signal
import time
from itertools import pairwise
from typing import Any

import aiohttp
import pytest
from hearth_server import HearthServer

pytestmark = pytest.mark.model

QUEUE_EVENTS = "/v1/queue/events"


async def _events(resp: aiohttp.ClientResponse):
    """(receipt time, event type, data) of each event; comments are yielded as ("comment")."""
    event, data = "message", []
    async for raw in resp.content:
        line = raw.decode().rstrip("\r\n")
        if not line:
            if data:
                yield time.monotonic(), event, "\n".join(data)
            event, data = "message", []
        elif line.startswith(":"):
            yield time.monotonic(), "comment", line
        elif line.startswith("event:"):
            event = line.split(":", 1)[1].strip()
        elif line.startswith("data:"):
            data.append(line.split(":", 1)[1].strip())


def _chat_completed(body: dict[str, Any]) -> int:
    return body["classes"]["chat"]["completed"]


def test_health_names_the_stream(server):
    status, health = server.get("/health")
    assert status == 200 and "queue_events" in health["features"]
    status, spec = server.get("/openapi.json")
    assert QUEUE_EVENTS in spec["paths"]


def test_initial_event_then_a_change_after_a_request(server):
    async def run() -> tuple[dict, list[tuple[float, str, str]], dict]:
        async with aiohttp.ClientSession() as session, \
                session.get(server.url + QUEUE_EVENTS) as resp:
            assert resp.status == 200
            assert resp.headers["Content-Type"].startswith("text/event-stream")
            stream = _events(resp)
            async with asyncio.timeout(10):  # the first event comes at once, not after a tick
                _, kind, data = await anext(stream)
            assert kind == "queue"
            first = json.loads(data)
            # The same document as GET /v1/queue.
            status, polled = await asyncio.to_thread(server.get, "/v1/queue")
            assert status == 200 and first.keys() == polled.keys()
            assert first["model"] == polled["model"]

            # A chat request: its completion shows in a later event, without asking again.
            request = asyncio.create_task(asyncio.to_thread(
                server.post, "/v1/chat/completions",
                {"messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 4,
                 "priority": "chat"}))
            seen: list[tuple[float, str, str]] = []
            async with asyncio.timeout(120):
                async for at, kind, data in stream:
                    seen.append((at, kind, data))
                    if kind == "queue" and _chat_completed(json.loads(data)) > \
                            _chat_completed(first):
                        break
            status, answer = await request
            assert status == 200, answer
            return first, seen, json.loads(seen[-1][2])

    first, seen, last = asyncio.run(run())
    assert _chat_completed(last) == _chat_completed(first) + 1
    queue_events = [(at, data) for at, kind, data in seen if kind == "queue"]
    # Each event is a change: no two in a row carry the same body.
    bodies = [data for _, data in queue_events]
    assert all(a != b for a, b in pairwise(bodies))
    # Rate-limited: the server sends at most one a second (receipt may bunch a little).
    gaps = [b - a for (a, _), (b, _) in pairwise(queue_events)]
    assert all(gap > 0.5 for gap in gaps), gaps


def test_key_required_and_stop_not_held_by_an_open_stream(tmp_path):
    key = "queue-stream-key"
    srv = HearthServer(data_dir=tmp_path, env={"HEARTH_API_KEY": key}).start()

    async def run() -> float:
        async with aiohttp.ClientSession() as session:
            async with session.get(srv.url + QUEUE_EVENTS) as resp:
                assert resp.status == 401
            async with session.get(srv.url + QUEUE_EVENTS,
                                   headers={"Authorization": f"Bearer {key}"}) as resp:
                assert resp.status == 200
                stream = _events(resp)
                async with asyncio.timeout(10):
                    _, kind, _ = await anext(stream)
                assert kind == "queue"
                stopped = time.monotonic()
                srv.proc.send_signal(signal.SIGTERM)
                async with asyncio.timeout(30):  # the stream ends with the server
                    async for _ in stream:
                        pass
                return time.monotonic() - stopped

    try:
        ended_after = asyncio.run(run())
        assert srv.proc.wait(30) == 0
    finally:
        srv.stop()
    # Not after the 15 s keepalive or the server's shutdown timeout.
    assert ended_after < 10, ended_after
