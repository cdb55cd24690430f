"""Admission into sequence ids and KV room, and preemption: a part of the engine that owns when
the next admission pass runs (:meth:`Admitter.changed`, a recheck time) and the request whose
sampler is being made (:attr:`Admitter.admitting`). The engine gives it the wait queue and the
running list, which it moves requests between; the policy, which picks who goes and who gives
way; the KV part (:class:`~hearth.engine.kv.KVSpace`), which counts and frees the cells; the
stats; and how to finish and fail a request."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from ..policy.queue import WaitQueue
from ..policy.scheduler import Policy
from ..shared.requests import Request
from .base import ADMIT_RECHECK_S, Backend, BatchItem, EngineConfig
from .kv import KVSpace
from .prefix_index import common_prefix
from .stats import Stats

log = logging.getLogger("hearth.engine")


class Admitter:
    """Who gets a sequence and cells, who gives them up."""

    def __init__(self, backend: Backend, cfg: EngineConfig, policy: Policy, stats: Stats,
                 kv: KVSpace, waiting: WaitQueue, running: list[Request],
                 finish: Callable[[Request, str, float], None],
                 fail: Callable[..., None]):
        self.b = backend
        self.cfg = cfg
        self.policy = policy
        self.stats = stats
        self.kv = kv
        self.waiting = waiting
        self.running = running  # the engine's list, changed in place by both
        self._finish = finish  # retires the request with an end event (and calls changed)
        self._fail = fail  # (r, message, now, status=500): retires it with an error event
        # A pass runs when something it depends on changed (an arrival, a finish, a
        # preemption, freed cells) or aging may have moved a class: not every iteration.
        self._dirty = True
        self._next = 0.0
        self.admitting: Request | None = None  # the one whose sampler is being made

    def changed(self) -> None:
        """Something a pass depends on changed: the next :meth:`admit` looks again."""
        self._dirty = True

    def lost(self) -> Request | None:
        """The backend's process died: returns the request whose sampler it was making."""
        admitting, self.admitting = self.admitting, None
        self._dirty = True
        return admitting

    # -- admission and preemption -----------------------------------------------------------
    def admit(self, now: float) -> None:
        if not self.waiting or (not self._dirty and now < self._next):
            return
        self._dirty = False
        self._next = now + ADMIT_RECHECK_S
        self.policy.begin_pass()
        blocked: Request | None = None  # the first waiting for cells: who may pass it, how
        may_displace: Callable[[Request], bool] | None = None  # once the slots are all taken
        order = self.policy.order_pass(self.waiting, now, self.running)
        for r in order:
            if blocked is not None and not self.policy.may_overtake(
                    r, blocked, blocked.meta.get("_overtaken", 0), now):
                break
            spare = self.kv.spare_ids() if self.policy.may_use_spare_ids(r.rank) else 0
            full = len(self.running) >= self.policy.slots_for(r, spare)
            if full:
                if may_displace is None:  # who may still enter, asked once per change
                    may_displace = self.policy.displacer(self.waiting, self.running, now)
                if not may_displace(r):  # nor may the rest of its group
                    if self.policy.skips_held_back():
                        order.skip_group()
                        continue
                    break
            if r.sampler is None:
                try:
                    self.admitting = r  # stays set if the worker dies making it
                    r.sampler = self.b.new_sampler(r.sampling)
                    self.admitting = None
                except Exception as e:  # e.g. a grammar llama.cpp refuses: this request's fault
                    self._fail(r, f"cannot sample this request: {e}", now, status=400)
                    continue
            if not self.policy.may_admit(r, self.running, self.waiting, now, spare):
                if not full:
                    order.skip_group()  # held back by its class cap, and so is its group
                    continue  # others may still go
                victim = (self.policy.priority_victim(r, self.running, now)
                          or self.policy.fairness_victim(r, self.running, self.waiting, now))
                if victim is None:
                    if self.policy.skips_held_back():
                        continue  # a lower class behind it may not preempt either
                    break
            else:
                victim = None
            entry, hit = self.kv.find(r.tokens)
            need = len(r.tokens) - hit + 1  # the uncached prompt and the first token's cell
            if blocked is not None and (victim is not None or need > self.kv.pool.free_cells):
                continue  # passing a request that waits takes only cells that are free
            fits, held = self.make_room(r, need, entry, now, r.rank, hit, victim)
            if not fits and victim is not None:
                break  # a slot without the cells or an id: the victim's work would be lost
            if not fits and not self.running:
                # Nothing else will ever free room: any prefix may go (its own hit last).
                fits, held = self.make_room(r, need, entry, now, None, hit)
                if not fits:
                    entry, hit, need = None, 0, len(r.tokens) + 1
                    fits, held = self.make_room(r, need, None, now, None)
            if not fits:
                if not self.running:  # nothing will ever free room: refuse it
                    self._fail(r, "the KV cache cannot hold this prompt", now, status=400)
                    continue
                blocked = r  # it waits for room; only a few of its class may pass it
                continue
            if held is not entry:  # a preempted sequence's kept prefix holds the hit now
                entry = held
                hit = min(common_prefix(held.tokens, r.tokens), len(r.tokens) - 1) if held else 0
                need = len(r.tokens) - hit + 1
                if self.kv.pool.free_cells < need:
                    break  # it does not happen: the hit's tokens are kept (make_room)
            seq = self.kv.pool.take_id()
            # Nothing running frees an id later: then any entry may go (not its hit).
            if seq is None and self.kv.free_id(entry, r.rank if self.running else None):
                seq = self.kv.pool.take_id()
            if seq is None:
                break
            self.waiting.remove(r)
            self.kv.seat(r, seq, entry, hit, need)
            if r.first_admitted_at is None:
                r.first_admitted_at = now
                r.cached_tokens = min(r.n_past, r.n_prompt)
            r.admitted_at = now
            self.running.append(r)
            may_displace = None  # who runs changed
            if blocked is not None:
                blocked.meta["_overtaken"] = blocked.meta.get("_overtaken", 0) + 1

    def make_room(self, r: Request, need: int, entry: Any, now: float, rank: int | None,
                  hit: int = 0, first: Request | None = None) -> tuple[bool, Any]:
        """Free ``need`` cells for ``r`` if that is possible keeping the ``hit`` tokens of its
        ``entry``: cached prefixes (only as many as needed, in the pool's order, none a higher
        class than ``rank`` is served by; of a prefix running sequences share in part, the
        rest), and running sequences of a lower class, lowest and newest first, only as many
        as needed; ``first`` (a slot's victim) goes in any case. Nothing is preempted unless
        the preemption is rehearsed to give ``r`` its cells and a sequence id
        (:meth:`plan`): preempting without admitting would throw their work away. Returns
        whether the room was made, and the entry that holds the hit then (the kept prefix of
        a victim may have superseded ``entry``)."""
        if first is None and self.kv.pool.free_cells >= need:
            return True, entry
        plan = self.plan(r, need, entry, hit, rank, now, first)
        if plan is None:
            return False, entry
        victims, keep = plan
        for victim in victims:
            self.preempt(victim, now, keep_kv=keep)
        entry = self.kv.holding(self.kv.pool, entry, r.tokens, hit)
        wanted = self.kv.wanted()
        while self.kv.pool.free_cells < need:
            if not self.kv.free_cache(entry, hit, rank, wanted):
                log.warning("admission rehearsed room for request %s that was not there", r.id)
                return False, entry
        return True, entry

    def plan(self, r: Request, need: int, entry: Any, hit: int, rank: int | None,
             now: float, first: Request | None = None) -> tuple[list[Request], bool] | None:
        """The fewest running sequences ``r`` may preempt (``first`` among them) after which
        it has ``need`` cells keeping the ``hit`` tokens of ``entry`` and, if anyone goes, a
        sequence id; and whether their cells are kept as prefixes. Each is rehearsed on a
        copy of the pool with the victims' kept prefixes as the insert leaves them: one may
        supersede ``entry`` (it then holds the hit), take the id ``r`` needs, or be kept
        against ``r``'s class; then they go unkept, and if that fails too, nobody goes."""
        victims = self.policy.priority_victims(r, self.running, now)
        if first is not None:
            victims = [first, *(v for v in victims if v is not first)]
        if self.kv.room(entry, hit, rank, victims) < need:
            return None  # not even with every victim's cells freed
        for k in range(0 if first is None else 1, len(victims) + 1):
            if k == 0:
                if self.kv.room_in(self.kv.pool, entry, hit, rank) >= need:
                    return [], True
                continue
            staying = len(self.running) > k
            for keep in (True, False):
                pool = self.kv.rehearse(victims[:k], keep)
                held = self.kv.holding(pool, entry, r.tokens, hit)
                if entry is not None and held is None:
                    continue
                if (self.kv.room_in(pool, held, hit, rank) >= need
                        and self.kv.id_in(pool, held, rank if staying else None)):
                    return victims[:k], keep
        return None

    def preempt(self, victim: Request, now: float, keep_kv: bool = True) -> None:
        """The victim waits again with every token it has (prompt + generated). Its computed
        cells stay as a cached prefix where the pool keeps them (given up like any other under
        pressure), so on resume it recomputes only what was lost, and its stream continues
        where it stopped."""
        self._dirty = True
        self.running.remove(victim)
        if keep_kv and self.cfg.prefix_cache and victim.n_past > 0:
            self.kv.keep(victim)
        else:
            self.kv.release(victim)
        victim.preemptions += 1
        victim.admitted_at = None
        self.waiting.append(victim)
        self.stats.record_preemption(victim.cls)
        log.debug("preempted request %s (%s)", victim.id, victim.cls)

    def fit(self, items: list[BatchItem], now: float) -> list[BatchItem]:
        """Line 2 of the protocol: the cells the batch needs beyond its reservations (a decode
        token each, past the first) must be free before llama_decode runs. Cached prefixes go
        first, then the lowest-class, newest sequence (its cells kept as a prefix, given up
        next if still needed); kept prefixes go before a preemption that would not help a
        better class (:meth:`Policy.growth_takes_kept`). Voice goes only when nothing else
        runs; a lone sequence the pool cannot grow has all the context there is and ends with
        "length"."""
        def extra() -> int:
            return sum(max(0, it.n - it.req.reserved) for it in items)

        while items and extra() > self.kv.pool.free_cells:
            # Growing lower-class streams preempt one of their own before they cost a higher
            # class its cached prefix; the best class that needs a cell decides.
            rank = min(it.req.rank for it in items if it.n > it.req.reserved)
            if self.kv.evict_entry(rank=rank):
                continue
            victim = self.policy.memory_victim(self.running)
            if (self.policy.growth_takes_kept(rank, victim, self.running)
                    and self.kv.evict_entry()):
                continue  # kept prefixes go before voice, or before a preemption for nothing
            if victim is None:
                victim = self.policy.last_resort_victim(self.running)
            if victim is None:
                for it in items:
                    if it.n > it.req.reserved:
                        self._finish(it.req, "length", now)
                items = [it for it in items if not it.req.finished]
                break
            self.preempt(victim, now)
            items = [it for it in items if it.req is not victim]
        return items

    def out_of_kv(self, items: list[BatchItem], now: float) -> None:
        """llama_decode found no KV slot although the accounting said the batch fits (it should
        not happen: the pool may fragment differently): give up cached prefixes, then the
        lowest-class, newest running sequence. Nothing of this batch was kept by llama.cpp."""
        needed = sum(it.n + len(it.draft) for it in items)
        log.warning("llama_decode found no room for a batch of %d tokens with %d cells "
                    "counted free", needed, self.kv.pool.free_cells)
        self._dirty = True
        if self.kv.evict_entry():
            while self.kv.pool.free_cells < needed and self.kv.evict_entry():
                pass
            return
        victim = self.policy.memory_victim(self.running)
        if victim is not None and len(self.running) > 1:
            self.preempt(victim, now, keep_kv=False)  # its cells may be what did not fit
            return
        newest = self.policy.exhausted_victim(self.running)
        self._fail(newest, "the KV cache is exhausted", now, status=503)
