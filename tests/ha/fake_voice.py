"""The fake server's voice-turn parts: wake-word reservations (``POST``/``DELETE
/v1/reservations``), and what a chat stream does before its answer (queue-status comments, a
wait a test releases, a superseded refusal)."""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING, Any

from aiohttp import web

if TYPE_CHECKING:
    from .fake_hearth import FakeHearth

FEATURE = "reservation"  # what /health's features name reservations
SUPERSEDED_ERROR = {"error": {"message": "a newer voice request from this satellite",
                              "type": "superseded", "code": "superseded", "param": None}}


class FakeVoice:
    """Serves reservations for a :class:`FakeHearth` and shapes its chat streams."""

    def __init__(self, fake: FakeHearth) -> None:
        self.fake = fake
        self.calls = 0  # POST /v1/reservations received, also by a server without them
        self.reservations: list[dict[str, Any]] = []  # the bodies received
        self.ended: list[str] = []  # DELETEd ids that were live
        self.live: dict[str, str] = {}  # id -> satellite
        self.delete_status: dict[str, int] = {}  # id -> status DELETE answers instead
        self.reserved = asyncio.Event()  # set at each reservation
        # Chat streams: these comment lines first (e.g. "queued position=2 eta_s=6.5"), then
        # wait for ``release`` (when set to an event) before the answer; ``refuse``: answer
        # 409 superseded instead; ``superseded_in_stream``: an error event instead of it.
        self.comments: list[str] = []
        self.release: asyncio.Event | None = None
        self.waiting = asyncio.Event()  # set while a stream waits for release
        self.refuse = False
        self.superseded_in_stream = False

    def add_routes(self, router: web.UrlDispatcher) -> None:
        router.add_post("/v1/reservations", self._reserve)
        router.add_delete("/v1/reservations/{rid}", self._end)

    async def _reserve(self, request: web.Request) -> web.Response:
        if not self.fake._authorized(request):
            return self.fake._unauthorized()
        self.calls += 1
        if FEATURE not in self.fake.features:
            return self.fake._error(404)
        body = await request.json()
        self.reservations.append(body)
        rid = f"res_{len(self.reservations)}"
        self.live[rid] = body["satellite"]
        self.reserved.set()
        return web.json_response({"id": rid, "model": body.get("model") or "fake-model",
                                  "expires_in_s": body.get("ttl_s") or 5.0})

    async def _end(self, request: web.Request) -> web.Response:
        if not self.fake._authorized(request):
            return self.fake._unauthorized()
        rid = request.match_info["rid"]
        if rid in self.delete_status:
            return self.fake._error(self.delete_status[rid])
        if self.live.pop(rid, None) is None:
            return self.fake._error(404)
        self.ended.append(rid)
        return web.json_response({"id": rid, "ended": True})

    def refusal(self, headers: dict[str, str]) -> web.Response | None:
        """The 409 a superseded request gets (None: it is answered). A voice request ends the
        live reservation of its satellite, as the server does."""
        satellite = headers.get("X-Hearth-Satellite")
        for rid, held in list(self.live.items()):
            if held == satellite:
                del self.live[rid]
        if self.refuse:
            return web.json_response(SUPERSEDED_ERROR, status=409)
        return None

    async def before_answer(self, response: web.StreamResponse) -> bool:
        """Write the comments and wait for the release; False when the stream ends here (a
        superseded error event)."""
        for comment in self.comments:
            await response.write(f": {comment}\n\n".encode())
        if self.release is not None:
            self.waiting.set()
            await self.release.wait()
            self.waiting.clear()
        if self.superseded_in_stream:
            await response.write(f"data: {json.dumps(SUPERSEDED_ERROR)}\n\n".encode())
            await response.write(b"data: [DONE]\n\n")
            return False
        return True
