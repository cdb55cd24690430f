"""The KV protocol under memory pressure (simulated backend): reservation at admission, a fit
check before each decode, preemption that keeps the victim's cells, eviction that keeps what
is used. See hearth.engine.kvcache's docstring for the protocol's three lines."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sim_backend import SimBackend, make_core, request, run_until

EXAMPLES = int(os.environ.get("HEARTH_PROPERTY_EXAMPLES", "150"))
SYSTEM = [7000 + i for i in range(40)]
PREFIXES = {"system": SYSTEM, "kitchen": SYSTEM + [8000 + i for i in range(30)],
            "hall": SYSTEM + [8100 + i for i in range(55)]}
N_PARALLEL = 4
# Longest context one request can reach: the longest prefix + its own prompt + its output.
MAX_CONTEXT = 95 + 60 + 12


def run_workload(jobs, n_ctx: int, entries: int, mode: str = "hearth"):
    """Runs the jobs; after every iteration the pool's accounting must be the backend's real
    count. Returns (core, backend, [(request, sink)])."""
    b = SimBackend(n_ctx=n_ctx, n_seq_max=N_PARALLEL + entries)
    core, _ = make_core(mode, n_parallel=N_PARALLEL, backend=b, prefix_cache_entries=entries)
    reqs = []

    def step() -> None:
        core.step()
        assert core.pool.used_cells == b.used, (core.pool.used_cells, b.used)
        assert core.pool.reserved_cells >= 0 and core.pool.free_cells >= 0

    for i, (cls, shared, n, out, gap) in enumerate(jobs):
        r, sink = request(b, cls, n, out, seed=i, prefix=PREFIXES.get(shared))
        core.submit(r)
        reqs.append((r, sink))
        for _ in range(gap):
            step()
    for _ in range(50_000):
        if all(s.done is not None for _, s in reqs):
            break
        step()
    return core, b, reqs


workload = st.lists(
    st.tuples(st.sampled_from(["voice", "chat", "agent", "background"]),
              st.sampled_from([None, *PREFIXES]),
              st.integers(1, 60), st.integers(1, 12), st.integers(0, 4)),
    min_size=1, max_size=25)


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(jobs=workload, n_ctx=st.integers(N_PARALLEL * MAX_CONTEXT, 1500),
       entries=st.integers(1, 4), mode=st.sampled_from(["hearth", "fifo"]))
def test_small_pools_finish_everything_exactly_and_never_overflow(jobs, n_ctx, entries, mode):
    """On a pool just big enough for the running slots: every request finishes with the stream
    it has on a roomy pool (preempted ones resume exactly), llama_decode never runs out of
    cells, preemptions per request stay bounded, and voice is never preempted."""
    core, b, reqs = run_workload(jobs, n_ctx, entries, mode)
    _, _, roomy = run_workload(jobs, 100_000, entries, mode)
    assert b.refusals == 0
    for (r, sink), (_, ref) in zip(reqs, roomy, strict=True):
        assert sink.done is not None and sink.done.kind == "done", (sink.done, jobs)
        assert sink.tokens == ref.tokens
        assert r.preemptions <= len(jobs)
        if mode == "hearth" and r.cls == "voice":
            assert r.preemptions == 0
    assert core.pool.running_cells == 0 and core.pool.reserved_cells == 0


def test_three_voice_and_a_chat_on_a_1600_cell_pool_do_not_livelock():
    """The scenario that livelocked (2,997 preemptions in 3,000 iterations, no voice request
    finished): each prompt fits alone, not all together. Now every request finishes, voice is
    never preempted, nothing is computed twice, and llama_decode never lacks room."""
    b = SimBackend(n_ctx=1600, n_seq_max=8)
    core, _ = make_core("hearth", n_parallel=4, backend=b, prefix_cache_entries=4)
    system = [9000 + i for i in range(300)]
    reqs = [request(b, "chat", 700, 120, seed=1)]
    reqs += [request(b, "voice", 200 + 40 * i, 40, seed=2 + i, prefix=system) for i in range(3)]
    for r, _ in reqs:
        core.submit(r)
    steps = run_until(core, lambda: all(s.done is not None for _, s in reqs), max_steps=5000)
    assert all(s.done.kind == "done" for _, s in reqs)
    assert all(r.preemptions == 0 for r, _ in reqs if r.cls == "voice")
    assert core.stats.preemptions <= 1
    assert b.refusals == 0
    assert steps < 1000
    computed = sum(r.prefilled_tokens for r, _ in reqs)
    prompts = sum(r.n_prompt - r.cached_tokens for r, _ in reqs)
    assert computed <= prompts + 120  # at most a preempted chat's output recomputed


def test_admission_reserves_so_two_prompts_never_share_one_room():
    """Two prompts that each fit the free room but not together: the second waits for the
    first instead of both starting and running out of cells."""
    b = SimBackend(n_ctx=1000, n_seq_max=6)
    core, _ = make_core("hearth", n_parallel=4, backend=b, prefix_cache_entries=2)
    a, sa = request(b, "chat", 600, 30, seed=1)
    c, sc = request(b, "chat", 600, 30, seed=2)
    core.submit(a)
    core.submit(c)
    core.step()
    assert a.seq_id is not None and c.seq_id is None
    assert core.pool.reserved_cells + core.pool.running_cells == 601
    run_until(core, lambda: sa.done is not None and sc.done is not None)
    assert b.refusals == 0 and core.stats.preemptions == 0


def test_a_voice_prompt_that_cannot_fit_preempts_nobody():
    """Preempting lower classes that would not make enough room throws their work away for
    nothing: the voice request waits for the voice stream holding the cells instead."""
    b = SimBackend(n_ctx=1000, n_seq_max=6)
    core, _ = make_core("hearth", n_parallel=4, backend=b, prefix_cache_entries=2)
    v1, s1 = request(b, "voice", 700, 20, seed=1)
    bg, sbg = request(b, "background", 100, 200, seed=2)
    core.submit(v1)
    core.submit(bg)
    run_until(core, lambda: v1.n_generated > 0 and bg.n_generated > 0)
    v2, s2 = request(b, "voice", 500, 5, seed=3)  # needs v1's cells, not the background's
    core.submit(v2)
    run_until(core, lambda: s1.done is not None)
    assert bg.preemptions == 0
    run_until(core, lambda: s2.done is not None and sbg.done is not None)
    assert s2.done.kind == "done" and sbg.done.kind == "done"


def test_a_preempted_sequence_resumes_from_its_kept_cells():
    """Preempted for a slot while the pool has room, a background summary keeps its computed
    cells as a cached prefix: resuming computes only the token it was about to decode."""
    core, b = make_core("hearth", n_parallel=1, prefix_cache_entries=4,
                        voice_spare_slots=0)  # voice preempts for its slot
    bg, sbg = request(b, "background", 800, 40, seed=1)
    core.submit(bg)
    run_until(core, lambda: bg.n_generated >= 10)
    v, sv = request(b, "voice", 30, 4, seed=2)
    core.submit(v)
    run_until(core, lambda: sv.done is not None and sbg.done is not None)
    assert bg.preemptions == 1
    assert bg.prefilled_tokens <= bg.n_prompt + 1, "nothing of the preempted work recomputed"
    assert len(sbg.tokens) == 40


def test_a_request_waiting_for_room_keeps_its_own_hit():
    """A voice turn whose system prompt is cached waits for room while another voice stream
    holds the pool: its cached system prompt is not given up meanwhile, so it is served warm."""
    b = SimBackend(n_ctx=1200, n_seq_max=6)
    core, _ = make_core("hearth", n_parallel=4, backend=b, prefix_cache_entries=2)
    system = [9000 + i for i in range(400)]
    warm, sw = request(b, "voice", 10, 2, seed=1, prefix=system)
    core.submit(warm)
    run_until(core, lambda: sw.done is not None)
    big, sbig = request(b, "voice", 700, 30, seed=2)  # leaves too little room for the turn
    core.submit(big)
    run_until(core, lambda: big.n_generated > 0)
    turn, st_ = request(b, "voice", 120, 4, seed=3, prefix=system)
    core.submit(turn)
    run_until(core, lambda: st_.done is not None and sbig.done is not None)
    assert turn.cached_tokens >= len(system)


def test_eviction_gives_up_only_as_many_prefixes_as_needed():
    """A prompt needing a little room evicts one one-off prefix, not the whole cache."""
    b = SimBackend(n_ctx=1000, n_seq_max=10)
    core, _ = make_core("hearth", n_parallel=2, backend=b, prefix_cache_entries=6)
    for i in range(4):  # four one-off prompts of 199 cells each stay cached
        r, s = request(b, "background", 199, 1, seed=10 + i)
        core.submit(r)
        run_until(core, lambda s=s: s.done is not None)
    assert len(core.pool.entries) == 4 and core.pool.free_cells == 1000 - 4 * 199
    r, s = request(b, "chat", 300, 2, seed=20)
    core.submit(r)
    run_until(core, lambda: s.done is not None)
    assert core.pool.evictions == 1


def test_one_off_background_prompts_do_not_evict_a_prefix_voice_uses():
    """A flood of one-off background prompts on a small pool: they wait for each other rather
    than give up the system prompt the voice satellite hits every turn."""
    b = SimBackend(n_ctx=1600, n_seq_max=8)
    core, _ = make_core("hearth", n_parallel=4, backend=b, prefix_cache_entries=4)
    system = [9000 + i for i in range(600)]
    for seed in (1, 2):  # the second turn hits the first's prefix
        v, sv = request(b, "voice", 20, 4, seed=seed, prefix=system)
        core.submit(v)
        run_until(core, lambda sv=sv: sv.done is not None)
    flood = [request(b, "background", 350, 20, seed=10 + i) for i in range(10)]
    for r, _ in flood:
        core.submit(r)
    run_until(core, lambda: all(s.done is not None for _, s in flood))
    assert all(s.done.kind == "done" for _, s in flood)
    assert core.pool.evictions > 0, "the flood did put the pool under pressure"
    turn, st_ = request(b, "voice", 20, 4, seed=3, prefix=system)
    core.submit(turn)
    run_until(core, lambda: st_.done is not None)
    assert turn.cached_tokens >= len(system)
    assert b.refusals == 0
