"""The waiting queue, kept in order as requests come and go, so an admission pass over 250
waiting requests costs what one over a handful does.

Requests of one class and one member are always in arrival order among themselves: the
policy's key (class after aging, the member's counter, its running sequences, arrival) differs
between them only in arrival, and aging lifts the older first. So the queue keeps one list per
(class, member), in arrival order, and the admission order is a lazy merge of those lists'
heads (:class:`Pass`): a pass that admits a few requests looks at a few, plus one head per
group, and a group whose head cannot go is skipped whole (what holds it back holds back the
rest of its group too).
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Callable, Iterator
from itertools import islice
from typing import Any


def _arrival(r: Any) -> tuple[float, int]:
    return (r.arrival, r.id)


class WaitQueue(list):
    """A list of waiting requests (in the order they joined) that also keeps them grouped by
    (class, member), each group in arrival order. Mutate it with ``append``/``remove`` only."""

    def __init__(self) -> None:
        super().__init__()
        self.groups: dict[tuple[int, str], list[Any]] = {}

    def append(self, r: Any) -> None:
        super().append(r)
        g = self.groups.setdefault((r.rank, r.user), [])
        bisect.insort(g, r, key=_arrival)  # a preempted request comes back at its place

    def remove(self, r: Any) -> None:
        super().remove(r)
        key = (r.rank, r.user)
        g = self.groups[key]
        g.remove(r)
        if not g:
            del self.groups[key]

    def clear(self) -> None:
        super().clear()
        self.groups.clear()

    def heads(self) -> list[Any]:
        """The oldest request of each group: the best of its group by any of the policy's
        keys (with the same clock)."""
        return [g[0] for g in self.groups.values()]

    def users(self) -> set[str]:
        return {u for _, u in self.groups}

    def best_rank(self) -> int:
        """The best submitted class waiting (99: none)."""
        return min((rank for rank, _ in self.groups), default=99)

    def oldest(self, n: int, key: Callable[[Any], Any]) -> list[Any]:
        """The first ``n`` by ``key`` (one that orders each group as arrival does)."""
        return list(islice(heapq.merge(*self.groups.values(), key=key), max(0, n)))


class Pass:
    """The waiting requests in admission order, computed lazily: iterate it, and call
    :meth:`skip_group` after a request whose whole group cannot go this pass."""

    def __init__(self, q: WaitQueue, key: Callable[[Any], Any]):
        self._key = key
        self._groups = [list(g) for g in q.groups.values()]  # the pass changes the queue
        self._heap = [(key(g[0]), i, 0) for i, g in enumerate(self._groups)]
        heapq.heapify(self._heap)
        self._last: tuple[int, int] | None = None

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        if self._last is not None:  # the one after the last, in its group, joins the merge
            gi, i = self._last
            g = self._groups[gi]
            if i + 1 < len(g):
                heapq.heappush(self._heap, (self._key(g[i + 1]), gi, i + 1))
            self._last = None
        if not self._heap:
            raise StopIteration
        _, gi, i = heapq.heappop(self._heap)
        self._last = (gi, i)
        return self._groups[gi][i]

    def skip_group(self) -> None:
        """The rest of the last request's group is not looked at in this pass."""
        self._last = None
