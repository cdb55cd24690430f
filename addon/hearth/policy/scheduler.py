"""The scheduling policy: who is admitted, in what order prefill runs, who is preempted.

Plain Python, no llama.cpp: the engine asks, the policy answers. Three modes:

- ``hearth``: class rank (after aging), then the user's virtual token counter (VTC), then arrival;
  per-class caps while higher classes wait; higher classes may preempt lower ones (never voice).
- ``fifo``: arrival order, classes ignored, the same continuous batching; no priority preemption.
- ``serial``: arrival order, one sequence at a time (what a naive server does).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from .classes import BACKGROUND_RANK as BACKGROUND_RANK
from .classes import CHAT_RANK, INTERACTIVE_RANK, RANK_NAMES, VOICE_RANK
from .classes import CLASS_RANKS as CLASS_RANKS
from .classes import class_rank as class_rank
from .iteration import IterationRules
from .queue import Pass, WaitQueue

# VTC weights (Sheng et al., "Fairness in Serving Large Language Models"): output tokens cost
# about twice what prompt tokens cost to serve.
PROMPT_WEIGHT = 1.0
OUTPUT_WEIGHT = 2.0

MODES = ("hearth", "fifo", "serial")
# How many requests may pass one that waits for cells (Policy.may_overtake).
MAX_OVERTAKES = 8


def _users(waiting: Iterable[Schedulable]) -> set[str]:
    return waiting.users() if isinstance(waiting, WaitQueue) else {w.user for w in waiting}


class Schedulable(Protocol):
    """What the policy needs to know about a request."""

    id: int
    rank: int  # the class rank it was submitted with
    user: str
    arrival: float
    admitted_at: float | None  # when it last became running (newest-first preemption)


@dataclass
class PolicyConfig:
    mode: str = "hearth"
    n_parallel: int = 8
    aging_seconds: dict[str, float] = field(default_factory=lambda: {
        "agent": 30.0, "background": 20.0, "embedding": 30.0})
    caps: dict[str, float] = field(default_factory=lambda: {"background": 0.5, "embedding": 0.25})
    fair_slots: bool = True  # a member over its share of slots yields one to a member behind
    # Counters halve every this many seconds (None: never), so service long past is forgiven:
    # a member who ran one long summary an hour ago is not behind one who holds every slot now.
    vtc_half_life_s: float | None = 300.0
    # Voice turns may run this many beyond n_parallel (on sequence ids the prefix cache holds)
    # rather than preempt a stream for its slot: the stream stalled for the whole voice turn
    # (0.94 s); one more token in each batch costs next to nothing.
    voice_spare_slots: int = 2

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"policy must be one of {MODES}, got {self.mode!r}")


class Policy(IterationRules):
    """The class rules with the state they need: the members' counters, who is active."""

    def __init__(self, cfg: PolicyConfig):
        self.cfg = cfg
        self.vtc: dict[str, float] = {}  # each as of self._vtc_at[user] (decayed lazily)
        self._vtc_at: dict[str, float] = {}
        self._active: dict[str, int] = {}  # user -> requests waiting or running
        self._best_memo: tuple[tuple, int] = ((), 99)
        self._members_memo: tuple[tuple, int] = ((), 0)

    # -- fairness bookkeeping ---------------------------------------------------------------
    @property
    def max_running(self) -> int:
        return 1 if self.cfg.mode == "serial" else self.cfg.n_parallel

    def counter(self, user: str, now: float | None = None) -> float:
        """``user``'s virtual token counter at ``now`` (None: as last charged)."""
        v = self.vtc.get(user, 0.0)
        half = self.cfg.vtc_half_life_s
        at = self._vtc_at.get(user)
        if now is None or not half or at is None or now <= at or not v:
            return v
        return v * 0.5 ** ((now - at) / half)

    def _set(self, user: str, value: float, now: float | None) -> None:
        self.vtc[user] = value
        if now is not None:
            self._vtc_at[user] = now

    def user_arrived(self, user: str, now: float | None = None) -> None:
        """A request of ``user`` entered the system. A user returning from idleness has its
        counter lifted to the active minimum, so idleness earns no credit to burst with."""
        if self._active.get(user, 0) == 0:
            active = [self.counter(u, now) for u, n in self._active.items()
                      if n > 0 and u in self.vtc]
            floor = min(active) if active else 0.0
            self._set(user, max(self.counter(user, now) if user in self.vtc else floor, floor),
                      now)
        self._active[user] = self._active.get(user, 0) + 1

    def user_left(self, user: str) -> None:
        n = self._active.get(user, 0) - 1
        if n <= 0:
            self._active.pop(user, None)
        else:
            self._active[user] = n

    def charge(self, user: str, prompt_tokens: int = 0, output_tokens: int = 0,
               now: float | None = None) -> None:
        """Service received; prefix-cache hits and recomputed tokens are never passed here."""
        self._set(user, self.counter(user, now) + PROMPT_WEIGHT * prompt_tokens
                  + OUTPUT_WEIGHT * output_tokens, now)

    # -- ordering ---------------------------------------------------------------------------
    def aging_period(self, rank: int) -> float:
        """Seconds a waiting request of class ``rank`` waits per rank it goes up (0: never)."""
        if self.cfg.mode != "hearth" or rank <= CHAT_RANK:
            return 0.0
        return self.cfg.aging_seconds.get(RANK_NAMES[rank]) or 0.0

    def effective_rank(self, r: Schedulable, now: float) -> int:
        """Class rank after aging: one rank up per ``aging_seconds`` waited, never above chat."""
        period = self.aging_period(r.rank)
        if not period:
            return r.rank
        steps = math.floor(max(0.0, now - r.arrival) / period)
        return max(CHAT_RANK, r.rank - steps)

    def key(self, r: Schedulable, now: float, in_flight: dict[str, int] | None = None,
            counters: dict[str, float] | None = None) -> tuple:
        if self.cfg.mode == "hearth":
            # Equal counters (a returning user is lifted to the active minimum) go to the user
            # with fewer sequences running. ``counters``: memo for one sort (members repeat).
            if counters is None:
                c = self.counter(r.user, now)
            elif (c := counters.get(r.user)) is None:
                c = counters[r.user] = self.counter(r.user, now)
            return (self.effective_rank(r, now), c,
                    (in_flight or {}).get(r.user, 0), r.arrival, r.id)
        return (r.arrival, r.id)

    def keyer(self, now: float, running: Iterable[Schedulable] = ()
              ) -> Callable[[Schedulable], tuple]:
        """:meth:`key` at ``now`` beside ``running``, for one sort (members' counters kept)."""
        in_flight: dict[str, int] = {}
        for x in running:
            in_flight[x.user] = in_flight.get(x.user, 0) + 1
        counters: dict[str, float] = {}
        return lambda r: self.key(r, now, in_flight, counters)

    def order(self, reqs: Iterable[Schedulable], now: float,
              running: Iterable[Schedulable] = ()) -> list[Schedulable]:
        """Admission order of waiting requests, and prefill order of admitted ones."""
        return sorted(reqs, key=self.keyer(now, running))

    def order_pass(self, waiting: WaitQueue, now: float,
                   running: Iterable[Schedulable] = ()) -> Pass:
        """:meth:`order` of a :class:`WaitQueue`, lazily: a pass that stops early, or skips
        groups that cannot go, computes the keys of a few requests, not of the whole queue."""
        return Pass(waiting, self.keyer(now, running))

    # -- admission --------------------------------------------------------------------------
    def slots_for(self, r: Schedulable, spare_ids: int = 0) -> int:
        """The running sequences beside which ``r`` may still be admitted: ``max_running``,
        and for voice up to ``voice_spare_slots`` more where sequence ids are spare
        (``spare_ids``: free, or held by cached prefixes that may be given up)."""
        if self.cfg.mode == "hearth" and r.rank == VOICE_RANK:
            return self.max_running + min(self.cfg.voice_spare_slots, spare_ids)
        return self.max_running

    def may_admit(self, r: Schedulable, running: Sequence[Schedulable],
                  waiting: Sequence[Schedulable], now: float, spare_ids: int = 0) -> bool:
        """Slots (:meth:`slots_for`), and caps: a capped class holds at most its share of the
        running slots while a request of a higher class waits."""
        if len(running) >= self.slots_for(r, spare_ids):
            return False
        if self.cfg.mode != "hearth":
            return True
        cap = self.cfg.caps.get(RANK_NAMES[r.rank])
        if cap is None:
            return True
        if self.best_rank(waiting, now) >= self.effective_rank(r, now):  # none higher waits
            return True
        same = sum(1 for x in running if x.rank == r.rank)
        return same < max(1, math.floor(cap * self.cfg.n_parallel))

    def begin_pass(self) -> None:
        """An admission pass starts: what was memoized for the last one is stale."""
        self._best_memo = ((), 99)
        self._members_memo = ((), 0)

    def best_rank(self, waiting: Sequence[Schedulable], now: float) -> int:
        """The best effective rank waiting; asked for every waiting request in one admission
        pass, so computed once per pass (same list, length and clock), not once per request."""
        key = (id(waiting), len(waiting), now)
        if self._best_memo[0] != key:  # a group's oldest is its best (policy.queue)
            heads = waiting.heads() if isinstance(waiting, WaitQueue) else waiting
            self._best_memo = (key, min((self.effective_rank(w, now) for w in heads),
                                        default=99))
        return self._best_memo[1]

    def displacer(self, waiting: Sequence[Schedulable], running: Sequence[Schedulable],
                  now: float) -> Callable[[Schedulable], bool]:
        """With every slot taken: whether :meth:`priority_victim` or :meth:`fairness_victim`
        could give a waiting request a slot (true for a superset). Cheap per request (one
        answer per class and member), so a pass over a long queue that nobody in it can enter
        costs little; a better class or a lower counter only makes it truer, so when a group's
        oldest cannot, none of the group can."""
        if self.cfg.mode != "hearth" or not running:
            return lambda r: False
        eff = {id(x): self.effective_rank(x, now) for x in running if x.rank != VOICE_RANK}
        lowest = max(eff.values(), default=-1)  # a waiting request above it may preempt
        over: list[tuple[int, float, str]] = []  # (rank, counter, member) of over-share slots
        held: dict[str, int] = {}
        share = 0
        if self.cfg.fair_slots:
            for x in running:
                held[x.user] = held.get(x.user, 0) + 1
            share = max(1, self.max_running // max(1, len(set(held) | _users(waiting))))
            over = [(eff[id(x)], self.counter(x.user, now), x.user) for x in running
                    if id(x) in eff and held[x.user] > share]
        seen: dict[tuple[int, str], bool] = {}

        def may(w: Schedulable) -> bool:
            mine = self.effective_rank(w, now)
            if mine < lowest:
                return True
            if not over or held.get(w.user, 0) >= share:
                return False
            if (ok := seen.get((mine, w.user))) is None:
                served = self.counter(w.user, now)
                ok = seen[mine, w.user] = any(u != w.user and rank >= mine and c >= served
                                              for rank, c, u in over)
            return ok
        return may

    def may_overtake(self, r: Schedulable, blocked: Schedulable, overtaken: int,
                     now: float) -> bool:
        """Whether ``r``, behind ``blocked`` in the order, may be admitted while ``blocked``
        waits for cells (into cells that are free, taking nothing from anyone): a short voice
        turn does not wait seconds behind a voice prompt that cannot fit yet. Only within an
        interactive class, and ``MAX_OVERTAKES`` times, so the one waiting is not starved."""
        return (self.cfg.mode == "hearth" and overtaken < MAX_OVERTAKES
                and self.effective_rank(r, now) == self.effective_rank(blocked, now)
                <= INTERACTIVE_RANK)

    def priority_victim(self, r: Schedulable, running: Sequence[Schedulable],
                        now: float) -> Schedulable | None:
        """The running request ``r`` displaces first for a slot or KV room (see
        :meth:`priority_victims`), or None."""
        victims = self.priority_victims(r, running, now)
        return victims[0] if victims else None

    def priority_victims(self, r: Schedulable, running: Sequence[Schedulable],
                         now: float) -> list[Schedulable]:
        """The running requests ``r`` may displace, in the order they go: those of a strictly
        lower class than ``r``, lowest class and newest first. Voice is never displaced; only
        hearth mode displaces for priority at all."""
        if self.cfg.mode != "hearth":
            return []
        mine = self.effective_rank(r, now)
        # Aged requests keep what they earned: compare effective ranks, not submitted ones.
        cands = [x for x in running
                 if x.rank != VOICE_RANK and self.effective_rank(x, now) > mine]
        return sorted(cands, key=lambda x: (self.effective_rank(x, now),
                                            x.admitted_at or x.arrival, x.id), reverse=True)

    def fairness_victim(self, r: Schedulable, running: Sequence[Schedulable],
                        waiting: Sequence[Schedulable], now: float) -> Schedulable | None:
        """With every slot taken, the running request that makes room for ``r`` by fairness: the
        newest one, of ``r``'s class or lower, of a member who holds more than a fair share of
        the slots (slots / members with work) and has been served at least as much as ``r``'s
        member (one who just arrived is lifted to the lowest active counter).
        The VTC orders the queue; this keeps one member from holding every slot meanwhile."""
        if self.cfg.mode != "hearth" or not self.cfg.fair_slots:
            return None
        key = (id(waiting), len(waiting), now, len(running))
        if self._members_memo[0] != key:  # once per admission pass, not once per request
            members = {x.user for x in running} | _users(waiting)
            self._members_memo = (key, len(members))
        share = max(1, self.max_running // max(1, self._members_memo[1]))
        held: dict[str, int] = {}
        for x in running:
            held[x.user] = held.get(x.user, 0) + 1
        mine, served = self.effective_rank(r, now), self.counter(r.user, now)
        cands = [x for x in running
                 if x.user != r.user and x.rank != VOICE_RANK and held[x.user] > share
                 and self.effective_rank(x, now) >= mine
                 and self.counter(x.user, now) >= served]
        if held.get(r.user, 0) >= share or not cands:
            return None
        return max(cands, key=lambda x: (held[x.user], self.effective_rank(x, now),
                                         x.admitted_at or x.arrival, x.id))

    def growth_takes_kept(self, rank: int, victim: Schedulable | None,
                          running: Sequence[Schedulable]) -> bool:
        """Running work whose best class needing cells is ``rank`` finds them only in kept
        prefixes or by preempting ``victim`` (:meth:`memory_victim`): whether the prefixes go
        first. They do when the victim is not of a lower class than that work and either the
        work is interactive (a chat preempted for room recomputes its prompt and output, and
        the kept prefix goes anyway when it comes back) or the victim runs alone beside voice
        (preempting itself helps nobody). Otherwise a lower class yields one of its own."""
        if self.cfg.mode != "hearth" or victim is None:
            return victim is None
        if victim.rank > rank:
            return False
        return rank <= INTERACTIVE_RANK or sum(1 for x in running if x.rank != VOICE_RANK) == 1

    def memory_victim(self, running: Sequence[Schedulable]) -> Schedulable | None:
        """When the KV pool is exhausted with no request to blame: lowest class, newest; never
        voice in hearth mode. In fifo/serial the newest arrival goes."""
        if self.cfg.mode == "hearth":
            return self._lowest_newest([x for x in running if x.rank != VOICE_RANK])
        return max(running, key=lambda x: (x.arrival, x.id), default=None)

    @staticmethod
    def _lowest_newest(cands: Sequence[Schedulable]) -> Schedulable | None:
        if not cands:
            return None
        return max(cands, key=lambda x: (x.rank, x.admitted_at or x.arrival, x.id))
