"""A llama_decode that fails part-way (a kernel or an allocation failing mid-batch): the
micro-batches it finished stay in llama.cpp's cache. The accounting must stay the backend's
count, and only the request whose decode fails on its own gets the error (simulated backend)."""

from __future__ import annotations

from sim_backend import POISON, SimBackend, make_core, request, run_until


def _chats(b, n=4, out=30):
    return [request(b, "chat", 150 + 20 * i, out, user=f"m{i}", seed=i) for i in range(n)]


def _tokens_alone(out=30):
    b = SimBackend(n_ctx=4000, n_seq_max=8, n_ubatch=32)
    core, _ = make_core("hearth", n_parallel=4, backend=b, latency_target=0.5)
    reqs = _chats(b, out=out)
    for r, _ in reqs:
        core.submit(r)
    run_until(core, lambda: all(s.done is not None for _, s in reqs))
    return [s.tokens for _, s in reqs]


def test_a_decode_failing_part_way_once_costs_no_stream_and_no_cell():
    """Two decodes fail after their first micro-batch (transient): every stream still ends
    with the tokens it has on a clean run, and after every iteration the pool counts exactly
    the cells the backend holds (the failed decode's finished micro-batches were 75 held
    against 59 counted)."""
    b = SimBackend(n_ctx=4000, n_seq_max=8, n_ubatch=32)
    core, _ = make_core("hearth", n_parallel=4, backend=b, latency_target=0.5)
    reqs = _chats(b)
    for r, _ in reqs:
        core.submit(r)
    core.step()
    b.flaky = 2
    for _ in range(2000):
        if all(s.done is not None for _, s in reqs):
            break
        core.step()
        assert core.pool.used_cells == b.used, (core.pool.used_cells, b.used)
    assert b.failures == 2
    assert all(s.done.kind == "done" for _, s in reqs)
    assert [s.tokens for _, s in reqs] == _tokens_alone()


def test_only_the_request_whose_decode_fails_alone_gets_the_error():
    """One prompt makes every batch it is in fail: its stream gets a 500, the three streams
    batched with it finish exactly as without it."""
    b = SimBackend(n_ctx=4000, n_seq_max=8, n_ubatch=32)
    core, _ = make_core("hearth", n_parallel=5, backend=b, latency_target=0.5)
    reqs = _chats(b)
    for r, _ in reqs:
        core.submit(r)
    run_until(core, lambda: all(r.n_generated > 2 for r, _ in reqs))
    # Its prefill goes after the streams' decode tokens, past the first micro-batch.
    bad, sbad = request(b, "chat", 40, 30, user="m9", seed=9,
                        prefix=[50 + i for i in range(40)] + [POISON])
    core.submit(bad)
    for _ in range(2000):
        if sbad.done is not None and all(s.done is not None for _, s in reqs):
            break
        core.step()
        assert core.pool.used_cells == b.used, (core.pool.used_cells, b.used)
    assert sbad.done.kind == "error" and sbad.done.status == 500
    assert all(s.done.kind == "done" for _, s in reqs)
    assert [s.tokens for _, s in reqs] == _tokens_alone()
    assert core.pool.running_cells == 0 and core.pool.reserved_cells == 0
