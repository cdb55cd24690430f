"""The engine's KV cache as one part: the pool's accounting (sequence ids, cells, reservations,
cached prefixes: :class:`~hearth.engine.kvcache.KVPool`) and the backend's memory calls that
keep that accounting the cache's own. The engine asks it to seat, grow, keep or release a
sequence and to free cells; which sequence gives way for which is the policy's
(:mod:`.admission`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..policy.queue import WaitQueue
from ..shared.requests import Request
from .base import Backend, EngineConfig
from .kvcache import KVPool
from .prefix_index import common_prefix

# How many waiting requests' prefixes are spared first when cached prefixes must go.
WANTED_LOOKAHEAD = 32


def _queue_key(r: Request) -> tuple[int, float, int]:
    return (r.rank, r.arrival, r.id)


class KVSpace:
    """Owns the pool; reads the waiting queue (to spare the prefixes its next requests are
    about to use) and an epoch that moves once per decode (how long that reading holds)."""

    def __init__(self, backend: Backend, cfg: EngineConfig, waiting: WaitQueue,
                 epoch: Callable[[], int]):
        self.b = backend
        self.prefix_cache = cfg.prefix_cache
        entries = cfg.prefix_cache_entries if cfg.prefix_cache else 0
        self.pool = KVPool(backend.n_ctx, backend.n_seq_max, entries, cfg.prefix_cache,
                           kept_cells=int(cfg.prefix_cache_kept_share * backend.n_ctx))
        self._waiting = waiting
        self._epoch = epoch
        self._wanted_memo: tuple[int, frozenset[int]] = (-1, frozenset())

    def lost(self) -> None:
        """The backend's cache is gone (a new worker): no cells, sequences or entries, the
        cache's history kept."""
        self.pool = self.pool.emptied()
        self._wanted_memo = (-1, frozenset())

    # -- sequences -------------------------------------------------------------------------
    def find(self, tokens: list[int]) -> tuple[Any, int]:
        """The cached prefix a prompt would share, and how many of its tokens."""
        return self.pool.find(tokens) if self.prefix_cache else (None, 0)

    def spare_ids(self) -> int:
        """Sequence ids free, or held by cached prefixes no running sequence shares."""
        return len(self.pool.free_ids) + sum(1 for e in self.pool.entries.values()
                                             if self.pool.evictable(e))

    def seat(self, r: Request, seq: int, entry: Any, hit: int, need: int) -> None:
        """``r`` runs on ``seq``, sharing the ``hit`` first tokens of ``entry`` (copied, not
        duplicated), with ``need`` cells reserved for what it computes next."""
        r.seq_id = seq
        if entry is not None:  # find() gives an entry only with a hit; it is still there
            self.b.seq_cp(entry.seq_id, seq, 0, hit)
            r.shared, r.shared_len = entry, hit
            entry.sharers.add(r)
            r.n_past = hit
        else:
            r.n_past = 0
        if self.prefix_cache:
            first = r.first_admitted_at is None
            self.pool.use(entry, hit, len(r.tokens), count=first and not r.warm_up,
                          rank=r.cache_rank)
            if first and r.warm_up:
                self.pool.warm_ups += 1
        r.reserved = need
        self.pool.reserve(need)

    def computed(self, r: Request, n: int) -> None:
        """``n`` more of ``r``'s cells were computed: from its reservation first."""
        mine = min(n, r.reserved)
        r.reserved -= mine
        self.pool.add_cells(n, reserved=mine)

    def release(self, r: Request) -> None:
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

    def keep(self, r: Request) -> None:
        """A sequence leaves the running set with its computed cells kept as a cached prefix
        (a preempted one's to resume from, ``resume``, while it has not finished)."""
        # cells past the counted ones go: a drafted stream that ended part-way through the
        # guesses its decode took (engine.drafts)
        self.b.seq_rm(r.seq_id, r.n_past, -1)  # type: ignore[arg-type]
        own = r.n_past - r.shared_len
        self.pool.release_cells(own)
        self.pool.unreserve(r.reserved)
        r.reserved = 0
        shared = r.shared if r.shared is not None and r.shared.seq_id in self.pool.entries else None
        if r.shared is not None:
            r.shared.sharers.discard(r)
        for seq in self.pool.insert(r.seq_id, r.tokens[: r.n_past], own, shared,  # type: ignore[arg-type]
                                    rank=r.cache_rank, now=self.b.now(), resume=not r.finished):
            self.drop(seq)
        r.seq_id, r.shared, r.shared_len = None, None, 0

    def drop(self, seq: int) -> None:
        """Clear a sequence the pool gave up and hand its id back."""
        self.b.seq_rm(seq)
        self.pool.give_id(seq)

    def note_high_water(self) -> None:
        self.pool.high_water = max(self.pool.high_water, self.pool.used_cells)

    # -- room ------------------------------------------------------------------------------
    @staticmethod
    def cells_of(r: Request) -> int:
        """The cells preempting ``r`` gives back (once its kept prefix is given up too)."""
        return r.n_past - r.shared_len + r.reserved

    def room(self, entry: Any, hit: int, rank: int | None, victims: list[Request]) -> int:
        """The cells a request of class ``rank`` could have, keeping ``hit`` tokens of
        ``entry``: free ones, those evicting and trimming prefixes frees once ``victims`` are
        out, and theirs (they come back as prefixes nobody shares). Counted exactly: a cell a
        staying sequence needs, through any chain of prefixes, is not room."""
        gone = frozenset(id(v) for v in victims)
        return (self.pool.free_cells + sum(self.cells_of(v) for v in victims)
                + self.pool.freeable(self.cache_need(entry, hit, rank, gone)))

    def cache_need(self, entry: Any, hit: int, rank: int | None,
                   gone: frozenset[int] = frozenset(),
                   pool: KVPool | None = None) -> dict[int, int]:
        """What of each cached prefix must stay (:meth:`KVPool.needs`): the ``hit`` tokens of
        ``entry``, the whole of those a request of class ``rank`` may not give up, what running
        sequences (but those in ``gone``) share. In ``pool``: this one, or a rehearsal."""
        pool = self.pool if pool is None else pool
        kept = pool.kept()
        protect = {e.seq_id: len(e.tokens) for e in pool.entries.values()
                   if not pool.yields_to(e, rank, kept)}
        if entry is not None and entry.seq_id in pool.entries:
            protect[entry.seq_id] = max(protect.get(entry.seq_id, 0), hit)
        return pool.needs(protect, gone)

    # -- a preemption rehearsed before it is made --------------------------------------------
    def rehearse(self, victims: list[Request], keep: bool) -> KVPool:
        """The pool as it will be once ``victims`` leave the running set, their computed cells
        kept as prefixes (``keep``: as :meth:`keep` does, superseding what the insert
        supersedes, and holding a sequence id each) or freed (:meth:`release`): a copy, this
        pool untouched."""
        pool = self.pool.rehearsal()
        for v in victims:
            shared = pool.entries.get(v.shared.seq_id) if v.shared is not None else None
            if shared is not None:
                shared.sharers.discard(v)
            own = v.n_past - v.shared_len
            pool.release_cells(own)
            pool.unreserve(v.reserved)
            if keep and self.prefix_cache and v.n_past > 0:
                for seq in pool.insert(v.seq_id, v.tokens[: v.n_past], own, shared,  # type: ignore[arg-type]
                                       rank=v.cache_rank, resume=not v.finished):
                    pool.give_id(seq)
            else:
                pool.give_id(v.seq_id)  # type: ignore[arg-type]
        return pool

    @staticmethod
    def holding(pool: KVPool, entry: Any, tokens: list[int], hit: int) -> Any:
        """The entry of ``pool`` that holds the ``hit`` first tokens of ``tokens`` that
        ``entry`` held: ``entry`` itself, or the kept prefix that superseded it (it holds them
        and more); None when they are gone."""
        if entry is None:
            return None
        same = pool.entries.get(entry.seq_id)
        if same is not None and common_prefix(same.tokens, tokens) >= hit:
            return same
        found, n = pool.find(tokens)
        return found if n >= hit else None

    def room_in(self, pool: KVPool, entry: Any, hit: int, rank: int | None) -> int:
        """The cells a request of class ``rank`` could have in ``pool`` (a rehearsal, or this
        one), keeping ``hit`` tokens of ``entry``: free ones and those giving up and trimming
        prefixes frees."""
        return pool.free_cells + pool.freeable(self.cache_need(entry, hit, rank, pool=pool))

    @staticmethod
    def id_in(pool: KVPool, entry: Any, rank: int | None) -> bool:
        """Whether ``pool`` has a sequence id free, or a cached prefix (not ``entry``) a
        request of class ``rank`` may give up for one (:meth:`free_id`)."""
        if pool.free_ids:
            return True
        kept = pool.kept()
        return any(e is not entry and pool.evictable(e) and pool.yields_to(e, rank, kept)
                   for e in pool.entries.values())

    def wanted(self) -> frozenset[int]:
        """Seq ids of the entries the next waiting requests (the ``WANTED_LOOKAHEAD`` best
        classes, oldest first) are about to use: given up last. An order of preference: looked
        up once per epoch, not once per eviction, and each request's lookup is kept while
        the cache's entries stay as they are, so a long queue costs no more than a short one."""
        key = self._epoch()
        if self._wanted_memo[0] != key:
            nxt = self._waiting.oldest(WANTED_LOOKAHEAD, _queue_key)
            self._wanted_memo = (key, frozenset(
                e.seq_id for w in nxt if (e := self.lookup(w)) is not None))
        return self._wanted_memo[1]

    def lookup(self, r: Request) -> Any:
        """The cached prefix ``r`` would use now (:meth:`KVPool.find`), kept on the request
        while the cache's entries do not change."""
        seen = r.meta.get("_lookup")
        if seen is None or seen[0] != self.pool.version or seen[1] != len(r.tokens):
            seen = r.meta["_lookup"] = (self.pool.version, len(r.tokens),
                                        self.pool.find(r.tokens)[0])
        return seen[2]

    def free_cache(self, entry: Any, hit: int, rank: int | None,
                   wanted: frozenset[int] | None = None) -> bool:
        """Free the cells of one cached prefix, or its tail running sequences do not share,
        keeping what :meth:`cache_need` keeps; whether any came free."""
        if not self.pool.entries:
            return False
        need = self.cache_need(entry, hit, rank)
        freed = self.pool.release_one(need, self.wanted() if wanted is None else wanted,
                                      self.pool.kept())
        if freed is None:
            return False
        seq, keep = freed
        if keep == 0:
            self.drop(seq)
        else:
            self.b.seq_rm(seq, keep, -1)
        return True

    def evict_entry(self, avoid: Any = None, rank: int | None = None) -> bool:
        """Free one cached prefix's cells (not ``avoid``, none that serves a class above
        ``rank``); whether any came free."""
        return self.free_cache(avoid, len(avoid.tokens) if avoid is not None else 0, rank)

    def free_id(self, entry: Any, rank: int | None) -> bool:
        """Every sequence id is taken (preempted work is kept past the entry cap): give up one
        cached prefix, not ``entry``, that a request of class ``rank`` may give up."""
        seq = self.pool.evict(avoid=entry, rank=rank, wanted=self.wanted())
        if seq is None:
            return False
        self.drop(seq)
        return True
