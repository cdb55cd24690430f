"""The class-aware prefix cache (hearth.policy.cache) on the simulated backend: the voice
prompts a household uses survive floods of one-off background work within their budget, and go
when running work needs the room or the budget is spent."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from sim_backend import SimBackend, make_core, request, run_until

from hearth.engine.prefix_index import PrefixEntry
from hearth.policy.cache import CachePolicy


def entry(seq: int, rank: int, own: int, hits: int = 0) -> PrefixEntry:
    return PrefixEntry(seq_id=seq, tokens=[seq] * own, own=own, rank=rank, hits=hits)


def test_the_budget_keeps_voice_before_chat_and_the_most_recent_first():
    policy = CachePolicy(kept_cells=500)
    lru = [entry(0, 1, 200), entry(1, 0, 300), entry(2, 1, 150), entry(3, 0, 250),
           entry(4, 3, 10)]  # least recently used first
    # Voice: 3 (newest, 250) then 1 (300: does not fit). Chat: 2 (150) fits, 0 (200) does not.
    assert policy.kept(lru) == {3, 2}
    assert not policy.may_evict(lru[3], 3, {3, 2})  # background may not take a kept entry
    assert policy.may_evict(lru[3], 0, {3, 2})  # voice may
    assert policy.may_evict(lru[3], None, {3, 2})  # the engine itself, for running work, may
    assert policy.may_evict(lru[1], 3, {3, 2})  # past the budget: like any other
    # Outside the budget before within it; never hit before hit; then least recently used.
    cands = [lru[3], lru[1], entry(5, 3, 10, hits=2), lru[4]]
    assert CachePolicy.victim(cands, frozenset(), {3}).seq_id == 1
    assert CachePolicy.victim(cands, frozenset({1}), {3}).seq_id == 4


def _flood_then_voice(system_len: int, share: float, sizes: list[int], n_ctx: int,
                      entries: int = 4):
    b = SimBackend(n_ctx=n_ctx, n_seq_max=4 + entries)
    core, _ = make_core("hearth", n_parallel=4, backend=b, prefix_cache_entries=entries,
                        prefix_cache_kept_share=share)
    system = [9000 + i for i in range(system_len)]
    first, s1 = request(b, "voice", 20, 4, seed=1, prefix=system)
    core.submit(first)
    run_until(core, lambda: s1.done is not None)
    evicted_by_lower: list[int] = []
    free = core.kv.free_cache

    def watched(entry, hit, rank, wanted=None):
        kept = {seq: len(core.pool.entries[seq].tokens) for seq in core.pool.kept()}
        freed = free(entry, hit, rank, wanted)
        if rank is not None and rank > 0:  # a kept entry gone or cut by a lower class
            evicted_by_lower.extend(
                seq for seq, n in kept.items()
                if seq not in core.pool.entries or len(core.pool.entries[seq].tokens) < n)
        return freed

    core.kv.free_cache = watched
    flood = [request(b, "background", n, 8, seed=100 + i) for i, n in enumerate(sizes)]
    for r, _ in flood:
        core.submit(r)
    run_until(core, lambda: all(s.done is not None for _, s in flood))
    turn, s2 = request(b, "voice", 20, 4, seed=2, prefix=system)
    core.submit(turn)
    run_until(core, lambda: s2.done is not None)
    return core, b, flood, turn, evicted_by_lower


@settings(max_examples=40, deadline=None)
@given(system_len=st.integers(100, 500), n_ctx=st.integers(1400, 2600),
       sizes=st.lists(st.integers(60, 420), min_size=4, max_size=30))
def test_voice_prompts_within_the_budget_survive_any_flood_of_one_off_prompts(system_len, n_ctx,
                                                                             sizes):
    core, b, flood, turn, by_lower = _flood_then_voice(system_len, 0.5, sizes, n_ctx)
    assert all(s.done.kind == "done" for _, s in flood), "the flood finished: nobody starved"
    assert by_lower == [], "no lower class took a kept entry"
    assert turn.cached_tokens >= system_len
    assert b.refusals == 0
    voice = core.pool.stats(b.now())["by_class"]["voice"]
    assert voice["entries"] >= 1 and voice["kept"] == voice["entries"]
    assert voice["cells"] <= max(core.pool.policy.kept_cells, 0.75 * n_ctx)


@settings(max_examples=25, deadline=None)
@given(fill=st.floats(0.5, 0.7), share=st.sampled_from([0.1, 0.25, 0.5]),
       sizes=st.lists(st.integers(60, 300), min_size=4, max_size=20))
def test_a_voice_prompt_larger_than_the_share_survives_the_flood_within_the_ceiling(
        fill, share, sizes):
    """A large household's voice prompt, half to 70 % of the pool: the budget grows to it,
    the flood runs in the quarter left and finishes, and the next voice turn finds the prompt."""
    n_ctx = 2000
    system_len = int(fill * n_ctx)
    core, b, flood, turn, by_lower = _flood_then_voice(system_len, share, sizes, n_ctx)
    assert all(s.done.kind == "done" for _, s in flood), "the flood finished: nobody starved"
    assert by_lower == [], "no lower class took a kept entry"
    assert turn.cached_tokens >= system_len
    assert b.refusals == 0
    assert core.pool.stats(b.now())["kept_budget"] >= system_len


def test_past_the_ceiling_the_flood_may_take_the_voice_prompt():
    """The same flood with a system prompt of 80 % of the pool, past the three quarters the
    budget may grow to: the voice entry is an ordinary one, and the flood's running work
    takes its cells."""
    _, _, flood, turn, _ = _flood_then_voice(1300, 0.1, [350] * 10, 1600)
    assert all(s.done.kind == "done" for _, s in flood)
    assert turn.cached_tokens < 1300


def test_running_voice_work_may_take_kept_cells():
    """Kept entries are kept against lower classes only: a voice prompt that needs the room
    takes it from another voice prompt."""
    b = SimBackend(n_ctx=1000, n_seq_max=6)
    core, _ = make_core("hearth", n_parallel=2, backend=b, prefix_cache_entries=4,
                        prefix_cache_kept_share=1.0)
    old, s1 = request(b, "voice", 500, 4, seed=1)
    core.submit(old)
    run_until(core, lambda: s1.done is not None)
    assert core.pool.kept() == {e.seq_id for e in core.pool.entries.values()}
    new, s2 = request(b, "voice", 700, 4, seed=2)
    core.submit(new)
    run_until(core, lambda: s2.done is not None)
    assert s2.done.kind == "done" and core.pool.evictions >= 1


def _warming(n_ctx: int, n_system: int):
    """A core with a voice warm-up of an ``n_system``-token prompt submitted (as
    ``POST /v1/cache/warm`` makes one): (core, backend, prompt, warm-up, its sink)."""
    b = SimBackend(n_ctx=n_ctx, n_seq_max=8)
    core, _ = make_core("hearth", n_parallel=4, backend=b, prefix_cache_entries=4)
    system = [9000 + i for i in range(n_system)]
    warm, sw = request(b, "background", 0, 1, seed=1, prefix=system)
    warm.keep_rank, warm.warm_up = 0, True
    core.submit(warm)
    return core, b, system, warm, sw


def test_a_warm_up_runs_as_background_and_keeps_its_prompt_for_voice():
    core, b, system, _, sw = _warming(1600, 500)
    run_until(core, lambda: sw.done is not None)
    (e,) = core.pool.entries.values()
    assert e.rank == 0 and core.pool.kept() == {e.seq_id}
    stats = core.pool.stats(b.now())["by_class"]
    assert stats["voice"]["entries"] == 1 and stats["background"]["entries"] == 0
    assert stats["background"]["lookups"] == stats["voice"]["lookups"] == 0  # not a turn
    turn, st_ = request(b, "voice", 20, 4, seed=2, prefix=system)
    core.submit(turn)
    run_until(core, lambda: st_.done is not None)
    assert turn.cached_tokens >= len(system) - 1
    after = core.pool.stats(b.now())
    assert after["by_class"]["voice"]["hit_rate"] == 1.0 and after["warm_ups"] == 1


def test_a_warm_up_waits_beside_streams_and_a_command_that_caches_its_prompt_ends_it():
    """A warm-up is given no prompt chunk in an iteration with a chat or voice stream (on a
    CPU the smallest chunk made each of the 1.5B's steps four times dearer), and once a
    command that began with the same prompt has left it cached, the warm-up ends without
    computing the rest: the prefix is kept for voice, as the warm-up asked."""
    core, b, system, warm, sw = _warming(4000, 1500)
    core.step()  # admitted, and its first chunk computed: nothing else runs yet
    assert 0 < warm.n_past < len(system)
    turn, st_ = request(b, "chat", 20, 30, seed=2, prefix=system)
    core.submit(turn)
    batches = []
    compose = core.batcher.compose

    def recorded(*args, **kwargs):
        items = compose(*args, **kwargs)
        batches.append([(it.req, it.n, it.output) for it in items])
        return items

    core.batcher.compose = recorded
    run_until(core, lambda: st_.done is not None and sw.done is not None)
    streaming = [batch for batch in batches if (turn, 1, True) in batch]
    assert len(streaming) >= 29  # the command's decodes
    assert not [batch for batch in streaming if any(r is warm for r, _, _ in batch)]
    assert sw.done.finish_reason == "stop" and warm.n_generated == 0
    assert warm.prefilled_tokens < len(system) // 2  # the command computed the prompt
    assert warm.cached_tokens == len(system) - warm.prefilled_tokens
    entry, hit = core.pool.find([*system, 1])
    assert hit == len(system) and entry.rank == 0  # kept for voice


def test_a_warm_up_goes_on_beside_a_jobs_stream():
    """Beside a stream no one waits for token by token (a background job), a warm-up is
    computed as before: it is done while the job still streams."""
    b = SimBackend(n_ctx=4000, n_seq_max=8)
    core, _ = make_core("hearth", n_parallel=4, backend=b, prefix_cache_entries=4)
    job, sj = request(b, "background", 10, 400, seed=3)
    core.submit(job)
    run_until(core, lambda: job.n_generated > 0)  # streaming
    system = [9000 + i for i in range(1500)]
    warm, sw = request(b, "background", 0, 1, seed=1, prefix=system)
    warm.keep_rank, warm.warm_up = 0, True
    core.submit(warm)
    run_until(core, lambda: sw.done is not None or sj.done is not None)
    assert sw.done is not None and sj.done is None  # done while the job still streams
    assert warm.prefilled_tokens == len(system)


def test_by_class_reports_the_oldest_entry_age():
    b = SimBackend(n_ctx=1600, n_seq_max=8)
    core, _ = make_core("hearth", n_parallel=4, backend=b, prefix_cache_entries=4)
    r, s = request(b, "voice", 100, 2, seed=1)
    core.submit(r)
    run_until(core, lambda: s.done is not None)
    born = next(iter(core.pool.entries.values())).born
    assert core.pool.stats(born + 42.0)["by_class"]["voice"]["oldest_s"] == 42.0
    assert core.pool.stats(born)["by_class"]["chat"]["oldest_s"] is None
