"""One iteration of the engine over its backend: submission, decoding, sampling and retiring.
Its parts own their state and are given what they need: admission and preemption
(:mod:`.admission`), the KV cache's accounting (:mod:`.kv`), batch composition
(:mod:`.batching`), embeddings (:mod:`.embeddings`), failed, cut and lost decodes
(:mod:`.recovery`), a draft model's guesses (:mod:`.drafts`), how a request ends
(:mod:`.retiring`), packing (:mod:`.compaction`) and
saving (:mod:`.persistence`) the prefix cache, and what other threads may read
(:mod:`.view`)."""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Iterable
from concurrent.futures import Future
from typing import Any

from ..policy.queue import WaitQueue
from ..policy.scheduler import Policy, PolicyConfig
from ..shared.requests import Event, Request, StopMatcher
from .admission import Admitter
from .base import Backend, BatchItem, EngineConfig, RequestError, WorkerLost, check_request
from .batching import BatchComposer
from .compaction import Packer
from .cost import CostModel, attention
from .drafts import Drafts
from .embeddings import Embedder
from .forcing import JumpForward
from .kv import KVSpace
from .kvcache import KVPool
from .outbox import Outbox
from .persistence import Persister
from .prefix_store import PrefixStore, Saved
from .queue_eta import QueueEta
from .recovery import Recovery
from .retiring import Retirer
from .satellites import Satellites
from .stats import Stats
from .view import View
from .warm_ups import served_warm_ups

log = logging.getLogger("hearth.engine")


