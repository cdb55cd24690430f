"""One model as the fleet holds it: its runtime (local) or remote worker, its estimated memory,
its leases and its residency history; and the settings it runs with."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..policy.residency import ModelView
from ..settings import Settings
from .registry import Entry


def memory_budget(settings: Settings, meminfo: Path = Path("/proc/meminfo")) -> int:
    """The bytes resident models may take: the setting, else four fifths of RAM."""
    if settings.memory_budget_mb:
        return settings.memory_budget_mb * 1024 * 1024
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024 * 4 // 5
    except (OSError, ValueError, IndexError):
        pass
    return 1 << 62  # unknown: no limit but the machine's


def settings_for(s: Settings, e: Entry, embedding_here: bool) -> Settings:
    """The server's settings as this model runs them."""
    spec = e.spec
    return s.model_copy(update={
        "model": spec.file, "models": [],
        "n_ctx": spec.n_ctx or s.n_ctx, "n_parallel": spec.n_parallel or s.n_parallel,
        "n_gpu_layers": s.n_gpu_layers if spec.n_gpu_layers is None else spec.n_gpu_layers,
        "embedding_model": s.embedding_model if embedding_here else ""})


@dataclass
class Worker:
    entry: Entry
    rt: Any  # a Runtime, or a RemoteWorker for a model on another server
    bytes: int = 0  # estimated from the GGUF header
    meta: dict[str, Any] = field(default_factory=dict)  # that header (no arrays)
    path: Path | None = None  # the file, once it is on disk
    leases: int = 0
    waiting_ranks: list[int] = field(default_factory=list)  # each request waiting for it
    first_load: str | None = None  # how the load at start ended: ready | failed
    last_used: float = 0.0
    interactive_at: float | None = None
    keep_alive_s: float | None = None  # a request's keep_alive (Ollama's) overrides the spec's
    loads: int = 0
    unloads: int = 0
    tasks: set[asyncio.Task] = field(default_factory=set)

    @property
    def waiting(self) -> int:
        """Requests waiting for it to load: it is busy for the policy too."""
        return len(self.waiting_ranks)

    @property
    def name(self) -> str:
        return self.entry.name

    @property
    def remote(self) -> bool:
        return bool(self.entry.spec.url)

    def view(self) -> ModelView:
        if self.remote:  # takes no memory here, and is never unloaded
            return ModelView(self.name, 0, loaded=True, pinned=True, busy=self.leases)
        ka = self.keep_alive_s if self.keep_alive_s is not None else self.entry.spec.keep_alive_s
        st = self.rt.state
        return ModelView(self.name, self.bytes, loaded=st in ("ready", "unloading"),
                         loading=st == "loading", unloading=st == "unloading",
                         pinned=self.entry.spec.pinned, keep_alive_s=None if ka < 0 else ka,
                         last_used=self.last_used, busy=self.leases + self.waiting,
                         interactive_at=self.interactive_at)
