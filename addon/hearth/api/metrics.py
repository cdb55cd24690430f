"""Prometheus exposition with prometheus-client: latency histograms per class, observed as
requests finish, and gauges/counters read from the engine at scrape time."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from ..engine.stats import Finished

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.2, 0.35, 0.5, 0.75, 1, 1.5, 2.5, 5, 10, 20, 40,
                    80, 160)
_ITL_BUCKETS = (0.002, 0.005, 0.01, 0.02, 0.035, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1, 2.5)


class Metrics:
    """Latencies of every model's requests; the engine gauges of the voice model (the
    household's headline), and each model's residency."""

    def __init__(self, fleet: Any):
        self.fleet = fleet
        self.job_counts: dict[str, int] | None = None  # refreshed by the /metrics route
        self.registry = CollectorRegistry()
        labels = ["class"]
        self.ttft = Histogram("hearth_time_to_first_token_seconds",
                              "Arrival to first token, queue included", labels,
                              buckets=_LATENCY_BUCKETS, registry=self.registry)
        self.itl = Histogram("hearth_inter_token_latency_seconds", "Gap between streamed tokens",
                             labels, buckets=_ITL_BUCKETS, registry=self.registry)
        self.queue = Histogram("hearth_queue_time_seconds", "Arrival to first admission",
                               labels, buckets=_LATENCY_BUCKETS, registry=self.registry)
        self.e2e = Histogram("hearth_e2e_request_latency_seconds", "Arrival to last token",
                             labels, buckets=_LATENCY_BUCKETS, registry=self.registry)
        self.registry.register(_EngineCollector(self))
        for w in fleet.workers.values():
            w.rt.stats.listeners.append(self.observe)

    def observe(self, f: Finished) -> None:
        if f.ttft is not None:
            self.ttft.labels(f.cls).observe(f.ttft)
        if f.queue is not None:
            self.queue.labels(f.cls).observe(f.queue)
        self.e2e.labels(f.cls).observe(f.e2e)
        h = self.itl.labels(f.cls)
        for gap in f.itl:
            h.observe(gap)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _EngineCollector:
    def __init__(self, metrics: Metrics):
        self.metrics = metrics

    def collect(self):
        fleet = self.metrics.fleet
        rt = fleet.primary.rt
        up = GaugeMetricFamily("hearth_up", "1 when the models loaded at start are serving")
        up.add_metric([], 1.0 if fleet.state == "ready" else 0.0)
        yield up
        yield from _models(fleet)
        jobs = self.metrics.job_counts
        if jobs:
            g = GaugeMetricFamily("hearth_jobs", "Durable jobs by status", labels=["status"])
            for status, n in jobs.items():
                g.add_metric([status], n)
            yield g
        core = rt.core
        if core is None or rt.state != "ready":
            return
        with core.lock:
            q = core.queue_state()
        snap = core.stats.snapshot(core.b.now())  # percentiles outside the engine's lock
        waiting = GaugeMetricFamily("hearth_requests_waiting", "Requests waiting", labels=["class"])
        running = GaugeMetricFamily("hearth_requests_running", "Sequences running",
                                    labels=["class"])
        done = CounterMetricFamily("hearth_requests_completed", "Requests completed",
                                   labels=["class"])
        rejected = CounterMetricFamily("hearth_requests_rejected", "Requests refused (429)",
                                       labels=["class"])
        preempted = CounterMetricFamily("hearth_preemptions", "Sequences preempted",
                                        labels=["class"])
        shed = CounterMetricFamily("hearth_requests_shed", "Requests refused because their "
                                   "expected wait passed the class's deadline (429)",
                                   labels=["class"])
        for cls, n in q["waiting"].items():
            waiting.add_metric([cls], n)
            running.add_metric([cls], q["running"][cls])
            c = snap["classes"][cls]
            done.add_metric([cls], c["completed"])
            rejected.add_metric([cls], c["rejected"])
            preempted.add_metric([cls], c["preempted"])
            shed.add_metric([cls], c["shed"])
        yield from (waiting, running, done, rejected, preempted, shed)
        kv = GaugeMetricFamily("hearth_kv_cache_usage_ratio", "Share of KV cells in use")
        kv.add_metric([], q["kv"]["use"])
        hit = GaugeMetricFamily("hearth_prefix_cache_hit_rate", "Prompt tokens served from the "
                                "prefix cache / prompt tokens looked up")
        hit.add_metric([], q["prefix_cache"]["token_hit_rate"])
        yield from _prefix_by_class(q["prefix_cache"]["by_class"])
        tps = GaugeMetricFamily("hearth_generation_tokens_per_second", "Generated tokens/s "
                                "over the last 10 s")
        tps.add_metric([], snap["tokens_per_s"])
        gen = CounterMetricFamily("hearth_generation_tokens", "Tokens generated")
        gen.add_metric([], snap["generated_tokens_total"])
        prompt = CounterMetricFamily("hearth_prompt_tokens", "Prompt tokens computed")
        prompt.add_metric([], snap["prompt_tokens_total"])
        forced = CounterMetricFamily("hearth_forced_tokens", "Tokens of tool calls written "
                                     "without sampling (their schemas left no choice)")
        forced.add_metric([], snap["forced_tokens_total"])
        drafted = CounterMetricFamily("hearth_drafted_tokens", "Tokens a draft model guessed "
                                      "for voice streams (speculative decoding)")
        drafted.add_metric([], snap["drafted_tokens_total"])
        accepted = CounterMetricFamily("hearth_accepted_drafts", "Drafted tokens the model's "
                                       "own samples agreed with")
        accepted.add_metric([], snap["accepted_drafts_total"])
        yield from (kv, hit, tps, gen, prompt, forced, drafted, accepted)


def _prefix_by_class(by_class: dict[str, dict[str, Any]]):
    """The prefix cache by the best class that used each entry, and each class's hit rate."""
    cells = GaugeMetricFamily("hearth_prefix_cache_cells", "KV cells held by cached prefixes",
                              labels=["class"])
    entries = GaugeMetricFamily("hearth_prefix_cache_entries", "Cached prefixes",
                                labels=["class"])
    rate = GaugeMetricFamily("hearth_prefix_cache_class_hit_rate", "Share of a class's "
                             "requests that found a cached prefix", labels=["class"])
    oldest = GaugeMetricFamily("hearth_prefix_cache_oldest_seconds", "Age of a class's oldest "
                               "cached prefix", labels=["class"])
    for cls, c in by_class.items():
        cells.add_metric([cls], c["cells"])
        entries.add_metric([cls], c["entries"])
        rate.add_metric([cls], c["hit_rate"])
        if c["oldest_s"] is not None:
            oldest.add_metric([cls], c["oldest_s"])
    yield from (cells, entries, rate, oldest)


