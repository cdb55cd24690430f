"""Scheduler behaviour of the engine on the simulated backend (deterministic, virtual time)."""

from __future__ import annotations

from itertools import pairwise

import pytest
from sim_backend import Collector, SimBackend, make_core, request, run_until

from hearth.engine import VOICE_PREFILL_STRETCH, RequestError
from hearth.shared.requests import Request


def iterations_to_first_token(mode: str) -> tuple[int, float, float]:
    """A voice request arrives while a 4,000-token background prompt is being prefilled.
    Returns (iterations until voice's first token, voice TTFT, idle voice TTFT)."""
    # Idle reference.
    core, b = make_core(mode)
    v, vs = request(b, "voice", 60, 8, seed=1)
    core.submit(v)
    run_until(core, lambda: vs.done is not None)
    idle_ttft = v.first_token_at - v.arrival

    core, b = make_core(mode)
    bg, _ = request(b, "background", 4000, 16, seed=2)
    core.submit(bg)
    for _ in range(5):  # the background prefill is under way
        core.step()
    assert 0 < bg.n_past < 4000
    v, vs = request(b, "voice", 60, 8, seed=1)
    core.submit(v)
    n = run_until(core, lambda: v.first_token_at is not None)
    return n, v.first_token_at - v.arrival, idle_ttft


def test_voice_during_long_background_prefill_gets_first_token_within_two_iterations():
    n, ttft, idle = iterations_to_first_token("hearth")
    assert n <= 2
    assert ttft <= 1.5 * idle + 0.07  # one bounded iteration at most on top of idle


def test_fifo_shows_head_of_line_blocking():
    n_fifo, ttft_fifo, _ = iterations_to_first_token("fifo")
    n_hearth, ttft_hearth, _ = iterations_to_first_token("hearth")
    # Under fifo the voice prompt waits for the whole 4,000-token prefill (same batching).
    assert n_fifo > 10 * n_hearth
    assert ttft_fifo > 5 * ttft_hearth


def test_iterations_stay_under_the_latency_target_while_prefilling():
    core, b = make_core("hearth", latency_target=0.05)
    bg, _ = request(b, "background", 3000, 4, seed=3)
    core.submit(bg)
    run_until(core, lambda: bg.finished)
    costs = [x["n"] * b.per_token + b.base for x in b.batches]
    assert max(costs) <= 0.05 + b.per_token


def test_decodes_are_never_starved_by_prefill():
    core, b = make_core("hearth")
    chats = [request(b, "chat", 20, 400, user=f"c{i}", seed=10 + i) for i in range(3)]
    for r, _ in chats:
        core.submit(r)
    run_until(core, lambda: all(r.n_generated >= 2 for r, _ in chats))
    bg, _ = request(b, "background", 5000, 4, seed=4)
    core.submit(bg)
    core.step()
    while bg.n_past < len(bg.prompt) - 1:
        before = [r.n_generated for r, _ in chats]
        core.step()
        after = [r.n_generated for r, _ in chats]
        assert all(a == x + 1 for a, x in zip(after, before, strict=True)), \
            "every running chat gets a token in every iteration of the long prefill"


def background_under_chat_load(aging_background: float, until: float):
    """Two slots kept saturated with chat (four chats always outstanding) while one background
    request waits. Returns the background request and its sink."""
    core, b = make_core("hearth", n_parallel=2, aging_seconds={"background": aging_background})
    bg, bgs = request(b, "background", 50, 20, user="auto", seed=5)
    core.submit(bg)
    chats: list = []
    seed = 100
    while b.t < until and not bg.finished:
        while sum(1 for r, _ in chats if not r.finished) < 4:
            r, s = request(b, "chat", 30, 60, user=f"u{seed % 2}", seed=seed)
            seed += 1
            core.submit(r)
            chats.append((r, s))
        core.step()
    return bg, bgs


def test_background_still_finishes_under_continuous_chat_load():
    """Aging: a background job rises a class per aging period, so chats cannot starve it."""
    bg, bgs = background_under_chat_load(aging_background=5.0, until=120)
    assert bg.finished and bgs.done.finish_reason == "length"
    assert bg.first_admitted_at - bg.arrival >= 10.0  # it had to age up to chat


def test_background_starves_without_aging_under_the_same_load():
    bg, _ = background_under_chat_load(aging_background=1e9, until=60)
    assert not bg.finished and bg.first_admitted_at is None


def served_share(mode: str) -> float:
    """Two users of one class: ``flood`` queues 40 requests at once, ``steady`` sends one at a
    time (closed loop). Returns steady's share of the tokens served while both are busy."""
    core, b = make_core(mode, n_parallel=2)
    flood = [request(b, "chat", 40, 40, user="flood", seed=i) for i in range(40)]
    for r, _ in flood:
        core.submit(r)
    steady: list = []
    seed = 1000
    while b.t < 40 and not all(r.finished for r, _ in flood):
        if not steady or steady[-1][0].finished:
            r, s = request(b, "chat", 40, 40, user="steady", seed=seed)
            seed += 1
            core.submit(r)
            steady.append((r, s))
        core.step()
    def served(rs):
        return sum(r.prefilled_tokens + 2 * r.n_generated for r, _ in rs)
    a, s = served(flood), served(steady)
    return s / (a + s)


