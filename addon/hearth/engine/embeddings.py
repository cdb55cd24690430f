"""Embedding requests, run in their own context beside the streams (part of
:class:`~hearth.engine.core.EngineCore`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..requests import Event, Request
from .base import BatchItem


def l2_normalised(vector: list[float]) -> list[float]:
    norm = sum(x * x for x in vector) ** 0.5 or 1.0
    return [x / norm for x in vector]


class Embeddings:
    """Embeddings never take a stream's iteration: they go after its decode, in what the
    latency target leaves (by their own cost model), or in whole batches when nothing streams."""

    def _should_embed(self, items: list[BatchItem], now: float) -> bool:
        if not self.embed_waiting:
            return False
        if not items and not self.waiting:
            return True
        head = self._embed_head or self.policy.order(self.embed_waiting, now)[0]
        rank = self.policy.effective_rank(head, now)
        best = min([self.waiting.best_rank(), *(it.req.rank for it in items if it.n > 1)])
        return self.policy.embeddings_go(rank, best)

    def _embed_budget(self, streaming: bool, spent: float) -> int:
        """Embedding tokens for this iteration. Like prefill, they keep to the latency target
        whenever an interactive request could arrive, streams or not, so a voice turn waits at
        most one such iteration (an embedding decode cannot be cut); beside running streams,
        what their decode left of it."""
        tok_limit, _ = self.b.embed_limits()
        if not self.policy.bounded(self.cfg.relax_prefill_bound, self.waiting.best_rank(),
                                   self.running):
            return tok_limit
        room = self.cfg.latency_target_s - (spent if streaming else 0.0)
        floor = 1 if streaming else self.cfg.min_prefill_chunk
        return max(floor, min(tok_limit, self.embed_cost.tokens_within(room)))

    def _run_embeddings(self, now: float, streaming: bool = False, spent: float = 0.0) -> None:
        """One chunk of the head embedding request's inputs, within :meth:`_embed_budget`
        (at least one input). An input longer than the budget goes in pieces where the
        backend can (a causal model: :meth:`~hearth.backend.LlamaBackend.embed_piece`), and
        its request stays the head until that input is done."""
        _, n_limit = self.b.embed_limits()
        budget = self._embed_budget(streaming, spent)
        head = self._embed_head or self.policy.order(self.embed_waiting, now)[0]
        if head.first_admitted_at is None:
            head.first_admitted_at = now
            head.admitted_at = now
        done = head.meta.setdefault("_embedded", [])
        inputs: list[list[int]] = head.prompt  # type: ignore[assignment]
        nxt = inputs[len(done)]
        # Pieces cost a decode each: only an input of several minimum chunks is worth cutting.
        long = len(nxt) > max(budget, 4 * self.cfg.min_prefill_chunk)
        if head is self._embed_head or (long and self._pieces()):
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
        self._embed_head = None if last else head
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
        self._embedding = head  # stays set if the worker dies in the call (WorkerLost)
        try:
            out = call()
        except Exception as e:  # surfaced to the caller, the engine keeps serving
            self._embedding = self._embed_head = None
            head.meta.pop("_piece", None)
            self._fail(head, f"embedding failed: {e}", self.b.now())
            return None
        self._embedding = None
        t1 = self.b.now()
        self.embed_cost.observe(used, t1 - t0)  # its own context: not the generation's cost
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
        self.embed_waiting.remove(head)
        self.policy.user_left(head.user)
        self.stats.record_finished(head, t1)
        self._emit(head, Event("done", finish_reason="stop", embedding=done,
                               usage=head.usage(), timing=head.timing()))
