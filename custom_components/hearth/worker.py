"""The model's worker process, as ``/v1/queue`` reports it: llama.cpp runs in a supervised
process per model, which the server restarts when it dies (a segmentation fault, an illegal
instruction, an out-of-memory kill, a hang). Older servers report no ``worker``; a remote
voice model reports it as null."""

from __future__ import annotations

from typing import Any

from homeassistant.util import dt as dt_util

WORKER_STATES = ["serving", "restarting", "failed", "starting", "stopped"]

# What changes rarely (a crash, a restart): each change of an attribute is a new state row in
# the recorder, so the per-iteration boundary numbers are a sensor of their own instead.
WORKER_ATTRIBUTES = ("cpu_rung", "cpu_variant", "rungs_skipped", "restarts", "quarantined")
CRASH_ATTRIBUTES = ("cause", "during", "requests_failed")


def worker_of(data: dict[str, Any] | None) -> dict[str, Any] | None:
    """The voice model's worker, or None (an older server, or a remote voice model)."""
    worker = (data or {}).get("worker")
    return worker if isinstance(worker, dict) else None


def has_worker(data: dict[str, Any]) -> bool:
    """Whether the server reports the voice model's worker."""
    return worker_of(data) is not None


def worker_state(data: dict[str, Any]) -> str | None:
    """The voice model's worker's state, one of WORKER_STATES."""
    state = (worker_of(data) or {}).get("state")
    return state if state in WORKER_STATES else None


def boundary_overhead(data: dict[str, Any]) -> float | None:
    """What the process boundary costs per engine iteration, in µs; None before the worker's
    first iteration (the server reports 0 then)."""
    boundary = (worker_of(data) or {}).get("boundary")
    if not isinstance(boundary, dict) or not boundary.get("iterations"):
        return None
    value = boundary.get("per_iteration_us")
    return value if isinstance(value, int | float) and not isinstance(value, bool) else None


def _crash_time(at: Any) -> str | None:
    if isinstance(at, bool) or not isinstance(at, int | float):
        return None
    return dt_util.utc_from_timestamp(at).isoformat()


def worker_attributes(data: dict[str, Any]) -> dict[str, Any]:
    """The worker's CPU rung, restarts and quarantined requests, and its last crash: cause,
    time (ISO), what it was doing and how many requests failed with it."""
    worker = worker_of(data) or {}
    attributes = {key: worker[key] for key in WORKER_ATTRIBUTES if worker.get(key) is not None}
    crash = worker.get("last_crash")
    if isinstance(crash, dict):
        attributes.update(
            {f"last_crash_{key}": crash[key] for key in CRASH_ATTRIBUTES
             if crash.get(key) is not None}
        )
        if (at := _crash_time(crash.get("at"))) is not None:
            attributes["last_crash_at"] = at
    return attributes


def model_worker_attributes(info: dict[str, Any]) -> dict[str, Any]:
    """A model's worker state and its last crash's cause, for the model's own sensor."""
    worker = info.get("worker")
    if not isinstance(worker, dict):
        return {}
    attributes: dict[str, Any] = {"worker": worker.get("state")}
    crash = worker.get("last_crash")
    if isinstance(crash, dict) and crash.get("cause"):
        attributes["worker_last_crash"] = crash["cause"]
    return attributes


def failed_workers(data: dict[str, Any] | None) -> dict[str, str]:
    """The models whose worker failed (the server could not restart it), each with why."""
    found: dict[str, tuple[dict[str, Any], Any]] = {}
    models = (data or {}).get("models")
    for name, info in (models if isinstance(models, dict) else {}).items():
        if isinstance(info, dict) and isinstance(worker := info.get("worker"), dict):
            found[str(name)] = (worker, info.get("error"))
    # The top-level worker is the voice model's, also under "models" on current servers.
    top = worker_of(data)
    if top is not None and all(top != worker for worker, _ in found.values()):
        found[str((data or {}).get("model") or "voice")] = (top, None)
    failed = {}
    for name, (worker, error) in found.items():
        if worker.get("state") != "failed":
            continue
        crash = worker.get("last_crash")
        cause = crash.get("cause") if isinstance(crash, dict) else None
        failed[name] = str(cause or error or "unknown cause")
    return failed
