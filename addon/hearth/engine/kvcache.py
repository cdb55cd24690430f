"""Sequence ids, KV-cell accounting and the prefix cache. Pure bookkeeping: the engine performs
the llama.cpp memory calls this module asks for.

The KV cache is one unified pool of ``n_ctx`` cells shared by ``n_seq_max`` sequence ids. Running
sequences hold ids; finished sequences may keep theirs as *cached prefixes* (LRU), which a new
request can share with ``llama_memory_seq_cp`` (cells are shared, not duplicated). Cached
prefixes are the first thing given up under pressure.

The KV protocol, in three lines (the engine keeps it; :mod:`hearth.engine.admission`):
1. admission reserves the cells of a prompt's uncached part (+1 for the first generated token)
   and admits only when they are free, making room from prefixes nobody uses, then from
   sequences of a lower class, and only if that makes the room and a sequence id (rehearsed on
   a copy of the pool, the victims' kept prefixes as they will be: :meth:`KVPool.rehearsal`);
2. before each decode the batch's cells beyond the reservations must be free, or cached
   prefixes go, then the lowest-class newest sequence is preempted (never voice while another
   class runs), its computed cells kept as a prefix it resumes from;
3. so llama_decode never runs out of cells; if it does anyway, the engine recovers the same way.

Cell accounting is exact: a sequence that shares a prefix counts only the cells it added. An
entry is given up only while no running sequence shares it and at most one other entry does:
that one then owns the cells it shared (the part its parent still holds stays shared with the
parent), so no cell is ever counted twice. An entry running sequences share only in part is cut
to the part they share (a turn that shares a cached conversation's system prompt must not pin
the whole conversation), so every cell no running sequence needs can be freed.
"""

from __future__ import annotations

import copy
import dataclasses
from collections import OrderedDict, defaultdict
from typing import Any

from ..policy.cache import CachePolicy
from ..policy.scheduler import RANK_NAMES
from .prefix_index import PrefixEntry, PrefixIndex, common_prefix


