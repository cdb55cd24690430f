"""Which cached prefixes stay when room is needed: the household's interactive prompts before
one-off work.

An entry remembers the best class that used it (the request that left it, and every hit since).
Voice and chat entries are *kept* against lower classes within a budget of cells (a share of the
pool): a background summary or an embedding job may not evict them to make room, however many
one-off prompts an evening brings. Past the budget, and for the engine itself (the pool is
needed for running work), they go like any other entry. Among the entries a request may evict,
the order is: a preempted request's work last, then entries outside the budget first, entries
no waiting request is about to use, entries that never served a hit, then least recently used.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ..scheduler import INTERACTIVE_RANK


@dataclass
class CachePolicy:
    kept_cells: int = 0  # the budget: cells of interactive prefixes lower classes may not take

    @staticmethod
    def interactive(e: Any) -> bool:
        return e.rank <= INTERACTIVE_RANK

    def by_worth(self, entries_lru: Iterable[Any]) -> list[Any]:
        """The interactive entries in the order they are worth keeping (in the pool, and on
        disk): voice before chat, most recently used first."""
        return sorted((e for e in reversed(list(entries_lru)) if self.interactive(e)),
                      key=lambda e: e.rank)  # stable: most recent first within a class

    def kept(self, entries_lru: Iterable[Any]) -> set[int]:
        """Seq ids of the entries within the budget, in :meth:`by_worth` order; an entry that
        does not fit leaves room for smaller ones."""
        kept: set[int] = set()
        room = self.kept_cells
        for e in self.by_worth(entries_lru):
            if e.own <= room:
                kept.add(e.seq_id)
                room -= e.own
        return kept

    @staticmethod
    def may_evict(e: Any, rank: int | None, kept: set[int]) -> bool:
        """Whether a request of class ``rank`` (None: the engine itself, for running work) may
        give ``e`` up."""
        return rank is None or e.seq_id not in kept or e.rank >= rank

    @staticmethod
    def victim(cands_lru: list[Any], wanted: frozenset[int], kept: set[int]) -> Any:
        """The entry to give up first among ``cands_lru`` (least recently used first)."""
        return min(cands_lru, key=lambda e: (e.resume, e.seq_id in kept, e.seq_id in wanted,
                                             e.hits > 0))
