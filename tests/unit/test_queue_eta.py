"""Queue places and expected times to first token (engine.queue_eta, policy.eta) on the
simulated backend, whose costs the cost model knows: the predictions must come close to what
happens, and deadlines refuse by expected time, never a job."""

from __future__ import annotations

import statistics

import pytest
from sim_backend import SimBackend, make_core, request, run_until

from hearth.engine.base import RequestError
from hearth.policy.eta import Bias, Clock, Job, plan


def _clock(per_token: float = 0.01, decode: float = 0.02, slots: int = 2) -> Clock:
    return Clock(lambda n, start, rank: per_token * n, decode, decode, slots, slots + 1)


def test_plan_orders_by_class_and_waits_for_slots():
    running = [Job(1, 1, 0, 10, 10.0), Job(2, 3, 0, 10, 100.0)]  # a chat and a summary decode
    waiting = [Job(3, 0, 50, 0, 5.0), Job(4, 1, 100, 0, 5.0), Job(5, 1, 100, 0, 5.0)]
    p = plan(running, waiting, _clock())
    # Voice: a spare slot, straight to its prompt (0.5 s).
    assert p.by_id[3] == (1, pytest.approx(0.5))
    # The chats wait for slots: two held by the chat running (ends at 0.2 s) and the voice
    # turn (ends at 0.5 + 0.1); the summary's slot is theirs (it is preempted).
    assert p.by_id[4] == (2, pytest.approx(0.5 + 1.0))
    assert p.by_id[5] == (3, pytest.approx(1.5 + 1.0))
    # A new chat goes behind them; a new voice turn only behind the voice turn.
    assert p.arrival(1, 100) == (4, pytest.approx(2.5 + 1.0))
    assert p.arrival(0, 10)[0] == 2


def test_a_plan_older_than_its_work_places_arrivals_from_now():
    """Plans are remade at most once a second (every few seconds when iterations are slow):
    arrivals after the plan's work ended queue from now, one behind the other, not from the
    plan's past (they were all told their own prompt's time: too short a wait)."""
    p = plan([Job(1, 1, 0, 10, 10.0)], [], _clock())  # one chat, done by 0.2 s
    first = p.add(7, 1, 100, 0, 5.0, now=5.0)
    second = p.add(8, 1, 100, 0, 5.0, now=5.0)
    assert first == (1, pytest.approx(5.0 + 1.0))
    assert second == (2, pytest.approx(5.0 + 2.0))
    assert p.arrival(1, 100, now=5.0) == (3, pytest.approx(5.0 + 3.0))


def test_a_summary_that_ages_into_chats_line_is_planned_ahead_of_the_chats_after():
    """Aging (background: a rank up every 20 s, never above chat): a summary that has waited
    35 s reaches chat's rank 5 s from now and enters chat's line then, by the policy's key
    (here its member's counter is lower). Chats admitted before that are not delayed; those
    after it wait for its prompt (10 s); so does a chat arriving now. One that has waited
    no time stays behind every chat."""
    chats = [Job(10 + i, 1, 100, 0, 10.0, tie=(5.0, i)) for i in range(6)]  # 1 s + 0.2 s each

    def summary(waited: float) -> Job:
        return Job(2, 2 if waited >= 20 else 3, 1000, 0, 10.0, tie=(1.0, 0), base=3,
                   waited_s=waited, every_s=20.0, best=1)

    running = [Job(1, 1, 0, 10, 10.0)]  # a chat decoding, done at 0.2 s
    clock = _clock(slots=1)
    aged = plan(running, [summary(35.0), *chats], clock)
    fresh = plan(running, [summary(0.0), *chats], clock)
    # Slots free at 0.2, 1.4, 2.6, 3.8, 5.0: the summary takes the one at 5.0.
    assert aged.by_id[2] == (5, pytest.approx(5.0 + 10.0))
    for i in range(4):
        assert aged.by_id[10 + i] == fresh.by_id[10 + i]
    assert aged.by_id[14][1] == pytest.approx(fresh.by_id[14][1] + 10.2)
    assert aged.arrival(1, 100)[1] == pytest.approx(fresh.arrival(1, 100)[1] + 10.2)
    assert fresh.by_id[2][0] == 7, "a summary that has not aged waits behind every chat"
    assert Job(3, 3, 1, 0, 1.0, base=3, every_s=20.0, best=1).rank_at(1000.0) == 1


def _fill(core, b, n_chat=6, prompt=300, max_tokens=30):
    sinks = []
    for i in range(n_chat):
        r, s = request(b, "chat", prompt, max_tokens, user=f"u{i % 2}", seed=i)
        core.submit(r)
        sinks.append((r, s))
    return sinks


