"""What the engine does for voice satellites: reservations on the wake word
(:mod:`hearth.policy.reservations`: while one is live, lower classes start no prompt chunk and
one in flight is cut at its next micro-batch, as a voice arrival cuts it; nothing is lost,
the cut chunk is computed again after), and a newer voice turn from a satellite superseding
its older one that still waits (409 ``superseded``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..policy.classes import VOICE_RANK
from ..policy.reservations import Reservation, Reservations
from ..shared.requests import Request

if TYPE_CHECKING:
    from .core import EngineCore

SATELLITE = "satellite"  # Request.meta: the X-Hearth-Satellite it came from
RESERVATION_WARM = "reservation_warm"  # Request.meta: a reservation's warm-up (ends nothing)


class Satellites:
    def __init__(self, core: EngineCore, ttl_s: float = 5.0):
        self._core = core
        self.book = Reservations(ttl_s, clock=core.b.now)
        self._newest: dict[str, Request] = {}  # satellite -> its newest voice request

    # -- any thread ------------------------------------------------------------------------
    def reserve(self, satellite: str, ttl_s: float | None = None) -> Reservation:
        core = self._core
        r = self.book.open(satellite, ttl_s)
        with core.lock:  # a lower-class chunk in flight is cut now, not at its end
            inflight = core._inflight
            if inflight is not None and inflight[0] > VOICE_RANK \
                    and inflight[1] >= core.cfg.min_prefill_chunk:
                core.b.request_abort()
        core.wakeup.set()
        return r

    def arrived(self, r: Request) -> None:
        """A request was submitted: a voice turn ends its satellite's reservation."""
        if r.rank == VOICE_RANK and r.kind == "generate" and not r.meta.get(RESERVATION_WARM):
            self.book.voice_arrived(r.meta.get(SATELLITE))

    # -- the engine thread -----------------------------------------------------------------
    def batchable(self, running: list[Request]) -> list[Request]:
        """``running`` less the lower classes' prompts while a reservation holds."""
        if not self.book.holds():
            return running
        return [r for r in running if r.rank <= VOICE_RANK or r.remaining <= 1]

    def taken_in(self, r: Request, now: float) -> None:
        """``r`` joined the wait queue: an older voice turn of its satellite still waiting
        for its first admission is superseded."""
        sat = r.meta.get(SATELLITE)
        if sat is None or r.rank != VOICE_RANK:
            return
        old = self._newest.get(sat)
        self._newest[sat] = r
        if old is not None and not old.finished and old.first_admitted_at is None:
            self._core.retirer.fail(old, f"superseded by a newer voice request from {sat}",
                                    now, status=409, code="superseded")
        if len(self._newest) > 256:  # satellites' finished turns are forgotten
            self._newest = {s: x for s, x in self._newest.items() if not x.finished}
