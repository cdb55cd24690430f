"""Packing the prefix cache into the lowest cells while the engine is idle (simulated backend,
whose cells go to the lowest free ids as llama.cpp's mostly do): streams, sharing and accounting
come through unchanged, the cells spanned shrink to the cells used, and a failure loses at
most the entries it touched."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sim_backend import SimBackend, make_core, request, run_until

from hearth.engine import compaction

EXAMPLES = int(os.environ.get("HEARTH_PROPERTY_EXAMPLES", "150")) // 2
SYSTEM = [7000 + i for i in range(40)]
PREFIXES = {"system": SYSTEM, "kitchen": SYSTEM + [8000 + i for i in range(30)]}


@pytest.fixture(autouse=True)
def pack_eagerly(monkeypatch):
    monkeypatch.setattr(compaction, "COMPACT_MIN_FREED", 1)  # the sim's pools are small


def run(jobs, pack: bool, entries: int = 4):
    """Runs the jobs in bursts; between bursts the engine is idle (and packs if ``pack``).
    Accounting must equal the backend's cells after every iteration and every packing."""
    b = SimBackend(n_ctx=4000, n_seq_max=4 + entries)
    core, _ = make_core("hearth", n_parallel=4, backend=b, prefix_cache_entries=entries,
                        compact_prefix_cache=pack)
    done = []
    for burst in jobs:
        reqs = []
        for i, (cls, shared, n, out) in enumerate(burst):
            r, sink = request(b, cls, n, out, seed=len(done) + i, prefix=PREFIXES.get(shared))
            core.submit(r)
            reqs.append((r, sink))
        for _ in range(20_000):
            if all(s.done is not None for _, s in reqs):
                break
            core.step()
            assert core.pool.used_cells == b.used
        done += reqs
        used = b.used
        packed = core.idle()
        assert core.pool.used_cells == b.used == used, "packing changes no count"
        if packed:
            assert b.cells_spanned == b.used, "every cached cell below the first free one"
    return core, b, done


bursts = st.lists(st.lists(
    st.tuples(st.sampled_from(["voice", "chat", "background"]),
              st.sampled_from([None, *PREFIXES]), st.integers(1, 200), st.integers(1, 10)),
    min_size=1, max_size=6), min_size=1, max_size=5)


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(jobs=bursts)
def test_packing_between_bursts_changes_no_stream_and_no_hit(jobs):
    _, b, packed = run(jobs, pack=True)
    _, _, plain = run(jobs, pack=False)
    for (r, sink), (ref_r, ref) in zip(packed, plain, strict=True):
        assert sink.done is not None and sink.done.kind == "done"
        assert sink.tokens == ref.tokens
        assert r.cached_tokens == ref_r.cached_tokens, "packing keeps every prefix hit"
    assert b.refusals == 0


def voice_turns(core, b, n: int, system: list[int]):
    for seed in range(n):
        v, sv = request(b, "voice", 30 + seed, 3, seed=seed, prefix=system)
        core.submit(v)
        run_until(core, lambda sv=sv: sv.done is not None)


def test_a_chain_of_voice_turns_still_shares_its_system_prompt_after_packing():
    """Every voice turn's entry shares the system prompt's cells with the turn before: after a
    burst of one-off work freed cells below them, packing keeps that sharing (the pool uses no
    more cells) and the next turn still hits the whole system prompt."""
    b = SimBackend(n_ctx=4000, n_seq_max=10)
    core, _ = make_core("hearth", n_parallel=2, backend=b, prefix_cache_entries=8)
    system = [9000 + i for i in range(500)]
    big, sbig = request(b, "background", 1500, 2, seed=99)
    core.submit(big)
    run_until(core, lambda: sbig.done is not None)
    voice_turns(core, b, 3, system)  # placed above the document's cells
    assert core.kv.evict_entry(None)  # the one-off document goes: its cells come free below
    shared = [e for e in core.pool.entries.values() if e.shared is not None]
    assert shared, "the turns share their system prompt"
    used, spanned = b.used, b.cells_spanned
    assert spanned > used + 1000
    assert core.idle() and core.pool.packings == 1
    assert b.used == used == core.pool.used_cells and b.cells_spanned == used
    assert all(e.shared is not None for e in shared)
    turn, st_ = request(b, "voice", 40, 3, seed=50, prefix=system)
    core.submit(turn)
    run_until(core, lambda: st_.done is not None)
    assert turn.cached_tokens >= len(system)
    assert not core.idle(), "nothing freed since: no second packing"


class NoState(SimBackend):
    def seq_state_get(self, seq):
        return None


class LosesOne(SimBackend):
    """Refuses to restore the first sequence given back after it was saved."""
    refused: int | None = None

    def seq_state_set(self, seq, data):
        if self.refused is None:
            self.refused = seq
            self.seq_rm(seq)
            return False
        return super().seq_state_set(seq, data)


@pytest.mark.parametrize("backend", [NoState, LosesOne])
def test_a_failed_packing_costs_at_most_the_entries_it_could_not_restore(backend):
    b = backend(n_ctx=4000, n_seq_max=10)
    core, _ = make_core("hearth", n_parallel=2, backend=b, prefix_cache_entries=8)
    big, sbig = request(b, "background", 1500, 2, seed=99)
    core.submit(big)
    run_until(core, lambda: sbig.done is not None)
    voice_turns(core, b, 3, [9000 + i for i in range(500)])
    assert core.kv.evict_entry(None)
    before = set(core.pool.entries)
    core.idle()
    assert core.pool.used_cells == b.used
    after = set(core.pool.entries)
    if backend is NoState:
        assert after == before and core.pool.packings == 0
    else:
        assert b.refused not in after and after < before
        assert sorted(core.pool.free_ids + list(after)) == list(range(10))
        for e in core.pool.entries.values():  # what is left is whole: every position has a cell
            assert b.seq_pos_max(e.seq_id) == len(e.tokens) - 1
            assert len(b.cells[e.seq_id]) == len(e.tokens)


class ArrivalWhilePacking(SimBackend):
    """A voice request is submitted while the first family's cells are being restored."""

    core = None
    arrival = None
    restores = 0

    def seq_state_set(self, seq, data):
        self.restores += 1
        if self.arrival is not None and self.arrival.id not in self.core.outbox.by_id and not any(
                x is self.arrival for _, x in self.core._inbox):
            self.core.submit(self.arrival)
        return super().seq_state_set(seq, data)


def test_an_arrival_stops_packing_after_the_family_under_way():
    """Five families of cached prompts above a freed document: a voice request that arrives
    while the first is restored waits for that family only (it waited for every entry to be
    saved, cleared and restored), and the next idle moment packs the rest."""
    b = ArrivalWhilePacking(n_ctx=6000, n_seq_max=12)
    core, _ = make_core("hearth", n_parallel=2, backend=b, prefix_cache_entries=8)
    b.core = core
    big, sbig = request(b, "background", 1500, 2, seed=99)
    core.submit(big)
    run_until(core, lambda: sbig.done is not None)
    for k in range(5):
        voice_turns(core, b, 1, [9000 + 1000 * k + i for i in range(300)])
    assert core.kv.evict_entry(None)  # the document goes: its cells come free below the rest
    used = b.used
    b.arrival, sink = request(b, "voice", 20, 2, seed=7)
    assert core.idle() and core.pool.packings == 1
    assert b.restores == 1, "one family packed, then the arrival went first"
    assert core.pool.used_cells == b.used == used
    run_until(core, lambda: sink.done is not None)
    b.arrival = None
    assert core.idle(), "the rest is packed at the next idle moment"
    assert b.cells_spanned == b.used
