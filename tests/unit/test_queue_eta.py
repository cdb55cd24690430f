"""Queue places and expected times to first token (engine.queue_eta, policy.eta) on the
simulated backend, whose costs the cost model knows: the predictions must come close to what
happens, and deadlines refuse by expected time, never a job."""

from __future__ import annotations

import statistics

import pytest
from sim_backend import make_core, request, run_until

from hearth.engine.base import RequestError
from hearth.policy.eta import Clock, Job, plan


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
