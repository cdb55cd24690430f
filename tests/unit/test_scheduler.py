"""The scheduling policy on its own: ranks, aging, VTC, caps, victims."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from hearth.policy.scheduler import CLASS_RANKS, Policy, PolicyConfig, class_rank


@dataclass(eq=False)
class R:
    id: int
    rank: int
    user: str = "u"
    arrival: float = 0.0
    admitted_at: float | None = None


def test_class_rank_accepts_names_and_ranks_and_rejects_others():
    assert class_rank("voice") == 0 and class_rank("Embedding") == 4 and class_rank(2) == 2
    assert class_rank("3") == 3
    for bad in ("urgent", 7, -1, True):
        with pytest.raises(ValueError):
            class_rank(bad)


def test_hearth_orders_by_class_then_counter_then_arrival():
    p = Policy(PolicyConfig())
    p.charge("heavy", prompt_tokens=1000)
    reqs = [R(1, 3, "a", 0.0), R(2, 1, "heavy", 1.0), R(3, 1, "light", 2.0), R(4, 0, "a", 3.0)]
    assert [r.id for r in p.order(reqs, now=3.0)] == [4, 3, 2, 1]


def test_fifo_and_serial_ignore_classes():
    for mode in ("fifo", "serial"):
        p = Policy(PolicyConfig(mode=mode))
        reqs = [R(1, 4, arrival=0.0), R(2, 0, arrival=1.0)]
        assert [r.id for r in p.order(reqs, now=5.0)] == [1, 2]
    assert Policy(PolicyConfig(mode="serial")).max_running == 1


def test_aging_rises_one_class_per_period_and_never_above_chat():
    p = Policy(PolicyConfig(aging_seconds={"background": 10.0, "embedding": 10.0}))
    bg = R(1, CLASS_RANKS["background"], arrival=0.0)
    assert p.effective_rank(bg, 9.9) == 3
    assert p.effective_rank(bg, 10.0) == 2
    assert p.effective_rank(bg, 25.0) == 1
    assert p.effective_rank(bg, 10_000.0) == 1  # never voice
    emb = R(2, CLASS_RANKS["embedding"], arrival=0.0)
    assert p.effective_rank(emb, 35.0) == 1
    assert Policy(PolicyConfig(mode="fifo")).effective_rank(bg, 100.0) == 3


def test_vtc_weights_output_twice_and_lifts_returning_users():
    p = Policy(PolicyConfig())
    p.user_arrived("a")
    p.charge("a", prompt_tokens=100, output_tokens=50)
    assert p.vtc["a"] == 200
    p.user_arrived("b")  # new while a is active: starts at a's counter, not at 0
    assert p.vtc["b"] == 200
    p.user_left("b")
    p.charge("a", output_tokens=500)
    p.user_arrived("b")  # back after idling: no banked credit
    assert p.vtc["b"] == 1200


def test_cap_limits_a_class_only_while_a_higher_class_waits():
    p = Policy(PolicyConfig(n_parallel=4, caps={"background": 0.5}))
    running = [R(1, 3), R(2, 3)]
    cand = R(3, 3, arrival=1.0)
    assert p.may_admit(cand, running, [cand], now=1.0)
    chat = R(4, 1, arrival=1.0)
    assert not p.may_admit(cand, running, [cand, chat], now=1.0)
    assert p.may_admit(chat, running, [cand, chat], now=1.0)


def test_priority_victim_is_lowest_class_newest_and_never_voice():
    p = Policy(PolicyConfig())
    running = [R(1, 3, admitted_at=1.0), R(2, 3, admitted_at=2.0), R(3, 1, admitted_at=3.0),
               R(4, 0, admitted_at=4.0)]
    assert p.priority_victim(R(9, 0), running, now=5.0).id == 2
    assert p.priority_victim(R(9, 3), running, now=5.0) is None
    assert p.priority_victim(R(9, 0), [R(5, 0)], now=5.0) is None
    assert Policy(PolicyConfig(mode="fifo")).priority_victim(R(9, 0), running, 5.0) is None


def test_an_aged_request_is_not_preempted_by_the_class_it_aged_into():
    p = Policy(PolicyConfig(aging_seconds={"background": 10.0}))
    aged = R(1, 3, arrival=0.0, admitted_at=30.0)
    assert p.priority_victim(R(2, 1, arrival=30.0), [aged], now=30.0) is None
    assert p.priority_victim(R(3, 0, arrival=30.0), [aged], now=30.0) is aged


def test_memory_victim_spares_voice_in_hearth_mode():
    p = Policy(PolicyConfig())
    assert p.memory_victim([R(1, 0, admitted_at=1.0)]) is None
    assert p.memory_victim([R(1, 0, admitted_at=2.0), R(2, 2, admitted_at=1.0)]).id == 2


def test_unknown_mode_is_rejected():
    with pytest.raises(ValueError):
        PolicyConfig(mode="random")


def test_the_engines_class_rules_are_the_policys_answers():
    """The engine asks, the policy answers (issue 28): the bound, cutting a decode, when
    embeddings go, voice's spare slots, and when running work may take kept prefixes."""
    from types import SimpleNamespace as R

    hearth, serial = Policy(PolicyConfig()), Policy(PolicyConfig(mode="serial"))
    chat, bg, voice = R(rank=1), R(rank=3), R(rank=0)
    assert hearth.bounded(False, 99, []) and not serial.bounded(False, 0, [])
    assert not hearth.bounded(True, 3, [bg]) and hearth.bounded(True, 1, [bg])
    assert hearth.bounded(True, 99, [chat])
    assert hearth.cuts_decode(0, 3, 64, 16) and not hearth.cuts_decode(0, 0, 64, 16)
    assert not hearth.cuts_decode(0, 3, 8, 16) and not hearth.cuts_decode(1, 3, 64, 16)
    assert hearth.embeddings_go(4, 99) and not hearth.embeddings_go(4, 3)
    assert Policy(PolicyConfig(mode="fifo")).embeddings_go(4, 0)
    assert hearth.slots_for(voice, spare_ids=5) == 8 + 2 and hearth.slots_for(voice) == 8
    assert hearth.slots_for(chat, spare_ids=5) == 8
    assert hearth.growth_takes_kept(1, chat, [chat, chat])  # a chat would preempt a chat
    assert not hearth.growth_takes_kept(1, bg, [chat, bg])  # a lower class yields first
    assert hearth.growth_takes_kept(3, bg, [bg, voice])  # alone beside voice: no use
    assert not hearth.growth_takes_kept(3, bg, [bg, bg])  # one of its own lets the other go
    assert hearth.growth_takes_kept(0, None, [voice])
