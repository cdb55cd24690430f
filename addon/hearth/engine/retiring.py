"""How a request ends: finished (its last text flushed, then ``done``) or failed (``error``),
and then retired: out of the queues and the running list, its KV cells kept as a cached
prefix where the cache takes them (else freed), its sampler freed, its member's share given
back. A part of the engine: the engine gives it the backend, its config, the policy, the
stats, the outbox, the KV part, the wait queue and the running list; admission's ``changed``
and the embedder's ``remove`` are set once those parts exist (they take its calls)."""

from __future__ import annotations

from collections.abc import Callable

from ..policy.queue import WaitQueue
from ..policy.scheduler import Policy
from ..shared.requests import Event, Request
from .base import Backend, EngineConfig
from .kv import KVSpace
from .outbox import Outbox
from .stats import Stats


class Retirer:
    def __init__(self, backend: Backend, cfg: EngineConfig, policy: Policy, stats: Stats,
                 outbox: Outbox, kv: KVSpace, waiting: WaitQueue, running: list[Request]):
        self.b = backend
        self.cfg = cfg
        self.policy = policy
        self.stats = stats
        self.outbox = outbox
        self.kv = kv
        self.waiting = waiting
        self.running = running
        self.changed: Callable[[], None] = lambda: None  # admission: a slot may have come free
        self.unqueue_embedding: Callable[[Request], None] = lambda r: None

    def finish(self, r: Request, reason: str, now: float, flush: bool = True) -> None:
        if r.finished:
            return
        r.finished = True
        r.finish_reason = reason
        r.finished_at = now
        if flush and reason != "cancelled" and r.decoder is not None:
            thought, tail = r.split(r.decoder.flush(), final=True)
            text, _ = r.stopper.feed(tail) if r.stopper else (tail, False)
            text += r.stopper.flush() if r.stopper else ""
            if text or thought:
                self.outbox.emit(r, Event("token", text=text, reasoning=thought))
        self._retire(r)
        self.stats.record_finished(r, now)
        self.outbox.emit(r, Event("done", finish_reason=reason, usage=r.usage(), timing=r.timing()))

    def fail(self, r: Request, message: str, now: float, status: int = 500,
             code: str | None = None) -> None:
        if r.finished:
            return
        r.finished = True
        r.finish_reason = "error"
        r.finished_at = now
        self._retire(r)
        self.stats.record_finished(r, now)
        self.outbox.emit(r, Event("error", message=message, status=status, code=code))

    def _retire(self, r: Request) -> None:
        self.changed()  # a slot, cells or a class's share may have come free
        if r in self.waiting:
            self.waiting.remove(r)
        self.unqueue_embedding(r)
        if r in self.running:
            self.running.remove(r)
            if (self.cfg.prefix_cache and r.seq_id is not None and r.n_past > 0
                    and not r.cancelled):
                self.kv.keep(r)
            else:
                self.kv.release(r)
        if r.sampler is not None:
            self.b.free_sampler(r.sampler)
            r.sampler = None
        self.policy.user_left(r.user)
