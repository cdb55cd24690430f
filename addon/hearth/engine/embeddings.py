"""Embedding requests, run in their own context beside the streams (part of
:class:`~hearth.engine.core.EngineCore`)."""

from __future__ import annotations

from ..requests import Event
from .base import BatchItem


class Embeddings:
    """Embeddings never take a stream's iteration: they go after its decode, in what the
    latency target leaves (by their own cost model), or in whole batches when nothing streams."""

    def _should_embed(self, items: list[BatchItem], now: float) -> bool:
        if not self.embed_waiting:
            return False
        if not items and not self.waiting:
            return True
        head = self.policy.order(self.embed_waiting, now)[0]
        rank = self.policy.effective_rank(head, now)
        best = min([self.waiting.best_rank(), *(it.req.rank for it in items if it.n > 1)])
        return rank <= best or self.policy.cfg.mode != "hearth"

    def _run_embeddings(self, now: float, streaming: bool = False, spent: float = 0.0) -> None:
        """One chunk of the head embedding request's inputs. Beside running streams the chunk
        fits what the iteration's latency target leaves after their decode (by the embedding
        context's own cost model; at least one input), so their cadence holds."""
        tok_limit, n_limit = self.b.embed_limits()
        if self.policy.cfg.mode == "serial" or not streaming:
            budget = tok_limit
        else:
            room = self.cfg.latency_target_s - spent
            budget = max(1, min(tok_limit, self.embed_cost.tokens_within(room)))
        head = self.policy.order(self.embed_waiting, now)[0]
        if head.first_admitted_at is None:
            head.first_admitted_at = now
            head.admitted_at = now
        done = head.meta.setdefault("_embedded", [])
        inputs: list[list[int]] = head.prompt  # type: ignore[assignment]
        chunk: list[list[int]] = []
        used = 0
        while len(done) + len(chunk) < len(inputs) and len(chunk) < n_limit:
            nxt = inputs[len(done) + len(chunk)]
            if chunk and used + len(nxt) > budget:
                break
            chunk.append(nxt)
            used += len(nxt)
        t0 = self.b.now()
        self._embedding = head  # stays set if the worker dies in the call (WorkerLost)
        try:
            vectors = self.b.embed(chunk)
        except Exception as e:  # surfaced to the caller, the engine keeps serving
            self._embedding = None
            self._fail(head, f"embedding failed: {e}", self.b.now())
            return
        self._embedding = None
        t1 = self.b.now()
        self.embed_cost.observe(used, t1 - t0)  # its own context: not the generation's cost
        done.extend(vectors)
        self.policy.charge(head.user, prompt_tokens=used, now=t1)
        self.stats.record_tokens(t1, 0, used)
        if len(done) == len(inputs):
            head.first_token_at = t1
            head.finished = True
            head.finish_reason = "stop"
            head.finished_at = t1
            self.embed_waiting.remove(head)
            self.policy.user_left(head.user)
            self.stats.record_finished(head, t1)
            self._emit(head, Event("done", finish_reason="stop", embedding=done,
                                   usage=head.usage(), timing=head.timing()))

