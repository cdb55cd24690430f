"""Several engines on one accelerator: the class order across them.

Two models' engines on one CPU or GPU compete for the same compute, and llama.cpp knows
nothing of the other's work: a summary prefilling on the background model slows a voice turn
on the voice model as much as it would in the same batch. So the rule inside one engine holds
across engines too: while an engine has voice or chat work running or waiting, the engines
whose best work is of a lower class pause between iterations. A paused engine still runs one
iteration every ``max_pause_s`` (its iterations are bounded by the latency target), so chat
that never stops cannot starve a summary.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from .scheduler import INTERACTIVE_RANK

IDLE_RANK = 99  # an engine with nothing to do


@dataclass(frozen=True)
class Arbitration:
    enabled: bool = True
    max_pause_s: float = 2.0

    def may_cut_others(self, rank: int) -> bool:
        """Whether a request of class ``rank`` arriving may pause or cut other engines' work
        (:meth:`must_pause` says which)."""
        return self.enabled and rank <= INTERACTIVE_RANK

    def must_pause(self, own: int, others: Iterable[int], paused_for_s: float) -> bool:
        """Whether an engine whose best work is of rank ``own`` waits, given the best ranks
        of the other engines and how long it has waited so far."""
        if not self.enabled or paused_for_s >= self.max_pause_s:
            return False
        best = min(others, default=IDLE_RANK)
        return best <= INTERACTIVE_RANK and own > best
