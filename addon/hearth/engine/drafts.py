"""Speculative decoding, a part of the engine: a voice stream's decode token goes with the
tokens a draft model guesses after it, and one decode checks them all (the worker samples
each in turn while they agree: :func:`~hearth.engine.base.sample_run`). A voice answer is
read out whole, so its last token is what the household waits for; the draft is for the
voice class only, where a draft model is set (``draft_model``).

It pays where checking a few tokens costs little more than decoding one: on a GPU, not on a
small CPU (measured: README, issue 30). So it drafts only as many tokens as pay (the
``measured`` policy, :class:`Payoff`), from the draft's cost a guess (measured by the worker at
load), the decode's cost by batch size (the composer's cost model, measured as it serves) and
the share of guesses accepted so far. Where none would pay even if every guess were accepted
(a CPU) it never drafts, so a draft set there costs nothing but its memory; where more
acceptance would make it pay, a one-token probe now and then keeps the share current. The
``always`` policy drafts every voice decode, to measure what drafting does.

What it must never change is the output: every token is still the model's own sample.
Guessed tokens need KV cells and batch room only for the decode that checks them; the refused
ones' cells are freed after it. The worker's draft holds one sequence: one voice stream an
iteration is drafted for (the first in decode order, as a rule the same one throughout), so
two streams never take turns evicting each other from it."""

from __future__ import annotations

import logging
from collections.abc import Callable

from ..shared.requests import Request
from .base import Backend, BatchItem
from .cost import CostModel, attention
from .kv import KVSpace
from .stats import Stats

log = logging.getLogger("hearth.engine")

# While no guess pays at the share accepted so far but some would at a higher share, one
# eligible iteration in this many is drafted for (one token), so the share is measured again.
PROBE_EVERY = 50


def best_guesses(k_max: int, batch: int, cost: CostModel, per_guess: float,
                 accepted: float, attended: int = 0, start: int = 0) -> int:
    """The guesses (0 to ``k_max``) that make a drafted stream's time a token least beside a
    batch of ``batch`` tokens attending ``attended`` positions, for a stream whose decode
    token is at ``start``: each guess accepted at rate ``accepted`` (after the one before it
    was), ``k`` guesses give 1 + a + ... + a^k tokens a decode, for the draft's time for
    ``k`` tokens and the decode's for ``k`` more positions, each attending all before it."""
    alone = cost.predict(batch, attended)
    best, best_s = 0, alone
    for k in range(1, k_max + 1):
        gained = sum(accepted ** j for j in range(k + 1))
        checked = cost.predict(batch + k, attended + attention(k, start + 1))
        # never below the batch alone: a bucket's fit may price one more token lower
        s = (per_guess * k + max(alone, checked)) / gained
        if s < best_s:
            best, best_s = k, s
    return best


class Payoff:
    """The share of guesses accepted, and from it how many to ask for."""

    def __init__(self) -> None:
        self.accepted = 0
        self.refused = 0  # runs cut short by a guess the model did not sample
        self._since_probe = 0

    def checked(self, offered: int, accepted: int) -> None:
        self.accepted += accepted
        self.refused += accepted < offered

    def rate(self) -> float:
        return (self.accepted + 1) / (self.accepted + self.refused + 2)  # 1/2 at first

    def tokens(self, k_max: int, batch: int, cost: CostModel, per_guess: float,
               attended: int = 0, start: int = 0) -> int:
        best = best_guesses(k_max, batch, cost, per_guess, self.rate(), attended, start)
        if best == 0 and best_guesses(k_max, batch, cost, per_guess, 1.0, attended,
                                      start) > 0:
            self._since_probe += 1
            if self._since_probe >= PROBE_EVERY:
                self._since_probe = 0
                return 1
        return best


class Drafts:
    def __init__(self, backend: Backend, kv: KVSpace, stats: Stats,
                 cost: Callable[[], CostModel], always: bool = False):
        self.b = backend
        self.kv = kv
        self.stats = stats
        self.cost = cost  # the composer's, which a new worker may replace
        self.always = always
        self.payoff = Payoff()

    def attach(self, items: list[BatchItem]) -> None:
        """Give the first voice stream's decode item in ``items`` the draft's guesses, as
        many as pay, within the cells free, the batch's room and the stream's limits."""
        k_max = getattr(self.b, "n_draft", 0)
        it = next((it for it in items if it.n == 1 and it.output and it.req.cls == "voice"),
                  None)
        if k_max <= 0 or it is None:
            return
        r = it.req
        batch = sum(x.n for x in items)
        if not self.always:
            k_max = self.payoff.tokens(k_max, batch, self.cost(), getattr(self.b, "draft_s", 0.0),
                                       sum(attention(x.n, x.start) for x in items), it.start)
        cells = self.kv.pool.free_cells - sum(max(0, x.n - x.req.reserved) for x in items)
        limit = min(k_max, cells, self.b.n_batch - batch, r.max_tokens - r.n_generated - 1,
                    self.b.n_ctx_seq - len(r.tokens) - 1)
        if limit <= 0 or (r.forcer is not None and not r.forcer.quiet("")):
            return  # inside a tool call, jump-forward writes what is fixed
        try:
            guessed = self.b.draft(r.tokens, limit, r.sampler)[:limit]
        except Exception as e:  # the draft's fault, not the stream's: it goes undrafted
            log.warning("the draft model failed (%s): this decode goes without it", e)
            return
        it.draft = self._unforced(r, guessed)
        self.stats.drafted_tokens += len(it.draft)

    def _unforced(self, r: Request, guessed: list[int]) -> list[int]:
        """The guesses up to where a tool call would open: text a call's schemas fix is
        written by jump-forward after the token that opens it (:mod:`.forcing`), and the
        tokens sampled after that one would not be the output."""
        if r.forcer is None:
            return guessed
        text = ""
        for n, tok in enumerate(guessed):
            text += self.b.piece(tok).decode("utf-8", "ignore")
            if not r.forcer.quiet(text):
                return guessed[:n]
        return guessed

    def checked(self, it: BatchItem, run: list[int]) -> None:
        """``it``'s decode checked its guesses and its stream got ``run``: the cells of the
        guesses refused are freed."""
        accepted = len(run) - 1
        self.stats.accepted_drafts += accepted
        self.payoff.checked(len(it.draft), accepted)
        if accepted < len(it.draft):
            self.b.seq_rm(it.req.seq_id, it.start + 1 + accepted, -1)  # type: ignore[arg-type]
