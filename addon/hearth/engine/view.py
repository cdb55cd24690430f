"""What other threads may read of the engine: the queue counts, and the view of the KV pool, the
prefix cache and the cost model that the engine thread publishes after each iteration, for
/v1/queue and /metrics.

A part that owns only the published snapshot (:attr:`View.snapshot`). It is given the whole
engine, read-only: a snapshot is by nature a reading of every part (queue, inbox, running list,
KV pool, store, cost model, latency target, policy's counters); it changes none. What it reads
is written down as :class:`Engine`, so this module does not import the core (which imports it)."""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Any, Protocol

from ..policy.scheduler import CLASS_RANKS
from ..shared.requests import Request

if TYPE_CHECKING:
    from ..policy.scheduler import Policy
    from .base import Backend
    from .batching import BatchComposer
    from .cost import CostModel
    from .kvcache import KVPool
    from .prefix_store import PrefixStore


class Engine(Protocol):
    """The parts of :class:`~.core.EngineCore` a view reads (read-only)."""

    @property
    def waiting(self) -> list[Request]: ...
    @property
    def embed_waiting(self) -> list[Request]: ...
    @property
    def running(self) -> list[Request]: ...
    @property
    def _inbox(self) -> deque[tuple[str, Any]]: ...
    @property
    def b(self) -> Backend: ...
    @property
    def policy(self) -> Policy: ...
    @property
    def batcher(self) -> BatchComposer: ...
    @property
    def pool(self) -> KVPool: ...
    @property
    def cost(self) -> CostModel: ...
    @property
    def store(self) -> PrefixStore | None: ...


class View:
    def __init__(self, core: Engine):
        self._core = core
        self.snapshot: dict[str, Any] = {}  # replaced whole by publish: readers never see it change

    def queue_state(self) -> dict[str, Any]:
        """Counts for /v1/queue and /metrics, from any thread (take the engine's ``lock`` for
        a view consistent with the inbox)."""
        core = self._core
        waiting = dict.fromkeys(CLASS_RANKS, 0)
        running = dict.fromkeys(CLASS_RANKS, 0)
        # Copies: the engine thread mutates these lists without the lock.
        for r in list(core.waiting) + list(core.embed_waiting):
            waiting[r.cls] += 1
        for _, x in list(core._inbox):
            if isinstance(x, Request):
                waiting[x.cls] += 1
        for r in list(core.running):
            running[r.cls] += 1
        view = self.snapshot
        store = core.store
        if store is not None:  # live: the writer thread saves after the view was made
            view = {**view, "prefix_cache": {**view["prefix_cache"], "store": store.stats()}}
        return {"waiting": waiting, "running": running, **view}

    def publish(self) -> None:
        """What other threads may read of the KV pool, the cost model and the counters: made
        by the engine thread after each iteration and swapped in whole, so readers never
        iterate structures the engine is changing."""
        core = self._core
        b, pool, cost, policy, store = core.b, core.pool, core.cost, core.policy, core.store
        prefix = pool.stats(b.now())
        used = pool.running_cells + prefix["cached_cells"]
        self.snapshot = {
            **core.queue_eta.publish(b.now()),  # eta_s by class, waiting_requests
            "kv": {"cells": pool.n_ctx, "used": used,
                   "used_by_running": pool.running_cells,
                   "used_by_prefix_cache": prefix["cached_cells"],
                   "reserved": pool.reserved_cells,
                   "use": round(used / pool.n_ctx, 4)},
            "prefix_cache": {**prefix, "store": store.stats() if store else None},
            "cost_model": {"decode_ms": round(1000 * cost.predict(1), 3),
                           "latency_target_ms": round(1000 * core.batcher.target(), 1),
                           "full_batch_ms": round(1000 * cost.predict(b.n_batch), 1),
                           "by_batch_size": cost.view()},
            "vtc": {u: round(policy.counter(u, b.now()), 1) for u in policy.vtc},
        }
