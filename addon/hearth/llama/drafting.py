"""The draft model of speculative decoding, in the worker (part of the thin adapter): a small
model with the large one's vocabulary guesses a stream's next tokens greedily; the engine has
the large model check them all in one decode (:mod:`hearth.engine.drafts`).

The draft keeps one sequence in its own small context and reuses the longest prefix it shares
with the next one it is asked about: a voice command's system prompt is the same every time,
so only the new turn is computed again. It never holds up a stream for long: at most
``PREFILL_STEP`` tokens of a sequence it has not seen are computed per call, and it drafts
nothing until it has caught up."""

from __future__ import annotations

import logging
import statistics
import time

import numpy as np

from .llama_adapter import Context, ContextParams, Model

log = logging.getLogger(__name__)

PREFILL_STEP = 512  # tokens computed per call for a sequence the draft has not seen
DRAFT_CTX = 8192  # the draft's context: longer sequences are not drafted for
_PROBE = 'Turn on the kitchen light. <tool_call>\n{"name": "HassTurnOn"}\n</tool_call> 21.5 °C'


def same_vocabulary(model: Model, draft: Model) -> str | None:
    """Why ``draft`` cannot draft for ``model`` (None: it can): its tokens must mean the
    same text, or every drafted token would be refused."""
    if draft.n_vocab != model.n_vocab:
        return f"its vocabulary has {draft.n_vocab} tokens, the model's {model.n_vocab}"
    if draft.tokenize(_PROBE, add_special=False) != model.tokenize(_PROBE, add_special=False):
        return "it splits text into other tokens than the model"
    return None


class Drafter:
    def __init__(self, draft: Model, n_threads: int = 0, n_ctx: int = DRAFT_CTX):
        self.model = draft
        self.ctx = Context(draft, ContextParams(n_ctx=n_ctx, n_seq_max=1,
                                                n_batch=PREFILL_STEP, n_ubatch=PREFILL_STEP,
                                                n_threads=n_threads))
        self.held: list[int] = []  # the tokens in the draft's cache, by position

    def calibrate(self, token: int, rounds: int = 5) -> float:
        """Seconds one guess costs: the median of single decodes (the engine decides from it
        whether drafting can pay on this machine before it drafts anything)."""
        times = []
        for pos in range(rounds):
            t0 = time.perf_counter()
            self.ctx.decode([token], [pos], [0], [True])
            self.model.is_eog(self._greedy())  # as a guess in draft() costs
            times.append(time.perf_counter() - t0)
        self.ctx.seq_rm(0, 0, -1)
        self.held = []
        return statistics.median(times)

    def draft(self, tokens: list[int], k: int) -> list[int]:
        """Up to ``k`` tokens the draft expects after ``tokens`` (fewer where it expects the
        end, none while it catches up with a new sequence or for one too long)."""
        if k <= 0 or not tokens or len(tokens) + k > self.ctx.n_ctx:
            return []
        if not self._catch_up(tokens):
            return []
        out: list[int] = []
        while True:
            tok = self._greedy()
            if self.model.is_eog(tok):
                return out
            out.append(tok)
            if len(out) == k or not self._feed([tok], True):
                return out

    def _greedy(self) -> int:
        """The most likely token after the last decode's last output."""
        return int(np.ctypeslib.as_array(self.ctx.logits(-1),
                                         shape=(self.model.n_vocab,)).argmax())

    def _catch_up(self, tokens: list[int]) -> bool:
        """Compute ``tokens`` in the draft's cache up to the last, whose logits come out:
        whatever prefix it holds already is kept. False while more than a step is missing."""
        keep = 0
        limit = min(len(self.held), len(tokens) - 1)  # the last token is fed again: its logits
        while keep < limit and self.held[keep] == tokens[keep]:
            keep += 1
        if keep < len(self.held):
            self.ctx.seq_rm(0, keep, -1)
            del self.held[keep:]
        rest = tokens[keep:]
        if len(rest) > PREFILL_STEP:
            self._feed(rest[:PREFILL_STEP], False)
            return False
        return self._feed(rest, True)

    def _feed(self, tokens: list[int], last_logits: bool) -> bool:
        start = len(self.held)
        n = len(tokens)
        outputs = [False] * (n - 1) + [last_logits]
        if self.ctx.decode(tokens, list(range(start, start + n)), [0] * n, outputs) != 0:
            self.ctx.seq_rm(0, start, -1)  # a failed draft costs only the draft
            return False
        self.held.extend(tokens)
        return True

    def close(self) -> None:
        self.ctx.close()
