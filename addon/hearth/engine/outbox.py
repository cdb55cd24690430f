"""What the engine owes its requests' sinks, a part of the engine: the events an iteration
produced, delivered together after it (one call per request, not one per token), and the
requests still to be answered, by id (a cancellation finds them here)."""

from __future__ import annotations

import logging

from ..shared.requests import Event, Request

log = logging.getLogger("hearth.engine")


class Outbox:
    def __init__(self) -> None:
        self.by_id: dict[int, Request] = {}
        self._events: dict[int, list[Event]] = {}

    def track(self, r: Request) -> None:
        self.by_id[r.id] = r

    def forget(self, r: Request) -> None:
        """``r`` will get no more events (answered by whoever took it)."""
        self.by_id.pop(r.id, None)

    def emit(self, r: Request, ev: Event) -> None:
        self._events.setdefault(r.id, []).append(ev)

    def flush(self) -> None:
        """Deliver what was emitted; a request whose last event was its end is forgotten."""
        if not self._events:
            return
        events, self._events = self._events, {}
        for rid, evs in events.items():
            r = self.by_id.get(rid)
            if r is not None:
                if any(e.kind in ("done", "error") for e in evs):
                    self.by_id.pop(rid, None)
                try:
                    r.sink(evs)
                except Exception:  # a broken consumer must not stop the engine
                    log.exception("event sink of request %s failed", rid)
