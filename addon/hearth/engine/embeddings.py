"""Embedding requests, run in their own context beside the streams: a part of the engine that
owns its queue, the request whose input is part-way, the one being computed and the embedding
context's cost model. The engine gives it the backend, the policy (who goes when), the stats,
and how to emit an event and fail a request."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..policy.scheduler import Policy
from ..shared.requests import Event, Request
from .base import Backend, BatchItem, EngineConfig
from .cost import CostModel
from .stats import Stats


def l2_normalised(vector: list[float]) -> list[float]:
    norm = sum(x * x for x in vector) ** 0.5 or 1.0
    return [x / norm for x in vector]


class Embedder:
    """Embeddings never take a stream's iteration: they go after its decode, in what the
    latency target leaves (by their own cost model), or in whole batches when nothing streams."""

    def __init__(self, backend: Backend, cfg: EngineConfig, policy: Policy, stats: Stats,
                 emit: Callable[[Request, Event], None],
                 fail: Callable[[Request, str, float], None],
                 target: Callable[[], float] | None = None):
        self.b = backend
        self.cfg = cfg
        # The generation's latency target (the composer's, which may exceed the configured one)
        self.target = target or (lambda: cfg.latency_target_s)
        self.policy = policy
        self.stats = stats
        self._emit = emit
        self._fail = fail  # answers the request with an error and retires it (remove)
        self.waiting: list[Request] = []
        self.head: Request | None = None  # the one with an input part-way (pieces)
        self.computing: Request | None = None  # the one whose inputs are being computed
        self.cost = CostModel()  # the embedding context's decodes, measured apart

    def add(self, r: Request) -> None:
        self.waiting.append(r)

    def remove(self, r: Request) -> None:
        """``r`` is done with (finished, failed, cancelled)."""
        if r in self.waiting:
            self.waiting.remove(r)
            if r is self.head:
                self.head = None

    def lost(self) -> Request | None:
        """The backend's process died: returns the request it was computing (out of the
        queue, for whoever answers it); the others start again from their first input."""
        computing, self.computing, self.head = self.computing, None, None
        if computing is not None and computing in self.waiting:
            self.waiting.remove(computing)
        for r in self.waiting:  # nothing was streamed: computed again from the start
            r.meta.pop("_embedded", None)
            r.meta.pop("_piece", None)
        return computing

    def should_run(self, items: list[BatchItem], best_waiting: int, others_wait: bool,
                   now: float) -> bool:
        """Whether the head request goes this iteration, beside ``items`` (the batch just
        built) while generation requests of class ``best_waiting`` at best wait
        (``others_wait``: any do)."""
        if not self.waiting:
            return False
        if not items and not others_wait:
            return True
        head = self.head or self.policy.order(self.waiting, now)[0]
        rank = self.policy.effective_rank(head, now)
        best = min([best_waiting, *(it.req.rank for it in items if it.n > 1)])
        return self.policy.embeddings_go(rank, best)

    def budget(self, streaming: bool, spent: float, bounded: bool) -> int:
        """Embedding tokens for this iteration. Like prefill, they keep to the latency target
        whenever an interactive request could arrive, streams or not, so a voice turn waits at
        most one such iteration (an embedding decode cannot be cut); beside running streams,
        what their decode left of it (``bounded``: the policy says iterations keep to it)."""
        tok_limit, _ = self.b.embed_limits()
        if not bounded:
            return tok_limit
        room = self.target() - (spent if streaming else 0.0)
        floor = 1 if streaming else self.cfg.min_prefill_chunk
        return max(floor, min(tok_limit, self.cost.tokens_within(room)))

    def run(self, now: float, streaming: bool = False, spent: float = 0.0,
            bounded: bool = True) -> None:
        """One chunk of the head embedding request's inputs, within :meth:`budget`
        (at least one input). An input longer than the budget goes in pieces where the
        backend can (a causal model: :meth:`~hearth.llama.backend.LlamaBackend.embed_piece`), and
        its request stays the head until that input is done."""
        _, n_limit = self.b.embed_limits()
        budget = self.budget(streaming, spent, bounded)
        head = self.head or self.policy.order(self.waiting, now)[0]
        if head.first_admitted_at is None:
            head.first_admitted_at = now
            head.admitted_at = now
        done = head.meta.setdefault("_embedded", [])
        inputs: list[list[int]] = head.prompt  # type: ignore[assignment]
        nxt = inputs[len(done)]
        # Pieces cost a decode each: only an input of several minimum chunks is worth cutting.
        long = len(nxt) > max(budget, 4 * self.cfg.min_prefill_chunk)
        if head is self.head or (long and self._pieces()):
            return self._embed_piece(head, nxt, budget, now)
        chunk: list[list[int]] = []
        used = 0
        while len(done) + len(chunk) < len(inputs) and len(chunk) < n_limit:
            nxt = inputs[len(done) + len(chunk)]
            if chunk and used + len(nxt) > budget:
                break
            chunk.append(nxt)
            used += len(nxt)
        vectors = self._embed_call(head, used, lambda: self.b.embed(chunk))
        if vectors is not None:
            done.extend(vectors)
            self._embedded(head)

    def _pieces(self) -> bool:
        can = getattr(self.b, "embed_pieces", None)  # a backend without: inputs go whole
        return bool(can and can())

    def _embed_piece(self, head: Request, tokens: list[int], budget: int, now: float) -> None:
        start, acc = head.meta.get("_piece", (0, None))
        n = min(len(tokens) - start, max(budget, self.cfg.min_prefill_chunk))
        last = start + n == len(tokens)
        self.head = None if last else head
        mean = self._embed_call(head, n, lambda: self.b.embed_piece(  # type: ignore[attr-defined]
            tokens[start:start + n], start, last))
        if mean is None:
            return
        acc = [n * x for x in mean] if acc is None else [a + n * x for a, x in zip(acc, mean,
                                                                                  strict=True)]
        if last:
            head.meta.pop("_piece", None)
            head.meta["_embedded"].append(l2_normalised(acc))
            self._embedded(head)
        else:
            head.meta["_piece"] = (start + n, acc)

    def _embed_call(self, head: Request, used: int, call: Callable[[], Any]) -> Any:
        """Run one embedding decode of ``used`` tokens for ``head``; None if it failed (the
        request has its error)."""
        t0 = self.b.now()
        self.computing = head  # stays set if the worker dies in the call (WorkerLost)
        try:
            out = call()
        except Exception as e:  # surfaced to the caller, the engine keeps serving
            self.computing = self.head = None
            head.meta.pop("_piece", None)
            self._fail(head, f"embedding failed: {e}", self.b.now())
            return None
        self.computing = None
        t1 = self.b.now()
        self.cost.observe(used, t1 - t0)  # its own context: not the generation's cost
        self.policy.charge(head.user, prompt_tokens=used, now=t1)
        self.stats.record_tokens(t1, 0, used)
        return out

    def _embedded(self, head: Request) -> None:
        """Finish ``head`` if every input has its vector."""
        done = head.meta["_embedded"]
        if len(done) < len(head.prompt):
            return
        t1 = self.b.now()
        head.first_token_at = t1
        head.finished = True
        head.finish_reason = "stop"
        head.finished_at = t1
        self.waiting.remove(head)
        self.policy.user_left(head.user)
        self.stats.record_finished(head, t1)
        self._emit(head, Event("done", finish_reason="stop", embedding=done,
                               usage=head.usage(), timing=head.timing()))