def _models(fleet: Any):
    loaded = GaugeMetricFamily("hearth_model_loaded", "1 while a model is loaded",
                               labels=["model"])
    memory = GaugeMetricFamily("hearth_model_memory_bytes", "A model's estimated memory "
                               "(weights + KV + compute, from its GGUF header)", labels=["model"])
    loads = CounterMetricFamily("hearth_model_loads", "Times a model was loaded",
                                labels=["model"])
    # The per-class gauges are the voice model's; these show where each model's work stands.
    waiting = GaugeMetricFamily("hearth_model_requests_waiting", "Requests waiting on a model "
                                "(on a remote: in its own queue, where it tells)",
                                labels=["model"])
    running = GaugeMetricFamily("hearth_model_requests_running", "Sequences running on a "
                                "model (on a remote: requests in flight)", labels=["model"])
    serving = GaugeMetricFamily("hearth_worker_serving", "1 while a model's worker process "
                                "serves (0 while it restarts after a crash)", labels=["model"])
    restarts = CounterMetricFamily("hearth_worker_restarts", "Times a model's worker process "
                                   "was restarted after it died", labels=["model"])
    for w in fleet.workers.values():
        if (sup := getattr(w.rt, "supervisor", None)) is not None:
            serving.add_metric([w.name], 1.0 if sup.state == "serving" else 0.0)
            restarts.add_metric([w.name], sup.restarts)
        loaded.add_metric([w.name], 1.0 if w.rt.state == "ready" else 0.0)
        memory.add_metric([w.name], w.bytes)
        loads.add_metric([w.name], w.loads)
        depth = fleet.queue_depth(w)
        if depth["waiting"] is not None:
            waiting.add_metric([w.name], depth["waiting"])
        running.add_metric([w.name], depth["running"])
    yield from (loaded, memory, loads, waiting, running, serving, restarts)
