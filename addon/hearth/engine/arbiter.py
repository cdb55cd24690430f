"""The engines of one process, and what each may read of the others' work to apply
:class:`~hearth.policy.arbitration.Arbitration` (the decision is the policy's; this module is
the threads' side: best ranks read from copies, pauses timed, a running prefill cut)."""

from __future__ import annotations

import threading
import time
from typing import Any

from ..policy.arbitration import IDLE_RANK, Arbitration
from ..policy.classes import VOICE_RANK

PAUSE_POLL_S = 0.01  # how often a paused engine looks again


def best_rank(core: Any) -> int:
    """The best class among a core's running, waiting and arriving requests. Read from another
    thread: copies of lists the engine thread replaces, never iterated in place."""
    ranks = [r.rank for r in (*list(core.running), *list(core.waiting),
                              *list(core.embed_waiting))]
    ranks += [x.rank for kind, x in list(core._inbox) if kind == "add"]
    sats = getattr(core, "satellites", None)
    if sats is not None and sats.book.live():  # a wake word: its voice turn is coming
        ranks.append(VOICE_RANK)
    return min(ranks, default=IDLE_RANK)


class Arbiter:
    def __init__(self, rule: Arbitration | None = None):
        self.rule = rule or Arbitration()
        self._cores: list[Any] = []
        self._lock = threading.Lock()
        self.paused_s: dict[int, float] = {}  # by id(core): time spent paused for others

    def join(self, core: Any) -> None:
        with self._lock:
            self._cores = [*self._cores, core]
        core.arbiter = self

    def leave(self, core: Any) -> None:
        with self._lock:
            self._cores = [c for c in self._cores if c is not core]
        core.arbiter = None

    def _others(self, core: Any) -> list[Any]:
        return [c for c in self._cores if c is not core]

    def pause(self, core: Any, stop: threading.Event) -> bool:
        """Called by an engine thread with work before an iteration: waits while the rule says
        so. Returns whether it waited."""
        t0 = time.monotonic()
        waited = 0.0
        while not stop.is_set():
            others = [best_rank(c) for c in self._others(core)]
            if not self.rule.must_pause(best_rank(core), others, waited):
                break
            core.wakeup.wait(PAUSE_POLL_S)
            core.wakeup.clear()
            waited = time.monotonic() - t0
        if waited:
            self.paused_s[id(core)] = self.paused_s.get(id(core), 0.0) + waited
        return waited > 0

    def arrived(self, core: Any, rank: int) -> None:
        """A request of ``rank`` reached ``core``: another engine's running decode that only
        prefills lower classes is cut now (its finished micro-batches are kept), not at its
        end, as one engine cuts its own for a voice request."""
        if not self.rule.may_cut_others(rank):
            return  # without looking at the other engines' work
        for other in self._others(core):
            if not self.rule.must_pause(best_rank(other), [rank], 0.0):
                continue
            with other.lock:
                inflight = other._inflight
                if inflight is not None and inflight[1] >= other.cfg.min_prefill_chunk \
                        and inflight[0] > rank:
                    other.b.request_abort()
