"""Which models are resident when memory holds fewer than the household configured.

Plain Python over a snapshot of the models; the fleet carries the decisions out (loading and
unloading off the request path). The rules:

- Resident models never exceed the budget (bytes, from each model's GGUF estimate).
- A pinned model is never unloaded; a model with work running or waiting is never unloaded.
- A model that served an interactive class (voice or chat) within ``interactive_grace_s`` is not
  unloaded to make room for a lower class's model: the voice model stays while the household
  speaks, whatever a summary wants.
- Otherwise victims go least recently used first, and only as many as the load needs. When no
  set of victims frees enough, the request waits (``Plan.wait``) until work finishes, rather than
  failing; a model larger than the budget left beside the pinned models is an error at once.
- An idle model past its keep-alive is unloaded (``expired``); pinned models have none.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from .scheduler import INTERACTIVE_RANK


@dataclass
class ModelView:
    name: str
    bytes: int
    loaded: bool = False
    loading: bool = False
    unloading: bool = False  # still resident until its unload ends; never a victim twice
    pinned: bool = False
    keep_alive_s: float | None = 300.0  # None: never unloaded for idleness
    last_used: float = 0.0
    busy: int = 0  # requests running or waiting on it
    interactive_at: float | None = None  # when it last served voice or chat

    @property
    def resident(self) -> bool:
        return self.loaded or self.loading


@dataclass
class Plan:
    load: str | None = None
    unload: list[str] = field(default_factory=list)
    wait: bool = False  # room may come once running work finishes
    error: str | None = None


@dataclass
class ResidencyPolicy:
    budget_bytes: int
    interactive_grace_s: float = 300.0

    def used(self, models: Iterable[ModelView]) -> int:
        return sum(m.bytes for m in models if m.resident)

    def _protected(self, m: ModelView, rank: int, now: float) -> bool:
        if m.pinned or m.busy or m.loading or m.unloading:
            return True
        recent = m.interactive_at is not None and now - m.interactive_at < \
            self.interactive_grace_s
        return recent and rank > INTERACTIVE_RANK

    def plan(self, models: list[ModelView], wanted: str, rank: int, now: float) -> Plan:
        """What to do for a request of class ``rank`` to model ``wanted``."""
        by_name = {m.name: m for m in models}
        target = by_name[wanted]
        if target.resident:
            return Plan()
        if target.bytes > self.budget_bytes:
            return Plan(error=f"model {wanted!r} needs {target.bytes / 2**20:.0f} MiB; the "
                        f"memory budget is {self.budget_bytes / 2**20:.0f} MiB")
        pinned = sum(m.bytes for m in models if m.pinned and m.resident)
        if target.bytes > self.budget_bytes - pinned:
            return Plan(error=f"model {wanted!r} needs {target.bytes / 2**20:.0f} MiB; beside "
                        f"the pinned models {(self.budget_bytes - pinned) / 2**20:.0f} MiB of "
                        "the memory budget are left")
        free = self.budget_bytes - self.used(models)
        victims: list[str] = []
        candidates = sorted((m for m in models if m.loaded and m.name != wanted
                             and not self._protected(m, rank, now)),
                            key=lambda m: m.last_used)
        for m in candidates:
            if free >= target.bytes:
                break
            victims.append(m.name)
            free += m.bytes
        if free < target.bytes:
            return Plan(wait=True)
        return Plan(load=wanted, unload=victims)

    def expired(self, models: Iterable[ModelView], now: float) -> list[str]:
        """Idle models past their keep-alive."""
        return [m.name for m in models
                if m.loaded and not m.unloading and not m.pinned and not m.busy
                and m.keep_alive_s is not None
                and now - m.last_used >= m.keep_alive_s]