def test_vtc_gives_a_steady_user_a_fair_share_against_a_flooding_one():
    hearth = served_share("hearth")
    fifo = served_share("fifo")
    assert hearth >= 0.40
    assert fifo < 0.15
    assert hearth > 3 * fifo


def test_preemption_frees_a_slot_for_voice_and_the_victim_resumes_exactly():
    # Reference: the background request alone, uninterrupted.
    core, b = make_core("hearth", n_parallel=2)
    ref, refs = request(b, "background", 200, 60, seed=7)
    core.submit(ref)
    run_until(core, lambda: refs.done is not None)

    core, b = make_core("hearth", n_parallel=2, voice_spare_slots=0)  # preempts for a slot
    bgs = [request(b, "background", 200, 60, seed=7 + i) for i in range(2)]
    for r, _ in bgs:
        core.submit(r)
    run_until(core, lambda: all(r.n_generated >= 10 for r, _ in bgs))
    v, _ = request(b, "voice", 30, 8, seed=99)
    core.submit(v)
    n = run_until(core, lambda: v.first_token_at is not None)
    assert n <= 2, "voice got a slot at once"
    assert sum(r.preemptions for r, _ in bgs) == 1
    assert core.stats.preemptions == 1
    run_until(core, lambda: all(s.done is not None for _, s in bgs))
    _, sink = bgs[0]
    assert sink.tokens == refs.tokens, "the resumed stream is the uninterrupted one"
    assert sink.done.finish_reason == "length" and len(sink.tokens) == 60


def test_voice_is_never_preempted():
    core, b = make_core("hearth", n_parallel=2)
    vs = [request(b, "voice", 30, 50, seed=i) for i in range(2)]
    for r, _ in vs:
        core.submit(r)
    run_until(core, lambda: all(r.n_generated >= 1 for r, _ in vs))
    v3, s3 = request(b, "voice", 30, 5, seed=9)
    core.submit(v3)
    run_until(core, lambda: all(s.done is not None for _, s in vs))
    assert all(r.preemptions == 0 for r, _ in vs)
    run_until(core, lambda: s3.done is not None)


def test_kv_exhaustion_preempts_lowest_class_and_everything_completes():
    b = SimBackend(n_ctx=1200, n_seq_max=12)
    core, b = make_core("hearth", n_parallel=4, backend=b, prefix_cache=False)
    reqs = [request(b, c, 250, 100, seed=i) for i, c in
            enumerate(["background", "background", "chat", "voice"])]
    for r, _ in reqs:
        core.submit(r)
    run_until(core, lambda: all(s.done is not None for _, s in reqs))
    assert all(s.done.kind == "done" and len(s.tokens) == 100 for _, s in reqs)
    assert core.stats.preemptions >= 1
    assert reqs[3][0].preemptions == 0 and reqs[2][0].preemptions == 0
    assert b.used == 0 and core.pool.used_cells == 0


def test_prefix_cache_shares_a_system_prompt_and_is_not_charged():
    core, b = make_core("hearth")
    core.policy.cfg.vtc_half_life_s = None  # exact counts
    system = [7000 + i for i in range(1000)]
    r1, s1 = request(b, "voice", 20, 4, user="kitchen", seed=1, prefix=system)
    core.submit(r1)
    run_until(core, lambda: s1.done is not None)
    vtc_before = core.policy.vtc["kitchen"]
    r2, s2 = request(b, "voice", 20, 4, user="kitchen", seed=2, prefix=system)
    core.submit(r2)
    run_until(core, lambda: s2.done is not None)
    assert r2.cached_tokens >= 1000
    assert r2.cached_tokens / r2.n_prompt >= 0.9
    charged = core.policy.vtc["kitchen"] - vtc_before
    assert charged == (r2.n_prompt - r2.cached_tokens) + 2 * 4


def test_cancel_frees_sequence_and_kv():
    core, b = make_core("hearth", prefix_cache=False)
    r, s = request(b, "chat", 100, 1000, seed=3)
    core.submit(r)
    run_until(core, lambda: r.n_generated >= 5)
    core.cancel(r.id)
    core.step()
    assert s.done.finish_reason == "cancelled"
    assert not core.running and b.used == 0 and core.pool.used_cells == 0


def test_serial_runs_one_sequence_at_a_time():
    core, b = make_core("serial")
    rs = [request(b, "chat", 50, 10, seed=i) for i in range(3)]
    for r, _ in rs:
        core.submit(r)
    while not all(s.done for _, s in rs):
        core.step()
        assert len(core.running) <= 1
    ends = [r.finished_at for r, _ in rs]
    assert ends == sorted(ends)


def test_embeddings_batch_many_inputs_per_decode():
    core, b = make_core("hearth")
    sink = Collector(b)
    r = Request(prompt=[[1, 2, 3]] * 32, rank=4, sink=sink, kind="embed")
    core.submit(r)
    run_until(core, lambda: sink.done is not None)
    assert len(sink.done.embedding) == 32
    assert core.stats.iterations == 0  # no generation decodes were needed


