"""What every route shares: application keys, errors in the shape of the API asked (OpenAI's
``{"error": {...}}`` or Ollama's ``{"error": "..."}``), auth, body validation, and who and which
class a request is."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from aiohttp import web
from pydantic import BaseModel, ValidationError

from ..chat.completions import CompletionError
from ..fleet.fleet import Fleet
from ..jobs.runner import JobRunner
from ..policy.scheduler import class_rank
from .claims import VoiceShares, authenticate, claimed_rank, key_required, pinned_user
from .guard import Guard
from .metrics import Metrics
from .satellite import tag_satellite

log = logging.getLogger(__name__)

FLEET = web.AppKey("fleet", Fleet)
JOBS = web.AppKey("jobs", JobRunner)
METRICS = web.AppKey("metrics", Metrics)
CLOSING = web.AppKey("closing", asyncio.Event)
GUARD = web.AppKey("guard", Guard)
VOICE_SHARES = web.AppKey("voice_shares", VoiceShares)
CLASS_USED = "hearth.class"  # the class a request ran in, for its X-Hearth-Class header
MAX_BODY = 8 * 1024 * 1024
BIG_BODY = 256 * 1024
OPEN_PATHS = {"/health", "/"}
# Every SSE stream (answers, jobs, queue health) comments after this long without an event:
# clients give up on a silent socket.
KEEPALIVE_S = 15.0
SSE_KEEPALIVE = b": keepalive\n\n"
STATUS_S = 1.0  # a waiting stream's queue comments: at most one a second
STATUS_TICK_S = 0.25  # how often a waiting stream looks at where it stands
OLLAMA_PREFIX = "/api/"

_KINDS = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
          404: "not_found_error", 405: "invalid_request_error", 413: "invalid_request_error",
          409: "superseded",  # a newer voice turn from the same satellite (the only 409)
          415: "invalid_request_error", 429: "rate_limit_error", 503: "service_unavailable"}


def error_response(status: int, message: str, code: str | None = None,
                   param: str | None = None, retry_after: float | None = None,
                   ollama: bool = False) -> web.Response:
    if ollama:  # Ollama's clients read a bare string (the python client's ResponseError)
        body: dict[str, Any] = {"error": message}
    else:
        body = {"error": {"message": message, "type": _KINDS.get(status, "server_error"),
                          "param": param, "code": code}}
    headers = {"Retry-After": str(max(1, round(retry_after)))} if retry_after else None
    return web.json_response(body, status=status, headers=headers)


class ApiError(CompletionError):
    pass


@web.middleware
async def errors_and_auth(request: web.Request,
                          handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                          ) -> web.StreamResponse:
    ollama = request.path.startswith(OLLAMA_PREFIX)
    if (refusal := _refused_by_guard(request, ollama)) is not None:
        return refusal
    settings = request.app[FLEET].settings
    # Constant-time comparisons; keys are never logged.
    if key_required(settings) and request.path not in OPEN_PATHS \
            and not authenticate(request, settings):
        return error_response(401, "invalid or missing API key", "invalid_api_key",
                              ollama=ollama)
    try:
        return await handler(request)
    except CompletionError as e:
        return error_response(e.status, e.message, e.code, e.param, e.retry_after, ollama)
    except web.HTTPException as e:
        if e.status >= 400:
            code = "body_too_large" if e.status == 413 else None
            return error_response(e.status, e.reason or "error", code, ollama=ollama)
        raise
    except (asyncio.CancelledError, ConnectionResetError):
        raise
    except Exception:
        log.exception("unhandled error on %s %s", request.method, request.path)
        return error_response(500, "internal server error", "internal_error", ollama=ollama)


def _refused_by_guard(request: web.Request, ollama: bool) -> web.Response | None:
    """A browser's cross-site request or a rebinding page's, or a body that is not JSON."""
    guard = request.app[GUARD]
    host = request.headers.get("Host")
    if not guard.host_allowed(host):
        shown = (host or "")[:100]
        log.warning("refused %s %s for Host %r (not a local name; see allowed_hosts)",
                    request.method, request.path, shown)
        return error_response(403, f"Host {shown!r} is not one of this "
                              "server's names; add it to allowed_hosts", "host_not_allowed",
                              ollama=ollama)
    origin = request.headers.get("Origin")
    if not guard.origin_allowed(origin, host):
        log.warning("refused a cross-site %s %s from Origin %r (see allowed_origins)",
                    request.method, request.path, origin[:100] if origin else origin)
        return error_response(403, "cross-site requests are not allowed; add the page's "
                              "origin to allowed_origins", "origin_not_allowed", ollama=ollama)
    has_body = request.body_exists or bool(request.content_length)
    if not guard.json_body_allowed(request.method, request.headers.get("Content-Type", ""),
                                   has_body):
        return error_response(415, "send the body as JSON with 'Content-Type: "
                              "application/json'", "unsupported_media_type", ollama=ollama)
    return None


async def class_header(request: web.Request, response: web.StreamResponse) -> None:
    """on_response_prepare: the class the request ran in (voice past a member's share runs as
    chat; a member key's default class)."""
    if (used := request.get(CLASS_USED)) is not None:
        response.headers["X-Hearth-Class"] = used


def validation_error(e: ValidationError, prefix: str = "") -> ApiError:
    """A 400 naming the first bad field, as a dotted path."""
    err = e.errors()[0]
    loc = ".".join(str(p) for p in (*([prefix] if prefix else []), *err["loc"]))
    return ApiError(400, f"{loc}: {err['msg']}" if loc else err["msg"], "invalid_value",
                    loc or None)


async def read_body(request: web.Request, model: type[BaseModel]) -> Any:
    raw = await request.read()  # raises 413 past client_max_size
    if len(raw) > BIG_BODY:  # parsing megabytes must not hold up /health and running streams
        return await asyncio.to_thread(parse_body, raw, model)
    return parse_body(raw, model)


def parse_body(raw: bytes, model: type[BaseModel]) -> Any:
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise ApiError(400, "the body is not valid UTF-8", "invalid_utf8") from e
    except RecursionError as e:  # e.g. 100,000 '[': the decoder gives up, not the input's shape
        raise ApiError(400, "the body is nested too deeply", "invalid_json") from e
    except ValueError as e:
        raise ApiError(400, f"the body is not valid JSON: {e}", "invalid_json") from e
    if not isinstance(data, dict):
        raise ApiError(400, "the body must be a JSON object", "invalid_json")
    if (where := unencodable_at(data)) is not None:
        raise ApiError(400, f"{where or 'a key'}: the text holds a lone surrogate (an escape "
                       "such as \\ud800 that is not half of a pair); it is not valid Unicode",
                       "invalid_unicode", where or None)
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise validation_error(e) from e


def unencodable_at(data: Any) -> str | None:
    """The dotted path of the first string (or key) in ``data`` that UTF-8 cannot encode: JSON
    allows escapes of lone surrogates, the tokenizer does not. None when all is well."""
    stack: list[tuple[str, Any]] = [("", data)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                return path
        elif isinstance(value, dict):
            for key, item in value.items():
                stack.append((f"{path}.{key}" if path else str(key), item))
                stack.append((path, key))  # a bad key is reported at its object (popped first)
        elif isinstance(value, list):
            stack.extend((f"{path}.{i}" if path else str(i), item) for i, item in enumerate(value))
    return None


def ready(request: web.Request) -> Fleet:
    """The fleet, once the models it loads at start are ready."""
    fleet = request.app[FLEET]
    if fleet.state != "ready":
        detail = f": {fleet.error}" if fleet.error else ""
        raise ApiError(503, f"the model is {fleet.state}{detail}", "model_not_ready",
                       retry_after=5)
    return fleet


def request_class(request: web.Request, priority: str | int | None, default: str,
                  alias: str | None = None) -> int:
    """The request's class: its own field, else the model alias it named, else the
    ``X-Hearth-Class`` header, else the endpoint's default."""
    value: str | int | None = priority if priority is not None else alias
    if value is None:
        value = request.headers.get("X-Hearth-Class")
    try:
        rank = class_rank(value if value is not None else default)
    except ValueError as e:
        raise ApiError(400, str(e), "invalid_class", "priority") from e
    return claimed_rank(request, rank, explicit=value is not None)


def request_user(request: web.Request, user: str | None, by_address: bool = False) -> str | None:
    """Who the request is for fairness: its member key's name, else its own field, else the
    ``X-Hearth-User`` header, else (for APIs without a user field, such as Ollama's) the
    client's address."""
    if pinned := pinned_user(request):
        return pinned
    if user:
        return user
    if header := request.headers.get("X-Hearth-User"):
        return header[:256]
    return request.remote if by_address and request.remote else None


async def serve_completion(
    request: web.Request, comp: Any, stream: bool, content_type: str,
    frames: Callable[[AsyncIterator[dict[str, Any]]], AsyncIterator[bytes]],
    whole: Callable[[dict[str, Any]], dict[str, Any]] = lambda r: r,
    keepalive: bytes | None = None,
    status: Callable[[], bytes | None] | None = None,
) -> web.StreamResponse:
    """Submit ``comp`` and write its answer: the whole response, or its chunks as the wire's
    ``frames`` (with ``keepalive`` written after every KEEPALIVE_S without one: a long prompt
    on a slow CPU, or a tool call held until it is whole, sends nothing for minutes, and
    clients give up on a silent socket). A client that leaves mid-stream cancels the request
    and frees its sequence. ``status``: a comment line on where the request stands while it
    waits (``: queued position=… eta_s=…``), written when it changes, at most one a second."""
    tag_satellite(request, comp)
    comp.submit()
    try:
        if stream and hasattr(comp, "start"):  # a remote worker: its status before ours
            await comp.start()
        if not stream:
            return web.json_response(whole(await comp.result()))
        resp = web.StreamResponse(headers={"Content-Type": content_type,
                                           "Cache-Control": "no-cache"})
        await resp.prepare(request)
        try:
            async with contextlib.aclosing(
                    _kept_alive(frames(comp.chunks()), keepalive, status)) as out:
                async for frame in out:
                    await resp.write(frame)
            await resp.write_eof()
        except ConnectionResetError:
            log.debug("client left stream %s", comp.id)  # the finally below cancels it
        return resp
    finally:
        comp.cancel()  # no-op when finished; frees the sequence when the client went away


async def _kept_alive(frames: AsyncIterator[bytes], keepalive: bytes | None,
                      status: Callable[[], bytes | None] | None = None
                      ) -> AsyncIterator[bytes]:
    """``frames``, with ``keepalive`` between two that are KEEPALIVE_S or more apart, and
    ``status`` lines when they change (at most one each STATUS_S)."""
    if keepalive is None:
        async for frame in frames:
            yield frame
        return
    it = aiter(frames)
    nxt: asyncio.Future[bytes] | None = None
    loop = asyncio.get_running_loop()
    said: bytes | None = None
    said_at = quiet_since = loop.time()
    try:
        while True:
            if status is not None and (line := status()) is not None and line != said \
                    and (said is None or loop.time() - said_at >= STATUS_S):
                said, said_at = line, loop.time()
                quiet_since = said_at
                yield line
            if nxt is None:
                nxt = asyncio.ensure_future(anext(it))
            wait = KEEPALIVE_S - (loop.time() - quiet_since)
            if status is not None:
                wait = min(wait, STATUS_TICK_S)
            done, _ = await asyncio.wait({nxt}, timeout=max(0.0, wait))
            if not done:
                if loop.time() - quiet_since >= KEEPALIVE_S:
                    quiet_since = loop.time()
                    yield keepalive
                continue
            quiet_since = loop.time()
            try:
                frame = nxt.result()
            except StopAsyncIteration:
                return
            nxt = None
            yield frame
    finally:
        if nxt is not None:  # the client left, or the handler was cancelled, while it read
            if nxt.done():
                nxt.cancelled() or nxt.exception()  # retrieved: the stream's end is no error
            else:
                nxt.cancel()
