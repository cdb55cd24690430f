"""The HTTP layer (aiohttp): OpenAI-compatible endpoints and the Hearth API. Thin: it validates,
turns bodies into engine requests and streams events back."""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from pydantic import BaseModel, ValidationError

from . import __version__
from .api_models import ChatCompletionRequest, CompletionRequest, EmbeddingRequest
from .engine import AsyncStream, RequestError
from .prompts import PromptError
from .requests import Request, SamplingParams
from .runtime import Runtime
from .scheduler import class_rank
from .settings import Settings

log = logging.getLogger(__name__)

RUNTIME = web.AppKey("runtime", Runtime)
MAX_BODY = 8 * 1024 * 1024
OPEN_PATHS = {"/health"}


# -- errors ------------------------------------------------------------------------------------
def error_response(status: int, message: str, code: str | None = None,
                   param: str | None = None, headers: dict[str, str] | None = None
                   ) -> web.Response:
    kind = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
            413: "invalid_request_error", 429: "rate_limit_error",
            503: "service_unavailable"}.get(status, "server_error")
    body = {"error": {"message": message, "type": kind, "param": param, "code": code}}
    return web.json_response(body, status=status, headers=headers)


class ApiError(Exception):
    def __init__(self, status: int, message: str, code: str | None = None,
                 param: str | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.code, self.param = status, message, code, param
        self.headers = headers

    def response(self) -> web.Response:
        return error_response(self.status, self.message, self.code, self.param, self.headers)


def from_request_error(e: RequestError) -> ApiError:
    headers = {"Retry-After": str(int(e.retry_after + 0.999))} if e.retry_after else None
    return ApiError(e.status, str(e), e.code, headers=headers)


@web.middleware
async def errors_and_auth(request: web.Request,
                          handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                          ) -> web.StreamResponse:
    rt = request.app[RUNTIME]
    key = rt.settings.api_key
    if key and request.path not in OPEN_PATHS:
        given = request.headers.get("Authorization", "")
        token = given[7:] if given.startswith("Bearer ") else ""
        if not hmac.compare_digest(token.encode(), key.encode()):
            return error_response(401, "invalid or missing API key", "invalid_api_key")
    try:
        return await handler(request)
    except ApiError as e:
        return e.response()
    except web.HTTPRequestEntityTooLarge:
        return error_response(413, f"request body larger than {MAX_BODY} bytes",
                              "body_too_large")
    except web.HTTPException as e:
        if e.status >= 400:
            return error_response(e.status, e.reason or "error")
        raise
    except Exception:
        log.exception("unhandled error on %s %s", request.method, request.path)
        return error_response(500, "internal server error", "internal_error")


async def read_body(request: web.Request, model: type[BaseModel]) -> Any:
    try:
        raw = await request.read()
    except web.HTTPRequestEntityTooLarge as e:
        raise ApiError(413, f"request body larger than {MAX_BODY} bytes", "body_too_large") from e
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise ApiError(400, "the body is not valid UTF-8", "invalid_utf8") from e
    except ValueError as e:
        raise ApiError(400, f"the body is not valid JSON: {e}", "invalid_json") from e
    if not isinstance(data, dict):
        raise ApiError(400, "the body must be a JSON object", "invalid_json")
    try:
        return model.model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        loc = ".".join(str(p) for p in err["loc"])
        raise ApiError(400, f"{loc}: {err['msg']}", "invalid_value", param=loc or None) from e


def ready(request: web.Request) -> Runtime:
    rt = request.app[RUNTIME]
    if rt.state != "ready":
        detail = f": {rt.error}" if rt.error else ""
        raise ApiError(503, f"the model is {rt.state}{detail}", "model_not_ready",
                       headers={"Retry-After": "5"})
    return rt


def check_model(rt: Runtime, name: str | None) -> None:
    if name and name not in (rt.model_id, "hearth", "default"):
        raise ApiError(404, f"model {name!r} does not exist; this server serves "
                            f"{rt.model_id!r}", "model_not_found", param="model")


def request_class(request: web.Request, priority: str | int | None, default: str) -> int:
    value: str | int | None = priority
    if value is None:
        value = request.headers.get("X-Hearth-Class")
    try:
        return class_rank(value if value is not None else default)
    except ValueError as e:
        raise ApiError(400, str(e), "invalid_class", param="priority") from e


def sampling_of(rt: Runtime, body: Any) -> SamplingParams:
    p = SamplingParams()
    if body.temperature is not None:
        p.temperature = body.temperature
    if body.top_p is not None:
        p.top_p = body.top_p
    if body.top_k is not None:
        p.top_k = body.top_k
    if body.min_p is not None:
        p.min_p = body.min_p
    if body.repeat_penalty is not None:
        p.repeat_penalty = body.repeat_penalty
    p.seed = body.seed
    return p


def submit(rt: Runtime, r: Request) -> None:
    try:
        rt.engine.submit(r)  # type: ignore[union-attr]
    except RequestError as e:
        raise from_request_error(e) from e


# -- handlers ----------------------------------------------------------------------------------
async def health(request: web.Request) -> web.Response:
    rt = request.app[RUNTIME]
    body = {"status": rt.state, "model": rt.model_id if rt.state == "ready" else None,
            "version": __version__}
    if rt.error:
        body["error"] = rt.error
    if rt.engine is not None and rt.engine.error is not None:
        body.update(status="failed", error=f"engine stopped: {rt.engine.error}")
    return web.json_response(body, status=200 if body["status"] == "ready" else 503)


async def models(request: web.Request) -> web.Response:
    rt = ready(request)
    return web.json_response({"object": "list", "data": [{
        "id": rt.model_id, "object": "model", "created": 0, "owned_by": "hearth",
        "meta": {"description": rt.model.description, "n_ctx": rt.backend.n_ctx,
                 "n_ctx_seq": rt.backend.n_ctx_seq, "path": rt.model_path.name}}]})


async def chat_completions(request: web.Request) -> web.StreamResponse:
    rt = ready(request)
    body: ChatCompletionRequest = await read_body(request, ChatCompletionRequest)
    check_model(rt, body.model)
    rank = request_class(request, body.priority, "chat")
    try:
        prompt = rt.formatter.render([m.model_dump(exclude_none=True) for m in body.messages],
                                     tools=[t.model_dump() for t in body.tools]
                                     if body.tools else None)
    except PromptError as e:
        raise ApiError(400, str(e), "invalid_messages", param="messages") from e
    tokens = rt.tokenize_prompt(prompt)
    max_tokens = body.max_completion_tokens or body.max_tokens or rt.settings.max_tokens_default
    return await generate(request, rt, body, tokens, rank, max_tokens, chat=True)


async def completions(request: web.Request) -> web.StreamResponse:
    rt = ready(request)
    body: CompletionRequest = await read_body(request, CompletionRequest)
    check_model(rt, body.model)
    rank = request_class(request, body.priority, "chat")
    if isinstance(body.prompt, list):
        if len(body.prompt) != 1:
            raise ApiError(400, "exactly one prompt per request", "invalid_value",
                           param="prompt")
        text = body.prompt[0]
    else:
        text = body.prompt
    tokens = rt.model.tokenize(text, add_special=True, parse_special=False)
    max_tokens = body.max_tokens or min(16, rt.settings.max_tokens_default)
    return await generate(request, rt, body, tokens, rank, max_tokens, chat=False)


async def generate(request: web.Request, rt: Runtime, body: Any, tokens: list[int], rank: int,
                   max_tokens: int, chat: bool) -> web.StreamResponse:
    stream = AsyncStream()
    r = Request(prompt=tokens, rank=rank, sink=stream, user=body.user or "anonymous",
                max_tokens=max_tokens, stop=body.stops(), ignore_eos=body.ignore_eos,
                sampling=sampling_of(rt, body))
    submit(rt, r)
    rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
    created = int(time.time())
    obj = "chat.completion" if chat else "text_completion"
    try:
        if body.stream:
            return await _stream(request, rt, r, stream, rid, created, obj, chat, body)
        text, done = [], None
        async for ev in stream.events():
            if ev.kind == "token":
                text.append(ev.text)
            elif ev.kind == "error":
                raise ApiError(ev.status, ev.message or "generation failed", "generation_failed")
            else:
                done = ev
        content = "".join(text)
        choice: dict[str, Any] = {"index": 0, "finish_reason": done.finish_reason,
                                  "logprobs": None}
        if chat:
            choice["message"] = {"role": "assistant", "content": content}
        else:
            choice["text"] = content
        return web.json_response({
            "id": rid, "object": obj, "created": created, "model": rt.model_id,
            "choices": [choice], "usage": _usage(done.usage), "hearth": done.timing})
    except (asyncio.CancelledError, ConnectionResetError):
        rt.engine.cancel(r.id)  # the client went away: free its sequence
        raise
    finally:
        if not r.finished:
            rt.engine.cancel(r.id)


def _usage(u: dict[str, int] | None) -> dict[str, Any]:
    u = u or {}
    return {"prompt_tokens": u.get("prompt_tokens", 0),
            "completion_tokens": u.get("completion_tokens", 0),
            "total_tokens": u.get("total_tokens", 0),
            "prompt_tokens_details": {"cached_tokens": u.get("cached_tokens", 0)}}


async def _stream(request: web.Request, rt: Runtime, r: Request, stream: AsyncStream, rid: str,
                  created: int, obj: str, chat: bool, body: Any) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                       "Cache-Control": "no-cache"})
    await resp.prepare(request)
    obj_chunk = "chat.completion.chunk" if chat else "text_completion"

    def chunk(delta: dict[str, Any] | str, finish: str | None) -> dict[str, Any]:
        c: dict[str, Any] = {"index": 0, "finish_reason": finish, "logprobs": None}
        if chat:
            c["delta"] = delta
        else:
            c["text"] = delta
        return {"id": rid, "object": obj_chunk, "created": created, "model": rt.model_id,
                "choices": [c]}

    async def send(payload: dict[str, Any]) -> None:
        await resp.write(b"data: " + json.dumps(payload).encode() + b"\n\n")

    if chat:
        await send(chunk({"role": "assistant", "content": ""}, None))
    async for ev in stream.events():
        if ev.kind == "token":
            if ev.text:
                await send(chunk({"content": ev.text} if chat else ev.text, None))
        elif ev.kind == "error":
            await send({"error": {"message": ev.message, "type": "server_error",
                                  "code": "generation_failed"}})
        else:
            await send(chunk({} if chat else "", ev.finish_reason))
            if body.stream_options and body.stream_options.include_usage:
                await send({"id": rid, "object": obj_chunk, "created": created,
                            "model": rt.model_id, "choices": [], "usage": _usage(ev.usage)})
    await resp.write(b"data: [DONE]\n\n")
    await resp.write_eof()
    return resp


