"""Packing the prefix cache alone (no engine): given the KV part and the backend, the packer
moves cached prefixes into the lowest cells, keeps their sharing and the accounting, waits while
the engine has work and stops between families when a request arrives."""

from __future__ import annotations

from sim_backend import SimBackend
from sim_backend import computed as seat_computed

from hearth.engine.base import EngineConfig
from hearth.engine.compaction import Packer
from hearth.engine.kv import KVSpace
from hearth.policy.queue import WaitQueue
from hearth.shared.requests import Request

SYSTEMS = [[7000 + 1000 * k + i for i in range(60)] for k in range(2)]


def computed(kv: KVSpace, b: SimBackend, cls: str, n: int, seed: int,
             prefix: list[int] | None = None) -> Request:
    r = seat_computed(kv, b, cls, n, seed, prefix)
    kv.note_high_water()
    return r


def cached_above_a_freed_document():
    """Two families of voice turns (each a system prompt shared by two turns) cached above a
    600-token document that has gone: its cells are free below them."""
    b = SimBackend(n_ctx=4000, n_seq_max=12, n_batch=1024)
    kv = KVSpace(b, EngineConfig(prefix_cache_entries=8), WaitQueue(), lambda: 0)
    doc = computed(kv, b, "background", 600, 1)
    for k, system in enumerate(SYSTEMS):
        for turn in range(2):
            r = computed(kv, b, "voice", 30, 10 * k + turn, prefix=system)
            r.finished = True
            kv.keep(r)
    kv.release(doc)
    return kv, b


def sharing(kv: KVSpace, b: SimBackend) -> list[tuple[int, bool]]:
    """Each child entry's shared length and whether it holds its parent's very cells."""
    out = []
    for e in kv.pool.entries.values():
        if e.shared is not None:
            n = len(e.tokens) - e.own
            same = all(b.cells[e.seq_id][p] == b.cells[e.shared.seq_id][p] for p in range(n))
            out.append((n, same))
    return out


def test_packing_moves_the_cached_prefixes_down_with_their_sharing_and_counts():
    kv, b = cached_above_a_freed_document()
    busy = [True]
    packer = Packer(b, kv, True, lambda: busy[0], lambda: False)
    used, entries, shared = b.used, dict(kv.pool.entries), sharing(kv, b)
    assert shared == [(60, True), (60, True)] and b.cells_spanned > used + 500
    assert not packer.maybe_compact(), "not while the engine has work"
    busy[0] = False
    assert packer.maybe_compact()
    assert kv.pool.packings == 1
    assert b.cells_spanned == b.used == used == kv.pool.used_cells
    assert kv.pool.entries == entries and sharing(kv, b) == shared
    for e in kv.pool.entries.values():  # every position of every entry has its cell
        assert len(b.cells[e.seq_id]) == len(e.tokens)
    assert not packer.maybe_compact(), "nothing freed since"


def test_an_arrival_stops_packing_after_the_family_under_way_and_it_goes_on_later():
    kv, b = cached_above_a_freed_document()
    asked = [0]

    def arrived() -> bool:  # someone arrives as the first family is done
        asked[0] += 1
        return asked[0] == 2

    packer = Packer(b, kv, True, lambda: False, arrived)
    spanned = b.cells_spanned
    assert packer.maybe_compact()
    assert b.cells_spanned == spanned, "the second family still sits above the gap"
    assert packer.maybe_compact()  # the next idle moment packs the rest
    assert b.cells_spanned == b.used and kv.pool.packings == 2


def test_packing_switched_off_moves_nothing():
    kv, b = cached_above_a_freed_document()
    spanned = b.cells_spanned
    assert not Packer(b, kv, False, lambda: False, lambda: False).maybe_compact()
    assert b.cells_spanned == spanned and kv.pool.packings == 0
