"""A small asynchronous client for the Hearth server's HTTP API."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp

from .const import (
    CLASS_HEADER,
    EVENTS_READ_TIMEOUT,
    LOGGER,
    QUEUE_EVENTS_PATH,
    REQUEST_TIMEOUT,
    SATELLITE_HEADER,
    STREAM_READ_TIMEOUT,
    WARM_UP_TIMEOUT,
)
from .sse import QueueStatus, ServerEvent, iter_sse


class HearthError(Exception):
    """Base class for errors talking to a Hearth server."""


class CannotConnect(HearthError):
    """The server cannot be reached (or is not ready yet)."""


class NotReady(CannotConnect):
    """The server answers but its model is still loading (503)."""


class InvalidAuth(HearthError):
    """The server refused the API key (401)."""


class NotFound(HearthError):
    """The server does not know the resource (404)."""


class ApiError(HearthError):
    """The server answered with an error."""

    def __init__(self, status: int, message: str) -> None:
        """Keep the HTTP status next to the server's message."""
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message


class Superseded(ApiError):
    """A newer voice turn from the same satellite took this one's place while it waited."""


# The error code of a superseded voice request (a 409 body, or an error event in its stream).
SUPERSEDED = "superseded"


def server_id(health: dict[str, Any]) -> str | None:
    """The id a server gives itself in its /health (``server_id``), the same at any address;
    None from a server that says none."""
    found = health.get("server_id")
    return found if isinstance(found, str) and found else None


def normalize_url(url: str) -> str:
    """Return the base URL without a trailing slash or a trailing /v1."""
    url = url.strip().rstrip("/")
    if url.endswith("/v1"):
        url = url[: -len("/v1")]
    return url


def _error_message(body: bytes) -> str:
    """Read the message of an OpenAI-shaped error body, falling back to the raw text."""
    text = body.decode(errors="replace")
    try:
        data = json.loads(text)
    except ValueError:
        return text[:500]
    if isinstance(data, dict):
        err = data.get("error")
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])
        if isinstance(err, str):
            return err
    return text[:500]


def _error_code(error: Any) -> str | None:
    """The ``code`` (or else ``type``) of an OpenAI-shaped error object."""
    if not isinstance(error, dict):
        return None
    code = error.get("code") or error.get("type")
    return code if isinstance(code, str) else None


def _body_error_code(body: bytes) -> str | None:
    try:
        data = json.loads(body)
    except ValueError:
        return None
    return _error_code(data.get("error")) if isinstance(data, dict) else None


