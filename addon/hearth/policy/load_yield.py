"""A model's load yields to the voice and chat work of the models already serving.

Loading a model (its weights read and repacked, the canary decode), its calibration decodes and
the restore of its saved prefixes take the same CPU cores as a voice turn on another model:
measured before this rule, a SmolLM2 voice reply took 3.5 s while Gemma 3 270M loaded, against
~0.3 s idle. So a load that nobody interactive waits for, while another model serves, runs at
the lowest CPU priority (with no other model serving there is nobody to yield to, and a load at
the lowest priority would only lose to whatever else the machine runs), and pauses while another
model has voice or chat work that outranks what waits for the load. Two bounds keep every load
finishing: a pause lasts ``max_pause_s`` at most, after which the load runs ``min_run_s`` before
it may pause again (it is never paused more than ``max_pause_s / (max_pause_s + min_run_s)`` of
the time), and once it has been paused ``boost_after_s`` in all, or as soon as a voice or chat
request waits for the model being loaded, it leaves the lowest priority (at its next call) and
pauses no more."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from .arbitration import IDLE_RANK
from .classes import INTERACTIVE_RANK

__all__ = ["IDLE_RANK", "LoadClock", "LoadYield"]


@dataclass(frozen=True)
class LoadYield:
    enabled: bool = True
    max_pause_s: float = 2.0
    min_run_s: float = 0.5
    boost_after_s: float = 10.0

    @property
    def max_pause_share(self) -> float:
        return self.max_pause_s / (self.max_pause_s + self.min_run_s)

    def low_priority(self, own: int, serving: bool) -> bool:
        """Whether a load starts at the lowest CPU priority, ``own`` being the best class
        waiting for it (IDLE_RANK: none; a model loaded at start or for a job) and
        ``serving`` whether another model on this machine serves (idle or not)."""
        return self.enabled and serving and own > INTERACTIVE_RANK

    def wants_pause(self, own: int, others: Iterable[int]) -> bool:
        """Whether the load would pause now, before its bounds: another model has voice or
        chat work of a better class than what waits for the load."""
        if not self.enabled:
            return False
        best = min(others, default=IDLE_RANK)
        return best <= INTERACTIVE_RANK and own > best


@dataclass
class LoadClock:
    """One load's pauses over time (pure: the caller gives ``now``). :meth:`step` says
    whether the load is paused from ``now`` on; the bounds of :class:`LoadYield` hold
    whatever it is asked."""

    rule: LoadYield
    paused_since: float | None = None
    run_until: float = 0.0  # a pause that ran out: the load runs until then, whatever comes
    paused_s: float = 0.0  # pauses that ended, in all
    pauses: int = 0
    boosted: bool = False  # left the lowest priority: pauses no more
    why: str | None = field(default=None)  # why it was boosted

    def held_s(self, now: float) -> float:
        """Time paused so far, the pause under way included."""
        return self.paused_s + (now - self.paused_since if self.paused_since is not None
                                else 0.0)

    def step(self, own: int, others: Iterable[int], now: float) -> bool:
        want = self.rule.wants_pause(own, list(others))
        if not self.boosted:
            if own <= INTERACTIVE_RANK:
                self.boost("a voice or chat request waits for this model")
            elif self.held_s(now) >= self.rule.boost_after_s:
                self.boost(f"paused {self.rule.boost_after_s:g} s in all")
        if self.paused_since is not None:
            ran_out = now - self.paused_since >= self.rule.max_pause_s
            if want and not ran_out and not self.boosted:
                return True
            self.paused_s += now - self.paused_since
            self.paused_since = None
            if ran_out:
                self.run_until = now + self.rule.min_run_s
            return False
        if want and not self.boosted and now >= self.run_until:
            self.paused_since = now
            self.pauses += 1
            return True
        return False

    def boost(self, why: str) -> None:
        if not self.boosted:
            self.boosted, self.why = True, why

    def end(self, now: float) -> None:
        if self.paused_since is not None:
            self.paused_s += now - self.paused_since
            self.paused_since = None