class EngineCore:
    def __init__(self, backend: Backend, policy_cfg: PolicyConfig,
                 cfg: EngineConfig | None = None, stats: Stats | None = None):
        self.b = backend
        self.cfg = cfg or EngineConfig()
        self.policy = Policy(policy_cfg)
        self.stats = stats or Stats()
        self.waiting = WaitQueue()  # in admission order by class and member (policy.queue)
        # The KV cache's accounting and memory calls; it spares the prefixes the next waiting
        # requests want, looked up once per decode.
        self.kv = KVSpace(backend, self.cfg, self.waiting, lambda: self.stats.iterations)
        self.running: list[Request] = []  # never replaced: the parts hold it
        self.lock = threading.RLock()  # guards the inbox, queue counts and snapshots
        self.wakeup = threading.Event()
        self._inbox: deque[tuple[str, Any]] = deque()
        self._inflight: tuple[int, int] | None = None  # (best prefill rank, prefill tokens)
        self.outbox = Outbox()  # events for the sinks, delivered after each iteration
        self.last_iteration: dict[str, Any] = {}
        self.failed: str | None = None  # set when the engine thread died: nothing is served
        self.arbiter: Any = None  # set when other engines share the accelerator
        self.retirer = Retirer(backend, self.cfg, self.policy, self.stats, self.outbox,
                               self.kv, self.waiting, self.running)
        self._finish, self._fail = self.retirer.finish, self.retirer.fail
        self.admitter = Admitter(backend, self.cfg, self.policy, self.stats, self.kv,
                                 self.waiting, self.running, self._finish, self._fail)
        self.batcher = BatchComposer(backend, self.cfg, self.policy)
        self.embedder = Embedder(backend, self.cfg, self.policy, self.stats, self.outbox.emit,
                                 self._fail, self.batcher.target)
        self.retirer.changed, self.retirer.unqueue_embedding = (self.admitter.changed,
                                                                self.embedder.remove)
        self.recovery = Recovery(backend, self.policy, self.stats, self.outbox, self.kv,
                                 self.waiting, self.running, self.embedder, self._fail,
                                 self.admitter.changed, self._charge_computed)
        self.packer = Packer(backend, self.kv, self.cfg.compact_prefix_cache, self.has_work,
                             self._arrived)
        self.persister = Persister(backend, self.kv, self.has_work, self._arrived)
        self.jump = JumpForward(backend, self.stats, self.policy, self._append)
        self.drafts = Drafts(backend, self.kv, self.stats, lambda: self.batcher.cost,
                             self.cfg.draft_policy == "always")
        self.queue_eta = QueueEta(self)  # places and expected waits (policy.eta)
        self.satellites = Satellites(self, self.cfg.reservation_s)  # wake words, supersede
        self.view = View(self)  # what other threads read: queue_state()
        self.view.publish()

    # What other modules and the tests read of the parts, by the names they had on the core.
    @property
    def pool(self) -> KVPool:  # the KV part's
        return self.kv.pool

    @property
    def cost(self) -> CostModel:  # the generation decodes': the composer's
        return self.batcher.cost

    @cost.setter
    def cost(self, cost: CostModel) -> None:  # a new worker keeps what was measured
        self.batcher.cost = cost

    @property
    def store(self) -> PrefixStore | None:  # where the persister saves the prefix cache
        return self.persister.store

    @store.setter
    def store(self, store: PrefixStore | None) -> None:
        self.persister.store = store

    def persist(self, force: bool = False) -> Future | None:  # :meth:`Persister.persist`
        return self.persister.persist(force)

    def restore(self, saved: Iterable[Saved]) -> int:  # :meth:`Persister.restore`, published
        n = self.persister.restore(saved)
        self.view.publish()
        return n

    @property
    def embed_waiting(self) -> list[Request]:  # the embedder's queue
        return self.embedder.waiting

    @property
    def embed_cost(self) -> CostModel:
        return self.embedder.cost

    @embed_cost.setter
    def embed_cost(self, cost: CostModel) -> None:  # a new worker keeps what was measured
        self.embedder.cost = cost

    # -- any thread ------------------------------------------------------------------------
    def queue_state(self) -> dict[str, Any]:
        """Counts and the last published view, for /v1/queue and /metrics (:class:`.View`)."""
        return self.view.queue_state()

    def submit(self, r: Request) -> Request:
        """Queue a request. Raises RequestError for a prompt that cannot fit or a full queue."""
        check_request(r, self.b)
        with self.lock:  # checked under the lock that fail_all takes: nothing slips past it
            if self.failed:
                raise RequestError(self.failed, status=503, code="engine_failed")
            queued = sum(1 for x in self.waiting + self.embed_waiting if x.rank == r.rank) + \
                sum(1 for k, x in self._inbox if k == "add" and x.rank == r.rank)
            if queued >= self.cfg.max_queue:
                self.stats.rejected[r.cls] += 1
                raise RequestError(f"the {r.cls} queue is full", status=429,
                                   code="queue_full", retry_after=self._retry_after())
            r.arrival = self.b.now()
            self.queue_eta.shed(r)  # past its class's deadline: refused now (429)
            self.satellites.arrived(r)  # a voice turn ends its satellite's reservation
            self._inbox.append(("add", r))
            self._maybe_abort(r)
        self.wakeup.set()
        if self.arbiter is not None:
            self.arbiter.arrived(self, r.rank)  # outside our lock: it takes the others'
        return r

    def cancel(self, request_id: int) -> None:
        with self.lock:
            self._inbox.append(("cancel", request_id))
        self.wakeup.set()

    def _retry_after(self) -> float:
        return max(1.0, round(self.cost.predict(self.b.n_batch) * 4, 1))

    def _maybe_abort(self, r: Request) -> None:
        """A voice request arriving while the running decode only prefills lower classes cuts
        that decode at the next graph node (its finished micro-batches are kept)."""
        inflight = self._inflight
        if inflight is not None and self.policy.cuts_decode(r.rank, *inflight,
                                                            self.cfg.min_prefill_chunk):
            self.b.request_abort()

    def calibrate(self, token: int, rounds: int = 2) -> None:
        self.batcher.calibrate(token, rounds)

    def fail_all(self, message: str) -> None:
        """The engine cannot go on: every queued and running request gets an error now, and
        later submissions are refused (called from the dying engine thread)."""
        with self.lock:
            self.failed = message
            pending = [x for _, x in self._inbox if isinstance(x, Request)]
            self._inbox.clear()
        requests = {r.id: r for r in [*pending, *self.waiting, *self.running,
                                      *self.embed_waiting]}
        self.waiting.clear()
        self.running.clear()
        self.embedder.waiting = []
        for r in requests.values():
            try:
                r.sink([Event("error", message=message, status=503)])
            except Exception:  # one broken sink must not keep the others waiting
                log.exception("could not tell request %d that the engine stopped", r.id)

    def worker_lost(self, why: WorkerLost) -> tuple[list[Request], list[Request]]:
        """Forget the dead worker's state: each part forgets its own. Returns the requests it
        was serving, taken out of the engine, and the suspects among them
        (:meth:`~hearth.engine.recovery.Recovery.worker_lost`)."""
        with self.lock:
            self._inflight = None
        self.outbox.flush()  # tokens sampled before the death reach their streams first
        lost, suspects = self.recovery.worker_lost(why, self.admitter.lost())
        self.embedder.lost()  # the rest are computed again from their first input
        self.kv.lost()  # the cache's history outlives the cells it held
        self.persister.lost()
        self.view.publish()
        return lost, suspects

    def has_work(self) -> bool:
        return bool(self._inbox or self.waiting or self.running or self.embed_waiting)

    def _arrived(self) -> bool:
        """Whether a submission waits to be taken in (idle housekeeping stops for it)."""
        return bool(self._inbox)

    def idle(self) -> bool:
        """Called by the engine thread when it has no work: housekeeping that must not hold up
        a request. Returns whether it did any."""
        done = self.packer.maybe_compact() or self.persister.maybe_persist()
        if done:
            self.view.publish()
        return done

    # -- the engine thread -----------------------------------------------------------------
    def step(self) -> bool:
        """One iteration. Returns False when there was nothing to do."""
        try:
            return self._iterate()
        finally:
            self.view.publish()

    def _iterate(self) -> bool:
        now = self.b.now()
        self._drain_inbox(now)
        self.admitter.admit(now)
        for r in served_warm_ups(self.running, self.kv):
            self._finish(r, "stop", now)  # what it was to compute is cached already
        items = self.admitter.fit(self._build_batch(now), now)
        self.drafts.attach(items)
        embed = self.embedder.should_run(items, self.waiting.best_rank(), bool(self.waiting),
                                         now)
        if not items and not embed:
            self.outbox.flush()
            return False  # nothing to compute: the thread naps until woken
        spent = 0.0
        if items:  # running streams always get their token: embeddings never take its place
            t0 = self.b.now()
            self._decode(items)
            spent = self.b.now() - t0
            self.kv.note_high_water()
        if embed:
            self.embedder.run(self.b.now(), streaming=bool(items), spent=spent,
                              bounded=self._bounded())
        self.outbox.flush()
        return True

    def _build_batch(self, now: float) -> list[BatchItem]:
        """After a failed decode, its sequences go one at a time until each has decoded once
        (:meth:`~hearth.engine.recovery.Recovery.decode_failed`); else the composer's batch."""
        alone = self.recovery.next_alone()
        if alone is not None:
            return self.batcher.alone(alone, self._bounded())
        return self.batcher.compose(self.satellites.batchable(self.running), now,
                                    self._bounded())

    def _bounded(self) -> bool:
        """Whether prefill and embeddings keep to the latency target now (the policy's
        answer, from who waits and runs)."""
        return self.policy.bounded(self.cfg.relax_prefill_bound, self.waiting.best_rank(),
                                   self.running)

    def _drain_inbox(self, now: float) -> None:
        with self.lock:
            items = list(self._inbox)
            self._inbox.clear()
        if items:
            self.admitter.changed()
        for kind, x in items:
            if kind == "add":
                r: Request = x
                self.outbox.track(r)
                self.policy.user_arrived(r.user, now)
                if r.kind == "embed":
                    self.embedder.add(r)
                else:
                    r.tokens = list(r.prompt)  # type: ignore[arg-type]
                    r.stopper = StopMatcher(r.stop)
                    r.decoder = self.b.make_decoder()
                    self.waiting.append(r)
                    self.satellites.taken_in(r, now)  # supersedes its satellite's older turn
            else:
                r = self.outbox.by_id.get(x)
                if r is not None and not r.finished:
                    r.cancelled = True
                    self._finish(r, "cancelled", now)
        # each arrival's ETA as it finds the queue, before it may be admitted
        self.queue_eta.arrived([x for k, x in items if k == "add"], now)

    def _decode(self, items: list[BatchItem]) -> None:
        tokens: list[int] = []
        pos: list[int] = []
        seqs: list[int] = []
        outs: list[bool] = []
        out_index: dict[int, int] = {}
        prefill_tokens, best_prefill, attended = 0, 99, 0
        for it in items:
            r = it.req
            m = it.n + len(it.draft)  # a draft's guesses follow the decode token, each output
            tokens.extend(r.tokens[it.start: it.start + it.n] + it.draft)
            pos.extend(range(it.start, it.start + m))
            seqs.extend([r.seq_id] * m)  # type: ignore[list-item]
            outs.extend([False] * (it.n - 1) + [it.output] + [True] * len(it.draft))
            attended += attention(m, it.start)
            if it.output:
                out_index[r.id] = len(tokens) - 1 - len(it.draft)
            if it.n > 1 or not it.output:
                prefill_tokens += it.n
                best_prefill = min(best_prefill, r.rank)
        with self.lock:
            self.b.clear_abort()
            self._inflight = (best_prefill, prefill_tokens)
        # Every output's token is sampled with the decode: one round trip to a worker process.
        samples = [(it.req.sampler, out_index[it.req.id], *([it.draft] if it.draft else []))
                   for it in items if it.output]
        t0 = self.b.now()
        status, sampled = self.b.decode_sample(tokens, pos, seqs, outs, samples)
        t1 = self.b.now()
        with self.lock:
            self._inflight = None
        self.stats.iterations += 1
        self.last_iteration = {"tokens": len(tokens), "prefill": prefill_tokens,
                               "seconds": t1 - t0, "status": status}
        if status == 0:
            self.recovery.decoded(items[0].req)
            self.cost.observe(len(tokens), t1 - t0, attended)
            self._after_decode(items, sampled, t1)
        elif status == 1:
            self.admitter.out_of_kv(items, t1)
        elif status == 2:
            self.stats.aborted_iterations += 1
            self.recovery.after_abort(items)
        else:
            self.recovery.decode_failed(items, status, t1)

    def _after_decode(self, items: list[BatchItem], sampled: list[int], now: float) -> None:
        prompt_done = generated = 0
        next_token = iter(sampled)  # in the order of the items with an output
        for it in items:
            r = it.req
            out = next(next_token) if it.output else -1
            if r.finished:
                continue
            if it.draft:
                generated += self._drafted_run(it, out, now)
                continue
            r.n_past += it.n
            self.kv.computed(r, it.n)
            if not (it.n == 1 and it.output):
                prompt_done += it.n
                r.prefilled_tokens += it.n
            self._charge_computed(r, it.start, it.n, now)
            if it.output:
                generated += 1
                self._on_token(r, out, now)
        self.stats.record_tokens(now, generated, prompt_done)

    def _drafted_run(self, it: BatchItem, run: list[int], now: float) -> int:
        """A voice stream's decode checked guesses and gave it ``run``: each token counted in
        the KV cache as it goes out, so one that ends the stream part-way (a stop string)
        leaves no cell counted past it (the cells are cleared as it ends). Returns the tokens
        that went out."""
        r = it.req
        self.drafts.checked(it, run)  # the refused guesses' cells freed
        for n, tok in enumerate(run, 1):
            r.n_past += 1  # the position before it: the decode token, then each guess taken
            self.kv.computed(r, 1)
            self._on_token(r, tok, now)
            if r.finished:
                return n
        return len(run)

    def _charge_computed(self, r: Request, start: int, n: int, now: float) -> None:
        """Positions ``start``.. ``start + n`` of ``r`` were computed: its member pays for those
        computed for the first time, so a preempted request that recomputes what it lost (its
        prompt, its own output, charged when sampled) does not pay twice."""
        done = r.meta.get("_charged_to", 0)
        end = min(start + n, r.n_prompt)  # later positions hold its output, charged as such
        if end > done:
            self.policy.charge(r.user, prompt_tokens=end - max(start, done), now=now)
            r.meta["_charged_to"] = end

    def _on_token(self, r: Request, tok: int, now: float) -> None:
        r.n_generated += 1
        self.policy.charge(r.user, output_tokens=1, now=now)
        if r.first_token_at is None:
            r.first_token_at = now
        elif r.last_token_at is not None:
            r.itl.append(now - r.last_token_at)
        r.last_token_at = now
        if self.b.is_eog(tok) and not r.ignore_eos:
            self._finish(r, "stop", now)
            return
        text = self._append(r, tok, now)
        if r.forcer is not None and not r.finished:
            self.jump.after(r, text, now)

    def _append(self, r: Request, tok: int, now: float) -> str:
        """``tok`` is ``r``'s next output: its text to the stream (stops matched), ``r``
        finished at a stop or its length. Returns the text decoded, before the stops."""
        r.tokens.append(tok)
        thought, decoded = r.split(r.decoder.feed(self.b.piece(tok)))  # type: ignore[union-attr]
        text, stopped = r.stopper.feed(decoded)  # type: ignore[union-attr]
        self.outbox.emit(r, Event("token", text=text, reasoning=thought, token_ids=[tok]))
        if stopped:
            self._finish(r, "stop", now, flush=False)
        elif r.n_generated >= r.max_tokens or len(r.tokens) >= self.b.n_ctx_seq:
            self._finish(r, "length", now)
        return decoded
