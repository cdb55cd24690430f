"""A model on another server: another Hearth, llama-server, vLLM or anything that speaks
OpenAI's API. It stands where a local :class:`~hearth.fleet.runtime.Runtime` stands (the fleet
leases it, the routes ask it for completions with the same interface), so the OpenAI routes,
Ollama's and the durable jobs reach it unchanged.

Hearth keeps the household's order on top: the class goes along (a Hearth worker reads it as
``priority`` by name; vLLM, run with ``--scheduling-policy priority``, as an integer where lower
runs first, which the ranks already are), each worker has a concurrency limit, its health is
checked every few seconds, and a request that fails on it marks it unreachable so that the next
one goes to its fallback.
"""

from __future__ import annotations

import asyncio
import logging
import re
import threading
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import aiohttp

from ..chat.completions import CompletionError
from ..engine.stats import Stats
from ..policy.scheduler import RANK_NAMES
from ..redact import redact
from ..settings import Settings
from .registry import Entry
from .sse import data_json

log = logging.getLogger(__name__)

HEALTH_S = 2.0  # how often a remote worker is checked
# A worker whose request failed (timed out, 5xx, connection lost) is not brought back by a
# health check for this long: a server that answers /v1/models but times out on work would
# otherwise take every other request and fail it.
COOLDOWN_S = 10.0
CHECK_TIMEOUT_S = 5.0
HEARTH_ONLY = ("priority", "tool_argument_values", "reasoning_format")


