"""Packing the prefix cache into the lowest KV cells while the engine is idle.

llama.cpp's unified KV cache attends over every cell up to the highest one in use (padded to
256), masked or not, for every token of every batch. Cached prefixes left high in the pool by a
burst of long prompts so tax every later decode: on SmolLM2 with 2 CPU cores, 8 streams decode
~18 % slower with 7,000 cells in use above them, ~5 % with 2,800. llama.cpp cannot move cells,
but a sequence's saved state (``llama_state_seq_get_data``) goes back into the lowest free
cells: once work has freed cells below the cached ones, the idle engine saves each family of
entries (a prefix and those sharing its cells), clears it, and restores it parents first, so
entries still share the cells they shared (a child's own cells travel through a spare sequence
id); between families it stops for an arriving request. Accounting does not change.

A part of the engine that owns no state of its own: what it changes is the KV part's pool (its
cells' places, ``high_water``, ``packings``). The engine gives it the backend, the KV part,
whether packing is on, and two questions: whether the engine has work (then it does not
start) and whether a request arrived (then it stops between families).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from .base import Backend
from .kv import KVSpace
from .prefix_index import PrefixEntry

log = logging.getLogger("hearth.engine")

# Cells freed below the cached ones before packing is worth its copy: the attended range moves
# in steps of 256 cells.
COMPACT_MIN_FREED = 512


class Packer:
    def __init__(self, backend: Backend, kv: KVSpace, enabled: bool,
                 busy: Callable[[], bool], arrived: Callable[[], bool]):
        self.b = backend
        self.kv = kv
        self.enabled = enabled
        self._busy = busy  # the engine has work: no packing
        self._arrived = arrived  # a request arrived: stop after the family under way

    def maybe_compact(self) -> bool:
        """Pack the cached prefixes if the engine is idle and work has freed enough cells since
        the last packing. Returns whether it packed."""
        pool = self.kv.pool
        if (not self.enabled or not pool.entries or self._busy()
                or pool.high_water - pool.used_cells < COMPACT_MIN_FREED):
            return False
        spare = pool.take_id()
        if spare is None:
            return False
        try:
            t0 = self.b.now()
            done, whole = self._compact(spare)
        finally:
            pool.give_id(spare)
        if whole:  # tried either way: not again until cells are freed
            pool.high_water = pool.used_cells
        if done:
            pool.packings += 1
            log.debug("packed %d cached prefixes (%d cells) in %.0f ms", len(pool.entries),
                      pool.cached_cells, 1000 * (self.b.now() - t0))
        return done

    def _compact(self, spare: int) -> tuple[bool, bool]:
        """Pack one family of entries (a prefix and those sharing its cells) at a time, and
        stop when a request arrives: what is packed stays packed, the rest where it was (the
        next idle moment goes on). Returns (whether any family moved, whether all were
        looked at)."""
        moved = False
        for family in _families(list(self.kv.pool.entries.values())):
            if self._arrived():  # someone waits: packing is only an optimisation
                return moved, False
            moved = self._pack(family, spare) or moved
        return moved, True

    def _pack(self, order: list[PrefixEntry], spare: int) -> bool:
        """Save a family's cells, clear them, restore them parents first into the lowest free
        cells. Returns False if an entry could not be saved (then nothing changed)."""
        saved: list[tuple[PrefixEntry, int, object]] = []
        for e in order:  # save everything before touching anything: a failure here costs nothing
            start = len(e.tokens) - e.own if e.shared is not None else 0
            try:
                if start:  # only the cells this entry adds: the rest come from its parent
                    self.b.seq_cp(e.seq_id, spare, start, -1)
                    data = self.b.seq_state_get(spare)
                else:
                    data = self.b.seq_state_get(e.seq_id)
            except Exception:  # e.g. no memory for the copies: packing is only an optimisation
                log.exception("could not save the cached prefixes for packing")
                data = None
            finally:
                self.b.seq_rm(spare)
            if data is None:
                return False
            saved.append((e, start, data))
        for e in order:
            self.b.seq_rm(e.seq_id)
        lost: set[PrefixEntry] = set()
        for e, start, data in saved:
            try:
                if e.shared in lost or not self._restore(e, start, data, spare):
                    lost.add(e)
            except Exception:
                log.exception("could not restore a cached prefix while packing")
                self.b.seq_rm(spare)
                lost.add(e)
        for e in reversed(order):  # children first: a lost entry's children are lost too
            if e in lost:
                self.kv.drop(self.kv.pool.forget(e))
        if lost:
            log.warning("%d cached prefixes could not be restored while packing the KV cache; "
                        "they will be recomputed when needed", len(lost))
        return True

    def _restore(self, e: PrefixEntry, start: int, data: object, spare: int) -> bool:
        if not start:
            return self.b.seq_state_set(e.seq_id, data)
        if not self.b.seq_state_set(spare, data):
            self.b.seq_rm(spare)
            return False
        self.b.seq_cp(e.shared.seq_id, e.seq_id, 0, start)  # type: ignore[union-attr]
        self.b.seq_cp(spare, e.seq_id, start, -1)
        self.b.seq_rm(spare)
        return True


def _families(entries: list[PrefixEntry]) -> list[list[PrefixEntry]]:
    """Entries grouped by the root prefix whose cells they share, each parents first (a
    family moves together: a parent restored alone would duplicate its children's cells)."""
    def root(e: PrefixEntry) -> PrefixEntry:
        while e.shared is not None:
            e = e.shared
        return e

    out: dict[int, list[PrefixEntry]] = {}
    for e in _parents_first(entries):
        out.setdefault(id(root(e)), []).append(e)
    return list(out.values())


def _parents_first(entries: list[PrefixEntry]) -> list[PrefixEntry]:
    def depth(e: PrefixEntry) -> int:
        d = 0
        while e.shared is not None:
            e, d = e.shared, d + 1
        return d
    return sorted(entries, key=depth)  # stable: LRU order within a depth
