"""Kept voice prefixes against running work (issue 28, item 5): running work that needs cells
only kept prefixes could give does not preempt itself (or another of its class) to keep them,
since the prefixes went anyway once it came back, and it recomputed its prompt meanwhile."""

from __future__ import annotations

from sim_backend import SimBackend, make_core, request, run_until


def _pool_of_kept_voice(n_ctx: int, prompts: int, size: int):
    b = SimBackend(n_ctx=n_ctx, n_seq_max=4 + 8)
    core, _ = make_core("hearth", n_parallel=4, backend=b, prefix_cache_entries=8,
                        prefix_cache_kept_share=1.0)
    for i in range(prompts):
        v, sv = request(b, "voice", size, 2, seed=10 + i, prefix=[8000 + 1000 * i])
        core.submit(v)
        run_until(core, lambda sv=sv: sv.done is not None)
    assert core.pool.kept() == set(core.pool.entries) and len(core.pool.entries) == prompts
    return core, b


def test_a_lone_chat_that_runs_into_kept_voice_prefixes_is_not_preempted():
    """A chat streams until the pool is kept voice prefixes and itself: it used to be
    preempted, recompute its prompt and output, and evict the voice prefix on its return."""
    core, b = _pool_of_kept_voice(1000, 3, 250)  # ~756 cells kept
    chat, sc = request(b, "chat", 150, 200, seed=1)
    core.submit(chat)
    run_until(core, lambda: sc.done is not None)
    assert sc.done.finish_reason == "length" and chat.n_generated == 200
    assert chat.preemptions == 0 and chat.prefilled_tokens == chat.n_prompt
    assert core.pool.used_cells == b.used and b.refusals == 0


def test_a_lone_background_summary_does_not_preempt_itself():
    core, b = _pool_of_kept_voice(1000, 3, 250)
    summary, ss = request(b, "background", 150, 200, seed=2)
    core.submit(summary)
    run_until(core, lambda: ss.done is not None)
    assert summary.preemptions == 0 and summary.n_generated == 200
    assert summary.prefilled_tokens == summary.n_prompt


def test_two_background_streams_still_yield_to_each_other_before_a_voice_prefix():
    """Where preempting one of its own class lets the other go, a lower class does that
    rather than take a kept voice prefix (the flood waits, the voice turn keeps its prompt)."""
    core, b = _pool_of_kept_voice(1000, 2, 250)  # ~504 kept, ~496 free
    kept = set(core.pool.entries)
    bgs = [request(b, "background", 100, 200, seed=3 + i) for i in range(2)]
    for r, _ in bgs:
        core.submit(r)
    run_until(core, lambda: all(s.done is not None for _, s in bgs))
    assert all(s.done.kind == "done" for _, s in bgs)
    assert kept <= set(core.pool.entries), "the voice prefixes stayed"