class RemoteWorker:
    """Duck-typed like a Runtime where the fleet and the routes look (state, model_id,
    stats, settings), plus the remote's health and queue depth."""

    remote = True

    def __init__(self, settings: Settings, entry: Entry):
        spec = entry.spec
        self.settings, self.entry, self.spec = settings, entry, spec
        self.model_id = self.name = entry.name
        self.url = re.sub(r"/v1/?$", "", spec.url.rstrip("/"))
        self.shown_url = redact(self.url)  # what /v1/models, /v1/queue and the log show
        # Another Hearth picks its class's model itself; other servers need a model's name.
        self.remote_model = spec.remote_model or (None if spec.kind == "hearth" else entry.name)
        self.state = "unknown"  # ready (healthy) | unreachable | unknown (not checked yet)
        self.error: str | None = None
        self.remote_waiting: int | None = None  # the remote's own queue, where it tells
        self.checked_at = 0.0
        self.failed_at = -COOLDOWN_S
        self.stats = Stats()
        self.engine = self.core = None
        self.exit_code = 0
        self.load_s: float | None = None
        self.backends: list[str] = []
        self.settled = threading.Event()
        self.settled.set()
        self._session: aiohttp.ClientSession | None = None
        self._checking: asyncio.Task | None = None

    # -- the connection and its health ---------------------------------------------------------
    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            headers = {"Authorization": f"Bearer {self.spec.api_key}"} if self.spec.api_key \
                else {}
            self._session = aiohttp.ClientSession(headers=headers)
        return self._session

    async def close(self) -> None:
        if self._checking is not None:
            self._checking.cancel()
        if self._session is not None:
            await self._session.close()

    def unreachable(self, why: str) -> None:
        if self.state != "unreachable":
            log.warning("worker %s (%s) is unreachable: %s", self.name, self.shown_url, why)
        self.state, self.error = "unreachable", redact(why)

    def check_soon(self, now: float) -> None:
        """Called every second by the fleet: a health check when one is due."""
        if now - self.checked_at >= HEALTH_S and (self._checking is None or
                                                   self._checking.done()):
            self.checked_at = now
            self._checking = asyncio.create_task(self.check())

    async def check(self) -> None:
        timeout = aiohttp.ClientTimeout(total=CHECK_TIMEOUT_S)
        try:
            async with self.session().get(self.url + "/v1/models", timeout=timeout) as r:
                if r.status != 200:
                    raise RuntimeError(f"/v1/models answered {r.status}")
            self.remote_waiting = await self._queue_depth(timeout)
        except (aiohttp.ClientError, TimeoutError, RuntimeError, ValueError) as e:
            self.unreachable(str(e) or type(e).__name__)
            return
        if time.monotonic() - self.failed_at < COOLDOWN_S:
            return  # reachable, but its last request failed: not yet
        if self.state != "ready":
            log.info("worker %s (%s) is reachable", self.name, self.shown_url)
        self.state, self.error = "ready", None

    async def _queue_depth(self, limit: aiohttp.ClientTimeout) -> int | None:
        """Requests waiting on the remote, as its kind reports them (None where it does not)."""
        kind = self.spec.kind
        if kind == "hearth":
            async with self.session().get(self.url + "/v1/queue", timeout=limit) as r:
                return sum((await r.json()).get("waiting", {}).values()) if r.ok else None
        if kind == "vllm":
            async with self.session().get(self.url + "/metrics", timeout=limit) as r:
                text = await r.text() if r.ok else ""
            found = re.findall(r"^vllm:num_requests_waiting\{[^}]*\} ([\d.e+]+)$", text, re.M)
            return round(sum(float(x) for x in found)) if found else None
        if kind == "llama-server":
            async with self.session().get(self.url + "/slots", timeout=limit) as r:
                return None if not r.ok else 0 if any(
                    not s.get("is_processing") for s in await r.json()) else 1
        return None

    def saturated(self, in_flight: int) -> bool:
        cap = self.spec.max_concurrency
        return in_flight >= cap or (self.remote_waiting or 0) >= cap

    # -- requests ------------------------------------------------------------------------------
    def payload(self, body: Any, rank: int) -> dict[str, Any]:
        out = body.model_dump(exclude_none=True, by_alias=True)
        out.pop("model", None)
        if self.remote_model:
            out["model"] = self.remote_model
        kind = self.spec.kind
        if kind != "hearth":
            for key in HEARTH_ONLY:
                out.pop(key, None)
        if kind == "hearth":
            out["priority"] = RANK_NAMES[rank]
        elif kind == "vllm":
            out["priority"] = rank  # vLLM runs lower values first
        return out

    async def post(self, path: str, payload: dict[str, Any]) -> dict[str, Any]:
        timeout = aiohttp.ClientTimeout(total=self.spec.timeout_s)
        try:
            async with self.session().post(self.url + path, json=payload,
                                           timeout=timeout) as r:
                data = await _json(r)
                self.check_status(r, data)
                return data
        except aiohttp.ClientConnectorError as e:
            raise self._failed(e, down=True) from e
        except (aiohttp.ClientError, TimeoutError, _Gone) as e:
            raise self._failed(e, down=isinstance(e, _Gone) and e.status == 503) from e

    def check_status(self, r: aiohttp.ClientResponse, data: Any) -> None:
        if r.status >= 500:
            raise _Gone(r.status, f"answered {r.status}: {_message(data)}")
        if r.status >= 400:
            raise CompletionError(r.status, f"worker {self.name}: {_message(data)}",
                                  "worker_refused")

    def _failed(self, e: BaseException, down: bool = False) -> CompletionError:
        """The worker is left out for a while. ``down``: it took nothing of the request (no
        connection, or 503), so the request may go to the fallback at once."""
        why = str(e) or type(e).__name__
        if isinstance(e, TimeoutError):
            why = f"no answer within {self.spec.timeout_s:g} s"
        self.failed_at = time.monotonic()
        self.unreachable(why)
        return CompletionError(502, f"worker {self.name} failed: {why}",
                               "worker_down" if down else "worker_unreachable",
                               retry_after=HEALTH_S)

    def completion(self, body: Any, rank: int, user: str | None) -> RemoteCompletion:
        return RemoteCompletion(self, body, rank, user)

    async def embeddings(self, raw: Any, rank: int, user: str | None) -> dict[str, Any]:
        payload: dict[str, Any] = {"input": raw}
        if self.remote_model:
            payload["model"] = self.remote_model
        if user:
            payload["user"] = user
        if self.spec.kind == "hearth":
            payload["priority"] = RANK_NAMES[rank]
        data = await self.post("/v1/embeddings", payload)
        return {**data, "model": self.name}

    async def warm(self, body: Any, rank: int) -> dict[str, Any]:
        if self.spec.kind != "hearth":  # no prefix-cache API to call
            return {"object": "cache.warm", "model": self.name, "class": RANK_NAMES[rank],
                    "prompt_tokens": 0, "cached_tokens": 0, "computed_tokens": 0,
                    "seconds": 0.0, "skipped": f"{self.spec.kind} worker"}
        data = await self.post("/v1/cache/warm", self.payload(body, rank))
        return {**data, "model": self.name}


