"""Two engines sharing one accelerator: the class order holds across them. The rule is tested
as a table and over random ranks; the mechanism with two real engine threads over simulated
backends whose decodes take real time."""

from __future__ import annotations

import threading
import time

from hypothesis import given
from hypothesis import strategies as st
from sim_backend import SimBackend, make_core, request

from hearth.engine import Engine
from hearth.engine.arbiter import Arbiter, best_rank
from hearth.policy.arbitration import IDLE_RANK, Arbitration
from hearth.policy.scheduler import INTERACTIVE_RANK, class_rank

VOICE, CHAT, AGENT, BACKGROUND = (class_rank(c) for c in ("voice", "chat", "agent", "background"))


def test_the_rule():
    rule = Arbitration()
    assert rule.must_pause(BACKGROUND, [VOICE], 0.0)
    assert rule.must_pause(CHAT, [VOICE], 0.0)  # chat waits for voice, as in one engine
    assert not rule.must_pause(VOICE, [VOICE], 0.0)  # equals share
    assert not rule.must_pause(BACKGROUND, [AGENT], 0.0)  # only interactive work pauses others
    assert not rule.must_pause(BACKGROUND, [], 0.0)
    assert not rule.must_pause(BACKGROUND, [IDLE_RANK], 0.0)
    assert not rule.must_pause(BACKGROUND, [VOICE], rule.max_pause_s)  # no starvation
    assert not Arbitration(enabled=False).must_pause(BACKGROUND, [VOICE], 0.0)


@given(st.integers(0, 4), st.lists(st.sampled_from([0, 1, 2, 3, 4, IDLE_RANK]), max_size=4),
       st.floats(0, 5))
def test_an_engine_pauses_only_for_better_interactive_work_and_never_for_long(own, others,
                                                                               waited):
    rule = Arbitration(max_pause_s=2.0)
    paused = rule.must_pause(own, others, waited)
    if paused:
        assert waited < 2.0
        assert min(others) <= INTERACTIVE_RANK and min(others) < own
    elif waited < 2.0 and others and min(others) <= INTERACTIVE_RANK:
        assert own <= min(others)


class TimedBackend(SimBackend):
    """Each decode takes real time (llama_decode releases the GIL) and is stamped."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.stamps: list[float] = []

    def decode(self, tokens, pos, seqs, outputs) -> int:
        time.sleep(0.002)
        self.stamps.append(time.monotonic())
        return super().decode(tokens, pos, seqs, outputs)


def _pair(arbiter: Arbiter | None):
    engines = []
    for _ in range(2):
        b = TimedBackend(n_seq_max=12)
        core, _ = make_core("hearth", n_parallel=4, backend=b)
        if arbiter is not None:
            arbiter.join(core)
        engines.append((core, b, Engine(core)))
    for _, _, e in engines:
        e.start()
    return engines


def _wait(cond, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "the workload did not finish"
        time.sleep(0.001)


def _voice_beside_a_summary(arbiter: Arbiter | None) -> tuple[int, int, float]:
    """(the summary's decodes while the voice turn ran, the voice turn's decodes, its
    duration)."""
    (voice_core, vb, ve), (bg_core, bb, be) = _pair(arbiter)
    try:
        summary, summary_sink = request(bb, "background", 3000, 400, seed=1)
        bg_core.submit(summary)
        _wait(lambda: len(bb.stamps) > 5)  # the summary is under way
        turn, turn_sink = request(vb, "voice", 40, 40, seed=2)
        t0 = time.monotonic()
        voice_core.submit(turn)
        _wait(lambda: turn_sink.done is not None)
        t1 = time.monotonic()
        beside = sum(1 for t in bb.stamps if t0 <= t <= t1)
        _wait(lambda: summary_sink.done is not None, timeout=60)  # and it still finishes
        assert summary_sink.done.kind == "done" and turn_sink.done.kind == "done"
        return beside, sum(1 for t in vb.stamps if t0 <= t <= t1), t1 - t0
    finally:
        for e in (ve, be):
            assert e.stop()


def test_a_summary_on_another_engine_pauses_while_a_voice_turn_runs():
    rule = Arbitration(max_pause_s=0.5)
    paused, own, seconds = _voice_beside_a_summary(Arbiter(rule))
    # At most the decode under way at the arrival, and one per max_pause_s.
    assert paused <= 2 + seconds / rule.max_pause_s, (paused, own, seconds)
    free, _, _ = _voice_beside_a_summary(None)
    assert free > 3 * max(paused, 1), (free, paused)  # without it, they interleave


def test_chat_that_never_stops_does_not_starve_another_engine():
    rule = Arbitration(max_pause_s=0.2)
    arbiter = Arbiter(rule)
    (chat_core, cb, ce), (bg_core, bb, be) = _pair(arbiter)
    stop = threading.Event()

    def chatter() -> None:
        while not stop.is_set():
            r, sink = request(cb, "chat", 30, 30, seed=len(cb.stamps))
            chat_core.submit(r)
            _wait(lambda sink=sink: sink.done is not None)

    t = threading.Thread(target=chatter, daemon=True)
    t.start()
    try:
        _wait(lambda: best_rank(chat_core) == CHAT)
        summary, sink = request(bb, "background", 200, 20, seed=3)
        bg_core.submit(summary)
        _wait(lambda: sink.done is not None, timeout=60)
        assert sink.done.kind == "done"
        assert arbiter.paused_s.get(id(bg_core), 0.0) > 0  # it did wait its turn
    finally:
        stop.set()
        t.join(10)
        for e in (ce, be):
            assert e.stop()
