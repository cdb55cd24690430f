"""Where each waiting request stands: its place in the admission order and the time to its
first token the cost model expects. Plain Python, no llama.cpp: the engine gives the running
and waiting requests (the waiting ones in admission order) and what an iteration costs.

The simulation is the scheduler's rules, coarsely: a request of class k waits for a slot only
behind requests of class k or better (lower classes give theirs up: preemption, spare voice
ids), and its prompt is computed after the prompts of class k or better that were there
before it. Classes are after aging, as the policy ages them: a waiting summary joins chat's line
when it would reach chat's rank, and a running one that has reached it is not preempted by a
chat. Each request ahead holds its slot until it has written its expected output (the class's
mean so far, at most what it may still write). One pass in admission order, so a
queue of hundreds costs a few hundred small steps; the engine runs it a few times a second
at most.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

N_RANKS = 5


@dataclass(frozen=True)
class Job:
    """What the simulation needs of one request."""

    id: int
    rank: int  # running: its class; waiting: its class after aging
    prefill: int  # prompt tokens still to compute (cached ones left out)
    start: int  # the position its prefill starts at
    output: float  # tokens it is expected to write still
    # Waiting only: the rest of the policy's key (member's counter, ...), and aging: its own
    # class, seconds waited, one rank up every ``every_s`` (0: never), never above ``best``.
    tie: tuple = ()
    base: int = 0
    waited_s: float = 0.0
    every_s: float = 0.0
    best: int = 0

    def rank_at(self, t: float) -> int:
        """Its class after aging, ``t`` seconds after the plan."""
        if self.every_s <= 0:
            return self.rank
        steps = math.floor((self.waited_s + t) / self.every_s)
        return min(self.rank, max(self.best, self.base - steps))


@dataclass
class Clock:
    """What the engine's time is made of, from its cost model."""

    prefill_s: Callable[[int, int, int], float]  # (tokens, start, rank) -> seconds
    decode_s: float  # one decode iteration beside the streams now running
    busy_s: float  # one iteration while prompts are being computed beside them
    slots: int  # sequences that may run at once
    voice_slots: int  # voice's, with spare ids


@dataclass
class Tail:
    """The state behind the last waiting request of one class or better: what a new one of
    that class would find."""

    cursor: float
    ends: list[float]
    ahead: int


@dataclass
class Plan:
    """Each waiting request's ``(position, eta_s)`` by id, and what a new arrival finds."""

    by_id: dict[int, tuple[int, float]] = field(default_factory=dict)
    tails: list[Tail] = field(default_factory=list)
    clock: Clock | None = None
    busy_until: float = 0.0  # when the prompts known are computed (streams go slower till then)

    def arrival(self, rank: int, prefill: int, start: int = 0, now: float = 0.0
                ) -> tuple[int, float]:
        """(position, eta_s) of a request of class ``rank`` arriving ``now`` (seconds after
        the plan was made) with ``prefill`` tokens to compute: behind every waiting request of
        its class or better. Times count from the plan's making."""
        if self.clock is None or not self.tails:
            return 1, 0.0
        t = self.tails[min(rank, len(self.tails) - 1)]
        admit = _admit_at(list(t.ends), self.clock.voice_slots if rank == 0 else self.clock.slots)
        # Not before now: a plan older than its work starts a new arrival's where it ended.
        eta = max(admit, t.cursor, now) + self.clock.prefill_s(prefill, start, rank)
        return t.ahead + 1, eta

    def add(self, rid: int, rank: int, prefill: int, start: int, output: float,
            now: float = 0.0) -> tuple[int, float]:
        """A request joined the queue since the plan was made: placed as :meth:`arrival`
        places it, and counted ahead of later arrivals of its class and the classes below."""
        if self.clock is None or not self.tails:
            return 1, 0.0
        c = self.clock
        out = (1, 0.0)
        for k in range(min(rank, len(self.tails) - 1), len(self.tails)):
            t = self.tails[k]
            ends = list(t.ends)  # replaced whole: readers on other threads see either
            admit = _admit_at(ends, c.voice_slots if k == 0 else c.slots)
            first = max(admit, t.cursor, now) + c.prefill_s(prefill, start, k)
            heapq.heappush(ends, _end(c, self.busy_until, first, output))
            self.tails[k] = Tail(first, ends, t.ahead + 1)
            if k == rank:
                out = (t.ahead + 1, first)
        self.by_id[rid] = out
        return out


def _admit_at(ends: list[float], slots: int) -> float:
    """When a slot comes free for one more among occupants ending at ``ends`` (a heap; popped
    in place)."""
    at = 0.0
    while len(ends) >= max(1, slots):
        at = heapq.heappop(ends)
    return at


