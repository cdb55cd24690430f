"""What other threads may read of the engine (part of :class:`~hearth.engine.core.EngineCore`):
the queue counts, and the view of the KV pool, the prefix cache and the cost model that the
engine thread publishes after each iteration, for /v1/queue and /metrics."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..requests import Request
from ..scheduler import CLASS_RANKS

if TYPE_CHECKING:
    from .core import EngineCore


class View:
    pool_view: dict[str, Any]

    def queue_state(self: EngineCore) -> dict[str, Any]:
        """Counts for /v1/queue and /metrics, from any thread (take ``lock`` for a view
        consistent with the inbox)."""
        waiting = dict.fromkeys(CLASS_RANKS, 0)
        running = dict.fromkeys(CLASS_RANKS, 0)
        # Copies: the engine thread mutates these lists without the lock.
        for r in list(self.waiting) + list(self.embed_waiting):
            waiting[r.cls] += 1
        for _, x in list(self._inbox):
            if isinstance(x, Request):
                waiting[x.cls] += 1
        for r in list(self.running):
            running[r.cls] += 1
        view = self.pool_view
        if self.store is not None:  # live: the writer thread saves after the view was made
            view = {**view, "prefix_cache": {**view["prefix_cache"], "store": self.store.stats()}}
        return {"waiting": waiting, "running": running, **view}

    def _publish(self: EngineCore) -> None:
        """What other threads may read of the KV pool, the cost model and the counters: made
        by the engine thread after each iteration and swapped in whole, so readers never
        iterate structures the engine is changing."""
        pool = self.pool
        prefix = pool.stats(self.b.now())
        used = pool.running_cells + prefix["cached_cells"]
        self.pool_view = {
            "kv": {"cells": pool.n_ctx, "used": used,
                   "used_by_running": pool.running_cells,
                   "used_by_prefix_cache": prefix["cached_cells"],
                   "reserved": pool.reserved_cells,
                   "use": round(used / pool.n_ctx, 4)},
            "prefix_cache": {**prefix, "store": self.store.stats() if self.store else None},
            "cost_model": {"decode_ms": round(1000 * self.cost.predict(1), 3),
                           "latency_target_ms": round(1000 * self.batcher.target(), 1),
                           "full_batch_ms": round(1000 * self.cost.predict(self.b.n_batch), 1),
                           "by_batch_size": self.cost.view()},
            "vtc": {u: round(self.policy.counter(u, self.b.now()), 1) for u in self.policy.vtc},
        }
