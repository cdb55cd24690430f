"""Per-request timings aggregated per class and per user over a sliding window.

The engine records; the HTTP layer reads :meth:`Stats.snapshot`, which copies under the stats'
own lock and computes outside it.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass

import numpy as np

from ..policy.scheduler import CLASS_RANKS


@dataclass
class Finished:
    at: float
    cls: str
    user: str
    queue: float | None
    ttft: float | None
    e2e: float
    itl: list[float]
    prompt: int
    cached: int
    generated: int
    reason: str | None


def _pcts(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"p50": None, "p95": None}
    a = np.asarray(values) * 1000.0
    return {"p50": round(float(np.percentile(a, 50)), 2),
            "p95": round(float(np.percentile(a, 95)), 2)}


def _rate(tokens: list[tuple[float, int]], now: float, span: float = 10.0) -> float:
    """Generated tokens per second over the last ``span`` seconds."""
    edge = now - span
    return round(sum(k for t, k in tokens if t >= edge) / span, 2)


class Stats:
    def __init__(self, window_s: float = 300.0):
        self.window_s = window_s
        self.finished: deque[Finished] = deque()
        self.tokens: deque[tuple[float, int]] = deque()  # (time, generated tokens) per iteration
        self.completed = dict.fromkeys(CLASS_RANKS, 0)
        self.rejected = dict.fromkeys(CLASS_RANKS, 0)
        self.shed = dict.fromkeys(CLASS_RANKS, 0)  # refused: past the deadline (429)
        self.failed = dict.fromkeys(CLASS_RANKS, 0)
        self.preemptions = 0
        self.preempted = dict.fromkeys(CLASS_RANKS, 0)
        self.generated_total = 0
        self.prompt_total = 0
        self.iterations = 0
        self.aborted_iterations = 0
        self.forced_tokens = 0  # output written in tool calls without sampling (call_forcing)
        self.drafted_tokens = 0  # guessed by a draft model and checked (engine.drafts)
        self.accepted_drafts = 0  # of those, the ones the model's own samples agreed with
        self._lock = threading.Lock()  # the engine thread records, HTTP handlers read
        self.listeners: list = []  # called with each Finished record (e.g. Prometheus)

    def _trim(self, now: float) -> None:
        edge = now - self.window_s
        while self.finished and self.finished[0].at < edge:
            self.finished.popleft()
        while self.tokens and self.tokens[0][0] < edge:
            self.tokens.popleft()

    def record_finished(self, r, now: float) -> None:  # r: requests.Request
        with self._lock:
            self._record_finished(r, now)

    def _record_finished(self, r, now: float) -> None:
        def d(a, b):
            return None if a is None or b is None else b - a

        if r.finish_reason == "error":
            self.failed[r.cls] += 1
        else:
            self.completed[r.cls] += 1
        self.finished.append(Finished(
            at=now, cls=r.cls, user=r.user, queue=d(r.arrival, r.first_admitted_at),
            ttft=d(r.arrival, r.first_token_at), e2e=now - r.arrival, itl=list(r.itl),
            prompt=r.n_prompt, cached=r.cached_tokens, generated=r.n_generated,
            reason=r.finish_reason))
        self._trim(now)
        for listener in self.listeners:
            listener(self.finished[-1])

    def record_tokens(self, now: float, generated: int, prompt: int) -> None:
        with self._lock:
            self._record_tokens(now, generated, prompt)

    def _record_tokens(self, now: float, generated: int, prompt: int) -> None:
        self.generated_total += generated
        self.prompt_total += prompt
        if generated:
            self.tokens.append((now, generated))

    def record_preemption(self, cls: str) -> None:
        self.preemptions += 1
        self.preempted[cls] += 1

    def snapshot(self, now: float) -> dict:
        """The window's aggregates. Only the copy is made under the lock the engine thread
        records under; the percentiles are computed outside it, so a reader never stalls an
        iteration."""
        with self._lock:
            self._trim(now)
            finished = list(self.finished)
            tokens = list(self.tokens)
            counts = {"completed": dict(self.completed), "rejected": dict(self.rejected),
                      "shed": dict(self.shed),
                      "failed": dict(self.failed), "preempted": dict(self.preempted)}
            totals = {"generated_tokens_total": self.generated_total,
                      "prompt_tokens_total": self.prompt_total,
                      "preemptions": self.preemptions, "iterations": self.iterations,
                      "aborted_iterations": self.aborted_iterations,
                      "forced_tokens_total": self.forced_tokens,
                      "drafted_tokens_total": self.drafted_tokens,
                      "accepted_drafts_total": self.accepted_drafts}
        per_class: dict[str, dict] = {}
        for cls in CLASS_RANKS:
            rows = [f for f in finished if f.cls == cls]
            per_class[cls] = {
                **{name: counts[name][cls] for name in counts},
                "window_completed": len(rows),
                "queue_ms": _pcts([f.queue for f in rows if f.queue is not None]),
                "ttft_ms": _pcts([f.ttft for f in rows if f.ttft is not None]),
                "itl_ms": _pcts([g for f in rows for g in f.itl]),
                "e2e_ms": _pcts([f.e2e for f in rows]),
            }
        served: dict[str, float] = {}
        for f in finished:
            served[f.user] = served.get(f.user, 0.0) + (f.prompt - f.cached) + 2 * f.generated
        total = sum(served.values()) or 1.0
        return {
            "window_s": self.window_s,
            "classes": per_class,
            "users": {u: {"share": round(v / total, 4), "served_tokens": v}
                      for u, v in sorted(served.items())},
            "tokens_per_s": _rate(tokens, now),
            **totals,
        }
