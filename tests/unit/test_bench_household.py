"""The household benchmark without a server: the workload generator and the metrics maths."""

from __future__ import annotations

import sys
from itertools import pairwise
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from household import metrics, report
from household.workload import (
    approx_tokens,
    describe,
    generate,
    load_spec,
    to_json,
)


@pytest.fixture(scope="module")
def spec():
    return load_spec()


@pytest.fixture(scope="module")
def trace(spec):
    return generate(spec, 240)


# -- workload ------------------------------------------------------------------------------------
def test_trace_is_deterministic_and_seeded(spec, trace):
    assert to_json(generate(spec, 240)) == to_json(trace)
    assert to_json(generate(spec, 240, seed=spec["seed"] + 1)) != to_json(trace)


def test_shorter_run_is_a_prefix_of_a_longer_one(spec, trace):
    quick = generate(spec, 60)
    assert quick and all(s.start_s < 60 for s in quick)
    assert to_json(quick) == to_json([s for s in trace if s.start_s < 60])


def test_every_class_and_at_least_two_users(trace):
    assert set(describe(trace)) == {"voice", "chat", "agent", "background", "embedding"}
    assert len({s.user for s in trace}) >= 2
    assert [s.start_s for s in trace] == sorted(s.start_s for s in trace)


@pytest.mark.parametrize("kind", ["quick", "full"])
def test_the_seed_gives_representative_counts(spec, kind):
    duration = spec["duration_s"][kind]
    got = describe(generate(spec, duration))
    for cls, c in spec["classes"].items():
        expected = c["rate_per_min"] * duration / 60
        assert got[cls]["sessions"] >= 1
        assert abs(got[cls]["sessions"] - expected) <= max(1, 0.25 * expected), cls


def test_voice_uses_one_long_prompt_per_satellite_and_short_answers(spec, trace):
    voice = [s for s in trace if s.cls == "voice"]
    systems = {s.calls[0].messages[0]["content"] for s in voice}
    assert len(systems) == len(spec["classes"]["voice"]["satellites"]) == 2
    cpt = spec["chars_per_token"]["entities"]
    for system in systems:
        assert 1000 <= approx_tokens(system, cpt) <= 1400
        assert "Exposed entities:" in system
    for s in voice:
        assert len(s.calls) == 1 and 1 <= s.calls[0].max_tokens <= 32
        assert s.meta["satellite"] in {x["id"] for x in spec["classes"]["voice"]["satellites"]}


def test_chat_turns_carry_the_history(trace):
    chats = [s for s in trace if s.cls == "chat"]
    assert chats
    for s in chats:
        assert 2 <= len(s.calls) <= 4
        for a, b in zip(s.calls, s.calls[1:], strict=False):
            assert b.messages[: len(a.messages)] == a.messages  # same prefix: cacheable
            assert b.messages[len(a.messages)]["role"] == "assistant"
            assert 3 <= b.delay_s <= 8
        assert all(100 <= c.max_tokens <= 200 for c in s.calls)


def test_agent_makes_several_short_calls(trace):
    agents = [s for s in trace if s.cls == "agent"]
    assert agents
    for s in agents:
        assert 3 <= len(s.calls) <= 6
        assert all(c.max_tokens <= 48 for c in s.calls)
        assert all(0.2 <= c.delay_s <= 0.6 for c in s.calls[1:])


def test_background_documents_and_embedding_batches(spec, trace):
    cpt = spec["chars_per_token"]["prose"]
    docs = [s for s in trace if s.cls == "background"]
    assert docs
    for s in docs:
        text = s.calls[0].messages[-1]["content"]
        assert 1900 <= approx_tokens(text, cpt) <= 3200
        assert 140 <= s.calls[0].max_tokens <= 160
    for s in (s for s in trace if s.cls == "embedding"):
        assert len(s.calls[0].inputs) == 32
        assert all(s.calls[0].inputs)


def test_arrivals_are_poisson_at_the_configured_rates(spec):
    long = generate(spec, 3600)
    for cls, c in spec["classes"].items():
        starts = [s.start_s for s in long if s.cls == cls]
        expected = c["rate_per_min"] * 60
        assert abs(len(starts) - expected) < 4 * expected**0.5, cls
        gaps = [b - a for a, b in pairwise(starts)]
        # exponential inter-arrival times: standard deviation close to the mean
        mean = sum(gaps) / len(gaps)
        sd = (sum((g - mean) ** 2 for g in gaps) / len(gaps)) ** 0.5
        assert 0.7 < sd / mean < 1.3, cls


