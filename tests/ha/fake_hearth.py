"""A small in-process server speaking the parts of Hearth's API the integration uses, for
behaviour the real model cannot be relied on to show (calling a tool) and for exact sensor
values."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

from aiohttp import web

from .fake_queue_stream import FakeQueueStream
from .fake_voice import FakeVoice

API_KEY = "hearth-test-key"

# The voice model's worker process as /v1/queue reports it (top-level "worker"; each local
# model's under "models" too); servers before the worker processes report no "worker".
SAMPLE_WORKER: dict[str, Any] = {
    "state": "serving",
    "pid": 4242,
    "cpu_rung": "native",
    "cpu_variant": "native",
    "rungs_skipped": [],
    "restarts": 0,
    "last_crash": None,
    "crashes": 0,
    "quarantined": 0,
    "boundary": {"iterations": 301, "per_iteration_us": 440.2, "share_of_iteration": 0.0193},
}
SEGFAULT = "SIGSEGV: a segmentation fault"

SAMPLE_QUEUE: dict[str, Any] = {
    "model": "fake-model",
    "policy": "hearth",
    "waiting": {"voice": 1, "chat": 2, "agent": 0, "background": 5, "embedding": 0},
    "running": {"voice": 0, "chat": 1, "agent": 0, "background": 2, "embedding": 0},
    "kv": {"cells": 16384, "used": 4096, "use": 0.25},
    "prefix_cache": {"entries": 2, "hit_rate": 0.67, "token_hit_rate": 0.57, "evictions": 0},
    "classes": {
        "voice": {
            "completed": 3,
            "rejected": 0,
            "failed": 0,
            "preempted": 0,
            "window_completed": 3,
            "queue_ms": {"p50": 1.0, "p95": 2.5},
            "ttft_ms": {"p50": 120.0, "p95": 180.4},
            "itl_ms": {"p50": 8.0, "p95": 11.2},
            "e2e_ms": {"p50": 300.0, "p95": 450.0},
        },
        "chat": {
            "completed": 0,
            "rejected": 0,
            "failed": 0,
            "preempted": 0,
            "window_completed": 0,
            "queue_ms": {"p50": None, "p95": None},
            "ttft_ms": {"p50": None, "p95": None},
            "itl_ms": {"p50": None, "p95": None},
            "e2e_ms": {"p50": None, "p95": None},
        },
    },
    "users": {"u1": {"share": 1.0, "served_tokens": 123}},
    "tokens_per_s": 12.3,
    "preemptions": 4,
    "generated_tokens_total": 1000,
    "prompt_tokens_total": 5000,
    "jobs": {"queued": 2, "running": 1, "done": 7, "failed": 1, "cancelled": 0},
    "worker": SAMPLE_WORKER,
}


class FakeHearth:
    """An in-process server speaking the parts of Hearth's API the integration uses."""

    def __init__(self) -> None:
        """Initialize the fake with a tool-calling chat handler."""
        self.api_key: str | None = API_KEY
        # /health answers this status instead of 200: 503 as a server still loading its model
        # does, 500 as one that is broken.
        self.health_status: int | None = None
        # The id /health gives the server (servers before it say none).
        self.server_id: str | None = None
        self.features: list[str] = []  # what /health says the server offers beyond its API
        self.queue: dict[str, Any] = json.loads(json.dumps(SAMPLE_QUEUE))
        # /v1/queue answers this status instead of 200 (a server gone away answers 500 here).
        self.queue_status: int | None = None
        self.queue_requests = 0  # GET /v1/queue answered (polls and refreshes)
        self.queue_stream = FakeQueueStream(self)  # offered when features name it
        self.voice = FakeVoice(self)  # reservations, and chat streams' comments and waits
        # The /v1/cache/warm bodies received; warm_status: answer that error instead (404: an
        # older server without warm-ups).
        self.warm_requests: list[dict[str, Any]] = []
        self.warm_status: int | None = None
        self.chat_requests: list[tuple[dict[str, str], dict[str, Any]]] = []
        self.chat_handler: Callable[[dict[str, Any]], list[dict[str, Any]]] = tool_call_script
        self.events_enabled = False
        self.events: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
        self.event_subscribers = 0
        self.event_resume_ids: list[str | None] = []
        self.jobs: dict[str, dict[str, Any]] = {}
        self.job_bodies: list[dict[str, Any]] = []
        self.port = 0
        self._runner: web.AppRunner | None = None
        self._event_id = 0

    @property
    def url(self) -> str:
        """Return the base URL."""
        return f"http://127.0.0.1:{self.port}"

    def _authorized(self, request: web.Request) -> bool:
        return self.api_key is None or (
            request.headers.get("Authorization") == f"Bearer {self.api_key}"
        )

    @staticmethod
    def _unauthorized() -> web.Response:
        return web.json_response(
            {
                "error": {
                    "message": "invalid or missing API key",
                    "type": "authentication_error",
                    "param": None,
                    "code": "invalid_api_key",
                }
            },
            status=401,
        )

    async def start(self, port: int = 0) -> None:
        """Serve on 127.0.0.1 (a free port unless one is given)."""
        app = web.Application()
        app.router.add_get("/health", self._health)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/v1/queue", self._queue)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/v1/cache/warm", self._warm)
        app.router.add_post("/v1/jobs", self._submit_job)
        app.router.add_get("/v1/jobs/{job_id}", self._get_job)
        app.router.add_delete("/v1/jobs/{job_id}", self._cancel_job)
        app.router.add_get("/v1/events", self._events)
        app.router.add_get("/v1/queue/events", self.queue_stream.handle)
        self.voice.add_routes(app.router)
        self._runner = web.AppRunner(app, shutdown_timeout=1)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", port)
        await site.start()
        self.port = self._runner.addresses[0][1]

    async def another_port(self) -> int:
        """Answer on a second port too (another address of the same server); return it."""
        assert self._runner is not None
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        return site._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        """Stop serving (ending the open event streams first)."""
        for _ in range(self.event_subscribers):
            self.events.put_nowait(None)
        self.queue_stream.end()
        if self.voice.release is not None:
            self.voice.release.set()
        await asyncio.sleep(0)
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _health(self, request: web.Request) -> web.Response:
        if self.health_status is not None:
            return web.json_response(
                {"error": {"message": f"status {self.health_status}", "type": "server_error",
                           "param": None, "code": None}},
                status=self.health_status,
            )
        body: dict[str, Any] = {"status": "ready", "model": "fake-model", "version": "0.1.0"}
        if self.server_id:
            body["server_id"] = self.server_id
        if self.features:
            body["features"] = self.features
        if (worker := self.queue.get("worker")) is not None:
            body["cpu"] = {"variant": worker["cpu_variant"], "rung": worker["cpu_rung"],
                           "rungs_skipped": worker["rungs_skipped"]}
            if worker["state"] in ("restarting", "failed") and worker["last_crash"]:
                body.update(status="degraded", reason=f"worker {worker['state']} after a "
                            f"crash: {worker['last_crash']['cause']}")
        return web.json_response(body)

    @property
    def worker(self) -> dict[str, Any]:
        """The voice model's worker as /v1/queue reports it (a test may change it)."""
        return self.queue["worker"]

    def crash_worker(self, cause: str = SEGFAULT, *, during: str = "decode",
                     requests_failed: int = 1, at: float = 1796248196.12) -> None:
        """The voice model's worker dies: it restarts, with this crash as its last."""
        worker = self.worker
        worker.update(state="restarting", pid=None, crashes=worker["crashes"] + 1,
                      last_crash={"at": at, "cause": cause, "during": during,
                                  "rung": worker["cpu_rung"], "requests_failed": requests_failed,
                                  "pid": worker["pid"]})

    def set_worker_state(self, state: str) -> None:
        """Set the worker's state; back to serving after a crash counts a restart."""
        worker = self.worker
        if state == "serving" and worker["state"] in ("restarting", "failed"):
            worker.update(restarts=worker["restarts"] + 1,
                          pid=((worker["last_crash"] or {}).get("pid") or 4242) + 1)
        worker["state"] = state

    async def _models(self, request: web.Request) -> web.Response:
        if not self._authorized(request):
            return self._unauthorized()
        return web.json_response({"object": "list", "data": [{"id": "fake-model"}]})

    async def _queue(self, request: web.Request) -> web.Response:
        if not self._authorized(request):
            return self._unauthorized()
        if self.queue_status is not None:
            return self._error(self.queue_status)
        self.queue_requests += 1
        return web.json_response(self.queue)

    @staticmethod
    def _error(status: int) -> web.Response:
        return web.json_response(
            {"error": {"message": f"status {status}", "type": "server_error", "param": None,
                       "code": None}},
            status=status,
        )

    async def _warm(self, request: web.Request) -> web.Response:
        if not self._authorized(request):
            return self._unauthorized()
        self.warm_requests.append(await request.json())
        if self.warm_status is not None:
            return self._error(self.warm_status)
        return web.json_response(
            {"object": "cache.warm", "model": "fake-model", "class": "voice",
             "prompt_tokens": 100, "cached_tokens": 0, "computed_tokens": 100, "seconds": 0.1}
        )

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        if not self._authorized(request):
            return self._unauthorized()
        body = await request.json()
        self.chat_requests.append((dict(request.headers), body))
        if (refused := self.voice.refusal(dict(request.headers))) is not None:
            return refused
        chunks = self.chat_handler(body)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        if not await self.voice.before_answer(response):
            return response
        for chunk in chunks:
            await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    def add_job(self, job: dict[str, Any]) -> None:
        """Store a job the way the server would."""
        self.jobs[job["id"]] = job

    async def _submit_job(self, request: web.Request) -> web.Response:
        if not self._authorized(request):
            return self._unauthorized()
        body = await request.json()
        self.job_bodies.append(body)
        job_id = f"job_{len(self.jobs) + 1:04x}"
        job = {
            "id": job_id,
            "object": "job",
            "kind": body.get("kind", "chat"),
            "class": body.get("class", "background"),
            "tag": body.get("tag"),
            "status": "queued",
            "created_at": 1000.0,
            "started_at": None,
            "finished_at": None,
            "result": None,
            "error": None,
        }
        self.add_job(job)
        return web.json_response(job, status=202)

    async def _get_job(self, request: web.Request) -> web.Response:
        if not self._authorized(request):
            return self._unauthorized()
        job = self.jobs.get(request.match_info["job_id"])
        if job is None:
            return web.json_response({"error": {"message": "no such job"}}, status=404)
        return web.json_response(job)

    async def _cancel_job(self, request: web.Request) -> web.Response:
        if not self._authorized(request):
            return self._unauthorized()
        job = self.jobs.get(request.match_info["job_id"])
        if job is None:
            return web.json_response({"error": {"message": "no such job"}}, status=404)
        job["status"] = "cancelled"
        return web.json_response(job)

    def finish_job(self, job_id: str, text: str) -> dict[str, Any]:
        """Mark a job done with a chat completion result; returns the job."""
        job = self.jobs[job_id]
        job.update(
            status="done",
            started_at=1000.5,
            finished_at=1002.0,
            result={
                "object": "chat.completion",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text}}],
                "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
                "hearth": {"ttft_ms": 50.0, "e2e_ms": 900.0},
            },
        )
        return job

    def publish(self, job: dict[str, Any]) -> None:
        """Send a job event to the event-stream subscribers."""
        self.events.put_nowait({"type": "job", "job": job})

    async def _events(self, request: web.Request) -> web.StreamResponse:
        if not self.events_enabled:
            return web.json_response({"error": {"message": "not found"}}, status=404)
        if not self._authorized(request):
            return self._unauthorized()
        self.event_resume_ids.append(request.headers.get("Last-Event-ID"))
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        self.event_subscribers += 1
        try:
            await response.write(b": keepalive\n\n")
            while True:
                data = await self.events.get()
                if data is None:
                    break
                self._event_id += 1
                await response.write(
                    f"id: {self._event_id}\nevent: job\ndata: {json.dumps(data)}\n\n".encode()
                )
        finally:
            self.event_subscribers -= 1
        return response


