"""The engine's side of :mod:`hearth.policy.eta`: the waiting requests' places and expected
times to first token, from the cost model, refreshed on the engine thread (at most every
``REFRESH_S``, or when who waits or runs changed) and published for other threads; and
deadlines: a request whose expected wait on arrival passes its class's deadline is refused at
once (jobs and warm-ups never are).

Each request keeps the ETA first predicted for it (``meta["eta_s"]``, counted from its
arrival), which its timing reports beside its real time to first token: how good the
prediction was can be read from any answer."""

from __future__ import annotations

import math
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from ..policy.classes import CHAT_RANK, CLASS_RANKS, RANK_NAMES
from ..policy.eta import Bias, Clock, Job, Plan, expected_output, plan
from .base import VOICE_PREFILL_STRETCH, RequestError
from .cost import attention
from .satellites import RESERVATION_WARM

if TYPE_CHECKING:
    from ..shared.requests import Request
    from .core import EngineCore

# The whole queue's places are computed at most once a REFRESH_S and REFRESH_ITERATIONS
# iterations (they cost a policy key per waiting request, where an admission pass looks at a
# few); an arrival is placed from the last plan.
REFRESH_S = 1.0
REFRESH_ITERATIONS = 32
STALE_S = 5.0  # and at least this often while iterations are slow
DEFAULT_OUTPUT = 64.0  # tokens a class is expected to write before any of it finished
KEEP = 0.8  # the running means' weight on what came before
NAMES = [RANK_NAMES[k] for k in range(len(RANK_NAMES))]


