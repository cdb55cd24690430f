"""When a decode fails or is cut short, or the backend's process dies: a part of the engine that
owns the suspects of a failed decode (the requests still to decode alone, in turn). A failed
decode is undone and its sequences retried one at a time, so only one that fails alone is
answered with an error; a decode cut short for a voice request keeps the micro-batches it
finished. A dead process's KV cache and samplers are gone with it: what was being computed is
handed back to be answered; what had not begun waits for the next worker. The engine gives it
the backend, the policy (the retry order), the stats, the outbox, the KV part, the wait queue,
the running list and the embedder (whose requests it takes out), how to fail a request, to tell
admission that something changed and to charge computed positions; the other parts forget
their own state (``lost``)."""

from __future__ import annotations

import logging
from collections.abc import Callable

from ..policy.queue import WaitQueue
from ..policy.scheduler import Policy
from ..shared.requests import Request
from .base import Backend, BatchItem, WorkerLost
from .embeddings import Embedder
from .kv import KVSpace
from .outbox import Outbox
from .stats import Stats

log = logging.getLogger("hearth.engine")

# Decodes a suspect gets alone before its failure is taken for its own: one more than a
# transient failure (an allocation on a busy device) takes.
SOLO_TRIES = 2


class Recovery:
    def __init__(self, backend: Backend, policy: Policy, stats: Stats, outbox: Outbox,
                 kv: KVSpace, waiting: WaitQueue, running: list[Request], embedder: Embedder,
                 fail: Callable[[Request, str, float], None], changed: Callable[[], None],
                 charge: Callable[[Request, int, int, float], None]):
        self.b = backend
        self.policy = policy
        self.stats = stats
        self.outbox = outbox
        self.kv = kv
        self.waiting = waiting
        self.running = running  # the engine's list, changed in place
        self.embedder = embedder
        self._fail = fail  # answers with an error and retires the request
        self._changed = changed  # admission looks again
        self._charge = charge  # (r, start, n, now): its member pays for positions computed
        self.suspects: list[Request] = []  # in a failed decode: decoding alone, in turn

    def next_alone(self) -> Request | None:
        """The suspect of a failed decode to decode alone next (while it still runs)."""
        if not self.suspects:
            return None
        self.suspects = [r for r in self.suspects if r in self.running]
        return self.suspects[0] if self.suspects else None

    def decoded(self, first: Request) -> None:
        """A decode whose first item was ``first`` succeeded."""
        if self.suspects and self.suspects[0] is first:
            self.suspects.pop(0)  # it decoded alone: not the one that fails

    def decode_failed(self, items: list[BatchItem], status: int, now: float) -> None:
        """llama_decode failed part-way (a kernel, an allocation): the micro-batches it
        finished stay in the KV cache, counted nowhere. Clear them, so the accounting stays the
        cache's, and let the batch's sequences decode alone, one at a time, until each has once
        (:meth:`next_alone`): a transient failure costs no stream, and the one that fails alone
        is the one answered with the error."""
        log.warning("llama_decode failed with status %d for a batch of %d sequences", status,
                    len(items))
        self._changed()
        for it in items:
            if it.req.seq_id is not None:
                self.b.seq_rm(it.req.seq_id, it.start, -1)
        reqs = list({id(it.req): it.req for it in items}.values())
        if len(reqs) == 1 and self.suspects and self.suspects[0] is reqs[0]:
            r = reqs[0]
            r.meta["_failed_alone"] = r.meta.get("_failed_alone", 0) + 1
            if r.meta["_failed_alone"] >= SOLO_TRIES:
                self.suspects.pop(0)
                self._fail(r, f"llama_decode failed with status {status}", now)
            return
        if not self.suspects:
            self.suspects = self.policy.retry_order(reqs)

    def after_abort(self, items: list[BatchItem]) -> None:
        """Keep the micro-batches llama.cpp finished; redo what needed logits."""
        for it in items:
            r = it.req
            done = self.b.seq_pos_max(r.seq_id) + 1  # type: ignore[arg-type]
            keep = min(done, it.start + it.n - (1 if it.output else 0))
            keep = max(keep, it.start)
            if done > keep:
                self.b.seq_rm(r.seq_id, keep, -1)  # type: ignore[arg-type]
            gained = keep - it.start
            if gained:
                r.n_past = keep
                r.prefilled_tokens += gained
                self.kv.computed(r, gained)
                self._charge(r, it.start, gained, self.b.now())

    def worker_lost(self, why: WorkerLost,
                    admitting: Request | None) -> tuple[list[Request], list[Request]]:
        """Take out of the engine the requests the dead worker was serving (running, preempted
        after they began answering, the embedding request under way, ``admitting``: the one
        whose sampler it was making), for whoever supervises the worker to answer. Returns them
        and of those the suspects: the one it was sampling for or making a sampler for, else
        all it was computing. The requests left waiting get new samplers at admission."""
        begun = [r for r in self.waiting if r.first_admitted_at is not None]
        embedding = self.embedder.computing
        computing = [*self.running, *([embedding] if embedding else [])]
        if not why.suspect:
            suspects = []
        elif why.during == "new_sampler" and admitting is not None:
            suspects = [admitting]
        elif why.during in ("decode_sample", "draft") and why.blame:
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
        self.suspects = []
        for r in self.waiting:
            r.sampler = None  # made in the dead worker: a new one at admission
        return lost, suspects