def text_chunks(text: str, *, model: str = "fake-model") -> list[dict[str, Any]]:
    """Stream ``text`` in a few pieces."""
    chunks: list[dict[str, Any]] = [
        {"object": "chat.completion.chunk", "model": model,
         "choices": [{"index": 0, "delta": {"role": "assistant"}, "finish_reason": None}]}
    ]
    words = text.split(" ")
    for i, word in enumerate(words):
        piece = word if i == 0 else " " + word
        chunks.append(
            {"object": "chat.completion.chunk", "model": model,
             "choices": [{"index": 0, "delta": {"content": piece}, "finish_reason": None}]}
        )
    chunks.append(
        {"object": "chat.completion.chunk", "model": model,
         "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
    )
    return chunks


SHADOW_DESCRIPTION = "Does nothing."  # tools of test_tool_loop's second API


def turn_on_tool(body: dict[str, Any]) -> str | None:
    """The name under which Home Assistant sent Assist's HassTurnOn tool. Releases spell it
    differently: ``HassTurnOn`` (2026.2), ``intent__HassTurnOn`` (2026.10), and prefixed by the
    API (``assist__...``) when two selected APIs offer tools of the same name."""
    for tool in body.get("tools") or ():
        function = tool["function"]
        if function["name"].endswith("HassTurnOn") and (
            function.get("description") != SHADOW_DESCRIPTION
        ):
            return function["name"]
    return None


def tool_call_script(
    body: dict[str, Any], call: dict[str, Any] | None = None
) -> list[dict[str, Any]]:
    """Call HassTurnOn for the kitchen light (with the arguments ``call``, if given), then
    report once the tool has answered."""
    messages = body["messages"]
    if messages[-1]["role"] == "tool":
        return text_chunks("The kitchen light is on.")
    tool_name = turn_on_tool(body)
    if tool_name is None:
        return text_chunks("I cannot control devices.")
    return call_chunks((tool_name, call or {"name": "Kitchen light"}))


def call_chunks(*calls: tuple[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """A streamed answer that calls each (tool, arguments), the arguments in two pieces."""

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {"object": "chat.completion.chunk",
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

    chunks = [chunk({"role": "assistant"})]
    for index, (name, args) in enumerate(calls):
        arguments = json.dumps(args)
        half = len(arguments) // 2
        chunks += [
            chunk({"tool_calls": [{"index": index, "id": f"call_{index + 1}",
                                   "type": "function",
                                   "function": {"name": name, "arguments": ""}}]}),
            chunk({"tool_calls": [{"index": index, "function": {"arguments": arguments[:half]}}]}),
            chunk({"tool_calls": [{"index": index, "function": {"arguments": arguments[half:]}}]}),
        ]
    return [*chunks, chunk({}, "tool_calls")]
