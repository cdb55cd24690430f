"""Which cached prefixes stay when room is needed: the household's interactive prompts before
one-off work.

An entry remembers the best class that used it (the request that left it, and every hit since).
Voice and chat entries are *kept* against lower classes within a budget of cells (a share of the
pool): a background summary or an embedding job may not evict them to make room, however many
one-off prompts an evening brings. The budget grows to hold the voice prompts whole, up to three
quarters of the pool: a large household's ~3,000-token prompt is larger than half of a
4,096-cell pool. Past the budget, and for the engine itself (the pool is needed for
running work), they go like any other entry. Among the entries a request may evict,
the order is: a preempted request's work last, then entries outside the budget first, entries
no waiting request is about to use, entries that never served a hit, then least recently used.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from .scheduler import INTERACTIVE_RANK, VOICE_RANK

# The most of the pool the budget grows to for the voice prompts: other work keeps a quarter
# (in 4,096 cells, a one-off ~900-token prompt at a time beside a 3,000-token voice prompt).
KEPT_CEILING = 0.75


@dataclass
class CachePolicy:
    kept_cells: int = 0  # the budget: cells of interactive prefixes lower classes may not take
    pool_cells: int = 0  # the pool's size, for the ceiling the budget may grow to

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
        worth = self.by_worth(entries_lru)
        room = self.budget(worth)
        for e in worth:
            if e.own <= room:
                kept.add(e.seq_id)
                room -= e.own
        return kept

    def budget(self, worth: list[Any]) -> int:
        """The kept budget for entries in :meth:`by_worth` order: the configured share, grown
        to the voice entries' cells (a system prompt and the turns after it are entries of
        their own) up to :data:`KEPT_CEILING` of the pool; nothing with a share of 0."""
        if not self.kept_cells:
            return 0
        voice = sum(e.own for e in worth if e.rank == VOICE_RANK)
        return max(self.kept_cells, min(voice, int(KEPT_CEILING * self.pool_cells)))

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
