"""The iteration cost model against a CPU-like cost: small batches cost nearly as much per
token as one decode, large ones several times less, and attention grows with position."""

from __future__ import annotations

from sim_backend import make_core, observe_slow_cpu

from hearth.engine import CostModel
from hearth.engine.cost import attention

PER_POSITION = 13e-6  # seconds per attended position, as measured with SmolLM2 on 2 cores


def cpu_like(n: int, attended: int = 0) -> float:
    """~11 ms a token below 32 tokens, ~2.5 ms from 32 on, plus attention."""
    size = 0.011 * n if n < 32 else 0.06 + 0.0025 * n
    return size + PER_POSITION * attended


def trained(m: CostModel) -> CostModel:
    for _ in range(8):
        for n, start in ((1, 50), (4, 200), (5, 300), (20, 0), (64, 0), (128, 0), (128, 900),
                         (132, 400), (256, 0)):
            m.observe(n, cpu_like(n, attention(n, start)), attention(n, start))
    return m


def test_the_model_learns_a_concave_size_cost_and_the_attention_term():
    m = trained(CostModel())
    assert abs(m.predict(4, 800) - cpu_like(4, 800)) < 0.01
    att = attention(128, 900)
    assert abs(m.predict(128, att) - cpu_like(128, att)) < 0.1 * cpu_like(128, att)
    assert abs(m._fit(128)[1] - PER_POSITION) < 0.1 * PER_POSITION
    # Beside 4 decodes, 60 ms holds no useful chunk, but 480 ms holds a large one early in a
    # prompt and a smaller one later, where each token attends to more.
    assert m.tokens_within(0.06, beside=4, beside_attended=800) < 16
    early = m.tokens_within(0.48, beside=4, beside_attended=800, start=0)
    late = m.tokens_within(0.48, beside=4, beside_attended=800, start=1200)
    assert early >= 64 and late < early


def test_a_long_prompt_beside_streams_is_not_held_to_minimum_chunks():
    """What held a 1,500-token chat prompt to 16-token chunks beside 4 streams (25 s to its
    first token): the budget, where not even a minimum chunk fits the latency target, is what
    fits twice the stretched bound instead (the streams get the next iteration to
    themselves), and that bound holds."""
    core, _ = make_core("hearth")
    trained(core.cost)
    budget = core.batcher.prefill_budget(4, 1.0, decode_attended=800, start=0, interactive=True)
    assert budget >= 64 and core.batcher.stretching
    assert core.cost.predict(4 + budget, 800 + attention(budget, 0)) <= 2 * 8 * 0.06
    # Calibrated, it goes at least where the cost per token levels off (128 here: 3.0 ms a
    # token against 3.4 at 64), within twice the stretched bound.
    assert core.cost.efficient_size() == 128
    core.batcher.efficient = 128  # as calibration sets it
    budget = core.batcher.prefill_budget(4, 1.0, decode_attended=800, start=0, interactive=True)
    assert budget + 4 >= 128
    assert core.cost.predict(4 + budget, 800 + attention(budget, 0)) <= 2 * 8 * 0.06
    # A background summary keeps to the minimum chunk: the streams' cadence comes first.
    assert (core.batcher.prefill_budget(4, 1.0, decode_attended=800, start=0)
            == core.cfg.min_prefill_chunk)


def test_a_size_inside_a_cheaper_larger_bucket_is_found():
    """The cost per token falls from one bucket to the next: 31 tokens cost more than 40.
    Within 0.75 s beside 4 decodes, the most that fits is inside the 32-63 bucket (not its
    largest size, which does not fit), where the old search stopped at 27 tokens."""
    m = CostModel()
    for _ in range(4):
        for n, per_token in ((4, 0.038), (16, 0.026), (32, 0.016), (64, 0.015)):
            m.observe(n, per_token * n)
    n = m.tokens_within(0.75, beside=4)
    assert 32 <= 4 + n <= 63
    assert m.predict(4 + n) <= 0.75 < m.predict(4 + n + 1)
    assert m.efficient_size() == 32  # 16 ms is within 10 % of 15 ms
    assert CostModel().efficient_size() == 0  # nothing measured: no floor


def test_a_waited_for_prompt_is_not_chunked_below_the_efficient_size_on_a_slow_model():
    """A large model on a CPU: one decode 50 ms, so the stretched bound beside 4 streams holds
    ~30 tokens at 26 ms each, where 64-token chunks cost 15 ms a token. A waited-for prompt
    goes in chunks of at least the efficient size (within twice the stretch); background
    work does not, and a fast model, whose bound already holds that size, is unchanged."""
    core, _ = make_core("hearth")
    slow = core.cost
    observe_slow_cpu(slow)
    assert slow.efficient_size() == 64
    core.batcher.efficient = slow.efficient_size()  # as calibration sets it
    stretched = slow.tokens_within(8 * core.batcher.target(), beside=4)
    assert stretched + 4 < 64
    budget = core.batcher.prefill_budget(4, 1.0, start=0, interactive=True)
    assert budget + 4 >= 64 and slow.predict(4 + budget) <= 2 * 8 * core.batcher.target()
    assert core.batcher.prefill_budget(4, 1.0, start=0) == core.cfg.min_prefill_chunk

    fast, _ = make_core("hearth")
    trained(fast.cost)
    fast.batcher.efficient = fast.cost.efficient_size()
    fast.cfg.latency_target_s = 1.0  # the bound holds far more than the efficient size
    assert (fast.batcher.prefill_budget(4, 1.0, decode_attended=800, interactive=True)
            == fast.cost.tokens_within(1.0, beside=4, beside_attended=800))


def test_calibration_measures_every_bucket_and_the_efficient_size():
    """Every bucket up to two micro-batches is measured before serving (an unmeasured one is
    priced as the smaller one below it, and so was never tried), and the efficient size comes
    from those measurements: the simulated 4 ms + 2 ms a token levels off from 32 tokens."""
    core, b = make_core("hearth")
    assert core.batcher.efficient == 0
    core.calibrate(1)
    top = min(b.n_batch, 2 * b.n_ubatch)
    assert all(core.cost.fits[k].seen for k in range(1, top.bit_length() + 1))
    assert core.batcher.efficient == 32


def test_decodes_at_similar_positions_do_not_put_their_cost_on_attention():
    """Decodes at 30-60 positions with a little noise (a fresh server's short chats): the
    two terms cannot be told apart, so a decode's cost stays a token's, and a long prompt's
    attention is not priced from a noise slope (it had been 533 µs a position, 0 a token)."""
    m = CostModel()
    noise = [0.004, -0.003, 0.002, -0.004, 0.003, -0.002, 0.001, -0.001]
    for i in range(40):
        pos = 30 + (i * 7) % 31
        m.observe(1, 0.015 + 2e-6 * pos + noise[i % 8] * (pos - 30) / 30, attention(1, pos))
    per_token, per_position = m._fit(1)
    assert per_token > 0.01, (per_token, per_position)
    assert m.predict(1, attention(900, 0)) < 2.0  # a 900-token prompt's own attention