def test_queue_full_is_refused_with_retry_after():
    core, b = make_core("hearth", max_queue=3)
    for i in range(3):
        core.submit(request(b, "background", 10, 1, seed=i)[0])
    with pytest.raises(RequestError) as e:
        core.submit(request(b, "background", 10, 1, seed=9)[0])
    assert e.value.status == 429 and e.value.retry_after >= 1
    core.submit(request(b, "voice", 10, 1, seed=10)[0])  # other classes still get in


def test_prompt_longer_than_context_is_refused():
    core, b = make_core("hearth", backend=SimBackend(n_ctx_seq=100))
    with pytest.raises(RequestError) as e:
        core.submit(request(b, "chat", 150, 1)[0])
    assert e.value.code == "context_length_exceeded"


class RefusingGrammars(SimBackend):
    """llama.cpp refuses some grammars the JSON-schema converter emits."""

    def new_sampler(self, p):
        if p.grammar == "refused":
            raise ValueError("invalid grammar")
        return super().new_sampler(p)


def test_a_sampler_that_cannot_be_built_fails_only_its_request():
    core, b = make_core("hearth", backend=RefusingGrammars(n_seq_max=16), prefix_cache=False)
    bad, bad_sink = request(b, "chat", 20, 4, seed=1)
    bad.sampling.grammar = "refused"
    good, good_sink = request(b, "chat", 20, 4, seed=2)
    core.submit(bad)
    core.submit(good)
    run_until(core, lambda: bad_sink.done is not None and good_sink.done is not None)
    assert bad_sink.done.kind == "error" and bad_sink.done.status == 400
    assert good_sink.done.kind == "done" and good.n_generated == 4
    assert not core.running and not core.waiting and core.pool.used_cells == 0


def voice_prefill_beside_a_stream(prompt_len: int) -> tuple[float, float, float]:
    """An uncached voice prompt of ``prompt_len`` tokens arrives while a chat streams.
    Returns (longest gap between the chat's tokens meanwhile, voice TTFT, solo voice TTFT)."""
    core, b = make_core("hearth", prefix_cache=False)
    solo, solo_sink = request(b, "voice", prompt_len, 2, seed=5)
    core.submit(solo)
    run_until(core, lambda: solo_sink.done is not None)
    solo_ttft = solo.first_token_at - solo.arrival

    core, b = make_core("hearth", prefix_cache=False)
    chat, chat_sink = request(b, "chat", 20, 10_000, seed=6)
    core.submit(chat)
    run_until(core, lambda: chat.n_generated >= 3)
    voice, _ = request(b, "voice", prompt_len, 2, seed=5)
    core.submit(voice)
    run_until(core, lambda: voice.first_token_at is not None)
    core.step()
    times = [t for e, t in zip(chat_sink.events, chat_sink.times, strict=True)
             if e.kind == "token" and t >= voice.arrival]
    gap = max(later - t for t, later in pairwise(times))
    return gap, voice.first_token_at - voice.arrival, solo_ttft


def test_a_long_uncached_voice_prompt_does_not_freeze_other_streams():
    gap, ttft, solo = voice_prefill_beside_a_stream(2000)  # ~4 s of prefill in this backend
    assert gap <= VOICE_PREFILL_STRETCH * 0.06 + 0.01  # bounded like any prefill, if looser
    assert ttft <= 1.2 * solo  # and voice pays little for the bound


def test_a_short_voice_prompt_still_goes_in_one_iteration():
    core, b = make_core("hearth", prefix_cache=False)
    chat, _ = request(b, "chat", 20, 10_000, seed=6)
    core.submit(chat)
    run_until(core, lambda: chat.n_generated >= 3)
    voice, _ = request(b, "voice", 100, 2, seed=5)
    core.submit(voice)
    assert run_until(core, lambda: voice.first_token_at is not None) == 1


def test_a_voice_turn_takes_a_spare_slot_and_no_stream_stalls():
    """Every slot streams chat when a voice turn comes: it runs on a spare sequence id beside
    them instead of preempting one (the preempted chat stalled for the whole voice turn,
    0.94 s, about 16 latency targets); the chats' gaps stay within the bound meanwhile."""
    core, b = make_core("hearth", n_parallel=2)
    chats = [request(b, "chat", 200, 200, seed=7 + i, user=f"m{i}") for i in range(2)]
    for r, _ in chats:
        core.submit(r)
    run_until(core, lambda: all(r.n_generated >= 10 for r, _ in chats))
    v, sv = request(b, "voice", 400, 30, seed=99)
    core.submit(v)
    start = b.now()
    n = run_until(core, lambda: v.first_token_at is not None)
    assert n <= 3, "voice got a slot at once"
    run_until(core, lambda: sv.done is not None)
    assert all(r.preemptions == 0 for r, _ in chats)
    for _, s in chats:
        during = [t for t in s.times if start <= t <= b.now()]
        assert max(later - earlier for earlier, later in pairwise(during)) <= 10 * 0.06
    assert core.pool.used_cells == b.used
