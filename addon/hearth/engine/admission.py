"""Admission into sequence ids and KV room, preemption, and giving cells back (part of
:class:`~hearth.engine.core.EngineCore`, which holds the state these methods use)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from ..requests import Request
from ..scheduler import VOICE_RANK
from .base import ADMIT_RECHECK_S, BatchItem

log = logging.getLogger("hearth.engine")
# How many waiting requests' prefixes are spared first when cached prefixes must go.
WANTED_LOOKAHEAD = 32


def _queue_key(r: Request) -> tuple[int, float, int]:
    return (r.rank, r.arrival, r.id)


class Admission:
    """The KV side of the engine: who gets a sequence and cells, who gives them up."""

    # -- admission and preemption -----------------------------------------------------------
    def _admit(self, now: float) -> None:
        if not self.waiting or (not self._admit_dirty and now < self._admit_next):
            return
        self._admit_dirty = False
        self._admit_next = now + ADMIT_RECHECK_S
        self.policy.begin_pass()
        blocked: Request | None = None  # the first waiting for cells: who may pass it, how
        may_displace: Callable[[Request], bool] | None = None  # once the slots are all taken
        order = self.policy.order_pass(self.waiting, now, self.running)
        for r in order:
            if blocked is not None and not self.policy.may_overtake(
                    r, blocked, blocked.meta.get("_overtaken", 0), now):
                break
            spare = self._spare_ids() if r.rank == VOICE_RANK else 0
            full = len(self.running) >= self.policy.slots_for(r, spare)
            if full:
                if may_displace is None:  # who may still enter, asked once per change
                    may_displace = self.policy.displacer(self.waiting, self.running, now)
                if not may_displace(r):  # nor may the rest of its group
                    if self.policy.cfg.mode == "hearth":
                        order.skip_group()
                        continue
                    break
            if r.sampler is None:
                try:
                    self._admitting = r  # stays set if the worker dies making it
                    r.sampler = self.b.new_sampler(r.sampling)
                    self._admitting = None
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
                    if self.policy.cfg.mode == "hearth":
                        continue  # a lower class behind it may not preempt either
                    break
            else:
                victim = None
            entry, hit = (self.pool.find(r.tokens) if self.cfg.prefix_cache else (None, 0))
            need = len(r.tokens) - hit + 1  # the uncached prompt and the first token's cell
            if blocked is not None and (victim is not None or need > self.pool.free_cells):
                continue  # passing a request that waits takes only cells that are free
            if victim is not None:
                if self._room(r, entry, hit, r.rank, now, victim) < need:
                    break  # a slot without the cells: the victim's work would be lost for nothing
                self._preempt(victim, now)
            fits = self._make_room(r, need, entry, now, r.rank, hit)
            if not fits and not self.running:
                # Nothing else will ever free room: any prefix may go, its own hit too.
                entry, hit, need = None, 0, len(r.tokens) + 1
                fits = self._make_room(r, need, None, now, None)
            if not fits:
                if not self.running:  # nothing will ever free room: refuse it
                    self._fail(r, "the KV cache cannot hold this prompt", now, status=400)
                    continue
                blocked = r  # it waits for room; only a few of its class may pass it
                continue
            if entry is not None and entry.seq_id not in self.pool.entries:
                # A preempted sequence's kept prefix superseded the hit: it serves as well.
                entry, hit = self.pool.find(r.tokens)
                need = len(r.tokens) - hit + 1
                if self.pool.free_cells < need:
                    break
            seq = self.pool.take_id()
            # Nothing running frees an id later: then any entry may go (not its hit).
            if seq is None and self._free_id(entry, r.rank if self.running else None):
                seq = self.pool.take_id()
            if seq is None:
                break
            self.waiting.remove(r)
            r.seq_id = seq
            if entry is not None:  # find() gives an entry only with a hit; it is still there
                self.b.seq_cp(entry.seq_id, seq, 0, hit)
                r.shared, r.shared_len = entry, hit
                entry.sharers.add(r)
                r.n_past = hit
            else:
                r.n_past = 0
            if self.cfg.prefix_cache:
                first = r.first_admitted_at is None
                self.pool.use(entry, hit, len(r.tokens), count=first and not r.warm_up,
                              rank=r.cache_rank)
                if first and r.warm_up:
                    self.pool.warm_ups += 1
            if r.first_admitted_at is None:
                r.first_admitted_at = now
                r.cached_tokens = min(r.n_past, r.n_prompt)
            r.admitted_at = now
            r.reserved = need
            self.pool.reserve(need)
            self.running.append(r)
            may_displace = None  # who runs changed
            if blocked is not None:
                blocked.meta["_overtaken"] = blocked.meta.get("_overtaken", 0) + 1

    def _spare_ids(self) -> int:
        """Sequence ids a voice turn could run on beyond ``n_parallel``: free ones, and those
        of cached prefixes it may give up (no running sequence shares them)."""
        return len(self.pool.free_ids) + sum(1 for e in self.pool.entries.values()
                                             if self.pool.evictable(e))

    def _make_room(self, r: Request, need: int, entry: Any, now: float,
                   rank: int | None, hit: int = 0) -> bool:
        """Free ``need`` cells for ``r`` if that is possible keeping the ``hit`` tokens of its
        ``entry``: cached prefixes first (only as many as needed, in the pool's order, none a
        higher class than ``rank`` is served by; of a prefix running sequences share in part,
        the rest), then running sequences of a lower class, lowest and newest first, and those
        only when they make enough room (preempting without admitting would throw their work
        away)."""
        if self.pool.free_cells >= need:
            return True
        if self._room(r, entry, hit, rank, now) < need:
            return False
        victims = self.policy.priority_victims(r, self.running, now)
        wanted = self._wanted()
        while self.pool.free_cells < need:
            if self._free_cache(entry, hit, rank, wanted):
                continue
            victim = next((v for v in victims if v in self.running), None)
            if victim is None:
                return False
            self._preempt(victim, now)
        return True

    def _room(self, r: Request, entry: Any, hit: int, rank: int | None, now: float,
              also: Request | None = None) -> int:
        """The cells ``r`` could have, keeping ``hit`` tokens of ``entry``: free ones, those
        evicting and trimming prefixes frees once the lower classes ``r`` may preempt (and
        ``also``) are out, and theirs (they come back as prefixes nobody shares). Counted
        exactly: a cell a staying sequence needs, through any chain of prefixes, is not room."""
        victims = self.policy.priority_victims(r, self.running, now)
        if also is not None and also not in victims:
            victims = [*victims, also]
        gone = frozenset(id(v) for v in victims)
        return (self.pool.free_cells + sum(self._cells_of(v) for v in victims)
                + self.pool.freeable(self._cache_need(entry, hit, rank, gone)))

    @staticmethod
    def _cells_of(r: Request) -> int:
        """The cells preempting ``r`` gives back (once its kept prefix is given up too)."""
        return r.n_past - r.shared_len + r.reserved

    def _cache_need(self, entry: Any, hit: int, rank: int | None,
                    gone: frozenset[int] = frozenset()) -> dict[int, int]:
        """What of each cached prefix must stay (:meth:`KVPool.needs`): the ``hit`` tokens of
        ``entry``, the whole of those a request of class ``rank`` may not give up, what running
        sequences (but those in ``gone``) share."""
        pool = self.pool
        kept = pool.kept()
        protect = {e.seq_id: len(e.tokens) for e in pool.entries.values()
                   if not pool.yields_to(e, rank, kept)}
        if entry is not None and entry.seq_id in pool.entries:
            protect[entry.seq_id] = max(protect.get(entry.seq_id, 0), hit)
        return pool.needs(protect, gone)

    def _wanted(self) -> frozenset[int]:
        """Seq ids of the entries the next waiting requests (the ``WANTED_LOOKAHEAD`` best
        classes, oldest first) are about to use: given up last. An order of preference: looked
        up once per iteration, not once per eviction, and each request's lookup is kept while
        the cache's entries stay as they are, so a long queue costs no more than a short one."""
        key = self.stats.iterations
        if self._wanted_memo[0] != key:
            nxt = self.waiting.oldest(WANTED_LOOKAHEAD, _queue_key)
            self._wanted_memo = (key, frozenset(
                e.seq_id for w in nxt if (e := self._lookup(w)) is not None))
        return self._wanted_memo[1]

    def _lookup(self, r: Request) -> Any:
        """The cached prefix ``r`` would use now (:meth:`KVPool.find`), kept on the request
        while the cache's entries do not change."""
        seen = r.meta.get("_lookup")
        if seen is None or seen[0] != self.pool.version or seen[1] != len(r.tokens):
            seen = r.meta["_lookup"] = (self.pool.version, len(r.tokens),
                                        self.pool.find(r.tokens)[0])
        return seen[2]

    def _free_cache(self, entry: Any, hit: int, rank: int | None,
                    wanted: frozenset[int] | None = None) -> bool:
        """Free the cells of one cached prefix, or its tail running sequences do not share,
        keeping what :meth:`_cache_need` keeps; whether any came free."""
        if not self.pool.entries:
            return False
        need = self._cache_need(entry, hit, rank)
        freed = self.pool.release_one(need, self._wanted() if wanted is None else wanted,
                                      self.pool.kept())
        if freed is None:
            return False
        seq, keep = freed
        if keep == 0:
            self._drop_seq(seq)
        else:
            self.b.seq_rm(seq, keep, -1)
        return True

    def _evict_entry(self, avoid: Any, rank: int | None = None) -> bool:
        """Free one cached prefix's cells (not ``avoid``, none that serves a class above
        ``rank``); whether any came free."""
        return self._free_cache(avoid, len(avoid.tokens) if avoid is not None else 0, rank)

    def _free_id(self, entry: Any, rank: int | None) -> bool:
        """Every sequence id is taken (preempted work is kept past the entry cap): give up one
        cached prefix, not ``entry``, that a request of class ``rank`` may give up."""
        seq = self.pool.evict(avoid=entry, rank=rank, wanted=self._wanted())
        if seq is None:
            return False
        self._drop_seq(seq)
        return True

    def _drop_seq(self, seq: int) -> None:
        """Clear a sequence the pool gave up and hand its id back."""
        self.b.seq_rm(seq)
        self.pool.give_id(seq)

    def _release_seq(self, r: Request) -> None:
        """Free a running sequence's id, cells and reservation."""
        if r.seq_id is None:
            return
        self.b.seq_rm(r.seq_id)
        self.pool.release_cells(r.n_past - r.shared_len)
        self.pool.unreserve(r.reserved)
        if r.shared is not None:
            r.shared.sharers.discard(r)
        self.pool.give_id(r.seq_id)
        r.seq_id, r.shared, r.shared_len, r.n_past, r.reserved = None, None, 0, 0, 0

    def _preempt(self, victim: Request, now: float, keep_kv: bool = True) -> None:
        """The victim waits again with every token it has (prompt + generated). Its computed
        cells stay as a cached prefix where the pool keeps them (given up like any other under
        pressure), so on resume it recomputes only what was lost, and its stream continues
        where it stopped."""
        self._admit_dirty = True
        self.running.remove(victim)
        if keep_kv and self.cfg.prefix_cache and victim.n_past > 0:
            self._keep_as_prefix(victim)
        else:
            self._release_seq(victim)
        victim.preemptions += 1
        victim.admitted_at = None
        self.waiting.append(victim)
        self.stats.record_preemption(victim.cls)
        log.debug("preempted request %s (%s)", victim.id, victim.cls)

    def _computed(self, r: Request, n: int) -> None:
        """``n`` more of ``r``'s cells were computed: from its reservation first."""
        mine = min(n, r.reserved)
        r.reserved -= mine
        self.pool.add_cells(n, reserved=mine)

    def _fit(self, items: list[BatchItem], now: float) -> list[BatchItem]:
        """Line 2 of the protocol: the cells the batch needs beyond its reservations (a decode
        token each, past the first) must be free before llama_decode runs. Cached prefixes go
        first, then the lowest-class, newest sequence (its cells kept as a prefix, given up
        next if still needed); kept prefixes go before a preemption that would not help a
        better class (:meth:`Policy.growth_takes_kept`). Voice goes only when nothing else
        runs; a lone sequence the pool cannot grow has all the context there is and ends with
        "length"."""
        def extra() -> int:
            return sum(max(0, it.n - it.req.reserved) for it in items)

        while items and extra() > self.pool.free_cells:
            # Growing lower-class streams preempt one of their own before they cost a higher
            # class its cached prefix; the best class that needs a cell decides.
            rank = min(it.req.rank for it in items if it.n > it.req.reserved)
            if self._evict_entry(avoid=None, rank=rank):
                continue
            victim = self.policy.memory_victim(self.running)
            if (self.policy.growth_takes_kept(rank, victim, self.running)
                    and self._evict_entry(avoid=None)):
                continue  # kept prefixes go before voice, or before a preemption for nothing
            if victim is None and len(self.running) > 1:
                victim = max(self.running, key=lambda x: (x.admitted_at or 0.0, x.id))
            if victim is None:
                for it in items:
                    if it.n > it.req.reserved:
                        self._finish(it.req, "length", now)
                items = [it for it in items if not it.req.finished]
                break
            self._preempt(victim, now)
            items = [it for it in items if it.req is not victim]
        return items

    def _out_of_kv(self, items: list[BatchItem], now: float) -> None:
        """llama_decode found no KV slot although the accounting said the batch fits (it should
        not happen: the pool may fragment differently): give up cached prefixes, then the
        lowest-class, newest running sequence. Nothing of this batch was kept by llama.cpp."""
        needed = sum(it.n for it in items)
        log.warning("llama_decode found no room for a batch of %d tokens with %d cells "
                    "counted free", needed, self.pool.free_cells)
        self._admit_dirty = True
        if self._evict_entry(avoid=None):
            while self.pool.free_cells < needed and self._evict_entry(avoid=None):
                pass
            return
        victim = self.policy.memory_victim(self.running)
        if victim is not None and len(self.running) > 1:
            self._preempt(victim, now, keep_kv=False)  # its cells may be what did not fit
            return
        newest = max(self.running, key=lambda r: r.arrival)
        self._fail(newest, "the KV cache is exhausted", now, status=503)

    def _keep_as_prefix(self, r: Request) -> None:
        own = r.n_past - r.shared_len
        self.pool.release_cells(own)
        self.pool.unreserve(r.reserved)
        r.reserved = 0
        shared = r.shared if r.shared is not None and r.shared.seq_id in self.pool.entries else None
        if r.shared is not None:
            r.shared.sharers.discard(r)
        for seq in self.pool.insert(r.seq_id, r.tokens[: r.n_past], own, shared,  # type: ignore[arg-type]
                                    rank=r.cache_rank, now=self.b.now(), resume=not r.finished):
            self._drop_seq(seq)
        r.seq_id, r.shared, r.shared_len = None, None, 0

