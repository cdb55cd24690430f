"""The engine's promises under adversarial household workloads (issue 28), on the simulated
backend with small pools: a reply ends only because the model stopped or its ``max_tokens``
ran out, never because the pool was full while cells could be freed or a lower class
preempted."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sim_backend import SimBackend, make_core, request, run_until

EXAMPLES = int(os.environ.get("HEARTH_PROPERTY_EXAMPLES", "150"))
SYSTEM = [7000 + i for i in range(60)]
PREFIXES = {"system": SYSTEM, "kitchen": SYSTEM + [8000 + i for i in range(40)],
            "hall": SYSTEM + [8100 + i for i in range(70)]}
LONGEST = 130 + 50 + 40  # the longest prefix, prompt and reply: one request's whole context


def ended_by_the_model(r, sink) -> bool:
    done = sink.done
    return done is not None and done.kind == "done" and (
        done.finish_reason == "stop" or r.n_generated == r.max_tokens)


def test_a_turn_sharing_part_of_a_cached_conversation_is_not_cut_short():
    """The cached conversation a voice turn shares only its system prompt with keeps the rest
    of its cells: the turn's reply runs out of room unless that rest is freed (it used to end
    with "length" after 92 of 120 tokens)."""
    b = SimBackend(n_ctx=420, n_seq_max=6)
    core, _ = make_core("hearth", n_parallel=2, backend=b, prefix_cache_entries=4)
    system = [9000 + i for i in range(200)]
    a, sa = request(b, "voice", 100, 1, seed=1, prefix=system)
    core.submit(a)
    run_until(core, lambda: sa.done is not None)
    turn, st_ = request(b, "voice", 29, 120, seed=2, prefix=system)
    core.submit(turn)
    run_until(core, lambda: st_.done is not None)
    assert ended_by_the_model(turn, st_) and turn.n_generated == 120
    assert turn.cached_tokens == 200, "the shared system prompt stayed"
    assert core.pool.used_cells == b.used and b.refusals == 0


def test_a_flood_of_voice_turns_on_a_tight_pool_all_get_their_whole_reply():
    """Eight voice turns on one system prompt, each leaving its conversation cached, on a pool
    that holds little more than one turn: none is cut short (7 of 8 were)."""
    b = SimBackend(n_ctx=420, n_seq_max=8)
    core, _ = make_core("hearth", n_parallel=4, backend=b, prefix_cache_entries=4)
    system = [9000 + i for i in range(200)]
    turns = [request(b, "voice", 20 + 10 * i, 100, seed=i, prefix=system) for i in range(8)]
    for r, _ in turns:
        core.submit(r)
        core.step()
    run_until(core, lambda: all(s.done is not None for _, s in turns))
    assert all(ended_by_the_model(r, s) for r, s in turns)
    assert core.pool.used_cells == b.used and b.refusals == 0


household = st.lists(
    st.tuples(st.sampled_from(["voice", "chat", "agent", "background"]),
              st.sampled_from([None, *PREFIXES]), st.integers(1, 50), st.integers(1, 40),
              st.integers(0, 5), st.sampled_from(["ann", "bob", "kid"])),
    min_size=1, max_size=20)


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(jobs=household, n_ctx=st.integers(LONGEST, 3 * LONGEST), entries=st.integers(1, 4),
       n_parallel=st.integers(1, 4))
def test_replies_end_only_by_the_model_on_any_pool_that_holds_one_request(jobs, n_ctx, entries,
                                                                         n_parallel):
    """Random households on pools that hold one request's whole context (and no more than
    three): every reply ends by stop or max_tokens, the accounting is the backend's count
    after every iteration, and llama_decode never runs out of cells."""
    b = SimBackend(n_ctx=n_ctx, n_seq_max=n_parallel + entries)
    core, _ = make_core("hearth", n_parallel=n_parallel, backend=b,
                        prefix_cache_entries=entries)
    reqs = []

    def step() -> None:
        core.step()
        assert core.pool.used_cells == b.used, (core.pool.used_cells, b.used)
        assert core.pool.free_cells >= 0

    for i, (cls, shared, n, out, gap, user) in enumerate(jobs):
        r, sink = request(b, cls, n, out, user=user, seed=i, prefix=PREFIXES.get(shared))
        core.submit(r)
        reqs.append((r, sink))
        for _ in range(gap):
            step()
    for _ in range(20_000):
        if all(s.done is not None for _, s in reqs):
            break
        step()
    for r, sink in reqs:
        assert ended_by_the_model(r, sink), (r.cls, r.n_generated, r.max_tokens, sink.done)
    assert b.refusals == 0
    assert core.pool.running_cells == 0 and core.pool.reserved_cells == 0
