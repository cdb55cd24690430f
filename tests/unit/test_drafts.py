"""Speculative decoding (engine.drafts): a voice stream's output is the model's own, drafted or
not; guessed tokens' cells are counted nowhere once checked; guesses stop before a tool call
opens (simulated backend, random workloads)."""

from __future__ import annotations

import hashlib
import os

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sim_backend import SimBackend, make_core, request

from hearth.chat.call_forcing import CallForcer
from hearth.engine.base import BatchItem, sample_run
from hearth.engine.cost import CostModel
from hearth.engine.drafts import PROBE_EVERY, Drafts, Payoff, best_guesses
from hearth.engine.stats import Stats
from hearth.shared.requests import Request

EXAMPLES = int(os.environ.get("HEARTH_PROPERTY_EXAMPLES", "150"))


def _next(context: list[int] | tuple[int, ...]) -> int:
    """The simulated model's token after ``context``: a function of its last 8 tokens only
    (the same for every sampler), so a draft can guess it."""
    h = hashlib.blake2b(repr(tuple(context[-8:])).encode(), digest_size=4)
    return 10 + int.from_bytes(h.digest(), "little") % 1000


class Drafting(SimBackend):
    """A simulated model with a draft that guesses right except where a hash says not (about
    one guess in ``miss``), and stops early now and then."""

    def __init__(self, n_draft: int, miss: int = 3, **kw):
        super().__init__(**kw)
        self.n_draft = n_draft
        self.miss = miss
        self.draft_calls = 0

    def sample(self, sampler, i: int) -> int:
        return _next(self._outputs[i])

    def draft(self, tokens: list[int], k: int, sampler=None) -> list[int]:
        self.draft_calls += 1
        ctx, out = list(tokens), []
        for _ in range(k):
            tok = _next(ctx)
            if tok % self.miss == 0:
                tok += 1  # a wrong guess
            if tok % 17 == 0:
                break  # the draft expects the end here
            out.append(tok)
            ctx.append(tok)
        return out


workload = st.lists(
    st.tuples(st.sampled_from(["voice", "voice", "chat", "background"]),
              st.integers(1, 60),   # prompt tokens
              st.integers(1, 30),   # tokens to generate
              st.integers(0, 4),    # iterations before the next arrival
              # a stop string: the sim writes token t as "<t>", so "<3" ends the output at the
              # first token from 30 to 39 or 300 to 399, often part-way through a drafted run
              st.sampled_from([None, "<3", "<7"])),
    min_size=1, max_size=12)


def _serve(b: SimBackend, jobs, check=None, policy: str = "always") -> list[list[int]]:
    core, _ = make_core("hearth", n_parallel=4, backend=b, draft_policy=policy)
    sinks = []
    for i, (cls, n, out, gap, stop) in enumerate(jobs):
        r, sink = request(b, cls, n, out, seed=i)
        r.stop = [stop] if stop else []
        core.submit(r)
        sinks.append(sink)
        for _ in range(gap):
            core.step()
            if check:
                check(core)
    for _ in range(20_000):
        if all(s.done is not None for s in sinks):
            break
        core.step()
        if check:
            check(core)
    assert all(s.done is not None and s.done.kind == "done" for s in sinks)
    return [s.tokens for s in sinks]


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(jobs=workload, k=st.integers(1, 6), miss=st.integers(2, 6),
       n_ctx=st.sampled_from([100_000, 400]), policy=st.sampled_from(["always", "measured"]))
def test_drafted_streams_write_what_they_would_alone(jobs, k, miss, n_ctx, policy):
    """Every request's output is the same with a draft as without, in pools that preempt or
    not; after every iteration the pool counts the cells the backend holds (refused guesses'
    cells freed); only voice streams are drafted for."""
    plain = _serve(Drafting(0, n_ctx=n_ctx, n_seq_max=12), jobs)
    b = Drafting(k, miss, n_ctx=n_ctx, n_seq_max=12)

    def check(core) -> None:
        assert core.pool.used_cells == b.used, (core.pool.used_cells, b.used)
        assert core.stats.accepted_drafts <= core.stats.drafted_tokens
        for e in core.pool.entries.values():  # a kept prefix holds its tokens' cells, no more
            assert b.seq_pos_max(e.seq_id) == len(e.tokens) - 1, (e.seq_id, len(e.tokens))

    assert _serve(b, jobs, check, policy) == plain
    if not any(cls == "voice" for cls, *_ in jobs):
        assert b.draft_calls == 0


def test_a_lone_voice_stream_needs_fewer_decodes_with_a_good_draft():
    """A draft that is always right: each decode gives the stream up to k + 1 tokens."""
    jobs = [("voice", 20, 24, 0, None)]
    alone = Drafting(0)
    _serve(alone, jobs)
    b = Drafting(3, miss=10**9)
    _serve(b, jobs)
    assert len(b.batches) < len(alone.batches) - 10, (len(b.batches), len(alone.batches))


