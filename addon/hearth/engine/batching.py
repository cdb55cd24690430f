"""Batch composition, a part of the engine: one decode token for every running stream, then
prefill chunks under a token budget sized by the cost model (which it owns: the generation
decodes' measured cost) so the iteration stays within the latency target. It reads the running
requests it is given and asks the policy who shares an iteration; it changes nothing."""

from __future__ import annotations

from ..policy.scheduler import Policy
from ..shared.requests import Request
from .base import DECODES_PER_TARGET, VOICE_PREFILL_STRETCH, Backend, BatchItem, EngineConfig
from .cost import CostModel, attention


class BatchComposer:
    def __init__(self, backend: Backend, cfg: EngineConfig, policy: Policy):
        self.b = backend
        self.cfg = cfg
        self.policy = policy
        self.cost = CostModel()
        # The batch size where the cost per token levels off, as calibrated (0 until then):
        # measured once at position 0, not refitted while serving, where the attention term
        # moves each size's fitted cost by more than the margin that picks it.
        self.efficient = 0
        # The last budget stretched past the target for a waited-for prompt, and the last
        # iteration so held one beside streams.
        self.stretching = False
        self.stretched = False

    def calibrate(self, token: int, rounds: int = 2) -> None:
        """Seed the cost model (and warm the kernels) with a few decodes of known size before
        serving, so the first iterations already respect the latency target."""
        # Every bucket up to two micro-batches, each at its smallest size (which errs towards
        # caution): an unmeasured bucket is priced as the nearest smaller one, and on a CPU
        # the per-token cost still falls steeply from 16 to 64 tokens (the 1.5B: 28 ms to
        # 17 ms). Left unmeasured, the 32-63 bucket looked too dear to try, so it was never
        # measured: a long prompt beside streams went in 27-token chunks at 1.6x the
        # per-token cost (issue 30).
        top = min(self.b.n_batch, 2 * self.b.n_ubatch)
        sizes = [1 << k for k in range(top.bit_length())]
        if sizes[-1] != top:
            sizes.append(top)
        for n in sizes * rounds:
            t0 = self.b.now()
            outs = [True] * n if n < 8 else [False] * (n - 1) + [True]
            status = self.b.decode([token] * n, list(range(n)), [0] * n, outs)
            dt = self.b.now() - t0
            self.b.seq_rm(0)
            if status == 0:
                self.cost.observe(n, dt, attention(n, 0))
        self.efficient = self.cost.efficient_size()

    def target(self) -> float:
        """The latency target an iteration keeps to: the configured one, or
        DECODES_PER_TARGET measured single decodes where one decode costs more than its half
        (a large model on a slow CPU)."""
        return max(self.cfg.latency_target_s, DECODES_PER_TARGET * self.cost.predict(1))

    def prefill_budget(self, n_decode: int, stretch: float = 1.0, decode_attended: int = 0,
                       start: int = 0, interactive: bool = False, bounded: bool = True) -> int:
        """Prefill tokens, from position ``start`` of their sequence, that fit beside
        ``n_decode`` decode tokens (attending ``decode_attended`` positions) in one iteration
        of ``stretch`` latency targets (an ``interactive`` prompt: someone waits for it);
        the batch's room when the policy does not keep iterations to the bound (``bounded``)."""
        n, self.stretching = self.budget(n_decode, stretch, decode_attended, start, interactive,
                                         bounded)
        return n

    def budget(self, n_decode: int, stretch: float = 1.0, decode_attended: int = 0,
               start: int = 0, interactive: bool = False, bounded: bool = True
               ) -> tuple[int, bool]:
        """:meth:`prefill_budget`, and whether it stretched past the target; changes
        nothing (other threads ask it for queue estimates)."""
        stretching = False
        cap = max(0, self.b.n_batch - n_decode)
        if not bounded:
            return cap, stretching
        target = self.target()

        def within(seconds: float) -> int:
            return self.cost.tokens_within(seconds, beside=n_decode,
                                           beside_attended=decode_attended, start=start, cap=cap)

        n = within(stretch * target)
        if n < self.cfg.min_prefill_chunk:
            # Not even a minimum chunk fits the target beside these streams (a large model on
            # a CPU, where a small batch costs nearly as much per token as a decode). Someone
            # waiting for this prompt gets what fits in twice the voice stretch, and streams
            # of its class get the next iteration to themselves (compose): their pace stays
            # about one token a stretch, and the prompt goes in chunks whose fixed cost
            # (the streams' decodes, attention over the pool) is spread thin. Smaller chunks
            # cost more (the 1.5B beside four chats: 28-token chunks 46 s to the first
            # token, 64-token ones 34 s). Work no one waits for keeps to the minimum chunk.
            stretching = interactive
            n = max(self.cfg.min_prefill_chunk,
                    within(2 * VOICE_PREFILL_STRETCH * target) if interactive else 0)
        knee = self.efficient - n_decode
        if interactive and knee > n and (self.cost.predict(self.efficient)
                                         <= 2 * VOICE_PREFILL_STRETCH * target):
            # Nor in chunks below the size where the cost per token levels off, where that
            # size costs at most twice the stretch: a large model on a CPU fits ~30 tokens in
            # the stretch beside streams, at 1.4x the per-token cost of 64 (issue 30: the
            # 1.5B's long chat prompt took 2.0x llama-server's time to its first token). The
            # size's own cost decides, not its attention: fitted from few samples, that had
            # priced late chunks of a long prompt several times too high.
            n = knee
        return min(cap, n), stretching  # never past the batch's room (the decode would fail)

    def compose(self, running: list[Request], now: float, bounded: bool) -> list[BatchItem]:
        """The next batch of ``running``: a decode token each for those past their prompt
        (highest class first), then prefill chunks in the policy's order and plan."""
        items: list[BatchItem] = []
        decoding = [r for r in running if r.remaining == 1]
        for r in self.policy.decode_order(decoding):
            items.append(BatchItem(r, r.n_past, 1, True))
        prefilling, large = self.policy.prefill_plan(
            self.policy.order([r for r in running if r.remaining > 1], now), bool(decoding))
        if any(self.policy.waited_for(r.rank) for r in decoding):
            # A warm-up never slows a stream someone waits for: on a CPU even the smallest
            # chunk beside one costs several decodes (the 1.5B: 16 tokens made each step
            # 0.4 s instead of 0.1 s for the first 90 s after a restart). A command that
            # needs the same prompt computes it, and that serves the warm-up
            # (warm_ups.served_warm_ups). Beside jobs' streams it goes on: a voice command's
            # warm prompt is worth more than a job's pace.
            prefilling = [r for r in prefilling if not r.warm_up]
        stretched, self.stretched = self.stretched, False
        if not prefilling:  # a decode-only iteration: no budget to search for
            return items
        head = prefilling[0]
        if stretched and items and self.policy.yields_to_streams(
                head.rank, [r.rank for r in decoding]):
            return items  # the streams' turn, between two long chunks (see the policy)
        if large and not items:  # no stream to hold up: the whole batch
            budget = self.b.n_batch
        else:  # beside running streams: one latency target, or a few for large chunks
            budget = self.prefill_budget(
                len(items), VOICE_PREFILL_STRETCH if large else 1.0,
                sum(attention(1, r.n_past) for r in decoding), head.n_past,
                self.policy.waited_for(head.rank), bounded)
        n_decode = len(items)
        for r in prefilling:
            if budget <= 0:
                break
            n = min(r.remaining, budget)
            items.append(BatchItem(r, r.n_past, n, n == r.remaining))
            budget -= n
        self.stretched = self.stretching and 0 < n_decode < len(items)
        return items

    def alone(self, r: Request, bounded: bool) -> list[BatchItem]:
        """``r``'s next step with nothing beside it (a suspect after a failed decode)."""
        if r.remaining == 1:
            return [BatchItem(r, r.n_past, 1, True)]
        n = min(r.remaining, max(1, self.prefill_budget(
            0, start=r.n_past, interactive=self.policy.waited_for(r.rank), bounded=bounded)))
        return [BatchItem(r, r.n_past, n, n == r.remaining)]