def test_waiting_requests_have_places_and_etas_that_come_true():
    core, b = make_core("hearth", n_parallel=2)
    sinks = _fill(core, b)
    core.step()
    q = core.queue_state()
    places = [w["position"] for w in q["waiting_requests"]]
    etas = [w["eta_s"] for w in q["waiting_requests"]]
    assert places == list(range(1, len(places) + 1)) and len(places) == 4
    assert etas == sorted(etas) and etas[0] > 0
    assert q["eta_s"]["chat"] >= etas[-1] > 0
    assert q["eta_s"]["voice"] < etas[0], "voice waits behind no chat"
    # Each request's place is told while it waits, none once it runs.
    r0, r_last = sinks[0][0], sinks[-1][0]
    assert core.queue_eta.position(r0) is None
    listed = next(w for w in q["waiting_requests"] if w["id"] == str(r_last.id))
    assert core.queue_eta.position(r_last) == (listed["position"],
                                                pytest.approx(listed["eta_s"], abs=0.01))
    run_until(core, lambda: all(s.done is not None for _, s in sinks))
    errors = []
    for _, s in sinks:
        actual = s.done.timing["ttft_ms"] / 1000
        predicted = s.done.timing["eta_ms"] / 1000
        errors.append(abs(predicted - actual) / actual)
    assert statistics.median(errors) < 0.25, errors


def test_deadlines_refuse_by_expected_wait_but_never_a_job():
    core, b = make_core("hearth", n_parallel=2, deadlines={"chat": 1.0})
    _fill(core, b, n_chat=8, prompt=400)
    core.step()
    late, _ = request(b, "chat", 400, 30, seed=99)
    with pytest.raises(RequestError) as e:
        core.submit(late)
    assert e.value.status == 429 and e.value.code == "deadline_exceeded"
    assert e.value.retry_after is not None and e.value.retry_after >= 2
    assert core.stats.shed["chat"] == 1
    job, _ = request(b, "chat", 400, 30, seed=100)
    job.meta["job"] = True
    core.submit(job)  # queued however long the wait
    voice, _ = request(b, "voice", 50, 10, seed=101)
    core.submit(voice)  # no deadline for voice here
    assert core.stats.shed["chat"] == 1 and core.stats.shed["voice"] == 0


def test_deadlines_setting_from_text_json_or_an_object():
    from hearth.settings import Settings, load

    s = load(None, {"HEARTH_DEADLINES": "voice=8, chat=60", "HEARTH_RESERVATION_S": "4"})
    assert s.deadline_seconds() == {"voice": 8.0, "chat": 60.0} and s.reservation_s == 4.0
    assert Settings(deadlines={"voice": 8, "chat": 0}).deadline_seconds() == {"voice": 8.0}
    assert Settings(deadlines='{"chat": 3}').deadline_seconds() == {"chat": 3.0}
    for bad in ("vocie=3", "chat=soon", "chat=-1"):
        with pytest.raises(ValueError):
            Settings(deadlines=bad)


def test_bias_learns_the_ratio_in_log_space_and_bounds_one_odd_request():
    bias = Bias(keep=0.5)
    assert bias.factor(1) == 1.0
    bias.learn(1, 2.0, 3.0)  # the first replaces nothing: 1.5x
    assert bias.factor(1) == pytest.approx(1.5)
    bias.learn(1, 1.0, 1.5)
    assert bias.factor(1) == pytest.approx(1.5)
    bias.learn(1, 0.01, 100.0)  # 10,000x counted as 4x
    assert bias.factor(1) == pytest.approx((1.5 * 4.0) ** 0.5)
    bias.learn(1, 0.0, 5.0)  # no prediction: nothing learned
    assert bias.factor(1) == pytest.approx((1.5 * 4.0) ** 0.5)
    assert bias.factor(0) == 1.0, "each class its own"
    bias.learn(1, 1.0, 3.0, queued=False)  # admitted as it arrived: apart
    assert bias.factor(1, queued=False) == pytest.approx(3.0)
    assert bias.factor(1) == pytest.approx((1.5 * 4.0) ** 0.5)


class _Unseen(SimBackend):
    """Time the cost model never sees: each iteration pays ``hidden`` outside its decode (the
    server's own work, say), so every prediction from decode costs alone is too short."""

    hidden = 0.03

    def clear_abort(self) -> None:
        super().clear_abort()
        self.t += self.hidden


def _errors(sinks) -> list[float]:
    out = []
    for _, s in sinks:
        actual, predicted = s.done.timing["ttft_ms"], s.done.timing["eta_ms"]
        out.append(abs(predicted - actual) / actual)
    return out


def test_predictions_learn_what_the_cost_model_does_not_see():
    core, b = make_core("hearth", n_parallel=2, backend=_Unseen(n_seq_max=10))
    waves = []
    for wave in range(3):
        sinks = []
        for i in range(6):
            r, s = request(b, "chat", 300, 30, user=f"u{i % 2}", seed=10 * wave + i)
            core.submit(r)
            sinks.append((r, s))
        run_until(core, lambda sinks=sinks: all(s.done is not None for _, s in sinks))
        waves.append(statistics.median(_errors(sinks)))
        if wave == 0:  # every one told too short a wait
            assert all(s.done.timing["eta_ms"] < s.done.timing["ttft_ms"] for _, s in sinks)
    assert core.queue_eta.bias.factor(1) > 1.3
    assert waves[0] > 0.3 and waves[2] < 0.2 and waves[2] < waves[0] / 2, waves


def test_an_accurate_cost_model_learns_no_bias():
    core, b = make_core("hearth", n_parallel=2)
    sinks = _fill(core, b)
    run_until(core, lambda: all(s.done is not None for _, s in sinks))
    core.queue_eta.publish(b.now() + 10)  # a refresh: it learns from the first tokens
    assert 0.75 < core.queue_eta.bias.factor(1) < 1.33
