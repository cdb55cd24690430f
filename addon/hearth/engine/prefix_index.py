"""The prefix cache's entries and how a prompt finds the ones it may share: the lookup side of
:mod:`hearth.engine.kvcache` (which keeps the cells' accounting and decides what is given up)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

INDEX_LEN = 16  # a shared prefix shorter than this is not worth a lookup


@dataclass(eq=False)
class PrefixEntry:
    seq_id: int
    tokens: list[int]
    own: int  # cells this entry alone keeps alive
    shared: PrefixEntry | None = None  # the entry its first cells are shared with
    sharers: set = field(default_factory=set)  # objects (requests/entries) sharing our cells
    hits: int = 0
    rank: int = 99  # the best class that left it or was served by it (see policy.cache)
    born: float = 0.0  # when its first tokens were cached (engine clock)
    resume: bool = False  # a preempted request's work, until it is used again


def common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    if n == 0 or a[0] != b[0]:
        return 0
    # Exponential probe then binary search: slices compare in C, far faster than a Python loop.
    lo, step = 0, 64
    while lo < n:
        hi = min(n, lo + step)
        if a[lo:hi] != b[lo:hi]:
            break
        lo, step = hi, step * 2
    else:
        return n
    hi = min(n, lo + step)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo if a[lo] != b[lo] else lo + 1


class PrefixIndex:
    """Entries by their first ``INDEX_LEN`` tokens (shorter ones apart): a lookup compares only
    the entries that can share a useful prefix with the prompt, not every entry."""

    def __init__(self) -> None:
        self._buckets: dict[tuple[int, ...], dict[int, PrefixEntry]] = {}

    @staticmethod
    def key(tokens: list[int]) -> tuple[int, ...]:
        return tuple(tokens[:INDEX_LEN]) if len(tokens) >= INDEX_LEN else ()

    def candidates(self, tokens: list[int]) -> Iterator[PrefixEntry]:
        """The entries that may share at least ``INDEX_LEN`` tokens with ``tokens``, and those
        shorter than that."""
        key = self.key(tokens)
        if key:
            yield from self._buckets.get(key, {}).values()
        yield from self._buckets.get((), {}).values()

    def add(self, e: PrefixEntry) -> None:
        self._buckets.setdefault(self.key(e.tokens), {})[e.seq_id] = e

    def remove(self, e: PrefixEntry, tokens: list[int] | None = None) -> None:
        """Forget ``e``, filed under ``tokens`` (default: its own)."""
        key = self.key(e.tokens if tokens is None else tokens)
        bucket = self._buckets[key]
        del bucket[e.seq_id]
        if not bucket:
            del self._buckets[key]

    def moved(self, e: PrefixEntry, old_tokens: list[int]) -> None:
        """``e``'s tokens changed from ``old_tokens`` (it was cut): file it anew."""
        if self.key(old_tokens) != self.key(e.tokens):
            self.remove(e, old_tokens)
            self.add(e)
