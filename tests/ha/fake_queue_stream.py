"""The fake server's queue stream (``GET /v1/queue/events``): the queue on connecting, then the
queue again each time a test pushes it."""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING, Any

from aiohttp import web

if TYPE_CHECKING:
    from .fake_hearth import FakeHearth

FEATURE = "queue_events"  # what /health's features name it


class FakeQueueStream:
    """Serves the stream for a :class:`FakeHearth`; a test pushes or ends it."""

    def __init__(self, fake: FakeHearth) -> None:
        self.fake = fake
        self.connections = 0  # subscriptions accepted so far
        # The stream answers this status instead (404: a server without it).
        self.status: int | None = None
        self._subscribers: list[asyncio.Queue[dict[str, Any] | None]] = []

    @property
    def subscribers(self) -> int:
        """The streams open now."""
        return len(self._subscribers)

    def push(self) -> None:
        """Send the fake's queue as it is now to every open stream."""
        for queue in self._subscribers:
            queue.put_nowait(json.loads(json.dumps(self.fake.queue)))

    def end(self) -> None:
        """Close every open stream (the connection drops)."""
        for queue in self._subscribers:
            queue.put_nowait(None)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if not self.fake._authorized(request):
            return self.fake._unauthorized()
        if self.status is not None:
            return self.fake._error(self.status)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        self.connections += 1
        queue: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
        self._subscribers.append(queue)
        try:
            body: dict[str, Any] | None = self.fake.queue
            while body is not None:
                await response.write(f"event: queue\ndata: {json.dumps(body)}\n\n".encode())
                body = await queue.get()
        finally:
            self._subscribers.remove(queue)
        return response
