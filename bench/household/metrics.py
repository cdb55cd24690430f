"""The numbers of a replay: percentiles, SLO attainment, service shares and Jain's index.

Everything here works on plain per-call records (dicts with the fields of
:class:`household.driver.CallResult`), so it is testable without a server.

Service is counted the way Hearth's fair scheduler counts it (virtual token counter): uncached
prompt tokens weigh 1 and output tokens 2 (the weights come from the workload definition).
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Iterable, Sequence
from itertools import pairwise
from typing import Any

import numpy as np

Record = dict[str, Any]


# -- basic statistics ----------------------------------------------------------------------------
def percentile(values: Iterable[float], q: float) -> float | None:
    """The q-th percentile (linear interpolation between closest ranks); None when empty."""
    a = np.asarray([v for v in values if v is not None], dtype=float)
    if a.size == 0:
        return None
    return float(np.percentile(a, q))


def jain(xs: Sequence[float]) -> float | None:
    """Jain's fairness index (sum x)^2 / (n * sum x^2): 1 when all equal, 1/n when one gets all.

    None for no values or when every value is zero (no service to share).
    """
    if not xs:
        return None
    if any(x < 0 for x in xs):
        raise ValueError("Jain's index needs non-negative values")
    sq = sum(x * x for x in xs)
    if sq == 0:
        return None
    return sum(xs) ** 2 / (len(xs) * sq)


def slo_attainment(ttfts: Iterable[float | None], threshold_s: float) -> float | None:
    """Share of requests whose TTFT met the threshold; a failed request (None) is a miss."""
    vals = list(ttfts)
    if not vals:
        return None
    return sum(1 for t in vals if t is not None and t <= threshold_s) / len(vals)


# -- per-record quantities -----------------------------------------------------------------------
def ok(r: Record) -> bool:
    return r["status"] == "ok"


def ttft(r: Record) -> float | None:
    if not ok(r) or r["first_s"] is None or r["sent_s"] is None:
        return None
    return r["first_s"] - r["sent_s"]


def e2e(r: Record) -> float | None:
    if not ok(r) or r["end_s"] is None or r["sent_s"] is None:
        return None
    return r["end_s"] - r["sent_s"]


def gaps(r: Record) -> list[float]:
    c = r["chunk_s"]
    return [b - a for a, b in pairwise(c)] if ok(r) else []


def is_embedding(r: Record) -> bool:
    return r["cls"] == "embedding"


def service(r: Record, w_prompt: float = 1.0, w_output: float = 2.0) -> float:
    """Service a finished call received: uncached prompt tokens and output tokens, weighted."""
    if not ok(r):
        return 0.0
    return (w_prompt * max(0, r["prompt_tokens"] - r["cached_tokens"])
            + w_output * r["completion_tokens"])


def service_in(r: Record, a: float, b: float, w_prompt: float = 1.0,
               w_output: float = 2.0) -> float:
    """Service a call received during [a, b).

    Its uncached prompt counts as received evenly between sending and the first content (the
    client cannot see prefill more finely); each output chunk counts when it arrived (an
    embedding's inputs count when its answer arrived).
    """
    if not ok(r) or r["first_s"] is None:
        return 0.0
    prompt = w_prompt * max(0, r["prompt_tokens"] - r["cached_tokens"])
    s0, s1 = r["sent_s"], r["first_s"]
    if s1 > s0:
        got = prompt * max(0.0, min(b, s1) - max(a, s0)) / (s1 - s0)
    else:
        got = prompt if a <= s1 < b else 0.0
    chunks = r["chunk_s"]
    if chunks and r["completion_tokens"]:
        per_chunk = w_output * r["completion_tokens"] / len(chunks)
        got += per_chunk * (bisect_left(chunks, b) - bisect_left(chunks, a))
    return got


# -- fairness ------------------------------------------------------------------------------------
def contended_fairness(records: Sequence[Record], window_s: float, horizon_s: float,
                       w_prompt: float = 1.0, w_output: float = 2.0) -> dict[str, Any]:
    """Fairness among household members who compete for the machine in the same class.

    The run is cut into windows of ``window_s``. In each window and class, the users that had a
    request of that class outstanding for the whole window are *backlogged*; where two or more
    are, Jain's index of the service each of them received in that window is taken. (Comparing
    within one class keeps deliberate class priority out of the fairness figure; requiring a
    user to be backlogged keeps a user who asked for little from counting as starved.) The
    reported index is the mean over those (window, class) pairs weighted by the service in them;
    ``share`` is each user's share of the service in them.
    """
    per_class: dict[str, dict[str, float]] = {}
    user_service: dict[str, float] = {}
    weighted = total = 0.0
    n_windows = 0
    done = [r for r in records if r["sent_s"] is not None and r["end_s"] is not None]
    n = max(0, math.floor(horizon_s / window_s))
    for k in range(n):
        a, b = k * window_s, (k + 1) * window_s
        by_class: dict[str, dict[str, float]] = {}
        for r in done:
            if r["sent_s"] <= a and r["end_s"] >= b:
                by_class.setdefault(r["cls"], {}).setdefault(r["user"], 0.0)
        for cls, users in by_class.items():
            if len(users) < 2:
                continue
            for r in done:
                if r["cls"] == cls and r["user"] in users:
                    users[r["user"]] += service_in(r, a, b, w_prompt, w_output)
            j = jain(list(users.values()))
            if j is None:
                continue
            s = sum(users.values())
            n_windows += 1
            weighted += j * s
            total += s
            c = per_class.setdefault(cls, {"weighted": 0.0, "service": 0.0, "windows": 0})
            c["weighted"] += j * s
            c["service"] += s
            c["windows"] += 1
            for u, v in users.items():
                user_service[u] = user_service.get(u, 0.0) + v
    return {
        "index": weighted / total if total else None,
        "windows": n_windows,
        "per_class": {c: {"index": v["weighted"] / v["service"] if v["service"] else None,
                          "windows": v["windows"]} for c, v in sorted(per_class.items())},
        "share": {u: v / total for u, v in sorted(user_service.items())} if total else {},
    }


# -- timelines -----------------------------------------------------------------------------------
def token_rate_series(records: Sequence[Record], horizon_s: float,
                      bin_s: float = 1.0) -> tuple[list[float], list[float]]:
    """Generated tokens/s seen by the client, per bin of ``bin_s`` (bin start times, rates)."""
    n = max(1, math.ceil(horizon_s / bin_s))
    counts = np.zeros(n)
    for r in records:
        if not ok(r) or not r["chunk_s"] or not r["completion_tokens"]:
            continue
        w = r["completion_tokens"] / len(r["chunk_s"])
        for t in r["chunk_s"]:
            i = int(t // bin_s)
            if 0 <= i < n:
                counts[i] += w
    return [i * bin_s for i in range(n)], list(counts / bin_s)


def in_flight_series(records: Sequence[Record], horizon_s: float,
                     step_s: float = 0.5) -> tuple[list[float], list[int]]:
    """Requests sent and not yet answered, sampled every ``step_s``."""
    n = max(1, math.ceil(horizon_s / step_s) + 1)
    ts = [i * step_s for i in range(n)]
    spans = [(r["sent_s"], r["end_s"]) for r in records
             if r["sent_s"] is not None and r["end_s"] is not None]
    return ts, [sum(1 for s, e in spans if s <= t < e) for t in ts]


def busy_time(records: Sequence[Record]) -> float:
    """Length of the union of the calls' [sent, end] intervals: time with work outstanding."""
    spans = sorted((r["sent_s"], r["end_s"]) for r in records
                   if r["sent_s"] is not None and r["end_s"] is not None)
    total, cur_s, cur_e = 0.0, None, None
    for s, e in spans:
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        total += cur_e - cur_s
    return total


