"""``X-Hearth-Satellite``: the voice satellite a voice request comes from (Home Assistant sends
its entity id), so a newer turn supersedes its older one still waiting and ends the
satellite's wake-word reservation (:mod:`hearth.engine.satellites`)."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from ..engine.satellites import SATELLITE
from ..policy.classes import VOICE_RANK

SATELLITE_HEADER = "X-Hearth-Satellite"


def tag_satellite(request: web.Request, comp: Any) -> None:
    """Mark a local voice completion with its satellite, before it is submitted."""
    sat = request.headers.get(SATELLITE_HEADER)
    r = getattr(comp, "request", None)
    if sat and r is not None and r.rank == VOICE_RANK:
        r.meta[SATELLITE] = sat[:256]