class HearthClient:
    """Talks to one Hearth server."""

    def __init__(
        self, session: aiohttp.ClientSession, url: str, api_key: str | None = None
    ) -> None:
        """Initialize the client."""
        self._session = session
        self.url = normalize_url(url)
        self._api_key = api_key or None

    def _headers(
        self, request_class: str | None = None, satellite: str | None = None
    ) -> dict[str, str]:
        headers = {"Accept": "application/json"}
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        if request_class:
            headers[CLASS_HEADER] = request_class
        if satellite:
            headers[SATELLITE_HEADER] = satellite
        return headers

    async def _request(
        self,
        method: str,
        path: str,
        *,
        json_body: Any = None,
        params: dict[str, str] | None = None,
        auth: bool = True,
        total_timeout: float = REQUEST_TIMEOUT,
    ) -> Any:
        headers = self._headers() if auth else {"Accept": "application/json"}
        try:
            async with self._session.request(
                method,
                self.url + path,
                json=json_body,
                params=params,
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=total_timeout),
            ) as response:
                body = await response.read()
                self._raise_for_status(response.status, body)
        except (aiohttp.ClientError, TimeoutError) as err:
            raise CannotConnect(f"{method} {path}: {err or type(err).__name__}") from err
        try:
            return json.loads(body)
        except ValueError as err:
            raise ApiError(response.status, "response is not JSON") from err

    async def _request_object(
        self,
        method: str,
        path: str,
        *,
        json_body: Any = None,
        auth: bool = True,
        total_timeout: float = REQUEST_TIMEOUT,
    ) -> dict[str, Any]:
        """``_request`` for the endpoints that answer a JSON object."""
        data = await self._request(
            method, path, json_body=json_body, auth=auth, total_timeout=total_timeout
        )
        if not isinstance(data, dict):
            raise ApiError(200, f"{method} {path}: the answer is not a JSON object")
        return data

    @staticmethod
    def _raise_for_status(status: int, body: bytes) -> None:
        if status < 400:
            return
        message = _error_message(body)
        if status == 409 and _body_error_code(body) == SUPERSEDED:
            raise Superseded(status, message)
        if status == 401:
            raise InvalidAuth(message)
        if status == 404:
            raise NotFound(message)
        if status == 503:
            raise NotReady(message)
        raise ApiError(status, message)

    # Server

    async def async_health(self) -> dict[str, Any]:
        """Return /health; raises NotReady while the model loads."""
        return await self._request_object("GET", "/health", auth=False)

    async def async_models(self) -> list[dict[str, Any]]:
        """Return the models the server serves (needs auth)."""
        data = await self._request("GET", "/v1/models")
        return list(data.get("data") or [])

    async def async_validate(self) -> dict[str, Any]:
        """Check that the server is ready and accepts our key; return its /health."""
        health = await self.async_health()
        await self.async_models()
        return health

    async def async_queue(self) -> dict[str, Any]:
        """Return the queue-health snapshot."""
        return await self._request_object("GET", "/v1/queue")

    async def async_warm(self, body: dict[str, Any]) -> dict[str, Any]:
        """Have the server compute and cache a chat prompt without answering it.

        ``body`` is a chat-completion body (``messages``, ``tools``, ``priority``: the class the
        prompt will serve). The server answers once the prompt is computed, as background work;
        leaving earlier would cancel it.
        """
        return await self._request_object(
            "POST", "/v1/cache/warm", json_body=body, total_timeout=WARM_UP_TIMEOUT
        )

    # Chat completions

    async def async_chat_stream(
        self,
        body: dict[str, Any],
        request_class: str | None = None,
        *,
        satellite: str | None = None,
        on_queued: Callable[[QueueStatus], None] | None = None,
    ) -> AsyncIterator[dict[str, Any]]:
        """Stream a chat completion, yielding the decoded chunks.

        ``satellite``: the voice turn's satellite, so a newer turn of it supersedes this one
        while it waits (raised as :class:`Superseded`). ``on_queued`` hears each queue status
        the server reports while the request waits.
        """
        body = {**body, "stream": True}
        headers = {**self._headers(request_class, satellite), "Accept": "text/event-stream"}
        try:
            async with self._session.post(
                self.url + "/v1/chat/completions",
                json=body,
                headers=headers,
                timeout=aiohttp.ClientTimeout(
                    total=None, sock_connect=REQUEST_TIMEOUT, sock_read=STREAM_READ_TIMEOUT
                ),
            ) as response:
                if response.status >= 400:
                    self._raise_for_status(response.status, await response.read())
                async for event in iter_sse(response, on_queued):
                    if event.data.strip() == "[DONE]":
                        return
                    try:
                        chunk = event.json()
                    except ValueError:
                        LOGGER.debug("Skipping a chunk that is not JSON: %s", event.data)
                        continue
                    if isinstance(chunk, dict) and "error" in chunk and "choices" not in chunk:
                        err = chunk["error"]
                        message = err.get("message") if isinstance(err, dict) else str(err)
                        if _error_code(err) == SUPERSEDED:
                            raise Superseded(409, str(message))
                        raise ApiError(response.status, str(message))
                    yield chunk
        except (aiohttp.ClientError, TimeoutError) as err:
            raise CannotConnect(f"chat completion: {err or type(err).__name__}") from err

    # Reservations

    async def async_reserve(
        self,
        satellite: str,
        *,
        model: str | None = None,
        warm: dict[str, Any] | None = None,
        ttl_s: float | None = None,
    ) -> dict[str, Any]:
        """Tell the server a voice turn from ``satellite`` is coming (its wake word was
        heard): it keeps ``model`` free for it and computes the ``warm`` prompt (a
        ``/v1/cache/warm`` body) for a few seconds. Servers whose /health features name
        ``reservation``; answers ``{"id", "model", "expires_in_s"}``."""
        body = {"model": model, "satellite": satellite, "ttl_s": ttl_s, "warm": warm}
        return await self._request_object("POST", "/v1/reservations", json_body=body)

    async def async_end_reservation(self, reservation_id: str) -> dict[str, Any]:
        """End a reservation before it expires; raises NotFound once it has ended."""
        return await self._request_object("DELETE", f"/v1/reservations/{reservation_id}")

    # Jobs

    async def async_submit_job(
        self,
        request: dict[str, Any],
        *,
        request_class: str | None = None,
        kind: str = "chat",
        tag: str | None = None,
    ) -> dict[str, Any]:
        """Queue a background job; the server answers 202 with the job at once."""
        body: dict[str, Any] = {"request": request, "kind": kind}
        if request_class:
            body["class"] = request_class
        if tag is not None:
            body["tag"] = tag
        return await self._request_object("POST", "/v1/jobs", json_body=body)

    async def async_get_job(self, job_id: str) -> dict[str, Any]:
        """Return one job; raises NotFound for an unknown id."""
        return await self._request_object("GET", f"/v1/jobs/{job_id}")

    async def async_cancel_job(self, job_id: str) -> dict[str, Any]:
        """Cancel a job; returns it (status cancelled unless it had already finished)."""
        return await self._request_object("DELETE", f"/v1/jobs/{job_id}")

    async def async_events(
        self,
        last_event_id: str | None = None,
        on_open: Callable[[], None] | None = None,
    ) -> AsyncIterator[ServerEvent]:
        """Follow the server's job event stream (resumable with the last event id seen).

        ``on_open`` runs once the server has accepted the subscription.
        """
        headers = {} if last_event_id is None else {"Last-Event-ID": last_event_id}
        async for event in self._async_follow("/v1/events", "event stream", headers, on_open):
            yield event

    async def async_queue_events(
        self, on_open: Callable[[], None] | None = None
    ) -> AsyncIterator[ServerEvent]:
        """Follow the server's queue health as it changes: ``queue`` events, each the body
        ``/v1/queue`` answers, the first at once (servers whose /health features name
        ``queue_events``)."""
        async for event in self._async_follow(
            QUEUE_EVENTS_PATH, "queue stream", {}, on_open
        ):
            yield event

    async def _async_follow(
        self,
        path: str,
        what: str,
        headers: dict[str, str],
        on_open: Callable[[], None] | None,
    ) -> AsyncIterator[ServerEvent]:
        headers = {**self._headers(), "Accept": "text/event-stream", **headers}
        try:
            async with self._session.get(
                self.url + path,
                headers=headers,
                timeout=aiohttp.ClientTimeout(
                    total=None, sock_connect=REQUEST_TIMEOUT, sock_read=EVENTS_READ_TIMEOUT
                ),
            ) as response:
                if response.status >= 400:
                    self._raise_for_status(response.status, await response.read())
                if on_open is not None:
                    on_open()
                async for event in iter_sse(response):
                    yield event
        except (aiohttp.ClientError, TimeoutError) as err:
            raise CannotConnect(f"{what}: {err or type(err).__name__}") from err
