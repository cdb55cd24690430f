"""What the engine and the supervisor do when a model's worker process dies, on the simulated
backend: who is answered, who is suspected, who waits, and the quarantine of a request that was
suspected twice (the real processes: tests/server/test_worker_crashes.py)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sim_backend import make_core, request, run_until

from hearth.engine.base import RequestError, WorkerLost
from hearth.fleet.supervisor import CRASHED_TWICE, Quarantine, Supervisor, fingerprint


def busy_core():
    """Two requests decoding, one not admitted yet (a slot short), one finished earlier."""
    core, b = make_core(n_parallel=2)
    done, _ = request(b, "chat", 40, 4, seed=9)
    core.submit(done)
    run_until(core, lambda: done.finished)
    running = [request(b, "chat", 30, 50, seed=i)[0] for i in range(2)]
    waiting, _ = request(b, "background", 30, 50, seed=5)
    for r in [*running, waiting]:
        core.submit(r)
    run_until(core, lambda: all(r.n_generated >= 2 for r in running))
    return core, b, running, waiting


def test_a_death_while_sampling_suspects_only_the_request_being_sampled():
    core, _, running, waiting = busy_core()
    hits = core.pool.hits
    lost, suspects = core.worker_lost(WorkerLost("SIGSEGV", signal=11, during="decode_sample",
                                                 blame=running[1].sampler))
    assert {id(r) for r in lost} == {id(r) for r in running}
    assert suspects == [running[1]]
    assert all(r.finished and r.finish_reason == "error" for r in lost)
    # The waiting request keeps its place and gets a new sampler in the next worker.
    assert core.waiting == [waiting] and waiting.sampler is None and not waiting.finished
    assert core.running == [] and core.pool.used_cells == 0 and not core.pool.entries
    assert core.pool.hits == hits  # the cache's history outlives its cells
    run_until(core, lambda: waiting.finished)  # the engine serves on with a fresh pool
    assert waiting.finish_reason == "length"


def test_a_death_in_the_draft_model_suspects_only_the_stream_drafted_for():
    core, _, running, _ = busy_core()
    _, suspects = core.worker_lost(WorkerLost("SIGSEGV", signal=11, during="draft",
                                              blame=running[0].sampler))
    assert suspects == [running[0]]


def test_a_death_inside_the_decode_suspects_the_batch_and_a_kill_from_outside_no_one():
    core, _, running, _ = busy_core()
    _, suspects = core.worker_lost(WorkerLost("SIGABRT", signal=6, during="decode_sample"))
    assert {id(r) for r in suspects} == {id(r) for r in running}
    core, _, running, _ = busy_core()
    lost, suspects = core.worker_lost(WorkerLost("SIGKILL", signal=9, during="decode_sample",
                                                 suspect=False))
    assert suspects == [] and len(lost) == 2


def test_a_death_while_building_a_grammar_suspects_the_request_being_admitted():
    core, b = make_core()
    r, _ = request(b, "chat", 20, 5)
    core.submit(r)
    core._drain_inbox(b.now())
    core.admitter.admitting = r  # as when new_sampler's call to the worker never came back
    lost, suspects = core.worker_lost(WorkerLost("SIGSEGV", signal=11, during="new_sampler"))
    assert suspects == [r] and lost == [r] and core.waiting == []


def test_the_quarantine_refuses_a_request_suspected_twice_and_remembers_it(tmp_path):
    _, b = make_core()
    bad, _ = request(b, "chat", 20, 5, seed=1)
    twin, _ = request(b, "voice", 20, 5, seed=1)  # the same prompt and grammar
    other, _ = request(b, "chat", 20, 5, seed=2)
    q = Quarantine(tmp_path / "q.json")
    assert q.strike(bad) == 1
    q.check(twin)  # once is bad luck
    assert q.strike(bad) == 2
    with pytest.raises(RequestError) as e:
        q.check(twin)
    assert e.value.status == 422 and e.value.code == "worker_crashed_twice"
    assert str(e.value) == CRASHED_TWICE
    q.check(other)
    again = Quarantine(tmp_path / "q.json")  # a restarted server
    with pytest.raises(RequestError):
        again.check(bad)
    assert len(again) == 1


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(0, 30), min_size=1, max_size=60))
def test_the_quarantine_keeps_at_most_its_limit_newest_first(keys):
    _, b = make_core()
    q = Quarantine(None, limit=8)
    for k in keys:
        q.strike(request(b, "chat", 5, 1, seed=k)[0])
    newest = list(dict.fromkeys(reversed(keys)))[:8]  # the 8 keys struck most recently
    assert set(q._strikes) == {fingerprint(request(b, "chat", 5, 1, seed=k)[0]) for k in newest}
    assert sum(q._strikes.values()) <= len(keys)


def test_the_ladder_skips_a_rung_after_a_crash_at_start_or_an_illegal_instruction(tmp_path):
    sup = Supervisor({}, tmp_path, watchdog_s=5)
    sup.crashed(WorkerLost("SIGSEGV", signal=11, rung="haswell"))  # serving: not the CPU's
    assert sup.skip == []
    sup.crashed(WorkerLost("SIGILL", signal=4, rung="haswell"))
    sup.crashed(WorkerLost("SIGSEGV", signal=11, rung="haswell+no-repack"), at_start=True)
    assert sup.skip == ["haswell", "haswell+no-repack"]
    again = Supervisor({}, tmp_path, watchdog_s=5)  # kept for this CPU, with each crash's cause
    assert again.skip == sup.skip
    assert again.skip_why == {"haswell": "SIGILL", "haswell+no-repack": "SIGSEGV"}
    assert sup.backoff() == 4.0  # three deaths in a row
    assert "SIGSEGV" in sup.report()["last_crash"]["cause"]


RUNGS = ["sapphirerapids", "zen4", "sapphirerapids+no-repack", "zen4+no-repack"]


def serving(sup: Supervisor, rung: str) -> Supervisor:
    """As if a worker had passed its canary on ``rung``."""
    sup.worker = SimpleNamespace(pid=7, lost=None, info={  # type: ignore[assignment]
        "rung": rung, "rungs": RUNGS, "cpu_variant": rung.split("+")[0]})
    sup.state = "serving"
    return sup


def test_a_step_down_at_start_is_ready_on_the_lower_rung_with_why_and_its_cost(tmp_path):
    sup = Supervisor({}, tmp_path, watchdog_s=5)
    sup.crashed(WorkerLost("SIGSEGV: a segmentation fault", signal=11, rung="sapphirerapids"),
                at_start=True)
    serving(sup, "zen4")
    assert sup.problem() is None  # nothing is degraded: it serves, one variant down
    step = sup.report()["step_down"]
    assert step["from"] == "sapphirerapids" and step["to"] == "zen4"
    assert step["why"].startswith("SIGSEGV") and step["skipped"] == ["sapphirerapids"]
    assert "repacked weights are kept" in step["cost"]
    # After a server restart the step-down is still said, with the crash that caused it.
    again = serving(Supervisor({}, tmp_path, watchdog_s=5), "zen4")
    assert again.report()["step_down"] == step and again.problem() is None


def test_a_crash_while_serving_still_degrades_after_a_step_down(tmp_path):
    sup = serving(Supervisor({}, tmp_path, watchdog_s=5), "zen4")
    sup.crashed(WorkerLost("SIGILL", signal=4, rung="sapphirerapids"), at_start=True)
    sup.crashed(WorkerLost("SIGKILL", signal=9, rung="zen4"), requests=2)
    assert sup.problem() is not None and "SIGKILL" in sup.problem()
    assert sup.skip == ["sapphirerapids"]


def test_the_top_rung_reports_no_step_down_and_an_old_rungs_file_still_reads(tmp_path):
    assert serving(Supervisor({}, tmp_path, watchdog_s=5), "sapphirerapids"
                   ).report()["step_down"] is None
    sup = Supervisor({}, tmp_path, watchdog_s=5)
    (tmp_path / "cpu-rungs.json").write_text(json.dumps({sup._key(): ["sapphirerapids"]}))
    old = serving(Supervisor({}, tmp_path, watchdog_s=5), "zen4")
    assert old.skip == ["sapphirerapids"]
    assert old.report()["step_down"]["why"] == "a crash at start"


def test_a_worker_that_died_at_start_keeps_its_whole_output_in_a_file(tmp_path):
    from hearth.fleet.supervisor import CRASH_LOGS

    sup = Supervisor({}, tmp_path, watchdog_s=5)
    output = "\n".join(f"line {i}" for i in range(5000))  # far more than the log's tail
    for i in range(CRASH_LOGS + 2):
        sup.crashed(WorkerLost(f"SIGSEGV {i}", signal=11, rung="zen4", during="starting",
                               output=output), at_start=True)
    kept = sup.report()["last_crash"]["output_log"]
    text = Path(kept).read_text()
    assert text.startswith(f"SIGSEGV {CRASH_LOGS + 1}\n") and text.rstrip().endswith(output)
    assert len(list((tmp_path / "worker-crashes").glob("*.log"))) == CRASH_LOGS
    sup.crashed(WorkerLost("SIGKILL", signal=9, rung="zen4"))  # while serving: no output
    assert sup.report()["last_crash"]["output_log"] is None