async def embeddings(request: web.Request) -> web.Response:
    rt = ready(request)
    body: EmbeddingRequest = await read_body(request, EmbeddingRequest)
    check_model(rt, body.model)
    rank = request_class(request, body.priority, "embedding")
    raw = body.input
    if isinstance(raw, str):
        inputs = [rt.model.tokenize(raw, add_special=True, parse_special=False)]
    elif raw and all(isinstance(x, int) for x in raw):
        inputs = [list(raw)]  # type: ignore[arg-type]
    elif raw and all(isinstance(x, list) for x in raw):
        inputs = [list(x) for x in raw]  # type: ignore[union-attr]
    elif raw:
        inputs = [rt.model.tokenize(x, add_special=True, parse_special=False) for x in raw]
    else:
        raise ApiError(400, "input must not be empty", "invalid_value", param="input")
    if len(inputs) > 2048:
        raise ApiError(400, "at most 2048 inputs per request", "invalid_value", param="input")
    stream = AsyncStream()
    r = Request(prompt=inputs, rank=rank, sink=stream, user=body.user or "anonymous",
                kind="embed")
    submit(rt, r)
    async for ev in stream.events():
        if ev.kind == "error":
            raise ApiError(ev.status, ev.message or "embedding failed", "embedding_failed")
        if ev.kind == "done":
            data = [{"object": "embedding", "index": i, "embedding": v}
                    for i, v in enumerate(ev.embedding or [])]
            n = sum(len(x) for x in inputs)
            return web.json_response({"object": "list", "data": data, "model": rt.model_id,
                                      "usage": {"prompt_tokens": n, "total_tokens": n}})
    raise ApiError(500, "embedding ended without a result")


async def queue(request: web.Request) -> web.Response:
    rt = ready(request)
    core = rt.core
    with core.lock:  # type: ignore[union-attr]
        state = core.queue_state()  # type: ignore[union-attr]
        stats = core.stats.snapshot(core.b.now())  # type: ignore[union-attr]
    return web.json_response({"model": rt.model_id, "policy": rt.settings.policy,
                              **state, **stats})


def create_app(settings: Settings, runtime: Runtime | None = None) -> web.Application:
    app = web.Application(middlewares=[errors_and_auth], client_max_size=MAX_BODY)
    rt = runtime or Runtime(settings)
    app[RUNTIME] = rt
    app.router.add_get("/health", health)
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/embeddings", embeddings)
    app.router.add_get("/v1/queue", queue)

    async def on_startup(app: web.Application) -> None:
        if rt.state == "loading" and rt.engine is None:
            rt.start_loading()

    async def on_cleanup(app: web.Application) -> None:
        await asyncio.get_running_loop().run_in_executor(None, rt.close)

    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)
    return app
