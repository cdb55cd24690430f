"""The CPU ladder's rungs and what each step down costs (plain Python: no llama.cpp)."""

from __future__ import annotations

from hearth.policy.cpu_ladder import NO_EXTRA, cost, extra_buffers, ladder, rung_variant, step_down

X86 = ["sapphirerapids", "zen4", "icelake", "haswell"]


def test_the_second_rung_drops_the_best_variant_and_keeps_repacked_weights():
    rungs = ladder(X86)
    assert rungs[:2] == ["sapphirerapids", "zen4"]
    assert all(extra_buffers(r) for r in rungs[:2])
    # Every rung after those turns the extra buffers off, best variant first.
    assert rungs[2:] == [v + NO_EXTRA for v in X86]
    assert [rung_variant(r) for r in rungs[2:]] == X86


def test_a_build_with_one_variant_has_two_rungs():
    assert ladder(["native"]) == ["native", "native" + NO_EXTRA]


def test_each_step_down_says_what_it_costs():
    kept = cost("sapphirerapids", "zen4")
    assert "repacked weights are kept" in kept and "sapphirerapids" in kept
    lost = cost("sapphirerapids", "sapphirerapids" + NO_EXTRA)
    assert "repacked weights are off" in lost and "0.72x" in lost and "kernels" not in lost
    assert "haswell kernels" in cost("sapphirerapids", "haswell" + NO_EXTRA)


def test_a_step_down_is_reported_only_below_the_top_rung():
    rungs = ladder(X86)
    assert step_down("sapphirerapids", rungs, [], {}) is None
    assert step_down(None, rungs, ["sapphirerapids"], {}) is None
    step = step_down("zen4", rungs, ["sapphirerapids"], {"sapphirerapids": "SIGSEGV"})
    assert step == {"from": "sapphirerapids", "to": "zen4", "skipped": ["sapphirerapids"],
                    "why": "SIGSEGV", "cost": cost("sapphirerapids", "zen4")}
