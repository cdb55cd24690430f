"""Server-sent events as the Hearth server streams them, and the queue status it reports in
their comments (``: queued position=N eta_s=X``) while a request waits."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp


@dataclass(slots=True)
class ServerEvent:
    """One server-sent event."""

    id: str | None
    event: str
    data: str

    def json(self) -> Any:
        """Return the event's data decoded as JSON."""
        return json.loads(self.data)


@dataclass(frozen=True, slots=True)
class QueueStatus:
    """Where a waiting request stands: its place in line (1: next) and the seconds the server
    expects before its first token."""

    position: int | None
    eta_s: float | None


def parse_queued(comment: str) -> QueueStatus | None:
    """The status a ``queued position=N eta_s=X`` comment (without its colon) reports; None
    for any other comment (keep-alives). A field missing or unreadable is None."""
    words = comment.split()
    if not words or words[0] != "queued":
        return None
    fields = dict(word.partition("=")[::2] for word in words[1:])
    try:
        position: int | None = int(fields["position"])
    except (KeyError, ValueError):
        position = None
    try:
        eta_s: float | None = float(fields["eta_s"])
    except (KeyError, ValueError):
        eta_s = None
    return QueueStatus(position, eta_s)


async def _iter_lines(response: aiohttp.ClientResponse) -> AsyncIterator[str]:
    """Yield the lines of a streamed body; lines may be longer than aiohttp's line limit."""
    buffer = b""
    async for chunk in response.content.iter_any():
        buffer += chunk
        while True:
            index = buffer.find(b"\n")
            if index < 0:
                break
            line, buffer = buffer[:index], buffer[index + 1 :]
            yield line.rstrip(b"\r").decode(errors="replace")
    if buffer:
        yield buffer.rstrip(b"\r").decode(errors="replace")


async def iter_sse(
    response: aiohttp.ClientResponse,
    on_queued: Callable[[QueueStatus], None] | None = None,
) -> AsyncIterator[ServerEvent]:
    """Parse a text/event-stream body into events. Comments are not events: a queue status
    among them goes to ``on_queued``, the others (keep-alives) are skipped."""
    event_id: str | None = None
    event_type = "message"
    data: list[str] = []
    async for line in _iter_lines(response):
        if not line:
            if data:
                yield ServerEvent(event_id, event_type, "\n".join(data))
            event_type = "message"
            data = []
            continue
        if line.startswith(":"):
            if on_queued is not None and (status := parse_queued(line[1:])) is not None:
                on_queued(status)
            continue
        field, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if field == "data":
            data.append(value)
        elif field == "event":
            event_type = value or "message"
        elif field == "id":
            event_id = value
    if data:
        yield ServerEvent(event_id, event_type, "\n".join(data))