class RemoteCompletion:
    """One completion on a remote worker, with :class:`~hearth.chat.completions.Completion`'s
    interface (submit, result, chunks, cancel)."""

    def __init__(self, worker: RemoteWorker, body: Any, rank: int, user: str | None):
        from ..chat.api_models import ChatCompletionRequest

        self.worker, self.body, self.rank = worker, body, rank
        self.chat = isinstance(body, ChatCompletionRequest)
        self.id = ("chatcmpl-" if self.chat else "cmpl-") + uuid.uuid4().hex[:24]
        self.path = "/v1/chat/completions" if self.chat else "/v1/completions"
        self.payload = worker.payload(body, rank)
        if user and "user" not in self.payload:
            self.payload["user"] = user
        self._response: aiohttp.ClientResponse | None = None
        self.t0 = time.monotonic()

    def submit(self) -> None:
        """Nothing to queue here: the request goes out when its answer is read."""

    def cancel(self) -> None:
        if self._response is not None:
            self._response.close()  # the remote sees the client leave and stops

    async def result(self) -> dict[str, Any]:
        data = await self.worker.post(self.path, {**self.payload, "stream": False})
        return {**data, "model": self.worker.name}

    async def start(self) -> None:
        """A stream's request goes out, and the remote's status is read, before the client is
        answered: a worker that is down is an error status (and a retry on its fallback), not
        an error in a stream that already said 200."""
        w = self.worker
        timeout = aiohttp.ClientTimeout(total=w.spec.timeout_s)
        try:
            r = await w.session().post(w.url + self.path, json={**self.payload, "stream": True},
                                       timeout=timeout)
        except aiohttp.ClientConnectorError as e:
            raise w._failed(e, down=True) from e
        except (aiohttp.ClientError, TimeoutError) as e:
            raise w._failed(e) from e
        if r.status >= 400:
            data = await _json(r)
            r.release()
            try:
                w.check_status(r, data)
            except _Gone as e:
                raise w._failed(e, down=e.status == 503) from e
        self._response = r

    async def chunks(self) -> AsyncIterator[dict[str, Any]]:
        if self._response is None:
            await self.start()
        r = self._response
        assert r is not None
        try:
            async for chunk in data_json(r.content):
                if "model" in chunk:
                    chunk["model"] = self.worker.name
                yield chunk
        except (aiohttp.ClientError, TimeoutError, ValueError) as e:
            err = self.worker._failed(e)
            yield {"error": {"message": err.message, "type": "server_error",
                             "code": err.code}}
        finally:
            r.release()


class _Gone(Exception):
    """The remote answered with a server error: treated as unreachable."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


async def _json(r: aiohttp.ClientResponse) -> Any:
    try:
        return await r.json(content_type=None)
    except ValueError:
        return {"error": (await r.text())[:300]}


def _message(data: Any) -> str:
    err = data.get("error") if isinstance(data, dict) else data
    if isinstance(err, dict):
        return str(err.get("message") or err)
    return str(err)[:300]
