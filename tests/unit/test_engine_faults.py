"""Faults that surface: a dead engine thread, settings that cannot work, batches that would not
fit (simulated backend)."""

from __future__ import annotations

import sys
import threading
import time

import pytest
from sim_backend import SimBackend, make_core, request, run_until

from hearth.engine import Engine, RequestError


class DyingBackend(SimBackend):
    """Decodes a few batches, then fails the way a broken driver or context would."""

    def __init__(self, decodes_before_failure: int, **kw):
        super().__init__(**kw)
        self.left = decodes_before_failure

    def decode(self, tokens, pos, seqs, outputs) -> int:
        self.left -= 1
        if self.left < 0:
            raise RuntimeError("device lost")
        return super().decode(tokens, pos, seqs, outputs)


def test_a_dead_engine_thread_fails_every_request_and_refuses_new_ones():
    """Running, admitted-but-waiting and not-yet-drained requests all get a 503 error event
    (nobody waits forever), later submissions are refused with 503, and the owner is told."""
    b = DyingBackend(3, n_seq_max=4)
    core, _ = make_core("hearth", n_parallel=2, backend=b)
    sinks = []
    for i in range(5):
        r, sink = request(b, "chat" if i % 2 else "background", 40, 50, seed=i)
        core.submit(r)
        sinks.append(sink)
    died = threading.Event()
    seen: list[BaseException] = []
    engine = Engine(core, on_death=lambda err: (seen.append(err), died.set()))
    engine.start()
    assert died.wait(10), "the engine did not die"
    engine.stop()

    assert isinstance(engine.error, RuntimeError) and seen == [engine.error]
    for sink in sinks:
        assert sink.done is not None and sink.done.kind == "error"
        assert sink.done.status == 503 and "engine stopped: device lost" in sink.done.message
    assert not (core.waiting or core.running)
    with pytest.raises(RequestError) as refused:
        core.submit(request(b, "voice", 10, 4, seed=9)[0])
    assert refused.value.status == 503 and refused.value.code == "engine_failed"


def test_prefill_never_overflows_the_batch():
    """With nearly every batch slot taken by decodes, prefill gets only the room that is left,
    not the minimum chunk (which once made llama_decode raise and killed the engine)."""
    b = SimBackend(n_batch=16, n_ubatch=16, n_seq_max=24)
    core, _ = make_core("hearth", n_parallel=16, backend=b)
    streams = []
    for i in range(15):
        r, sink = request(b, "chat", 8, 400, seed=i)
        core.submit(r)
        streams.append((r, sink))
    run_until(core, lambda: all(r.first_token_at is not None for r, _ in streams))
    assert core.batcher.prefill_budget(15) == 1 and core.batcher.prefill_budget(16) == 0
    late, late_sink = request(b, "chat", 64, 2, seed=99)
    core.submit(late)
    run_until(core, lambda: late_sink.done is not None)
    assert late_sink.done.kind == "done"
    assert max(batch["n"] for batch in b.batches) <= 16


def test_the_runtime_reports_a_dead_engine_and_stops_the_process(monkeypatch):
    """/health turns to failed with the reason, and the process is asked to stop gracefully
    (SIGTERM: jobs are requeued) with a failure status, so its supervisor restarts it."""
    from hearth.fleet import runtime
    from hearth.settings import Settings

    signals: list[tuple[int, int]] = []
    monkeypatch.setattr(runtime.os, "kill", lambda pid, sig: signals.append((pid, sig)))
    rt = runtime.Runtime(Settings())
    rt._engine_died(RuntimeError("device lost"))
    assert (rt.state, rt.error, rt.exit_code) == ("failed", "engine stopped: device lost", 70)
    assert signals == [(runtime.os.getpid(), runtime.signal.SIGTERM)]


class BusyBackend(SimBackend):
    """Each decode takes real time (as llama_decode does, releasing the GIL), so that readers
    on another thread run while the engine is between and inside iterations."""

    def decode(self, tokens, pos, seqs, outputs) -> int:
        time.sleep(0.0002)
        return super().decode(tokens, pos, seqs, outputs)


def test_readers_never_trip_over_the_running_engine():
    """/v1/queue and /metrics read while the engine thread churns the prefix cache (one-off
    prompts evicting each other) and finishes requests: no reader ever sees a structure
    mid-change ("OrderedDict mutated during iteration" once), and the counts add up."""
    b = BusyBackend(n_seq_max=4 + 48, n_ctx=8192)
    core, _ = make_core("hearth", n_parallel=4, backend=b, prefix_cache_entries=48)
    sinks = []
    for i in range(150):
        r, sink = request(b, ("chat", "background", "voice")[i % 3], 30 + i % 17, 6, seed=i)
        core.submit(r)
        sinks.append(sink)
    engine = Engine(core)
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads change hands often, inside loops too
    engine.start()
    reads = 0
    try:
        while not all(s.done for s in sinks):
            with core.lock:
                state = core.queue_state()
            snap = core.stats.snapshot(b.now())
            assert state["kv"]["used"] <= state["kv"]["cells"]
            assert snap["classes"]["chat"]["completed"] <= 50
            reads += 1
            assert reads < 1_000_000, "the workload did not finish"
    finally:
        sys.setswitchinterval(switch)
        engine.stop()
    assert engine.error is None
    assert all(s.done.kind == "done" for s in sinks)
    assert reads > 10 and core.stats.snapshot(b.now())["classes"]["voice"]["completed"] == 50


