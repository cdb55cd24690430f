"""Saving the household's prompts from the prefix cache to disk, and putting them back at start
(the files are :mod:`hearth.engine.prefix_store`'s).

The engine thread copies the cells of the voice and chat entries out (llama.cpp's sequence
state) while it is idle, at most every ``PERSIST_EVERY_S``, and once more when the server stops;
the store writes them on its own thread. At start, before the server says it is ready, each
saved prefix goes back into the KV cache as an entry of the class it served; a prefix that
starts like one restored before shares that one's cells, as it did before the restart.

A part of the engine that owns the store, when it last saved and the names it saved then. The
engine gives it the backend, the KV part (whose pool's entries it saves and restores), and two
questions: whether the engine has work (then it does not save) and whether a request arrived
(then a save stops, what is on disk kept).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from typing import Any

from .base import Backend
from .kv import KVSpace
from .prefix_index import INDEX_LEN, PrefixEntry
from .prefix_store import PrefixStore, Saved, name_for

log = logging.getLogger("hearth.engine")

PERSIST_EVERY_S = 60.0  # between saves while idle: a crash loses at most this much warmth
HEADER_BYTES = 512  # a file's header past its token ids, at most


class Persister:
    def __init__(self, backend: Backend, kv: KVSpace, busy: Callable[[], bool],
                 arrived: Callable[[], bool]):
        self.b = backend
        self.kv = kv
        self._busy = busy  # the engine has work: no save
        self._arrived = arrived  # a request arrived: it goes before the rest of a save
        self.store: PrefixStore | None = None  # set once the server knows its model's folder
        self._persisted_at = float("-inf")
        self._persisted: tuple[str, ...] = ()  # the names of the entries saved last

    def lost(self) -> None:
        """A new worker: the next idle moment saves what it holds."""
        self._persisted = ()

    def _to_persist(self) -> list[PrefixEntry]:
        pool = self.kv.pool
        return pool.policy.by_worth(pool.entries.values())

    def maybe_persist(self) -> bool:
        if self._busy() or self.b.now() - self._persisted_at < PERSIST_EVERY_S:
            return False
        return self.persist() is not None

    def persist(self, force: bool = False) -> Future | None:
        """Hand the interactive entries not on disk yet to the store (in the engine thread, or
        once it stopped); None when there is nothing to do."""
        store = self.store
        if store is None or not store.enabled:
            return None
        now = self.b.now()
        entries = [(e, name_for(e.tokens)) for e in self._to_persist()]
        names = tuple(name for _, name in entries)
        self._persisted_at = now
        if names == self._persisted and not force:
            return None
        new: list[tuple[str, dict[str, Any], Any]] = []
        keep: list[str] = []
        total = 0
        wall = time.time()
        for i, (e, name) in enumerate(entries):
            size = store.on_disk.get(name)
            payload = None
            if size is None and not force and self._arrived():
                # A request arrived: it goes first. What is on disk stays; the rest next time.
                keep += [n for _, n in entries[i:] if n in store.on_disk]
                return store.save(new, keep)
            if size is None:
                data = self.b.seq_state_get(e.seq_id)
                if data is None:
                    continue
                payload = self.b.state_bytes(data)
                size = len(payload) + HEADER_BYTES + 8 * len(e.tokens)  # what the file takes
            if total + size > store.max_bytes:
                continue  # a smaller one further down may still fit
            total += size
            keep.append(name)
            if payload is not None:
                new.append((name, {"tokens": e.tokens, "rank": e.rank, "hits": e.hits,
                                   "born": wall - (now - e.born)}, payload))
        self._persisted = names
        return store.save(new, keep)

    def restore(self, saved: Iterable[Saved]) -> int:
        """Put saved prefixes back into an empty pool, before the engine thread starts.
        Returns how many are back."""
        pool = self.kv.pool
        now = t0 = self.b.now()
        peak = 0
        for s in saved:
            if len(pool.entries) >= pool.max_entries:
                break
            if len(s.tokens) >= self.b.n_ctx_seq or len(s.tokens) > pool.free_cells:
                continue
            seq = pool.take_id()
            if seq is None:
                break
            if not self.b.seq_state_set(seq, self.b.state_from_bytes(s.payload)):
                log.warning("llama.cpp refused the saved prefix %s; it will be recomputed",
                            s.name)
                self.kv.drop(seq)
                continue
            peak = max(peak, pool.used_cells + len(s.tokens))
            parent, shared = pool.find(s.tokens)
            if parent is not None and shared >= INDEX_LEN:
                # Its first cells are another entry's: share them as before the restart.
                self.b.seq_rm(seq, 0, shared)
                self.b.seq_cp(parent.seq_id, seq, 0, shared)
            else:
                parent, shared = None, 0
            for drop in pool.insert(seq, s.tokens, len(s.tokens) - shared, parent, rank=s.rank,
                                    now=now - s.age_s):
                self.kv.drop(drop)
            if (e := pool.entries.get(seq)) is not None:
                e.hits = max(e.hits, s.hits)
        # Cells freed by sharing sit between the restored ones: the first idle moment packs them.
        pool.high_water = max(pool.high_water, peak)
        self._persisted = tuple(name_for(e.tokens) for e in self._to_persist())
        self._persisted_at = now
        if self.store is not None:
            self.store.restored, self.store.restore_s = len(pool.entries), self.b.now() - t0
        return len(pool.entries)
