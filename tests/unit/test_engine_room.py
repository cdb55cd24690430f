"""Room before preemption (simulated backend): a running request is preempted, for a slot or
for cells, only when that lets the request it is preempted for in. Otherwise its work is thrown
away (or recomputed) and the other request waits all the same (issue 28, items 3 and 4)."""

from __future__ import annotations

from sim_backend import SimBackend, make_core, request, run_until

SYSTEM = [9000 + i for i in range(300)]


def test_no_one_is_preempted_for_a_slot_when_the_cells_are_not_there_either():
    """Every slot is taken and a voice prompt needs the cells a voice stream holds: the
    background stream is not preempted for its slot (it used to be, and stalled, while the
    voice request waited for the cells anyway)."""
    b = SimBackend(n_ctx=1000, n_seq_max=6)
    core, _ = make_core("hearth", n_parallel=2, backend=b, prefix_cache_entries=2)
    v1, s1 = request(b, "voice", 700, 20, seed=1)
    bg, sbg = request(b, "background", 100, 200, seed=2)
    core.submit(v1)
    core.submit(bg)
    run_until(core, lambda: v1.n_generated > 0 and bg.n_generated > 0)
    v2, s2 = request(b, "voice", 500, 5, seed=3)
    core.submit(v2)
    run_until(core, lambda: s1.done is not None)
    assert bg.preemptions == 0
    run_until(core, lambda: s2.done is not None and sbg.done is not None)
    assert s2.done.kind == "done" and sbg.done.kind == "done"


def test_cells_a_running_turn_needs_through_a_cached_child_are_not_counted_as_room():
    """A cached system prompt whose cells a cached conversation shares, which a running chat
    turn continues: giving the system prompt up frees only what the conversation does not
    share. Counting all of it, a chat prompt preempted a background job that could not make
    enough room and waited anyway."""
    b = SimBackend(n_ctx=1000, n_seq_max=8)
    core, _ = make_core("hearth", n_parallel=4, backend=b, prefix_cache_entries=4)
    for seed, n in ((1, 10), (2, 110)):  # the system prompt + 10; a conversation on it
        r, s = request(b, "chat", n, 1, seed=seed, prefix=SYSTEM)
        core.submit(r)
        run_until(core, lambda s=s: s.done is not None)
    conversation = next(e for e in core.pool.entries.values() if e.shared is not None)
    turn, st_ = request(b, "chat", 20, 200, seed=3, prefix=conversation.tokens)
    bg, sbg = request(b, "background", 100, 300, seed=4)
    core.submit(turn)
    core.submit(bg)
    run_until(core, lambda: turn.n_generated > 0 and bg.n_generated > 0)
    chat, sc = request(b, "chat", 700, 5, seed=5)
    core.submit(chat)
    run_until(core, lambda: st_.done is not None)  # the turn's cells are what the chat needs
    assert bg.preemptions == 0 and chat.seq_id is None
    run_until(core, lambda: sc.done is not None and sbg.done is not None)
    assert all(s.done.kind == "done" for s in (st_, sbg, sc))
    assert core.pool.used_cells == b.used and b.refusals == 0


def test_preempted_work_keeps_its_cells_past_the_entry_cap():
    """The cache holds its cap of voice prefixes (kept against lower classes) when a long
    summary is preempted for a voice turn: its computed cells stay as a prefix past the cap
    (its sequence id was its own already), so it resumes without recomputing its prompt (it
    recomputed all 3,005 tokens with most of the pool free)."""
    b = SimBackend(n_ctx=20_000, n_seq_max=1 + 4)
    core, _ = make_core("hearth", n_parallel=1, backend=b, prefix_cache_entries=4,
                        voice_spare_slots=0)  # voice preempts for its slot
    for i in range(4):
        v, sv = request(b, "voice", 40, 2, seed=10 + i, prefix=[9000 + 100 * i])
        core.submit(v)
        run_until(core, lambda sv=sv: sv.done is not None)
    assert len(core.pool.entries) == 4
    summary, ss = request(b, "background", 3000, 40, seed=1)
    core.submit(summary)
    run_until(core, lambda: summary.n_generated >= 5)
    turn, st_ = request(b, "voice", 30, 4, seed=2)
    core.submit(turn)
    run_until(core, lambda: st_.done is not None and ss.done is not None)
    assert summary.preemptions == 1 and st_.done.kind == "done" and ss.done.kind == "done"
    assert summary.prefilled_tokens <= summary.n_prompt + 1, "its computed cells were kept"
    assert core.pool.used_cells == b.used and b.refusals == 0
    assert len(core.pool.entries) <= 4 + 1


def test_a_short_voice_turn_does_not_wait_behind_a_voice_prompt_that_cannot_fit_yet():
    """A long voice prompt waits for the cells a voice stream holds; a short voice turn
    arriving behind it fits in the free cells and goes at once (it waited 1.9 s here)."""
    b = SimBackend(n_ctx=1000, n_seq_max=6)
    core, _ = make_core("hearth", n_parallel=4, backend=b, prefix_cache_entries=2)
    v1, s1 = request(b, "voice", 600, 150, seed=1)
    core.submit(v1)
    run_until(core, lambda: v1.n_generated > 0)
    long_, sl = request(b, "voice", 500, 5, seed=2)
    core.submit(long_)
    core.step()
    short, ss = request(b, "voice", 20, 4, seed=3)
    core.submit(short)
    run_until(core, lambda: ss.done is not None)
    assert short.first_token_at - short.arrival < 0.2
    assert s1.done is None, "it went before the long prompt could"
    run_until(core, lambda: sl.done is not None and s1.done is not None)
    assert all(s.done.kind == "done" for s in (s1, sl, ss))
