"""A model's load yields to other models' voice and chat work: the rule and its bounds as a
table, over simulated time and random inputs; the turn's thread stopping and continuing a
stand-in worker; the worker's lowest-priority thread, read from /proc."""

from __future__ import annotations

import itertools
import os
import signal
import threading
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st
from proc_sched import SCHED_OTHER, thread_sched

from hearth.fleet.load_priority import LoadTurn
from hearth.policy.load_yield import IDLE_RANK, LoadClock, LoadYield
from hearth.policy.scheduler import class_rank
from hearth.runner.low_priority import LowPriorityThread

VOICE, CHAT, AGENT, BACKGROUND = (class_rank(c) for c in ("voice", "chat", "agent", "background"))
RANKS = [VOICE, CHAT, AGENT, BACKGROUND, IDLE_RANK]


def test_the_rule():
    rule = LoadYield()
    assert rule.low_priority(IDLE_RANK, True) and rule.low_priority(BACKGROUND, True)
    assert rule.low_priority(AGENT, True)
    assert not rule.low_priority(VOICE, True) and not rule.low_priority(CHAT, True)  # waited
    assert not rule.low_priority(BACKGROUND, False)  # no other model serves: nobody to yield
    assert not LoadYield(enabled=False).low_priority(IDLE_RANK, True)
    assert rule.wants_pause(IDLE_RANK, [VOICE]) and rule.wants_pause(BACKGROUND, [CHAT])
    assert rule.wants_pause(CHAT, [VOICE])
    assert not rule.wants_pause(IDLE_RANK, [AGENT, BACKGROUND])  # only voice and chat
    assert not rule.wants_pause(VOICE, [VOICE])
    assert not rule.wants_pause(IDLE_RANK, [])
    assert not LoadYield(enabled=False).wants_pause(IDLE_RANK, [VOICE])


def run(clock: LoadClock, own: int, others: list[int], t0: float, t1: float,
        dt: float = 0.01) -> list[tuple[float, bool]]:
    out, now = [], t0
    while now < t1:
        out.append((now, clock.step(own, others, now)))
        now = round(now + dt, 6)
    return out


def test_a_load_pauses_while_voice_runs_elsewhere_and_runs_when_it_ends():
    clock = LoadClock(LoadYield())
    assert not clock.step(IDLE_RANK, [], 0.0)
    assert clock.step(IDLE_RANK, [VOICE], 0.1)
    assert clock.step(IDLE_RANK, [VOICE, BACKGROUND], 0.5)
    assert not clock.step(IDLE_RANK, [BACKGROUND], 0.6)  # the voice turn ended
    assert clock.pauses == 1 and clock.held_s(0.6) == pytest.approx(0.5)
    assert clock.step(IDLE_RANK, [CHAT], 0.7)  # a pause that was not cut short: at once
    assert clock.pauses == 2


def test_endless_voice_pauses_a_load_at_most_its_share_and_then_not_at_all():
    rule = LoadYield(max_pause_s=2.0, min_run_s=0.5, boost_after_s=10.0)
    clock = LoadClock(rule)
    steps = run(clock, IDLE_RANK, [VOICE], 0.0, 60.0)
    paused = [t for t, p in steps if p]
    # Every pause lasts max_pause_s at most, and min_run_s of running follows it.
    runs = [t for t, p in steps if not p]
    assert runs and all(b - a <= rule.max_pause_s + 0.011 for a, b in itertools.pairwise(runs))
    window = [p for t, p in steps if t < 10.0]
    assert sum(window) / len(window) <= rule.max_pause_share + 0.01
    # After boost_after_s paused in all, it is boosted: it runs, and pauses no more.
    assert clock.boosted and "paused" in (clock.why or "")
    assert len(paused) * 0.01 == pytest.approx(rule.boost_after_s, abs=0.05)
    assert not any(p for t, p in steps if t > paused[-1])


def test_a_voice_request_waiting_for_the_load_ends_its_pause_and_boosts_it():
    clock = LoadClock(LoadYield())
    assert clock.step(BACKGROUND, [VOICE], 0.0)
    assert not clock.step(VOICE, [VOICE], 0.1)  # voice waits for this model too
    assert clock.boosted and "waits" in (clock.why or "")
    assert not clock.step(BACKGROUND, [VOICE], 0.2)  # boosted stays boosted


