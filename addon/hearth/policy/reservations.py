"""Reservations on the wake word: a satellite heard its wake word, so a voice turn for one model
comes in a few seconds (speech-to-text runs in between). While a reservation of a model is
live its engine starts no prompt chunk of a lower class, so the voice turn finds the machine
free. Plain Python, no llama.cpp, on any clock (the engine's: virtual in the simulation).

Bounded so that no flood of signals starves lower classes:

- each reservation expires (``ttl_s``, at most ``MAX_TTL_S``); a satellite holds at most one
  (a second replaces the first);
- a satellite whose reservation expired unused (no voice turn came) gets half the time on its
  next one, and half again after another: a satellite stuck on ``listening`` costs little; a
  voice turn that comes gives its full time back;
- a model is held at most ``MAX_HOLD_S`` without a break, then free for ``BREAK_S`` whatever
  reservations say: lower classes always progress.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

MAX_TTL_S = 15.0
MIN_TTL_S = 0.25
MAX_HOLD_S = 15.0
BREAK_S = 2.0
MAX_LIVE = 32  # reservations held at once (a household has a few satellites)


@dataclass
class Reservation:
    id: str
    satellite: str
    expires_at: float
    used: bool = False  # ended by its voice turn


class Reservations:
    """The live reservations of one model's engine. Any thread may call; ``clock`` is the
    engine's."""

    def __init__(self, ttl_s: float = 5.0, clock: Callable[[], float] | None = None):
        self.ttl_s = min(ttl_s, MAX_TTL_S)
        self.clock = clock or time.monotonic
        self._lock = threading.Lock()
        self._live: dict[str, Reservation] = {}  # by satellite
        self._strikes: dict[str, int] = {}  # by satellite: expired unused in a row
        self._hold_from: float | None = None  # when the current unbroken hold began
        self._break_until = -1.0
        self.opened = 0
        self.ended_by_voice = 0
        self.expired = 0

    def open(self, satellite: str, ttl_s: float | None = None) -> Reservation:
        """Reserve for ``satellite`` (replacing its live one): its time, halved per unused
        expiry in a row."""
        now = self.clock()
        with self._lock:
            self._expire(now)
            ttl = min(MAX_TTL_S, self.ttl_s if ttl_s is None else ttl_s)
            ttl = max(MIN_TTL_S, ttl / 2 ** self._strikes.get(satellite, 0))
            old = self._live.pop(satellite, None)
            if old is None and len(self._live) >= MAX_LIVE:  # the one ending soonest goes
                del self._live[min(self._live.values(), key=lambda x: x.expires_at).satellite]
            r = Reservation(old.id if old else "rsv_" + uuid.uuid4().hex[:16], satellite,
                            now + ttl)
            self._live[satellite] = r
            self.opened += 1
            return r

    def end(self, rid: str) -> bool:
        """End one by its id (DELETE): neither used nor a strike. False if unknown."""
        with self._lock:
            self._expire(self.clock())
            for sat, r in list(self._live.items()):
                if r.id == rid:
                    del self._live[sat]
                    return True
        return False

    def voice_arrived(self, satellite: str | None) -> Reservation | None:
        """A voice request came: it ends its satellite's reservation (or, sent without a
        satellite, the one ending soonest). Its satellite's strikes are forgiven."""
        with self._lock:
            self._expire(self.clock())
            if satellite is not None:
                self._strikes.pop(satellite, None)
                r = self._live.pop(satellite, None)
            elif self._live:
                r = min(self._live.values(), key=lambda x: x.expires_at)
                del self._live[r.satellite]
            else:
                r = None
            if r is not None:
                r.used = True
                self.ended_by_voice += 1
            return r

    def holds(self) -> bool:
        """Whether lower classes must not start prompt chunks now."""
        now = self.clock()
        with self._lock:
            self._expire(now)
            if not self._live or now < self._break_until:
                if not self._live:
                    self._hold_from = None
                return False
            if self._hold_from is None:
                self._hold_from = now
            if now - self._hold_from >= MAX_HOLD_S:  # a break, whatever is reserved
                self._break_until = now + BREAK_S
                self._hold_from = None
                return False
            return True

    def expires_in(self, satellite: str) -> float | None:
        with self._lock:
            r = self._live.get(satellite)
            return None if r is None else max(0.0, r.expires_at - self.clock())

    def live(self) -> int:
        with self._lock:
            self._expire(self.clock())
            return len(self._live)

    def _expire(self, now: float) -> None:
        for sat, r in list(self._live.items()):
            if r.expires_at <= now:
                del self._live[sat]
                self._strikes[sat] = min(8, self._strikes.get(sat, 0) + 1)
                self.expired += 1
        if len(self._strikes) > 4 * MAX_LIVE:  # forget the oldest satellites' strikes
            for sat in list(self._strikes)[: len(self._strikes) - 4 * MAX_LIVE]:
                del self._strikes[sat]