# -- one mode's summary --------------------------------------------------------------------------
def _r(x: float | None, nd: int = 3) -> float | None:
    return None if x is None else round(x, nd)


def summarize(records: Sequence[Record], queue_samples: Sequence[dict[str, Any]],
              spec: dict[str, Any], makespan_s: float) -> dict[str, Any]:
    wp = spec.get("service_weights", {}).get("prompt", 1)
    wo = spec.get("service_weights", {}).get("output", 2)
    slo_s = spec["slo"]["voice_ttft_s"]
    classes: dict[str, Any] = {}
    for cls in ("voice", "chat", "agent", "background", "embedding"):
        rows = [r for r in records if r["cls"] == cls]
        if not rows:
            continue
        good = [r for r in rows if ok(r)]
        t = [ttft(r) for r in good]
        e = [e2e(r) for r in good]
        itl = [g for r in good for g in gaps(r)]
        out = sum(r["completion_tokens"] for r in good)
        prompt = sum(r["prompt_tokens"] for r in good)
        cached = sum(r["cached_tokens"] for r in good)
        classes[cls] = {
            "requests": len(rows), "ok": len(good),
            "failed": sum(1 for r in rows if r["status"] == "error"),
            "unfinished": sum(1 for r in rows if r["status"] == "unfinished"),
            "retries_429": sum(r["retries"] for r in rows),
            "ttft_p50_s": _r(percentile(t, 50)), "ttft_p95_s": _r(percentile(t, 95)),
            "ttft_p99_s": _r(percentile(t, 99)),
            "itl_p50_ms": _r(percentile([g * 1000 for g in itl], 50), 1),
            "itl_p95_ms": _r(percentile([g * 1000 for g in itl], 95), 1),
            "e2e_p50_s": _r(percentile(e, 50)), "e2e_p95_s": _r(percentile(e, 95)),
            "e2e_max_s": _r(max(e) if e else None),
            "output_tokens": out, "prompt_tokens": prompt, "cached_tokens": cached,
            "prompt_tokens_mean": _r(prompt / len(good), 1) if good else None,
            # Embeddings produce no output tokens: their throughput counts input tokens.
            "tokens_per_s": _r((prompt if cls == "embedding" else out) / makespan_s, 2)
            if makespan_s > 0 else None,
        }
    voice = [r for r in records if r["cls"] == "voice"]
    users: dict[str, Any] = {}
    total_service = sum(service(r, wp, wo) for r in records) or 1.0
    for u in sorted({r["user"] for r in records}):
        rows = [r for r in records if r["user"] == u]
        s = sum(service(r, wp, wo) for r in rows)
        users[u] = {"requests": len(rows), "service": s, "share": _r(s / total_service, 4)}
    fair = contended_fairness(records, spec.get("fairness_window_s", 2.0), makespan_s, wp, wo)
    for u, share in fair["share"].items():
        users.setdefault(u, {})["contended_share"] = _r(share, 4)
    good = [r for r in records if ok(r)]
    generated = sum(r["completion_tokens"] for r in good)
    work = sum(service(r, 1, 1) for r in good)
    busy = busy_time(records)
    bg = [e2e(r) for r in records if r["cls"] == "background" and ok(r)]
    last = queue_samples[-1] if queue_samples else {}
    busy_tps = [q["tokens_per_s"] for q in queue_samples
                if q.get("tokens_per_s") and sum((q.get("running") or {}).values())]
    return {
        "classes": classes,
        "voice_slo": {"threshold_s": slo_s, "requests": len(voice),
                      "attained": _r(slo_attainment([ttft(r) for r in voice], slo_s), 4)},
        "users": users,
        "fairness": {"jain_contended": _r(fair["index"], 4), "windows": fair["windows"],
                     "per_class": fair["per_class"]},
        "background_completion_s": {"p50": _r(percentile(bg, 50)), "mean": _r(
            sum(bg) / len(bg) if bg else None), "max": _r(max(bg) if bg else None)},
        "totals": {
            "calls": len(records), "ok": len(good),
            "failed": sum(1 for r in records if r["status"] == "error"),
            "unfinished": sum(1 for r in records if r["status"] == "unfinished"),
            "retries_429": sum(r["retries"] for r in records),
            "makespan_s": _r(makespan_s, 2), "busy_s": _r(busy, 2),
            "generated_tokens": generated,
            "generated_tokens_per_busy_s": _r(generated / busy, 2) if busy else None,
            "processed_tokens_per_busy_s": _r(work / busy, 2) if busy else None,
        },
        "server": {
            "preemptions": last.get("preemptions"),
            "prefix_hit_rate": last.get("prefix_hit_rate"),
            "max_waiting": max((sum((q.get("waiting") or {}).values()) for q in queue_samples),
                               default=None),
            "tokens_per_s_while_running_mean": _r(sum(busy_tps) / len(busy_tps), 2)
            if busy_tps else None,
        },
    }