@given(st.lists(st.tuples(st.sampled_from(RANKS), st.lists(st.sampled_from(RANKS), max_size=3),
                          st.floats(0.001, 1.0)), max_size=200))
def test_whatever_comes_the_bounds_hold(events):
    rule = LoadYield(max_pause_s=2.0, min_run_s=0.5, boost_after_s=10.0)
    clock = LoadClock(rule)
    now, since, ran_out_at = 0.0, None, None
    for own, others, dt in events:
        was_boosted = clock.boosted
        paused = clock.step(own, others, now)
        if paused:
            assert not clock.boosted and rule.wants_pause(own, others)
            assert own > CHAT and not was_boosted
            since = now if since is None else since
            assert now - since < rule.max_pause_s  # a pause never outlasts its bound
            if ran_out_at is not None:
                assert since - ran_out_at >= rule.min_run_s
        elif since is not None:
            if now - since >= rule.max_pause_s:
                ran_out_at = now
            since = None
        assert clock.held_s(now) <= rule.boost_after_s + rule.max_pause_s
        now += dt


# -- the turn's thread, over stand-ins for the supervisor and its worker ----------------------
class Proc:
    def __init__(self) -> None:
        self.signals: list[int] = []

    def send_signal(self, sig: int) -> None:
        self.signals.append(sig)


class Worker:
    def __init__(self, pid: int = 1) -> None:
        self.pid, self.proc, self.calls = pid, Proc(), []

    def call(self, deferred: list, op: str, *args: object) -> None:
        self.calls.append(op)


class Sup:
    def __init__(self) -> None:
        self.cfg: dict = {"model": "m"}
        self.closing = False
        self.starting: Worker | None = None
        self.worker: Worker | None = None


class Backend:
    def __init__(self, worker: Worker) -> None:
        self.worker, self.before_call, self.flushed = worker, None, 0

    def flush(self) -> None:
        self.flushed += 1


def until(cond, what: str) -> None:
    """Waits for the turn's thread (it looks every 10 ms); the deadline only bounds a hang."""
    deadline = time.monotonic() + 10
    while not cond():
        assert time.monotonic() < deadline, what
        time.sleep(0.005)


def turn(own: list[int], others: list[int], **rule) -> LoadTurn:
    return LoadTurn(LoadYield(max_pause_s=60.0, boost_after_s=120.0, **rule),
                    lambda: min(own, default=IDLE_RANK), lambda: list(others),
                    watchdog_s=600.0)


def test_the_turn_stops_the_loading_worker_while_voice_runs_and_continues_it_after():
    others: list[int] = [IDLE_RANK]  # another model serves, idle
    t, sup, w = turn([], others), Sup(), Worker()
    assert t.low
    sup.starting = w
    t.begin(sup)
    assert sup.cfg["load_priority"] == "low"
    others.append(VOICE)
    until(lambda: w.proc.signals == [signal.SIGSTOP], "never stopped")
    assert t.report()["paused"]
    others.clear()
    until(lambda: w.proc.signals == [signal.SIGSTOP, signal.SIGCONT], "never continued")
    # Started: the worker being loaded is the supervisor's now, and is stopped again.
    sup.starting, sup.worker = None, w
    others.append(CHAT)
    until(lambda: len(w.proc.signals) == 3, "not stopped again")
    backend = Backend(w)
    t.finish(backend)  # the load ended: continued, and told to serve at its own priority
    assert w.proc.signals == [signal.SIGSTOP, signal.SIGCONT] * 2
    assert w.calls == ["normal_priority"] and backend.flushed == 1
    assert "load_priority" not in sup.cfg  # a restart after a crash starts at normal
    report = t.report()
    assert report["pauses"] == 2 and not report["paused"] and report["paused_s"] > 0
    t.finish()  # again, from the load's end: nothing more
    assert len(w.proc.signals) == 4 and w.calls == ["normal_priority"]


def test_a_stop_of_the_server_continues_a_stopped_worker():
    t, sup, w = turn([], [VOICE]), Sup(), Worker()
    sup.starting = w
    t.begin(sup)
    until(lambda: w.proc.signals == [signal.SIGSTOP], "never stopped")
    sup.closing = True
    until(lambda: w.proc.signals == [signal.SIGSTOP, signal.SIGCONT], "left stopped")
    t.finish()
    assert w.proc.signals == [signal.SIGSTOP, signal.SIGCONT]


