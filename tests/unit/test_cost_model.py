"""The iteration cost model against a CPU-like cost: small batches cost nearly as much per
token as one decode, large ones several times less, and attention grows with position."""

from __future__ import annotations

from sim_backend import make_core

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
    fits the stretched bound instead, and that bound holds."""
    core, _ = make_core("hearth")
    trained(core.cost)
    budget = core.batcher.prefill_budget(4, 1.0, decode_attended=800, start=0, interactive=True)
    assert budget >= 64
    assert core.cost.predict(4 + budget, 800 + attention(budget, 0)) <= 8 * 0.06
    # A background summary keeps to the minimum chunk: the streams' cadence comes first.
    assert (core.batcher.prefill_budget(4, 1.0, decode_attended=800, start=0)
            == core.cfg.min_prefill_chunk)
