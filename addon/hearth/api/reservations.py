"""``POST /v1/reservations`` and ``DELETE /v1/reservations/{id}``: a satellite heard its wake
word (Home Assistant tells), so a voice turn for a model comes in a few seconds. The model's
engine holds lower classes' prompt chunks for the reservation's time and computes the voice
prompt given as ``warm`` (a ``/v1/cache/warm`` body) as voice work, so the turn finds it
cached. The rules (expiry, one per satellite, bounds) are the policy's
(:mod:`hearth.policy.reservations`); the engine's side is :mod:`hearth.engine.satellites`."""

from __future__ import annotations

import asyncio
import logging
import uuid

from aiohttp import web
from pydantic import ValidationError

from ..chat.api_models import ChatCompletionRequest, ReservationCreate
from ..engine.satellites import RESERVATION_WARM
from ..policy.classes import VOICE_RANK
from ..service.serving import completion
from .http import FLEET, ApiError, read_body, ready, validation_error
from .names import resolve

log = logging.getLogger(__name__)

FEATURES = ("reservation", "queue_eta", "supersede", "deadlines")
BOOK = web.AppKey("reservations", dict)  # reservation id -> model name
TASKS = web.AppKey("reservation_tasks", set)


async def create(request: web.Request) -> web.Response:
    fleet = ready(request)
    body = await read_body(request, ReservationCreate)
    warm = None
    if body.warm is not None:
        try:
            warm = ChatCompletionRequest.model_validate(body.warm)
        except ValidationError as e:
            raise validation_error(e, "warm") from e
    name, _ = resolve(request, body.model)
    name = name or fleet.registry.for_class("voice")
    w = fleet.workers[name]
    core = None if w.remote or w.rt.state != "ready" else w.rt.core
    if core is None:  # nothing runs there to hold back; the warm-up loads it
        rid, expires = "rsv_" + uuid.uuid4().hex[:16], 0.0
    else:
        res = core.satellites.reserve(body.satellite, body.ttl_s)
        rid, expires = res.id, max(0.0, res.expires_at - core.b.now())
        request.app[BOOK][rid] = name
        if len(request.app[BOOK]) > 1024:  # ids of long-ended reservations are forgotten
            for old in list(request.app[BOOK])[:512]:
                del request.app[BOOK][old]
    if warm is not None and not w.remote:
        task = asyncio.create_task(_warm(request.app, name, warm))
        request.app[TASKS].add(task)
        task.add_done_callback(request.app[TASKS].discard)
    return web.json_response({"id": rid, "model": name,
                              "expires_in_s": round(expires, 3)})


async def _warm(app: web.Application, name: str, body: ChatCompletionRequest) -> None:
    """The voice prompt computed as voice work (one token), kept for voice."""
    body = body.model_copy(update={"max_tokens": 1, "max_completion_tokens": None,
                                   "stream": False, "temperature": 0.0,
                                   "response_format": None})
    try:
        async with app[FLEET].use(name, VOICE_RANK) as rt:
            comp = await completion(rt, body, VOICE_RANK, keep_rank=VOICE_RANK)
            comp.request.meta[RESERVATION_WARM] = True
            comp.submit()
            try:
                await comp.result()
            finally:
                comp.cancel()
    except asyncio.CancelledError:
        raise
    except Exception as e:  # a warm-up that fails costs the turn its head start, nothing more
        log.info("a reservation's warm-up failed: %s", e)


async def delete(request: web.Request) -> web.Response:
    rid = request.match_info["rid"]
    name = request.app[BOOK].pop(rid, None)
    w = request.app[FLEET].workers.get(name) if name else None
    core = w.rt.core if w is not None and not w.remote else None
    if core is None or not core.satellites.book.end(rid):
        raise ApiError(404, "no such reservation (ended, expired or never made)",
                       "reservation_not_found", "id")
    return web.json_response({"id": rid, "ended": True})


def install(app: web.Application) -> None:
    app[BOOK] = {}
    app[TASKS] = set()
    app.router.add_post("/v1/reservations", create)
    app.router.add_delete("/v1/reservations/{rid}", delete)

    async def stop(_app: web.Application) -> None:
        for t in list(app[TASKS]):
            t.cancel()

    app.on_shutdown.append(stop)
