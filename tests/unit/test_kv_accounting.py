"""KV accounting against the backend's real cells (simulated backend, random workloads)."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sim_backend import SimBackend, make_core, request

SYSTEM = [7000 + i for i in range(40)]  # a system prompt many requests share
# Prompts that build on it and on each other: cached entries then share cells in chains.
PREFIXES = {
    "system": SYSTEM,
    "kitchen": SYSTEM + [8000 + i for i in range(30)],
    "hall": SYSTEM + [8100 + i for i in range(20)],
    "kitchen_tools": SYSTEM + [8000 + i for i in range(30)] + [8200 + i for i in range(25)],
}

EXAMPLES = int(os.environ.get("HEARTH_PROPERTY_EXAMPLES", "150"))

workload = st.lists(
    st.tuples(st.sampled_from(["voice", "chat", "agent", "background"]),
              st.sampled_from([None, *PREFIXES]),
              st.integers(1, 60),   # own prompt tokens
              st.integers(1, 12),   # tokens to generate
              st.integers(0, 6)),   # iterations before the next arrival
    min_size=1, max_size=25)


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(jobs=workload, entries=st.integers(1, 6))
def test_cell_accounting_equals_the_backends_cells(jobs, entries):
    """After every iteration the pool's count of used cells (running + cached prefixes) is the
    backend's real count, whatever shares, evictions and finishes happened; every request
    finishes."""
    b = SimBackend(n_ctx=100_000, n_seq_max=4 + entries)
    core, _ = make_core("hearth", n_parallel=4, backend=b, prefix_cache_entries=entries)
    sinks = []

    def step() -> None:
        core.step()
        assert core.pool.used_cells == b.used, (core.pool.used_cells, b.used, jobs, entries)

    for i, (cls, shared, n, out, gap) in enumerate(jobs):
        prefix = PREFIXES.get(shared)
        r, sink = request(b, cls, n, out, seed=i, prefix=prefix)
        core.submit(r)
        sinks.append(sink)
        for _ in range(gap):
            step()
    for _ in range(20_000):
        if all(s.done is not None for s in sinks):
            break
        step()
    assert all(s.done is not None and s.done.kind == "done" for s in sinks)
    # The hit rate counts each request once, however long it waited for room.
    assert core.pool.lookups == len(sinks)


def test_a_request_waiting_for_room_is_counted_once_in_the_hit_rate():
    """A prompt that must wait for KV room asks the prefix cache every iteration; the hit
    rate counts it once, when it is admitted (it once counted every retry)."""
    b = SimBackend(n_ctx=700, n_seq_max=8)
    core, _ = make_core("hearth", n_parallel=4, backend=b, prefix_cache_entries=2)
    first, first_sink = request(b, "chat", 500, 150, seed=1, prefix=SYSTEM)
    core.submit(first)
    while first.n_generated == 0:  # its prompt's cells are computed
        core.step()
    late, late_sink = request(b, "chat", 300, 4, seed=2, prefix=SYSTEM)
    core.submit(late)
    for _ in range(20_000):
        if first_sink.done and late_sink.done:
            break
        core.step()
    assert late.first_admitted_at - late.arrival > 0.5  # it did wait for room
    assert core.pool.lookups == 2