def test_load_scales_the_rates(spec):
    base = len(generate(spec, 1800))
    double = len(generate(spec, 1800, load=2.0))
    assert 1.7 < double / base < 2.3


# -- metrics -------------------------------------------------------------------------------------
def test_percentiles():
    values = list(range(1, 101))
    assert metrics.percentile(values, 50) == pytest.approx(50.5)
    assert metrics.percentile(values, 95) == pytest.approx(95.05)
    assert metrics.percentile(values, 99) == pytest.approx(99.01)
    assert metrics.percentile([3.0], 99) == 3.0
    assert metrics.percentile([], 50) is None
    assert metrics.percentile([None, 2.0, 4.0], 50) == 3.0


def test_jain_index():
    assert metrics.jain([5, 5, 5, 5]) == pytest.approx(1.0)
    assert metrics.jain([10, 0, 0, 0]) == pytest.approx(0.25)
    assert metrics.jain([1, 2, 3]) == pytest.approx(36 / 42)
    assert metrics.jain([0, 0]) is None
    assert metrics.jain([]) is None
    with pytest.raises(ValueError):
        metrics.jain([1, -1])


def test_slo_attainment_counts_failures_as_misses():
    assert metrics.slo_attainment([0.5, 1.4, 1.6, None], 1.5) == 0.5
    assert metrics.slo_attainment([1.5], 1.5) == 1.0
    assert metrics.slo_attainment([], 1.5) is None


def rec(cls="chat", user="alice", sent=0.0, first=1.0, end=2.0, prompt=100, cached=0,
        out=10, chunks=None, status="ok", **kw):
    if chunks is None:
        chunks = [first + i * (end - first) / max(1, out - 1) for i in range(out)]
    return {"session": kw.get("session", f"{cls}-{user}-{sent}"), "call": 0, "cls": cls,
            "user": user, "max_tokens": out, "due_s": sent, "sent_s": sent, "first_s": first,
            "end_s": end, "status": status, "error": None, "retries": kw.get("retries", 0),
            "retry_wait_s": 0.0, "prompt_tokens": prompt, "cached_tokens": cached,
            "completion_tokens": out, "chunk_s": chunks}


def test_per_record_times_and_service():
    r = rec(sent=1.0, first=1.5, end=3.0, prompt=300, cached=200, out=4,
            chunks=[1.5, 2.0, 2.5, 3.0])
    assert metrics.ttft(r) == pytest.approx(0.5)
    assert metrics.e2e(r) == pytest.approx(2.0)
    assert metrics.gaps(r) == pytest.approx([0.5, 0.5, 0.5])
    assert metrics.service(r) == 100 + 2 * 4  # cached prompt tokens are not service
    # prompt spread over [sent, first]; chunks where they landed
    assert metrics.service_in(r, 1.0, 1.25) == pytest.approx(50)
    assert metrics.service_in(r, 1.25, 2.25) == pytest.approx(50 + 2 * 2)
    assert metrics.service_in(r, 0.0, 10.0) == pytest.approx(metrics.service(r))
    bad = rec(status="error")
    assert metrics.ttft(bad) is None and metrics.service(bad) == 0


def test_contended_fairness_compares_backlogged_users_within_a_class():
    # alice and bob both wait in 'agent' for the whole of [0, 4): equal service -> 1.0
    even = [rec("agent", "alice", 0, 0.5, 4.0, prompt=0, out=8, chunks=[0.5 * i for i in range(8)]),
            rec("agent", "bob", 0, 0.5, 4.0, prompt=0, out=8, chunks=[0.5 * i for i in range(8)])]
    f = metrics.contended_fairness(even, 2.0, 4.0)
    assert f["windows"] == 2 and f["index"] == pytest.approx(1.0)
    assert f["share"] == pytest.approx({"alice": 0.5, "bob": 0.5})
    # bob waits the whole time but gets nothing until the end -> index 1/2
    skew = [rec("agent", "alice", 0, 0.1, 4.0, prompt=0, out=8, chunks=[0.5 * i for i in range(8)]),
            rec("agent", "bob", 0, 3.9, 4.0, prompt=0, out=1, chunks=[4.0])]
    f = metrics.contended_fairness(skew, 2.0, 4.0)
    assert f["index"] == pytest.approx(0.5)
    assert f["share"]["bob"] == 0
    # different classes never compete for fairness (class priority is deliberate)
    apart = [rec("voice", "alice", 0, 0.5, 4.0, prompt=0, out=8),
             rec("background", "bob", 0, 0.5, 4.0, prompt=0, out=8)]
    f = metrics.contended_fairness(apart, 2.0, 4.0)
    assert f["windows"] == 0 and f["index"] is None


