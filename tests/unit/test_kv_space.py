"""The engine's KV part alone (no engine): seating, growing, keeping and releasing sequences
and freeing cached prefixes keep its count of cells the backend's; the room it promises is
the room freeing gives; the prefixes the next waiting requests want go last."""

from __future__ import annotations

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from sim_backend import SimBackend, request

from hearth.engine.base import EngineConfig
from hearth.engine.kv import KVSpace
from hearth.policy.queue import WaitQueue

SYSTEM = [7000 + i for i in range(40)]


def space(n_ctx: int = 10_000, entries: int = 4, epoch=lambda: 0):
    b = SimBackend(n_ctx=n_ctx, n_seq_max=entries + 4)
    waiting = WaitQueue()
    kv = KVSpace(b, EngineConfig(prefix_cache_entries=entries), waiting, epoch)
    return kv, b, waiting


def new(b, cls="chat", n=20, seed=0, prefix=None, t=0.0):
    r, _ = request(b, cls, n, 4, seed=seed, prefix=prefix)
    r.tokens, r.arrival = list(r.prompt), t
    return r


def seat(kv, r) -> bool:
    """What admission does once it decided ``r`` goes: its hit, an id, its reservation."""
    entry, hit = kv.find(r.tokens)
    seq = kv.pool.take_id()
    if seq is None:
        return False
    kv.seat(r, seq, entry, hit, len(r.tokens) - hit + 1)
    return True


def compute(kv, b, r, n=None) -> None:
    """Prefill ``n`` (all) of ``r``'s uncomputed tokens on the backend, as a decode does."""
    n = len(r.tokens) - r.n_past if n is None else n
    pos = list(range(r.n_past, r.n_past + n))
    assert b.decode([r.tokens[p] for p in pos], pos, [r.seq_id] * n, [False] * n) == 0
    r.n_past += n
    kv.computed(r, n)


def counted(kv) -> int:
    return kv.pool.used_cells


@settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(st.tuples(st.sampled_from(["seat", "compute", "keep", "release", "free"]),
                          st.sampled_from([None, 10, 30]), st.integers(1, 30)),
                max_size=40))
@example([("seat", None, 20), ("compute", None, 30), ("seat", 30, 5), ("compute", None, 30),
          ("compute", None, 1), ("compute", None, 30), ("compute", None, 1), ("keep", None, 1),
          ("seat", 30, 5), ("compute", None, 3), ("compute", None, 1), ("release", None, 1)])
def test_the_count_of_cells_is_the_backends_through_any_sequence_of_calls(ops):
    kv, b, _ = space()
    running = []
    for i, (op, shared, n) in enumerate(ops):
        if op == "seat":
            r = new(b, n=n, seed=i, prefix=SYSTEM[:shared] if shared else None)
            if seat(kv, r):
                running.append(r)
        elif op == "compute" and running:
            r = running[i % len(running)]
            if r.n_past < len(r.tokens):
                compute(kv, b, r, min(n, len(r.tokens) - r.n_past))
        elif op in ("keep", "release") and running:
            r = running.pop(i % len(running))
            r.finished = True
            (kv.keep if op == "keep" and r.n_past > 0 else kv.release)(r)
        elif op == "free":
            kv.evict_entry()
        assert counted(kv) == b.used
        assert kv.pool.reserved_cells == sum(r.reserved for r in running)
        held = {r.seq_id for r in running} | set(kv.pool.entries)
        assert len(held) + len(kv.pool.free_ids) == kv.pool.n_seq_max
    for r in running:
        kv.release(r)
    while kv.evict_entry():
        pass
    assert counted(kv) == b.used == 0


def test_room_is_what_releasing_the_victims_and_freeing_the_cache_gives():
    kv, b, _ = space()
    done = []
    for seed in range(3):  # three finished turns on the system prompt, kept as prefixes
        r = new(b, n=30, seed=seed, prefix=SYSTEM)
        assert seat(kv, r)
        compute(kv, b, r)
        r.finished = True
        kv.keep(r)
        done.append(r)
    stays = new(b, n=25, seed=10, prefix=SYSTEM)  # shares the system prompt: it must stay
    victim = new(b, n=50, seed=11)
    for r in (stays, victim):
        assert seat(kv, r)
        compute(kv, b, r, len(r.tokens) - r.n_past - 5)  # part-way: some still reserved
    room = kv.room(None, 0, None, [victim])
    before = kv.pool.free_cells
    victim.finished = True
    kv.keep(victim)  # a preempted victim's cells come back as a prefix nobody shares
    while kv.free_cache(None, 0, None):
        pass
    assert kv.pool.free_cells == room > before
    assert stays.shared.seq_id in kv.pool.entries  # what it shares was not counted as room
    assert counted(kv) == b.used


def test_the_prefixes_waiting_requests_want_go_last_and_the_lookup_holds_for_an_epoch():
    epoch = [0]
    kv, b, waiting = space(epoch=lambda: epoch[0])
    kitchen, hall = SYSTEM + list(range(300, 330)), list(range(500, 540))
    for seed, prefix in enumerate((kitchen, hall)):  # kitchen is the least recently used
        r = new(b, n=10, seed=seed, prefix=prefix)
        assert seat(kv, r)
        compute(kv, b, r)
        r.finished = True
        kv.keep(r)
    by_first = {e.tokens[0]: e.seq_id for e in kv.pool.entries.values()}
    waiting.append(new(b, n=5, seed=9, prefix=kitchen))
    assert kv.wanted() == {by_first[kitchen[0]]}
    waiting.append(new(b, "voice", n=5, seed=8, prefix=hall))
    assert kv.wanted() == {by_first[kitchen[0]]}  # the same epoch: looked up once
    epoch[0] += 1
    assert kv.wanted() == {by_first[kitchen[0]], by_first[hall[0]]}
    waiting.remove(waiting[1])
    epoch[0] += 1
    assert kv.free_cache(None, 0, None)
    assert set(kv.pool.entries) == {by_first[kitchen[0]]}  # the hall went, not the older one
    assert counted(kv) == b.used