class QueueEta:
    def __init__(self, core: EngineCore):
        self._core = core
        self.plan = Plan()
        self.output: dict[int, float] = {}  # mean tokens written, by class
        self.prompt: dict[int, float] = {}  # mean prompt tokens computed, by class
        self._seen: dict[int, Request] = {}  # running at the last refresh
        self._at = -math.inf  # the engine's clock at the last full plan
        self._wall = -math.inf  # the wall clock's
        self._iter = 0  # the engine's iteration count's
        # The waiting requests in admission order, each with the engine time its first
        # token is expected at; and a new arrival's expected wait by class, at ``_at``.
        self._entries: list[tuple[Request, float]] = []
        self.where: dict[int, tuple[int, float]] = {}  # request id -> (position, eta_s)
        self.bias = Bias()  # each class's predictions against its first tokens

    # -- the engine thread -----------------------------------------------------------------
    def arrived(self, reqs: list[Request], now: float) -> None:
        """New requests in the wait queue: each one's place and ETA as it finds the queue
        (from the last plan, counted from its refresh), before it may be admitted."""
        if not reqs:
            return
        self.refresh(now)  # at most once a REFRESH_S: then it placed these too
        since = now - self._at
        # The costs as measured now (the plan's may predate calibration, or a slower load).
        clock = self.plan.clock = self._clock()
        for r in reqs:
            if r.kind != "generate" or clock is None or "eta_s" in r.meta:
                continue
            job = self._job(r, r.rank, waiting=True)
            pos, eta = self.plan.add(r.id, r.rank, job.prefill, job.start, job.output, since)
            own = clock.prefill_s(job.prefill, job.start, r.rank)
            raw = max(own, eta - since)
            # Told only its own prompt's time (nothing ahead of it) or a wait in the queue.
            eta = self._scaled(r, now, raw, queued=raw > own * 1.01)
            self._entries.insert(min(pos - 1, len(self._entries)), (r, now + eta))
            # The plan may predate admissions: its place counts those admitted since.
            self._entries = [(x, at) for x, at in self._entries
                             if x.first_admitted_at is None and not x.finished]
            place = next((i for i, (x, _) in enumerate(self._entries, 1) if x is r), None)
            if place is None:  # admitted or ended in the same drain: it waits no more
                continue
            r.meta["queue"] = (place, eta)
            r.meta["eta_s"] = round(now - r.arrival + eta, 3)
            self.plan.busy_until = max(self.plan.busy_until, raw + since)

    def refresh(self, now: float) -> None:
        core = self._core
        # By the wall clock (a simulated engine's clock is not its cost) and iterations.
        wall = time.monotonic() - self._wall
        if self._wall > -math.inf and (wall < REFRESH_S or (
                core.stats.iterations - self._iter < REFRESH_ITERATIONS and wall < STALE_S)):
            return
        self._at, self._wall, self._iter = now, time.monotonic(), core.stats.iterations
        self._learn(core.running)
        policy = core.policy
        key = policy.keyer(now, core.running)
        keyed = sorted((key(r), r) for r in core.waiting)  # keys end in the id: no ties
        ordered = [r for _, r in keyed]
        waiting = [self._aging(r, now, i, k) for i, (k, r) in enumerate(keyed)]
        # Running ones by their class after aging too: one that waited long enough to reach
        # chat's rank is not preempted by a chat (on the 1.5B, chats waited minutes so).
        running = [self._job(r, policy.effective_rank(r, now)) for r in core.running]
        clock = self._clock()
        self.plan = p = plan(running, waiting, clock)
        for r in ordered:  # the first prediction each request gets, from its arrival
            if "eta_s" not in r.meta:
                r.meta["eta_s"] = round(now - r.arrival + self._scaled(
                    r, now, p.by_id[r.id][1], queued=True), 3)
        for r in core.running:  # admitted as it arrived: its prompt's time
            if r.first_token_at is None and "eta_s" not in r.meta:
                r.meta["eta_s"] = round(now - r.arrival + self._scaled(
                    r, now, clock.prefill_s(r.remaining, r.n_past, r.rank), queued=False), 3)
        self._entries = [(r, now + p.by_id[r.id][1] * self.bias.factor(r.rank))
                         for r in ordered]

    def publish(self, now: float) -> dict[str, Any]:
        """``eta_s`` by class, ``waiting_requests`` and ``eta_bias`` for /v1/queue, as of
        ``now``: the last plan's, less those admitted since (the rest move up) and the time
        gone by. Cheap (no policy keys): called after every iteration; the plan itself is
        refreshed at most once a REFRESH_S."""
        for r in self._core.running:  # each class's bias, from the first tokens just written
            if r.first_token_at is not None and "_eta_raw" in r.meta:
                at, raw, queued = r.meta.pop("_eta_raw")
                self.bias.learn(r.rank, raw, r.first_token_at - at, queued)
        self.refresh(now)
        self._entries = [(r, at) for r, at in self._entries
                         if r.first_admitted_at is None and not r.finished]
        listed, where = [], {}
        for i, (r, at) in enumerate(self._entries, 1):
            eta = max(0.0, at - now)
            where[r.id] = (i, eta)
            listed.append({"id": str(r.id), "class": NAMES[r.rank], "member": r.user,
                           "position": i, "eta_s": round(eta, 2)})
        self.where = where
        gone = max(0.0, now - self._at)
        eta = {}
        for c, k in CLASS_RANKS.items():
            pos, at = self.plan.arrival(k, max(1, round(self.prompt.get(k, 0.0))), now=gone)
            eta[c] = (at - gone) * self.bias.factor(k, queued=pos > 1)
        return {"eta_s": {c: round(max(0.0, t), 2) for c, t in eta.items()},
                "waiting_requests": listed,
                # The factor each class's raw predictions are scaled by (learned; 1: none yet).
                "eta_bias": {c: {"queued": round(self.bias.factor(k), 2),
                                 "at_once": round(self.bias.factor(k, queued=False), 2)}
                             for c, k in CLASS_RANKS.items()}}

    def _scaled(self, r: Request, now: float, raw: float, queued: bool) -> float:
        """``r``'s first expected wait from ``now`` as told: the cost model's ``raw`` one
        (kept, to learn from once its first token comes) scaled by its class's bias."""
        if not (r.warm_up or r.meta.get(RESERVATION_WARM)):
            r.meta["_eta_raw"] = (now, raw, queued)
        return raw * self.bias.factor(r.rank, queued)

    def _learn(self, running: list[Request]) -> None:
        """The classes' mean output and computed prompt, from the requests that finished or
        started since the last refresh."""
        for rid, r in list(self._seen.items()):
            if r.finished:
                del self._seen[rid]
                if r.finish_reason in ("stop", "length"):
                    self._mean(self.output, r.rank, r.n_generated)
        for r in running:
            if r.id not in self._seen:
                self._seen[r.id] = r
                self._mean(self.prompt, r.rank, max(0, r.n_prompt - r.cached_tokens))

    @staticmethod
    def _mean(means: dict[int, float], rank: int, value: float) -> None:
        old = means.get(rank)
        means[rank] = value if old is None else KEEP * old + (1 - KEEP) * value

    def _job(self, r: Request, rank: int, waiting: bool = False) -> Job:
        if waiting:
            hit = r.meta.get("_eta_hit")
            if hit is None:  # looked up once: the cache's answer rarely changes while it waits
                hit = r.meta["_eta_hit"] = self._core.kv.find(r.tokens)[1]
            prefill, start = max(1, len(r.tokens) - max(hit, r.n_past)), max(hit, r.n_past)
        else:
            prefill = r.remaining if r.remaining > 1 else 0
            start = r.n_past
        left = r.max_tokens - r.n_generated
        # Told to ignore the end of generation, it writes all it may: no guess needed.
        out = float(left) if r.ignore_eos else expected_output(self.output, r.rank, left,
                                                               DEFAULT_OUTPUT)
        return Job(r.id, rank, prefill, start, out)

    def _aging(self, r: Request, now: float, i: int, key: tuple) -> Job:
        """A waiting request as the plan sees it: its class now and how it ages, and the rest
        of its policy key, which orders it among those of the class it reaches."""
        policy = self._core.policy
        job = self._job(r, policy.effective_rank(r, now), waiting=True)
        tie = key[1:] if policy.cfg.mode == "hearth" else (i,)
        return replace(job, tie=tie, base=r.rank, waited_s=max(0.0, now - r.arrival),
                       every_s=policy.aging_period(r.rank), best=CHAT_RANK)

    def _clock(self) -> Clock:
        core = self._core
        cost, b, batcher, policy = core.cost, core.b, core.batcher, core.policy
        decoding = [r for r in core.running if r.remaining == 1]
        n_dec = len(decoding)
        dec_att = sum(attention(1, r.n_past) for r in decoding)
        streams = [r.rank for r in decoding]
        target = batcher.target()
        bounded = core._bounded()

        # The streams now running end after their expected outputs: a long prompt is computed
        # beside them only till then, then alone (SmolLM2: a summary admitted at once was
        # told 50 s, priced beside two short chats for all its chunks, and took 13 s).
        left = max((self._job(r, r.rank).output for r in decoding), default=0.0)

        def chunking(n_dec: int, dec_att: int, mid: int, rank: int, bound: bool
                     ) -> tuple[int, float]:
            """The chunk the composer gives a prompt beside ``n_dec`` streams (its budget
            asked at the prompt's middle, where attention averages) and the streams' own
            turn between chunks where it takes turns with them."""
            extra = 0.0
            if n_dec == 0 and (rank <= 1 or not bound):  # alone: whole batches
                chunk = b.n_batch
            else:
                chunk, stretched = batcher.budget(
                    n_dec, VOICE_PREFILL_STRETCH if rank == 0 else 1.0, dec_att, mid,
                    policy.waited_for(rank), bound)
                if stretched and policy.yields_to_streams(rank, streams):
                    extra = cost.predict(n_dec, dec_att)
            return max(1, min(chunk, b.n_batch - n_dec)), extra

        def chunks_s(n: int, n_dec: int, dec_att: int, chunk: int, extra: float) -> float:
            full, last = divmod(n, chunk)
            t = full * (cost.predict(n_dec + chunk, dec_att) + extra) if full else 0.0
            return t + (cost.predict(n_dec + last, dec_att) if last else 0.0)

        def prefill_s(n: int, start: int, rank: int) -> float:
            """A prompt's time in the chunks the composer gives it: beside the streams now
            running while they last (each writes a token a chunk, two where they take
            turns), then alone."""
            if n <= 0:
                return 0.0
            mid = start + n // 2
            chunk, extra = chunking(n_dec, dec_att, mid, rank, bounded)
            beside = min(n, int(left // (2 if extra else 1)) * chunk) if n_dec else n
            t = chunks_s(beside, n_dec, dec_att, chunk, extra)
            if beside < n:  # the streams gone, nothing is kept to the latency target
                alone, _ = chunking(0, 0, mid, rank, False)
                t += chunks_s(n - beside, 0, 0, alone, 0.0)
            # The prompt's own attention, which grows with its position.
            return t + cost.predict(1, attention(n, start)) - cost.predict(1)

        slots = core.policy.max_running
        spare = core.policy.cfg.voice_spare_slots if core.policy.cfg.mode == "hearth" else 0
        decode = cost.predict(max(1, n_dec), dec_att)
        return Clock(prefill_s, decode, max(decode, target), slots, slots + spare)

    # -- any thread ------------------------------------------------------------------------
    def shed(self, r: Request) -> None:
        """Refuse (429 deadline_exceeded, Retry-After its ETA) a request whose expected time
        to first token passes its class's deadline. Jobs and warm-ups only ever queue. Its
        place and ETA as the last plan has them, till the engine places it."""
        if r.kind != "generate":
            return
        core, clock = self._core, self.plan.clock
        own = clock.prefill_s(len(r.prompt), 0, r.rank) if clock is not None else 0.0
        if not core.running and not core.waiting:  # idle: the last plan's queue is gone
            pos, eta = 1, own
        else:  # the last plan's times count from its refresh
            since = max(0.0, time.monotonic() - self._wall)
            pos, eta = self.plan.arrival(r.rank, len(r.prompt), now=since)
            eta = max(own, eta - since)
        eta *= self.bias.factor(r.rank, queued=pos > 1)
        # The plan may predate admissions: those admitted since no longer stand ahead.
        gone = sum(1 for x, _ in list(self._entries) if x.rank <= r.rank
                   and (x.first_admitted_at is not None or x.finished))
        r.meta["queue"] = (max(1, pos - gone), eta)
        deadline = self._core.cfg.deadlines.get(r.cls, 0.0)
        never = r.warm_up or r.meta.get("job") or r.meta.get(RESERVATION_WARM)
        if deadline and eta > deadline and not never:
            self._core.stats.shed[r.cls] += 1
            raise RequestError(
                f"the {r.cls} queue's expected wait ({eta:.1f} s) passes its deadline "
                f"({deadline:g} s)", status=429, code="deadline_exceeded",
                retry_after=max(1, math.ceil(eta)))

    def position(self, r: Request) -> tuple[int, float] | None:
        """``r``'s (position, eta_s) while it waits for its first admission; None once it
        runs (or before the engine saw it, its estimate at submission)."""
        if r.first_admitted_at is not None or r.finished:
            return None
        return self.where.get(r.id) or r.meta.get("queue")