def test_busy_time_and_series():
    rs = [rec(sent=0, first=1, end=2), rec(sent=1.5, first=2, end=3), rec(sent=5, first=5.5, end=6)]
    assert metrics.busy_time(rs) == pytest.approx(4.0)
    _, n = metrics.in_flight_series(rs, 6.0, 1.0)
    assert n[:7] == [1, 1, 1, 0, 0, 1, 0]
    _, rate = metrics.token_rate_series([rec(out=4, chunks=[0.1, 0.2, 1.1, 1.2])], 2.0, 1.0)
    assert rate == [2.0, 2.0]


def synthetic_run(spec):
    recs = [
        rec("voice", "alice", 0, 0.4, 0.8, prompt=1200, cached=1190, out=10),
        rec("voice", "bob", 5, 7.0, 7.5, prompt=1200, cached=1190, out=10),
        rec("chat", "bob", 1, 1.5, 5, out=150),
        rec("background", "alice", 0, 8, 12, prompt=2500, out=150),
        rec("background", "bob", 0, 9, 14, prompt=2500, out=150),
        rec("embedding", "alice", 2, 3, 3, prompt=640, out=0, chunks=[]),
        rec("agent", "alice", 3, 3.5, 4, out=30, status="unfinished"),
    ]
    summary = metrics.summarize(recs, [{"t": 1.0, "waiting": {"voice": 1}, "running": {"chat": 1},
                                        "tokens_per_s": 50.0, "preemptions": 2,
                                        "prefix_hit_rate": 0.5}], spec, 14.0)
    return recs, summary


def test_summary_of_a_mode(spec):
    _, s = synthetic_run(spec)
    assert s["voice_slo"] == {"threshold_s": spec["slo"]["voice_ttft_s"], "requests": 2,
                              "attained": 0.5}
    assert s["classes"]["voice"]["ttft_p50_s"] == pytest.approx(1.2)
    assert s["classes"]["embedding"]["tokens_per_s"] == pytest.approx(640 / 14, abs=0.01)
    assert s["classes"]["agent"]["unfinished"] == 1
    assert s["background_completion_s"]["max"] == pytest.approx(14.0)
    assert s["totals"]["busy_s"] == pytest.approx(14.0)
    assert sum(u["share"] for u in s["users"].values()) == pytest.approx(1.0, abs=1e-3)
    assert s["fairness"]["windows"] >= 1  # both summaries wait together in 'background'
    assert s["server"]["preemptions"] == 2 and s["server"]["max_waiting"] == 1


def test_markdown_table(spec):
    _, s = synthetic_run(spec)
    run = {"started": "2026-01-01 00:00:00", "command": "python bench/run_household.py --quick",
           "quick": True, "machine": {"cpus": 2, "platform": "test"}, "model": "m",
           "workload": {"file": "bench/workloads/household.json", "seed": 1, "duration_s": 60,
                        "load": 1.0, "trace": {"voice": {"sessions": 2, "calls": 2}},
                        "slo": spec["slo"], "fairness_window_s": 2.0},
           "modes": [{"name": "hearth", "description": "d", "other_cpu_share": 0.25,
                      "summary": s},
                     {"name": "fifo", "description": "d", "loadavg_before": 0.2, "summary": s}],
           "notes": ["a note"]}
    md = report.markdown(run, image_prefix="20260101-000000/")
    assert "| voice | hearth | 2 |" in md and "| voice | fifo | 2 |" in md
    assert "TTFT ≤ 1.5 s" in md
    assert "(20260101-000000/ttft_cdf.png)" in md
    assert "- a note" in md
    assert "other processes 25 % of the CPU" in md and "load average before 0.20" in md
    assert "**hearth against fifo:** voice p95 TTFT" in md and "within the 10 %" in md
