"""The HTTP layer (aiohttp): OpenAI-compatible endpoints and the Hearth API. Thin: it checks
auth, validates bodies, hands them to :mod:`hearth.chat.completions` /
:mod:`hearth.jobs.runner` and writes the answers."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import uuid
from collections.abc import AsyncIterator, Awaitable
from pathlib import Path
from typing import Any

from aiohttp import ClientSession, web

from . import __version__, discovery
from .api import ollama, queue_stream, reservations
from .api.claims import VoiceShares, claimed_rank, pinned_user
from .api.guard import Guard
from .api.http import (
    CLOSING,
    FLEET,
    GUARD,
    JOBS,
    KEEPALIVE_S,
    MAX_BODY,
    METRICS,
    SSE_KEEPALIVE,
    VOICE_SHARES,
    ApiError,
    class_header,
    errors_and_auth,
    read_body,
    ready,
    request_user,
    serve_completion,
)
from .api.metrics import CONTENT_TYPE, Metrics
from .api.names import listed, with_model
from .api.openapi import build as build_openapi
from .chat.api_models import ChatCompletionRequest, CompletionRequest, EmbeddingRequest, JobCreate
from .fleet.fleet import Fleet
from .fleet.runtime import Runtime
from .jobs import queue as job_queue
from .jobs.runner import JobRunner, validate_job_request
from .jobs.store import STATUSES, JobStore
from .policy.scheduler import RANK_NAMES, class_rank
from .service.queued import sse_status
from .service.serving import completion, embeddings, warm
from .settings import Settings

log = logging.getLogger(__name__)

SERVER_ID = web.AppKey("server_id", str)
FEATURES = ("tool_argument_sets", queue_stream.FEATURE, *reservations.FEATURES)


def server_id(data_dir: str) -> str:
    """This server's id, the same at any address and across restarts (kept in data_dir):
    Home Assistant tells one server added by hand and found by discovery by it."""
    path = Path(data_dir) / "server_id"
    try:
        found = path.read_text().strip()
        if found:
            return found
    except OSError:
        pass
    made = uuid.uuid4().hex
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(made + "\n")
    return made


# -- OpenAI-compatible -------------------------------------------------------------------------
async def health(request: web.Request) -> web.Response:
    fleet = request.app[FLEET]
    primary = fleet.primary.rt
    state = fleet.state
    body: dict[str, Any] = {"status": state,
                            "model": primary.model_id if primary.state == "ready" else None,
                            "version": __version__, "server_id": request.app[SERVER_ID],
                            # what a client may rely on beyond the version's API
                            "features": list(FEATURES)}
    if state == "ready":
        body["backends"] = sorted({b for w in fleet.loaded() for b in w.rt.backends})
        if (sup := getattr(primary, "supervisor", None)) is not None:  # its llama.cpp's CPU
            report = sup.report()
            body["cpu"] = {"variant": report["cpu_variant"], "rung": report["cpu_rung"],
                           "rungs_skipped": report["rungs_skipped"],
                           # serving one rung down is ready, with why and what it costs
                           "step_down": report["step_down"]}
        if why := fleet.degraded():  # still answering: requests wait for the worker's restart
            body.update(status="degraded", reason=why)
    if fleet.error:
        body["error"] = fleet.error
    if (died := fleet.engine_error) is not None:
        body["error"] = f"engine stopped: {died}"
    if len(fleet.workers) > 1:
        body["models"] = {w.name: w.rt.state for w in fleet.workers.values()}
    return web.json_response(body, status=200 if state == "ready" else 503)


async def models(request: web.Request) -> web.Response:
    """Every model and its class aliases, loaded or not (a request loads it)."""
    ready(request)
    data = []
    for w, names in listed(request):
        rt = w.rt
        meta: dict[str, Any] = {"state": rt.state}
        if w.remote:
            meta.update(url=rt.shown_url, kind=w.entry.spec.kind)
        else:
            meta.update(memory_bytes=w.bytes, n_ctx=rt.settings.n_ctx)
        if rt.state == "ready" and not w.remote:
            meta.update(description=rt.model.description, n_ctx=rt.backend.n_ctx,
                        n_ctx_seq=rt.backend.n_ctx_seq, file=rt.model_path.name)
        data.append({"id": names[0], "object": "model", "created": 0, "owned_by": "hearth",
                     "meta": meta})
        for name in names[1:]:  # the class aliases, after the model itself
            data.append({"id": name, "object": "model", "created": 0, "owned_by": "hearth",
                         "meta": {**meta, "alias_of": names[0],
                                  "class": name.rsplit(":", 1)[1]}})
    return web.json_response({"object": "list", "data": data})


async def chat_completions(request: web.Request) -> web.StreamResponse:
    ready(request)
    return await _complete(request, await read_body(request, ChatCompletionRequest))


async def completions(request: web.Request) -> web.StreamResponse:
    ready(request)
    return await _complete(request, await read_body(request, CompletionRequest))


async def _complete(request: web.Request, body: ChatCompletionRequest | CompletionRequest
                    ) -> web.StreamResponse:
    user = request_user(request, body.user)

    async def run(rt: Any, rank: int) -> web.StreamResponse:
        return await openai_answer(request, await completion(rt, body, rank, user))

    return await with_model(request, body.model, body.priority, "chat", run, user=user)


async def _sse(chunks: AsyncIterator[dict[str, Any]]) -> AsyncIterator[bytes]:
    async for chunk in chunks:
        yield b"data: " + json.dumps(chunk).encode() + b"\n\n"
    yield b"data: [DONE]\n\n"


def openai_answer(request: web.Request, comp: Any) -> Awaitable[web.StreamResponse]:
    return serve_completion(request, comp, comp.body.stream, "text/event-stream", _sse,
                            keepalive=SSE_KEEPALIVE, status=sse_status(comp))


async def embeddings_handler(request: web.Request) -> web.Response:
    ready(request)
    body = await read_body(request, EmbeddingRequest)
    user = request_user(request, body.user)
    return web.json_response(await with_model(
        request, body.model, body.priority, "embedding",
        lambda rt, rank: embeddings(rt, body.input, rank, user), user=user))


# -- Hearth API --------------------------------------------------------------------------------
async def warm_cache(request: web.Request) -> web.Response:
    """Cache a chat prompt for the class that will use it (voice unless named)."""
    ready(request)
    body = await read_body(request, ChatCompletionRequest)
    return web.json_response(await with_model(
        request, body.model, body.priority, "voice", lambda rt, rank: warm(rt, body, rank),
        user=request_user(request, body.user)))


async def queue(request: web.Request) -> web.Response:
    """The voice model's queue (the household's headline), every model's residency, jobs;
    pushed as it changes by ``/v1/queue/events`` (api/queue_stream.py)."""
    ready(request)
    return web.json_response(await queue_stream.queue_body(request.app))


async def create_job(request: web.Request) -> web.Response:
    body = await read_body(request, JobCreate)
    validate_job_request(body.kind, body.request)
    # A member key's job runs in its classes, as its member.
    cls = RANK_NAMES[claimed_rank(request, class_rank(body.cls), "cls" in body.model_fields_set)]
    if pinned := pinned_user(request):
        body.request["user"] = pinned
    request.app[JOBS].model_for(body.request, cls)  # 404 now, not when it runs
    job = await request.app[JOBS].submit(body.kind, cls, body.tag, body.request)
    return web.json_response(job, status=202)


async def list_jobs(request: web.Request) -> web.Response:
    status = request.query.get("status")
    if status is not None and status not in STATUSES:
        raise ApiError(400, f"status must be one of {', '.join(STATUSES)}", "invalid_value",
                       "status")
    try:
        limit = int(request.query.get("limit", "100"))
    except ValueError as e:
        raise ApiError(400, "limit must be an integer", "invalid_value", "limit") from e
    if not 1 <= limit <= 1000:
        raise ApiError(400, "limit must be 1..1000", "invalid_value", "limit")
    jobs = await asyncio.to_thread(request.app[JOBS].store.list, status, limit)
    return web.json_response({"object": "list", "data": jobs})


async def get_job(request: web.Request) -> web.Response:
    runner = request.app[JOBS]
    job = await asyncio.to_thread(runner.store.get, request.match_info["job_id"], True)
    if job is None:
        raise ApiError(404, "no such job", "job_not_found", "job_id")
    job["queue"] = job_queue.queue_of(runner, job)  # while it waits, else null
    job.pop("request")
    return web.json_response(job)


async def delete_job(request: web.Request) -> web.Response:
    runner = request.app[JOBS]
    job_id = request.match_info["job_id"]
    job = await runner.cancel(job_id)
    if job is None:
        job = await asyncio.to_thread(runner.store.get, job_id)
        if job is None:
            raise ApiError(404, "no such job", "job_not_found", "job_id")
    return web.json_response(job)


async def events(request: web.Request) -> web.StreamResponse:
    """Job state changes as SSE. Each event carries its id; a client that reconnects with
    ``Last-Event-ID`` (or ``?after=``) gets everything it missed, in order."""
    runner = request.app[JOBS]
    cursor_s = request.headers.get("Last-Event-ID") or request.query.get("after")
    try:
        cursor = int(cursor_s) if cursor_s else await asyncio.to_thread(runner.store.last_event)
    except ValueError as e:
        raise ApiError(400, "Last-Event-ID must be an integer", "invalid_value") from e
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                       "Cache-Control": "no-cache"})
    await resp.prepare(request)
    try:
        await resp.write(b": hearth events\n\n")
        while not request.app[CLOSING].is_set():
            for seq, payload in await asyncio.to_thread(runner.store.events_after, cursor):
                await resp.write(f"id: {seq}\nevent: job\ndata: {payload}\n\n".encode())
                cursor = seq
            if request.transport is None or request.transport.is_closing():
                break  # the client left
            async with runner.changed:
                try:
                    await asyncio.wait_for(runner.changed.wait(), KEEPALIVE_S)
                except TimeoutError:
                    await resp.write(SSE_KEEPALIVE)
    except ConnectionResetError:
        pass  # the client left mid-write
    return resp


async def metrics(request: web.Request) -> web.Response:
    request.app[METRICS].job_counts = await asyncio.to_thread(request.app[JOBS].store.counts)
    return web.Response(body=request.app[METRICS].render(),
                        headers={"Content-Type": CONTENT_TYPE})


async def openapi(request: web.Request) -> web.Response:
    return web.json_response(build_openapi())


# -- the application ---------------------------------------------------------------------------
def create_app(settings: Settings, runtime: Runtime | None = None) -> web.Application:
    app = web.Application(middlewares=[errors_and_auth], client_max_size=MAX_BODY)
    fleet = Fleet(settings, runtime)
    app[FLEET] = fleet
    app[SERVER_ID] = server_id(settings.data_dir)
    app[GUARD] = Guard(settings.allowed_hosts, settings.allowed_origins, own_names=[settings.host])
    app[VOICE_SHARES] = VoiceShares(settings.voice_per_member)
    app.on_response_prepare.append(class_header)
    store = JobStore(Path(settings.data_dir) / "jobs.sqlite3", max_active=settings.job_queue_max,
                     max_bytes=settings.job_store_max_mb * 1_000_000,
                     max_request_bytes=settings.job_request_max_kb * 1_000)
    app[JOBS] = JobRunner(store, fleet, app[VOICE_SHARES],
                          concurrency=max(2, settings.n_parallel),
                          retention_s=settings.job_retention_hours * 3600)
    app[METRICS] = Metrics(fleet)
    app[CLOSING] = asyncio.Event()
    r = app.router
    r.add_get("/health", health)
    r.add_get("/v1/models", models)
    r.add_post("/v1/chat/completions", chat_completions)
    r.add_post("/v1/completions", completions)
    r.add_post("/v1/embeddings", embeddings_handler)
    r.add_get("/v1/queue", queue)
    r.add_post("/v1/cache/warm", warm_cache)
    r.add_post("/v1/jobs", create_job)
    r.add_get("/v1/jobs", list_jobs)
    r.add_get("/v1/jobs/{job_id}", get_job)
    r.add_delete("/v1/jobs/{job_id}", delete_job)
    r.add_get("/v1/events", events)
    queue_stream.install(app)  # GET /v1/queue/events
    reservations.install(app)  # POST /v1/reservations, DELETE /v1/reservations/{id}
    r.add_get("/metrics", metrics)
    r.add_get("/openapi.json", openapi)
    ollama.add_routes(r)
    app.on_startup.append(_startup)
    app.on_shutdown.append(_shutdown)
    app.on_cleanup.append(_cleanup)
    return app


async def _startup(app: web.Application) -> None:
    await app[FLEET].start()
    await app[JOBS].start()
    app["bg_tasks"] = [asyncio.create_task(_announce_when_ready(app))]


async def _announce_when_ready(app: web.Application) -> None:
    """Announce to the Supervisor once the models loaded at start are: Home Assistant sets the
    integration up from the announcement at once, and a server still loading would answer it
    503. (on_startup also runs before the port is bound.)"""
    fleet = app[FLEET]
    # Waits of a second at most: a stop during a long download must not leave a thread
    # blocked for the executor's shutdown to wait on.
    for name in fleet.start_models:
        while not await asyncio.to_thread(fleet.workers[name].rt.settled.wait, 1.0):
            pass
    if fleet.state != "ready":
        return  # the load failed: the log says why, and there is nothing to set up
    await asyncio.sleep(0.25)  # the port is bound by now, however fast the model loaded
    # HEARTH_SUPERVISOR_URL points tests (or an unusual setup) at another Supervisor.
    url = os.environ.get("HEARTH_SUPERVISOR_URL", discovery.SUPERVISOR_URL)
    async with ClientSession() as session:
        # The Supervisor may still be starting with the host: retry for about a minute.
        await discovery.announce(fleet.settings, session, supervisor_url=url, attempts=7)


async def _shutdown(app: web.Application) -> None:
    app[CLOSING].set()  # event streams end instead of holding the shutdown
    await app[JOBS].notify()
    for t in app.get("bg_tasks", []):
        t.cancel()
    await app[JOBS].stop()
    await app[FLEET].stop()


async def _cleanup(app: web.Application) -> None:
    await asyncio.get_running_loop().run_in_executor(None, app[FLEET].close)
    app[JOBS].store.close()
