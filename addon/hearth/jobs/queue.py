"""Where a job stands in its model's queue: ``queue`` on ``GET /v1/jobs/{id}``, and progress
events on ``/v1/events`` while its request waits (when it starts waiting, then when its place
changes, at most one each ``EVERY_S``: events are kept in the store)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from ..policy.classes import CLASS_RANKS
from ..service.queued import queue_object

EVERY_S = 5.0


async def watch(store: Any, job_id: str, comp: Any, notify: Callable[[], Awaitable[None]],
                every_s: float = EVERY_S) -> None:
    """Progress events for ``job_id`` while ``comp`` waits (run beside it; cancelled after)."""
    said: int | None = None
    while (q := queue_object(comp)) is not None:  # None once admitted
        if q["position"] != said:
            said = q["position"]
            if await asyncio.to_thread(store.progress, job_id, q) is not None:
                await notify()
        await asyncio.sleep(every_s)


def queue_of(runner: Any, job: dict[str, Any]) -> dict[str, Any] | None:
    """A job's place while it waits: its request's in the engine's queue once submitted;
    before that (held back by the job runner's concurrency), behind the engine's queue for
    its class, with the class's ETA."""
    if job["status"] == "running":
        comp = runner._tasks.get(job["id"], (None, None))[1]
        if comp is not None:  # submitted with it (the engine estimates a place at submission)
            return queue_object(comp)
        if job["kind"] == "embeddings":  # runs without a completion: no place of its own
            return None
        # Taken by the runner, its completion not built yet (a model to load, a prompt to
        # render): it is about to wait in its class's queue, so it says so, not nothing.
    elif job["status"] != "queued":
        return None
    if runner.fleet.state != "ready":
        return None
    try:
        model = runner.model_for(job.get("request") or {}, job["class"])
        core = runner.fleet.workers[model].rt.core
    except Exception:  # a model not served (any more), or not loaded: no estimate
        return None
    if core is None:
        return None
    snap = core.queue_state()
    rank = CLASS_RANKS[job["class"]]
    ahead = sum(1 for w in snap.get("waiting_requests", []) if CLASS_RANKS[w["class"]] <= rank)
    return {"position": ahead + 1, "eta_s": snap.get("eta_s", {}).get(job["class"], 0.0)}