def test_voice_waiting_for_the_loading_model_raises_it_at_its_next_call():
    own: list[int] = [BACKGROUND]
    t, sup, w = turn(own, [VOICE]), Sup(), Worker()
    sup.worker = w
    t.begin(sup)
    until(lambda: w.proc.signals == [signal.SIGSTOP], "never stopped")
    t.before_call(w)
    assert w.calls == []  # not boosted: still low
    own.append(VOICE)
    until(lambda: w.proc.signals == [signal.SIGSTOP, signal.SIGCONT], "not continued")
    t.before_call(w)
    t.before_call(w)
    assert w.calls == ["normal_priority"]  # once
    t.finish(Backend(w))
    assert w.calls == ["normal_priority"] and w.proc.signals[-1] == signal.SIGCONT


def test_a_load_voice_waits_for_starts_at_normal_priority_and_never_pauses():
    t, sup, w = turn([VOICE], [VOICE]), Sup(), Worker()
    assert not t.low
    sup.starting = w
    t.begin(sup)
    assert "load_priority" not in sup.cfg
    t.finish(Backend(w))
    assert w.proc.signals == [] and w.calls == []


# -- the worker's side: a thread at the lowest priority, the others untouched ----------------
def test_a_load_with_no_other_model_serving_is_not_lowered():
    assert not turn([], []).low


def test_the_low_priority_thread_is_nice_19_and_ends_when_closed():
    own_nice = os.getpriority(os.PRIO_PROCESS, 0)
    low = LowPriorityThread()
    me, pid = threading.get_native_id(), os.getpid()
    tid = low.call(threading.get_native_id)
    state = thread_sched(pid, tid)
    assert state is not None and state[1] == 19 and state[2] == SCHED_OTHER, state
    assert low.lowered.get("nice") == 19
    caller = thread_sched(pid, me)  # untouched (a test run under nice 19 starts there)
    assert caller is not None and caller[2] == SCHED_OTHER and caller[1] == own_nice
    # A thread it starts inherits it (llama.cpp's compute threads).
    child: list = []
    low.call(lambda: (t := threading.Thread(target=lambda: child.append(
        thread_sched(pid, threading.get_native_id())))).start() or t.join())
    assert child[0][1] == 19
    assert low.call(lambda a, b: a + b, 2, 3) == 5
    with pytest.raises(ValueError, match="inside"):
        low.call(lambda: (_ for _ in ()).throw(ValueError("inside")))
    low.close()
    low.thread.join(timeout=10)
    assert not low.thread.is_alive()


# -- what the fleet gives the turn --------------------------------------------------------
def test_the_fleet_gives_a_load_its_waiters_and_the_other_models_work():
    from types import SimpleNamespace as NS

    from hearth.fleet.load_priority import turn_for
    from hearth.policy.arbitration import Arbitration

    def core(*ranks: int) -> NS:
        return NS(running=[NS(rank=r) for r in ranks], waiting=[], embed_waiting=[], _inbox=[])

    def model(state: str, core_: NS | None, remote: bool = False) -> NS:
        return NS(remote=remote, waiting_ranks=[], rt=NS(state=state, core=core_))

    loading = model("loading", None)
    workers = {"gemma": loading, "small": model("ready", core(BACKGROUND, VOICE)),
               "other": model("unloading", core(VOICE)), "far": model("ready", core(CHAT), True)}
    fleet = NS(arbiter=NS(rule=Arbitration()), workers=workers,
               settings=NS(worker_watchdog_s=120.0))
    t = turn_for(fleet, loading)
    assert t is not None and t.low and t.rule.max_pause_s == LoadYield().max_pause_s
    assert t.others() == [VOICE]  # serving models only, here on this machine
    assert t.own() == IDLE_RANK
    loading.waiting_ranks += [BACKGROUND, CHAT]
    assert t.own() == CHAT
    assert turn_for(NS(**{**vars(fleet), "arbiter": None}), loading) is None  # one model
    off = NS(**{**vars(fleet), "arbiter": NS(rule=Arbitration(enabled=False))})
    assert turn_for(off, loading) is None
    # A short watchdog shortens the pauses: a call is never killed for a pause.
    short = NS(**{**vars(fleet), "settings": NS(worker_watchdog_s=2.0)})
    assert turn_for(short, loading).rule.max_pause_s == 0.5
