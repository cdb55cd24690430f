"""Wake-word reservations (policy.reservations, engine.satellites) and supersede, on the
simulated backend: a reservation holds lower classes' prompts back for its time only, never
loses their work, and no flood of signals starves them; a newer voice turn from a satellite
supersedes its older one still waiting."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sim_backend import make_core, request

from hearth.engine.satellites import SATELLITE
from hearth.policy.reservations import BREAK_S, MAX_HOLD_S, Reservations


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_expiry_one_per_satellite_and_unused_ones_shrink():
    c = Clock()
    book = Reservations(4.0, clock=c)
    a = book.open("sat.kitchen")
    again = book.open("sat.kitchen")
    assert again.id == a.id and book.live() == 1  # replaced, not added
    assert book.holds()
    c.t = 4.01
    assert not book.holds() and book.live() == 0  # expired unused: a strike
    book.open("sat.kitchen")
    assert book.expires_in("sat.kitchen") == 2.0  # half the time after an unused one
    assert book.voice_arrived("sat.kitchen") is not None  # the turn came: forgiven
    book.open("sat.kitchen")
    assert book.expires_in("sat.kitchen") == 4.0
    assert book.end(book.open("sat.porch").id) and not book.end("rsv_unknown")


def test_a_voice_turn_without_a_satellite_ends_the_soonest():
    c = Clock()
    book = Reservations(4.0, clock=c)
    book.open("a", 2.0)
    book.open("b", 3.0)
    assert book.voice_arrived(None).satellite == "a"
    assert book.live() == 1


def test_an_unbroken_hold_breaks_for_lower_classes():
    c = Clock()
    book = Reservations(5.0, clock=c)
    held = []
    while c.t < 40:
        book.open(f"sat{int(c.t) % 3}")  # a flood: a signal every 0.5 s
        held.append(book.holds())
        c.t += 0.5
    free = [i for i, h in enumerate(held) if not h]
    assert free, "never released"
    # At most MAX_HOLD_S held in a row, then BREAK_S free.
    longest = max(len(run) for run in "".join("h" if h else "." for h in held).split("."))
    assert longest * 0.5 <= MAX_HOLD_S + 0.5
    assert sum(1 for h in held if not h) * 0.5 >= BREAK_S


def _drive(core, b, events, sinks, limit_s=600.0):
    """Apply timed events ("submit", r) / ("reserve", satellite, ttl) as the virtual clock
    passes them, stepping the engine; when it has nothing to do, time passes."""
    events = sorted(events, key=lambda e: e[0])
    while events or any(s.done is None for s in sinks):
        while events and events[0][0] <= b.t:
            _, kind, *args = events.pop(0)
            if kind == "submit":
                core.submit(args[0])
            else:
                core.satellites.reserve(*args)
        if not core.step():
            b.t = min(events[0][0], b.t + 0.01) if events else b.t + 0.01
        assert b.t < limit_s, "work starved"


def _workload(b, spec):
    reqs = []
    for i, (t, cls, n, out) in enumerate(spec):
        r, s = request(b, cls, n, out, user=f"u{i % 3}", seed=i)
        reqs.append((t, r, s))
    return reqs


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=st.lists(st.tuples(st.floats(0, 5), st.sampled_from(["voice", "chat", "background"]),
                               st.integers(20, 600), st.integers(1, 40)),
                     min_size=1, max_size=12),
       signals=st.lists(st.tuples(st.floats(0, 30), st.integers(0, 3), st.floats(0.5, 15)),
                        max_size=40))
def test_reservations_never_lose_or_starve_work(spec, signals):
    outputs = []
    for with_signals in (False, True):
        core, b = make_core("hearth", n_parallel=3)
        reqs = _workload(b, spec)
        events = [(t, "submit", r) for t, r, _ in reqs]
        if with_signals:
            events += [(t, "reserve", f"sat{k}", ttl) for t, k, ttl in signals]
        sinks = [s for _, _, s in reqs]
        _drive(core, b, events, sinks)
        for (_, r, s) in reqs:
            assert s.done.kind == "done", s.done  # nothing failed
            assert len(s.tokens) == r.max_tokens  # nothing lost
        outputs.append([s.tokens for _, _, s in reqs])
        if with_signals:
            # Lower classes progress once the last reservation expired: the work left then
            # needs no more than it would with none (a generous bound of the sim's pace).
            last = max((t + ttl for t, _, ttl in signals), default=0.0)
            assert b.t <= max(last, 5.0) + 60.0
    assert outputs[0] == outputs[1], "a held or cut prompt resumed differently"


def test_a_reservation_holds_lower_prompts_then_lets_them_go():
    core, b = make_core("hearth", n_parallel=4)
    summary, s = request(b, "background", 2000, 4, seed=1)
    core.submit(summary)
    core.step()
    done_before = summary.n_past
    assert 0 < done_before < 2000
    core.satellites.reserve("sat.kitchen", 2.0)
    t0 = b.t
    while b.t - t0 < 1.9:  # held: no chunk of it is computed
        if not core.step():
            b.t += 0.05
    assert summary.n_past == done_before
    voice, vs = request(b, "voice", 50, 3, seed=2)
    voice.meta[SATELLITE] = "sat.kitchen"
    core.submit(voice)  # the turn came: the reservation ends with it
    assert core.satellites.book.live() == 0
    while s.done is None:
        if not core.step():
            b.t += 0.01
    assert vs.done is not None and vs.done.kind == "done"
    assert len(s.tokens) == 4


def test_a_newer_voice_turn_supersedes_the_older_still_waiting():
    core, b = make_core("hearth", n_parallel=1, voice_spare_slots=0)
    first, fs = request(b, "voice", 30, 50, seed=1)  # holds the only slot
    core.submit(first)
    core.step()
    old, olds = request(b, "voice", 30, 5, seed=2)
    old.meta[SATELLITE] = "sat.kitchen"
    other, others = request(b, "voice", 30, 5, seed=3)
    other.meta[SATELLITE] = "sat.porch"
    core.submit(old)
    core.submit(other)
    core.step()
    new, news = request(b, "voice", 30, 5, seed=4)
    new.meta[SATELLITE] = "sat.kitchen"
    core.submit(new)
    core.step()
    assert olds.done is not None and olds.done.kind == "error"
    assert olds.done.status == 409 and olds.done.code == "superseded"
    while any(x.done is None for x in (fs, others, news)):
        core.step()
    assert others.done.kind == "done" and news.done.kind == "done"
