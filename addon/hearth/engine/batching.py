"""Batch composition (part of :class:`~hearth.engine.core.EngineCore`): one decode token for
every running stream, then prefill chunks under a token budget sized by the cost model so the
iteration stays within the latency target."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..scheduler import INTERACTIVE_RANK
from .base import VOICE_PREFILL_STRETCH, BatchItem
from .cost import attention

if TYPE_CHECKING:
    from .core import EngineCore


class Batching:
    def prefill_budget(self: EngineCore, n_decode: int, stretch: float = 1.0,
                       decode_attended: int = 0, start: int = 0,
                       interactive: bool = False) -> int:
        """Prefill tokens, from position ``start`` of their sequence, that fit beside
        ``n_decode`` decode tokens (attending ``decode_attended`` positions) in one iteration
        of ``stretch`` latency targets (an ``interactive`` prompt: someone waits for it)."""
        cap = max(0, self.b.n_batch - n_decode)
        if not self.policy.bounded(self.cfg.relax_prefill_bound, self.waiting.best_rank(),
                                   self.running):
            return cap
        target = self.cfg.latency_target_s

        def within(seconds: float) -> int:
            return self.cost.tokens_within(seconds, beside=n_decode,
                                           beside_attended=decode_attended, start=start, cap=cap)

        n = within(stretch * target)
        if n < self.cfg.min_prefill_chunk:
            # Not even a minimum chunk fits the target beside these streams (on a CPU a small
            # batch costs nearly as much per token as a decode). Someone waiting for this
            # prompt gets what fits in the voice stretch: the streams wait not much longer
            # than for a minimum chunk, and the prompt goes several times faster. Work no one
            # waits for keeps to the minimum chunk, and the streams' cadence.
            n = max(self.cfg.min_prefill_chunk,
                    within(VOICE_PREFILL_STRETCH * target) if interactive else 0)
        return min(cap, n)  # never past the batch's room, which would fail the decode

    def _build_batch(self: EngineCore, now: float) -> list[BatchItem]:
        if self._suspects:
            alone = self._suspect_batch()
            if alone:
                return alone
        items: list[BatchItem] = []
        decoding = [r for r in self.running if r.remaining == 1]
        for r in self.policy.decode_order(decoding):
            items.append(BatchItem(r, r.n_past, 1, True))
        prefilling, large = self.policy.prefill_plan(
            self.policy.order([r for r in self.running if r.remaining > 1], now))
        if not prefilling:  # a decode-only iteration: no budget to search for
            return items
        if large and not items:  # no stream to hold up: the whole batch
            budget = self.b.n_batch
        else:  # beside running streams: one latency target, or a few for large chunks
            head = prefilling[0]
            budget = self.prefill_budget(
                len(items), VOICE_PREFILL_STRETCH if large else 1.0,
                sum(attention(1, r.n_past) for r in decoding), head.n_past,
                head.rank <= INTERACTIVE_RANK)
        for r in prefilling:
            if budget <= 0:
                break
            n = min(r.remaining, budget)
            items.append(BatchItem(r, r.n_past, n, n == r.remaining))
            budget -= n
        return items

    def _suspect_batch(self: EngineCore) -> list[BatchItem]:
        """After a failed decode, its sequences go one at a time until each has decoded once
        (:meth:`~hearth.engine.recovery.Recovery._decode_failed`): the next suspect's step."""
        self._suspects = [r for r in self._suspects if r in self.running]
        if not self._suspects:
            return []
        r = self._suspects[0]
        if r.remaining == 1:
            return [BatchItem(r, r.n_past, 1, True)]
        n = min(r.remaining, max(1, self.prefill_budget(
            0, start=r.n_past, interactive=r.rank <= INTERACTIVE_RANK)))
        return [BatchItem(r, r.n_past, n, n == r.remaining)]