class KVPool:
    # What the pool has done over its life (not what it holds): kept by emptied().
    COUNTERS = ("hits", "lookups", "hit_tokens", "lookup_tokens", "evictions", "lookups_by",
                "hits_by", "packings", "warm_ups", "trims")

    def __init__(self, n_ctx: int, n_seq_max: int, max_entries: int, enabled: bool = True,
                 kept_cells: int = 0):
        self.n_ctx = n_ctx
        self.n_seq_max = n_seq_max
        self.policy = CachePolicy(kept_cells, n_ctx)
        self.free_ids: list[int] = list(range(n_seq_max - 1, -1, -1))
        self.entries: OrderedDict[int, PrefixEntry] = OrderedDict()  # LRU order
        self.max_entries = max_entries if enabled else 0
        self.running_cells = 0  # cells owned by running sequences
        self.reserved_cells = 0  # set aside for running sequences, not computed yet
        self._index = PrefixIndex()
        self.hits = 0
        self.lookups = 0
        self.hit_tokens = 0
        self.lookup_tokens = 0
        self.evictions = 0
        # By the class of the request looking up: the voice hit rate is the one that matters.
        self.lookups_by: defaultdict[int, int] = defaultdict(int)
        self.hits_by: defaultdict[int, int] = defaultdict(int)
        self.high_water = 0  # most cells in use at once since the cache was last packed
        self.packings = 0
        self.warm_ups = 0
        self.trims = 0  # entries cut to the part running sequences share
        self.version = 0  # moves whenever an entry comes, goes or is cut: lookups go stale

    def emptied(self) -> KVPool:
        """This pool with no cells, sequences or entries (a new worker's KV cache is empty),
        its counters kept."""
        pool = KVPool(self.n_ctx, self.n_seq_max, self.max_entries,
                      kept_cells=self.policy.kept_cells)
        for name in self.COUNTERS:
            setattr(pool, name, getattr(self, name))
        return pool

    def rehearsal(self) -> KVPool:
        """A copy to try a change on (what a preemption would leave, before it is made): its
        own entries, ids and counts; the running sequences among the sharers are the same
        objects. Nothing of it reaches the backend."""
        twin = copy.copy(self)
        twins = {seq: dataclasses.replace(e, sharers=set()) for seq, e in self.entries.items()}
        for seq, e in self.entries.items():
            t = twins[seq]
            t.shared = twins.get(e.shared.seq_id) if e.shared is not None else None
            t.sharers = {twins[s.seq_id] if isinstance(s, PrefixEntry) else s
                         for s in e.sharers}
        twin.entries = OrderedDict(twins)
        twin._index = PrefixIndex()
        for t in twins.values():
            twin._index.add(t)
        twin.free_ids = list(self.free_ids)
        return twin

    # -- accounting ------------------------------------------------------------------------
    @property
    def cached_cells(self) -> int:
        return sum(e.own for e in self.entries.values())

    @property
    def used_cells(self) -> int:
        return self.running_cells + self.cached_cells

    @property
    def free_cells(self) -> int:
        return self.n_ctx - self.used_cells - self.reserved_cells

    def reserve(self, n: int) -> None:
        self.reserved_cells += n

    def unreserve(self, n: int) -> None:
        self.reserved_cells -= n

    def add_cells(self, n: int, reserved: int = 0) -> None:
        """``n`` cells were computed, ``reserved`` of them set aside before."""
        self.reserved_cells -= reserved
        self.running_cells += n

    def release_cells(self, n: int) -> None:
        self.running_cells = max(0, self.running_cells - n)

    # -- sequence ids ----------------------------------------------------------------------
    def take_id(self) -> int | None:
        return self.free_ids.pop() if self.free_ids else None

    def give_id(self, seq_id: int) -> None:
        self.free_ids.append(seq_id)

    # -- the prefix cache ------------------------------------------------------------------
    def find(self, tokens: list[int]) -> tuple[PrefixEntry | None, int]:
        """The entry sharing the longest prefix with ``tokens``, without touching anything (a
        request waiting for room asks again every iteration). At least one token is left to
        compute, since the last prompt token's logits are needed."""
        best, best_n = None, 0
        for e in self._candidates(tokens):
            n = common_prefix(e.tokens, tokens)
            if n > best_n:
                best, best_n = e, n
        best_n = min(best_n, len(tokens) - 1)
        if best is None or best_n <= 0:
            return None, 0
        return best, best_n

    def _candidates(self, tokens: list[int]):
        return self._index.candidates(tokens)

    def _add(self, e: PrefixEntry) -> None:
        self.version += 1
        self.entries[e.seq_id] = e
        self._index.add(e)

    def use(self, entry: PrefixEntry | None, hit: int, n_tokens: int, count: bool = True,
            rank: int = 99) -> None:
        """A request of class ``rank`` was admitted with this hit: the entry is fresh again and
        has served; the hit rate counts the request once (``count``: its first admission, not a
        resumption)."""
        if entry is not None and hit > 0:
            entry.resume = False
            self.entries.move_to_end(entry.seq_id)
            entry.hits += 1
            entry.rank = min(entry.rank, rank)
        if count:
            self.lookups += 1
            self.lookup_tokens += n_tokens
            self.lookups_by[rank] += 1
            if entry is not None and hit > 0:
                self.hits += 1
                self.hit_tokens += hit
                self.hits_by[rank] += 1

    def insert(self, seq_id: int, tokens: list[int], own: int, shared: PrefixEntry | None,
               rank: int = 99, now: float = 0.0, resume: bool = False) -> list[int]:
        """Keep the cells of a sequence a request of class ``rank`` left as a cached prefix.
        Returns seq ids the caller must clear (``seq_rm``) and give back: entries this one
        supersedes, and overflow past ``max_entries``. A preempted request's work
        (``resume``) stays past the cap: its sequence id was taken already, and the request
        resumes from it (the engine frees an id when it needs one: :meth:`evict`)."""
        drop: list[int] = []
        if self.max_entries == 0:
            return [seq_id]
        entry = PrefixEntry(seq_id=seq_id, tokens=tokens, own=own, shared=shared, rank=rank,
                            born=now, resume=resume)
        if shared is not None:
            shared.sharers.add(entry)
        for e in list(self._candidates(tokens)):
            # An older entry that is a prefix of this one serves no lookup this one cannot; its
            # record of being useful passes on (unless running sequences still share it).
            if (len(e.tokens) <= len(tokens) and self.evictable(e)
                    and common_prefix(e.tokens, tokens) == len(e.tokens)):
                entry.hits = max(entry.hits, e.hits)
                entry.rank = min(entry.rank, e.rank)
                entry.born = min(entry.born, e.born)
                drop.append(self._remove(e))
        self._add(entry)
        while len(self.entries) > self.max_entries and not resume:
            seq = self.evict(avoid=entry, rank=rank)
            if seq is None:  # all in use: the newest (shared by nothing yet) goes instead
                drop.append(self._remove(entry))
                break
            drop.append(seq)
        return drop

    @staticmethod
    def evictable(e: PrefixEntry) -> bool:
        """Whether giving ``e`` up keeps the accounting exact: no running sequence shares its
        cells (they would free nothing anyway) and at most one entry does."""
        entries = 0
        for s in e.sharers:
            if not isinstance(s, PrefixEntry):
                return False
            entries += 1
        return entries <= 1

    # -- freeing cells: whole entries, or the tails nobody shares ------------------------------
    def needs(self, protect: dict[int, int], gone: frozenset[int] = frozenset()) -> dict[int, int]:
        """How many first tokens of each entry must stay: what a running sequence (none whose
        ``id`` is in ``gone``: about to be preempted) or a staying child entry shares of it, and
        ``protect`` (seq id -> tokens). The rest of an entry's own cells can be freed: the
        whole entry when nothing is needed, else its tail (:meth:`release_one`)."""
        def depth(e: PrefixEntry) -> int:
            n, x = 0, e.shared
            while x is not None:
                n, x = n + 1, x.shared
            return n

        need: dict[int, int] = {}
        for e in sorted(self.entries.values(), key=depth, reverse=True):  # children first
            n = protect.get(e.seq_id, 0)
            for s in e.sharers:
                if isinstance(s, PrefixEntry):
                    n = max(n, min(need.get(s.seq_id, len(s.tokens)), len(s.tokens) - s.own))
                elif id(s) not in gone:
                    n = max(n, s.shared_len)
            need[e.seq_id] = min(n, len(e.tokens))
        return need

    @staticmethod
    def _spare(e: PrefixEntry, need: int) -> int:
        """Own cells of ``e`` past its first ``need`` tokens."""
        return min(e.own, len(e.tokens) - need)

    def freeable(self, need: dict[int, int]) -> int:
        """Cells that evicting and trimming entries down to ``need`` (:meth:`needs`) frees."""
        return sum(self._spare(e, need[e.seq_id]) for e in self.entries.values())

    def release_one(self, need: dict[int, int], wanted: frozenset[int] = frozenset(),
                    kept: set[int] | frozenset[int] = frozenset()) -> tuple[int, int] | None:
        """Free the cells of one entry beyond ``need``, in the policy's order: the whole entry
        when none of it is needed, else its unshared tail (a turn sharing only the system
        prompt of a cached conversation must not pin the whole conversation). Returns
        ``(seq_id, keep)``: the caller clears the sequence's positions from ``keep`` on, and
        gives the id back when ``keep`` is 0; None when nothing can be freed."""
        cands = [e for e in self.entries.values() if self._spare(e, need[e.seq_id]) > 0
                 and (self._trimmable(e, need[e.seq_id]) if need[e.seq_id] > 0
                      else self.evictable(e))]
        if not cands:
            return None
        e = self.policy.victim(cands, wanted, kept)
        keep = need[e.seq_id]
        if keep == 0:
            self.evictions += 1
            return self._remove(e), 0
        self.trim(e, keep)
        return e.seq_id, keep

    @staticmethod
    def _trimmable(e: PrefixEntry, keep: int) -> bool:
        """Whether no child entry holds cells of ``e`` past ``keep`` now (a child not needed
        goes first: its cells are freed only with it)."""
        return all(len(s.tokens) - s.own <= keep for s in e.sharers
                   if isinstance(s, PrefixEntry))

    def trim(self, e: PrefixEntry, keep: int) -> None:
        """Cut ``e`` to its first ``keep`` tokens (no sharer shares more); the caller clears
        the cells past them."""
        self.trims += 1
        self.version += 1
        old = e.tokens
        e.own -= self._spare(e, keep)
        e.tokens = e.tokens[:keep]
        self._index.moved(e, old)

    def kept(self) -> set[int]:
        """Seq ids of the interactive entries within the kept budget (:mod:`..policy.cache`)."""
        return self.policy.kept(self.entries.values())

    def yields_to(self, e: PrefixEntry, rank: int | None, kept: set[int]) -> bool:
        """Whether a request of class ``rank`` (None: the engine itself) may make room by
        giving ``e`` up: a background summary waits rather than cost the next voice turn its
        cached system prompt."""
        return self.policy.may_evict(e, rank, kept)

    def evict(self, avoid: PrefixEntry | None = None, rank: int | None = None,
              wanted: frozenset[int] = frozenset()) -> int | None:
        """Give up one entry (that a request of class ``rank`` may give up, in the policy's
        order; ``wanted``: seq ids a waiting request is about to use); returns its seq id (the
        caller clears it), or None."""
        kept = self.kept()
        cands = [e for e in self.entries.values()
                 if e is not avoid and self.evictable(e) and self.yields_to(e, rank, kept)]
        if not cands:
            return None
        victim = self.policy.victim(cands, wanted, kept)
        self.evictions += 1
        return self._remove(victim)

    def forget(self, e: PrefixEntry) -> int:
        """Drop an entry whose cells are gone (its sharers forgotten first); returns its seq id,
        which the caller clears and gives back, as after :meth:`evict`."""
        return self._remove(e)

    def _remove(self, e: PrefixEntry) -> int:
        """Forget an evictable entry. Its one sharing entry, if any, owns the cells it shared
        with ``e`` from now on, except those ``e`` itself shared with its own parent: those
        it shares with that parent instead."""
        del self.entries[e.seq_id]
        self.version += 1
        self._index.remove(e)
        parent = e.shared
        if parent is not None:
            parent.sharers.discard(e)
        with_parent = len(e.tokens) - e.own if parent is not None else 0
        for s in list(e.sharers):  # evictable: entries only, at most one
            shared = len(s.tokens) - s.own
            keep = min(shared, with_parent)
            s.own += shared - keep
            s.shared = parent if keep > 0 else None
            if s.shared is not None:
                s.shared.sharers.add(s)
        e.sharers.clear()
        return e.seq_id

    def stats(self, now: float = 0.0) -> dict[str, Any]:
        return {
            "entries": len(self.entries),
            "hit_rate": self.hits / self.lookups if self.lookups else 0.0,
            "token_hit_rate": self.hit_tokens / self.lookup_tokens if self.lookup_tokens else 0.0,
            "evictions": self.evictions,
            "cached_cells": self.cached_cells,
            "kept_budget": self.policy.budget(self.policy.by_worth(self.entries.values())),
            "packings": self.packings,
            "warm_ups": self.warm_ups,
            "by_class": self.by_class(now),
        }

    def by_class(self, now: float) -> dict[str, dict[str, Any]]:
        """Per class: the entries it holds (by the best class that used them), their cells,
        how many are within the kept budget, the age of the oldest, and the hit rate of that
        class's requests."""
        kept = self.kept()
        mine: dict[int, list[PrefixEntry]] = {rank: [] for rank in RANK_NAMES}
        for e in self.entries.values():  # one pass: this runs after every iteration
            mine.setdefault(e.rank, []).append(e)
        out: dict[str, dict[str, Any]] = {}
        for rank, name in RANK_NAMES.items():
            es, lookups = mine[rank], self.lookups_by.get(rank, 0)
            out[name] = {
                "entries": len(es), "cells": sum(e.own for e in es),
                "kept": sum(1 for e in es if e.seq_id in kept),
                "oldest_s": round(now - min(e.born for e in es), 1) if es else None,
                "lookups": lookups,
                "hit_rate": round(self.hits_by.get(rank, 0) / lookups, 4) if lookups else 0.0,
            }
        return out
