"""Where a waiting request stands, as the wire says it: the SSE comment an OpenAI stream
carries while it waits (clients skip comments), and the ``queue`` object of a job."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def where(comp: Any) -> tuple[int, float] | None:
    """(position, eta_s) of a local completion's request while it waits for admission; None
    once it runs, or for a remote worker's (its queue is its own)."""
    core = getattr(getattr(comp, "rt", None), "core", None)
    r = getattr(comp, "request", None)
    if core is None or r is None or getattr(core, "queue_eta", None) is None:
        return None
    return core.queue_eta.position(r)


def queue_object(comp: Any) -> dict[str, Any] | None:
    """``{"position", "eta_s"}`` while ``comp`` waits, else None."""
    at = where(comp)
    return None if at is None else {"position": at[0], "eta_s": round(at[1], 1)}


def sse_status(comp: Any) -> Callable[[], bytes | None]:
    """The ``: queued position=N eta_s=X.X`` comment for ``comp`` now (None: not waiting)."""
    def line() -> bytes | None:
        at = where(comp)
        if at is None:
            return None
        return f": queued position={at[0]} eta_s={at[1]:.1f}\n\n".encode()

    return line
