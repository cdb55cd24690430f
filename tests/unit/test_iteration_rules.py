"""The class rules the engine used to apply itself, answered by the policy alone."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from hearth.policy.arbitration import Arbitration
from hearth.policy.scheduler import CLASS_RANKS, Policy, PolicyConfig


def req(i, cls, arrival, admitted):
    return SimpleNamespace(id=i, rank=CLASS_RANKS[cls], arrival=arrival, admitted_at=admitted,
                           user="u")


@pytest.mark.parametrize("mode", ["hearth", "fifo", "serial"])
def test_who_is_waited_for_who_takes_spare_ids_and_whether_a_held_back_request_blocks(mode):
    p = Policy(PolicyConfig(mode=mode))
    assert [p.waited_for(r) for r in range(5)] == [True, True, False, False, False]
    assert [p.may_use_spare_ids(r) for r in range(5)] == [mode == "hearth"] + [False] * 4
    assert p.skips_held_back() == (mode == "hearth")


def test_victims_of_last_resort_and_the_retry_order():
    p = Policy(PolicyConfig())
    a, b, c = req(1, "voice", 0.0, 5.0), req(2, "voice", 1.0, 3.0), req(3, "chat", 2.0, 1.0)
    assert p.last_resort_victim([a]) is None  # a lone sequence has all the context there is
    assert p.last_resort_victim([b, a]) is a  # the newest admitted
    assert p.exhausted_victim([a, c, b]) is c  # the newest arrival
    assert p.retry_order([c, b, a]) == [a, b, c]  # best class first, then arrival


def test_only_interactive_arrivals_cut_other_engines():
    rule = Arbitration()
    assert [rule.may_cut_others(r) for r in range(5)] == [True, True, False, False, False]
    assert not Arbitration(enabled=False).may_cut_others(0)