def plan(running: Sequence[Job], waiting: Sequence[Job], clock: Clock) -> Plan:
    """Simulate admission in order: ``waiting`` is in admission order (its ranks after aging
    are then non-decreasing). Twice: streams write a token an iteration, and an iteration
    that also computes a prompt's chunk is longer, so the first pass finds until when prompts
    are being computed, and the second counts the streams' tokens until then at that pace."""
    first = _pass(running, waiting, clock, 0.0)
    return _pass(running, waiting, clock, first.tails[-1].cursor)


def _end(clock: Clock, busy_until: float, at: float, output: float) -> float:
    """When a stream that writes its first token at ``at`` has written ``output`` tokens:
    at the pace of iterations that also compute prompts until ``busy_until``."""
    busy = min(output, max(0.0, busy_until - at) / clock.busy_s) if clock.busy_s else 0.0
    return at + busy * clock.busy_s + (output - busy) * clock.decode_s


def _pass(running: Sequence[Job], waiting: Sequence[Job], clock: Clock,
          busy_until: float) -> Plan:
    """Class by class: a class's line takes the running of that class, then, each time a
    slot comes free, the best waiting request whose class (after aging, at that time) is
    that class or better. So a summary that has waited long enough enters chat's line when
    it reaches chat's rank, by the policy's key there; before that, it is not ahead of any
    chat (on the 1.5B under summaries, chats told a short wait waited 333 s behind them)."""
    def end(at: float, output: float) -> float:
        return _end(clock, busy_until, at, output)

    out = Plan(clock=clock, busy_until=busy_until)
    by_rank: list[list[Job]] = [[] for _ in range(N_RANKS)]
    for r in running:
        by_rank[min(r.rank, N_RANKS - 1)].append(r)
    # One line per class, in admission order: aging lifts a line's oldest first.
    lines: list[deque[Job]] = [deque() for _ in range(N_RANKS)]
    for w in waiting:
        lines[min(max(w.base, w.rank), N_RANKS - 1)].append(w)
    ends: list[float] = []
    cursor = 0.0
    placed = 0
    for k in range(N_RANKS):
        # The running requests of this class now hold slots; their prompts go first.
        for r in by_rank[k]:
            if r.prefill > 0:
                cursor += clock.prefill_s(r.prefill, r.start, k)
                first = cursor
            else:
                first = 0.0
            heapq.heappush(ends, end(first, r.output))
        slots = clock.voice_slots if k == 0 else clock.slots
        while True:
            need = len(ends) - max(1, slots) + 1
            admit = heapq.nsmallest(need, ends)[-1] if need > 0 else 0.0
            heads = [(rk, line[0].tie, i) for i, line in enumerate(lines)
                     if line and (rk := line[0].rank_at(admit)) <= k]
            if not heads:
                break
            w = lines[min(heads)[2]].popleft()
            _admit_at(ends, slots)
            first = max(admit, cursor) + clock.prefill_s(w.prefill, w.start, k)
            cursor = first
            heapq.heappush(ends, end(first, w.output))
            placed += 1
            out.by_id[w.id] = (placed, first)
        out.tails.append(Tail(cursor, list(ends), placed))
    return out


LOG_4 = math.log(4.0)


@dataclass
class Bias:
    """How far each class's predictions have fallen short or run over: an exponentially
    weighted mean of log(actual / predicted) time to first token, learned from the requests
    that got theirs, and the factor it makes. The cost model prices iterations well but not
    what it does not see (an iteration in flight when a prompt arrives, work arriving later
    that goes first, the server's own time), and on the household's 1.5B every voice turn
    and chat was told too short a wait. Learned from the raw predictions, never the scaled
    ones, so the factor cannot feed on itself; one odd request moves it at most 4x a step.

    Apart for a request admitted as it arrives (predicted from its prompt's compute alone)
    and one that queues (from the simulated queue): they err differently. A summary admitted
    at once on the 1.5B took ~3.5x its prediction (voice and chat cut in all through its
    prompt), while queued ones were told both too long and too short."""

    keep: float = 0.7
    logs: dict[tuple[int, bool], float] = field(default_factory=dict)

    def learn(self, rank: int, predicted_s: float, actual_s: float, queued: bool = True
              ) -> None:
        if predicted_s <= 0 or actual_s <= 0:
            return
        x = max(-LOG_4, min(LOG_4, math.log(actual_s / predicted_s)))
        old = self.logs.get((rank, queued))
        self.logs[rank, queued] = x if old is None else self.keep * old + (1 - self.keep) * x

    def factor(self, rank: int, queued: bool = True) -> float:
        return math.exp(self.logs.get((rank, queued), 0.0))


def expected_output(means: dict[int, float], rank: int, left: int, default: float) -> float:
    """Tokens a request of class ``rank`` that may write ``left`` more is expected to write."""
    return max(0.0, min(float(left), means.get(rank, default)))