def test_sample_run_stops_at_the_first_disagreement():
    samples = {5: 11, 6: 12, 7: 99, 8: 14}
    assert sample_run(samples.__getitem__, 5, [11, 12, 13]) == [11, 12, 99]
    assert sample_run(samples.__getitem__, 5, [11, 12]) == [11, 12, 99]
    assert sample_run(samples.__getitem__, 5, [10]) == [11]
    assert sample_run(samples.__getitem__, 5, []) == [11]


class _Pieces(SimBackend):
    n_draft = 8

    def __init__(self, pieces: dict[int, str], guesses: list[int]):
        super().__init__()
        self.texts, self.guesses = pieces, guesses

    def piece(self, token: int) -> bytes:
        return self.texts[token].encode()

    def draft(self, tokens, k, sampler=None):
        return self.guesses[:k]


TOOLS = [{"type": "function", "function": {"name": "HassTurnOn", "parameters": {
    "type": "object", "properties": {"name": {"type": "string"}}}}}]


def _drafted(b: _Pieces, forcer: CallForcer | None) -> list[int]:
    core, _ = make_core(backend=b)
    r = Request(prompt=[1, 2, 3], rank=0, sink=lambda events: None, forcer=forcer)
    r.tokens, r.max_tokens = [1, 2, 3], 50
    item = BatchItem(r, 3, 1, True)
    Drafts(b, core.kv, Stats(), lambda: core.cost, always=True).attach([item])
    return item.draft


def _costs() -> tuple[CostModel, CostModel]:
    """A small CPU: a batch costs 30 ms a token (the 1.5B on 2 cores: 4 positions 3x one);
    a GPU: a few more positions cost next to nothing."""
    cpu, gpu = CostModel(), CostModel()
    for _ in range(4):
        for n in range(1, 9):
            cpu.observe(n, 0.002 + 0.030 * n)
            gpu.observe(n, 0.010 + 0.0002 * n)
    return cpu, gpu


def test_where_no_guess_could_pay_none_is_asked_for_not_even_a_probe():
    """On the CPU a guess of a draft a third as dear as a decode does not pay even if every
    guess were accepted; on the GPU it does from the first (accepted half the time, as
    assumed before any is checked)."""
    cpu, gpu = _costs()
    assert best_guesses(4, 1, cpu, 0.011, accepted=1.0) == 0
    p = Payoff()
    assert [p.tokens(4, 1, cpu, 0.011) for _ in range(3 * PROBE_EVERY)] == [0] * 3 * PROBE_EVERY
    assert p.tokens(4, 1, gpu, 0.002) >= 1


def test_a_draft_mostly_refused_is_probed_now_and_then():
    """On the GPU, guesses that are refused make drafting a loss; it would pay if they were
    accepted, so a one-token probe goes every PROBE_EVERY iterations; once accepted again,
    more are asked for."""
    _, gpu = _costs()
    p = Payoff()
    for _ in range(40):
        p.checked(3, 0)
    asked = [p.tokens(4, 1, gpu, 0.004) for _ in range(3 * PROBE_EVERY)]
    assert asked.count(1) == 3 and asked.count(0) == len(asked) - 3
    for _ in range(400):
        p.checked(3, 3)
    assert p.tokens(4, 1, gpu, 0.004) >= 2


def test_guesses_stop_before_a_tool_call_opens():
    """Jump-forward writes a call's fixed text after the token that opens it: the guesses end
    before that token, so it can only be the last of a stream's run."""
    pieces = {20: "Sure", 21: " ", 22: '{"', 23: "name", 24: '":', 25: ' "'}
    guesses = [20, 21, 22, 23, 24, 25]
    assert _drafted(_Pieces(pieces, guesses), None) == guesses
    assert _drafted(_Pieces(pieces, guesses), CallForcer(TOOLS)) == [20, 21, 22, 23]
    inside = CallForcer(TOOLS)
    inside.feed('{"name": "HassTu')
    assert _drafted(_Pieces(pieces, guesses), inside) == []  # a call open: nothing drafted


class _Failing(_Pieces):
    def draft(self, tokens, k, sampler=None):
        raise RuntimeError("the draft's worker call failed")


def test_a_failing_draft_leaves_the_stream_undrafted():
    assert _drafted(_Failing({}, []), None) == []


def test_guesses_deep_in_a_long_context_pay_less():
    """Each guess attends every position before it: on a device where attention is what a
    decode costs at depth, guesses that pay early in a sequence do not 20,000 tokens in."""
    gpu = CostModel()
    for _ in range(4):
        for n in range(1, 9):
            for start in (0, 4000, 16000):
                att = n * start + n * (n + 1) // 2
                gpu.observe(n, 0.010 + 0.0002 * n + 2e-7 * att, att)
    shallow = best_guesses(4, 1, gpu, 0.002, 0.6, attended=11, start=10)
    deep = best_guesses(4, 1, gpu, 0.002, 0.6, attended=20_001, start=20_000)
    assert shallow >= 1 and deep < shallow, (shallow, deep)
