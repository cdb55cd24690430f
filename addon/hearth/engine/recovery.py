"""When a decode fails or the backend's process dies (part of
:class:`~hearth.engine.core.EngineCore`). A failed decode is undone and its sequences retried
one at a time, so only one that fails alone is answered with an error. A dead process's KV
cache and samplers are gone with it: what was being computed is handed back to be answered;
what had not begun waits for the next worker."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from ..requests import Request

if TYPE_CHECKING:
    from .base import BatchItem, WorkerLost
    from .core import EngineCore

log = logging.getLogger("hearth.engine")

# Decodes a suspect gets alone before its failure is taken for its own: one more than a
# transient failure (an allocation on a busy device) takes.
SOLO_TRIES = 2


class Recovery:
    def _decode_failed(self: EngineCore, items: list[BatchItem], status: int,
                       now: float) -> None:
        """llama_decode failed part-way (a kernel, an allocation): the micro-batches it
        finished stay in the KV cache, counted nowhere. Clear them, so the accounting stays the
        cache's, and let the batch's sequences decode alone, one at a time, until each has once
        (:meth:`~hearth.engine.core.EngineCore._build_batch`): a transient failure costs
        no stream, and the one that fails alone is the one answered with the error."""
        log.warning("llama_decode failed with status %d for a batch of %d sequences", status,
                    len(items))
        self.admitter.changed()
        for it in items:
            if it.req.seq_id is not None:
                self.b.seq_rm(it.req.seq_id, it.start, -1)
        reqs = list({id(it.req): it.req for it in items}.values())
        if len(reqs) == 1 and self._suspects and self._suspects[0] is reqs[0]:
            r = reqs[0]
            r.meta["_failed_alone"] = r.meta.get("_failed_alone", 0) + 1
            if r.meta["_failed_alone"] >= SOLO_TRIES:
                self._suspects.pop(0)
                self._fail(r, f"llama_decode failed with status {status}", now)
            return
        if not self._suspects:
            self._suspects = self.policy.retry_order(reqs)

    def worker_lost(self: EngineCore, why: WorkerLost) -> tuple[list[Request], list[Request]]:
        """Forget the dead worker's state. Returns the requests it was serving (running,
        preempted after they began answering, the embedding request under way, the one whose
        sampler it was making), taken out of the engine for whoever supervises the worker to
        answer, and of those the suspects: the one it was sampling for or making a sampler
        for, else all it was computing."""
        with self.lock:
            self._inflight = None
        self.outbox.flush()  # tokens sampled before the death reach their streams first
        admitting = self.admitter.lost()
        begun = [r for r in self.waiting if r.first_admitted_at is not None]
        embedding = self.embedder.computing
        computing = [*self.running, *([embedding] if embedding else [])]
        if not why.suspect:
            suspects = []
        elif why.during == "new_sampler" and admitting is not None:
            suspects = [admitting]
        elif why.during == "decode_sample" and why.blame:
            suspects = [r for r in self.running if r.sampler == why.blame] or computing
        else:
            suspects = computing
        lost = list({id(r): r for r in [*computing, *begun, *suspects]}.values())
        now = self.b.now()
        for r in lost:
            if r in self.waiting:
                self.waiting.remove(r)
            self.embedder.remove(r)
            r.finished, r.finish_reason, r.finished_at = True, "error", now
            r.seq_id, r.sampler = None, None
            self.outbox.forget(r)
            self.policy.user_left(r.user)
            self.stats.record_finished(r, now)
        self.running.clear()
        self._suspects = []
        for r in self.waiting:
            r.sampler = None  # made in the dead worker: a new one at admission
        self.embedder.lost()  # the rest are computed again from their first input
        self.kv.lost()  # the cache's history outlives the cells it held
        self._persisted = ()  # the next idle moment saves what the new worker holds
        self._publish()
        return lost, suspects