class StuckBackend(SimBackend):
    """A decode that runs until it is aborted (a long prefill on a slow device), or forever
    if ``heeds_abort`` is false."""

    def __init__(self, heeds_abort: bool = True, **kw):
        super().__init__(**kw)
        self.heeds_abort = heeds_abort
        self.decoding = threading.Event()
        self.aborted = threading.Event()
        self.release = threading.Event()  # lets a stuck decode end when the test is over

    def request_abort(self) -> None:
        super().request_abort()
        if self.heeds_abort:
            self.aborted.set()

    def decode(self, tokens, pos, seqs, outputs) -> int:
        self.decoding.set()
        while not (self.aborted.is_set() or self.release.is_set()):
            time.sleep(0.001)
        return 2  # aborted, as llama_decode answers


@pytest.mark.parametrize("heeds_abort", [True, False])
def test_stop_aborts_a_running_decode_and_says_whether_the_thread_ended(heeds_abort):
    """Stopping aborts the decode under way, so the thread ends at once; if it does not end,
    stop says so (and the runtime then keeps the context rather than free it under a
    running decode)."""
    b = StuckBackend(heeds_abort=heeds_abort)
    core, _ = make_core("hearth", backend=b)
    core.submit(request(b, "chat", 50, 4)[0])
    engine = Engine(core)
    engine.start()
    assert b.decoding.wait(5)
    started = time.monotonic()
    assert engine.stop(timeout=0.5) is heeds_abort
    assert time.monotonic() - started < (0.5 if heeds_abort else 5)
    b.release.set()
    assert engine.stop(timeout=5)


def test_a_decode_that_will_not_stop_costs_its_worker_not_the_process():
    """A stuck decode once pinned its context (freeing it would crash the server); in a
    worker process it is killed at once, and an engine that stopped asks its worker to exit."""
    from types import SimpleNamespace

    from hearth.fleet import runtime
    from hearth.settings import Settings

    stops: list[float] = []
    rt = runtime.Runtime(Settings())
    rt.supervisor = SimpleNamespace(worker=SimpleNamespace(stop=lambda timeout: stops.append(
        timeout)), state="serving", starting=None)
    rt.engine = SimpleNamespace(stop=lambda timeout=10.0: False, error=None)
    assert rt.close()
    assert stops == [0.0]  # killed, not asked
    rt.supervisor.state = "serving"
    rt.engine = SimpleNamespace(stop=lambda timeout=10.0: True, error=None)
    rt.close()
    assert stops == [0.0, 10.0]


def test_models_the_engine_cannot_share_are_refused_by_name():
    from types import SimpleNamespace

    from hearth.runner.boot import unservable

    def model(**kind):
        return SimpleNamespace(**{"is_recurrent": False, "is_hybrid": False, **kind})

    assert unservable(model()) is None
    assert "a recurrent model" in unservable(model(is_recurrent=True))
    assert "a hybrid" in unservable(model(is_hybrid=True))


def test_admission_runs_when_something_changed_not_every_iteration():
    """60 requests wait while every slot streams: admission looks at them when something it
    depends on changes (here nothing does) or aging may have moved a class (every 0.25 s),
    not on each of the 100 iterations; the waiting requests are still admitted once slots
    free up."""
    core, b = make_core("hearth", n_parallel=4)
    for i in range(4):
        core.submit(request(b, "chat", 20, 400, seed=i)[0])
    run_until(core, lambda: len(core.running) == 4 and all(r.n_generated for r in core.running))
    waiting = [request(b, "background", 20, 2, seed=100 + i) for i in range(60)]
    for r, _ in waiting:
        core.submit(r)
    looked = 0
    may_admit = core.policy.may_admit

    def counting(*args, **kwargs):
        nonlocal looked
        looked += 1
        return may_admit(*args, **kwargs)

    core.policy.may_admit = counting
    start = b.now()
    for _ in range(100):
        core.step()
    checks = 1 + (b.now() - start) / 0.25  # the arrival, then the aging rechecks
    assert looked <= (checks + 1) * 60 < 100 * 60, (looked, checks)
    run_until(core, lambda: all(sink.done is not None for _, sink in waiting))
