"""A small OpenAI-compatible server that stands in for a remote worker Hearth cannot run here (a
vLLM box, say): it answers chat completions (whole or streamed) with canned text, and can be
told to answer slowly or with 5xx, so that timeouts and failover are tested. It records every
body it receives. It runs on its own event loop in a thread of the test process."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from typing import Any

from aiohttp import web
from hearth_server import free_port


class StandIn:
    def __init__(self, model: str = "stand-in-model", port: int | None = None):
        self.model = model
        self.port = port or free_port()
        self.mode = "ok"  # ok | slow | error
        self.delay_s = 0.0
        self.bodies: list[dict[str, Any]] = []
        self.waiting = 0  # reported as vLLM's num_requests_waiting
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def _models(self, request: web.Request) -> web.Response:
        if self.mode == "error":
            return web.json_response({"error": {"message": "stand-in is down"}}, status=503)
        return web.json_response({"object": "list", "data": [{"id": self.model}]})

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(text=f'vllm:num_requests_waiting{{model_name="{self.model}"}} '
                                 f"{float(self.waiting)}\n")

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.bodies.append(body)
        if self.mode == "error":
            return web.json_response({"error": {"message": "CUDA out of memory"}}, status=500)
        if self.mode == "slow":
            await asyncio.sleep(self.delay_s)
        words = ["Stand-in", " summary", " done."]
        if not body.get("stream"):
            return web.json_response({
                "id": "cmpl-standin", "object": "chat.completion", "created": int(time.time()),
                "model": body.get("model"), "choices": [{
                    "index": 0, "finish_reason": "stop",
                    "message": {"role": "assistant", "content": "".join(words)}}],
                "usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}})
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)

        async def send(chunk: dict[str, Any]) -> None:
            await resp.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")

        base = {"id": "cmpl-standin", "object": "chat.completion.chunk",
                "created": int(time.time()), "model": body.get("model")}
        for i, w in enumerate(words):
            await send({**base, "choices": [{"index": 0, "finish_reason": None,
                                             "delta": {"content": w, **(
                                                 {"role": "assistant"} if i == 0 else {})}}]})
        await send({**base, "choices": [{"index": 0, "finish_reason": "stop", "delta": {}}]})
        if (body.get("stream_options") or {}).get("include_usage"):
            await send({**base, "choices": [], "usage": {
                "prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}})
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    def start(self) -> StandIn:
        ready = threading.Event()

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            app = web.Application()
            app.router.add_get("/v1/models", self._models)
            app.router.add_get("/metrics", self._metrics)
            app.router.add_post("/v1/chat/completions", self._chat)
            self._runner = web.AppRunner(app)
            loop.run_until_complete(self._runner.setup())
            loop.run_until_complete(web.TCPSite(self._runner, "127.0.0.1", self.port).start())
            ready.set()
            loop.run_forever()
            loop.run_until_complete(self._runner.cleanup())
            loop.close()

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()
        ready.wait(10)
        return self

    def stop(self) -> None:
        if self._loop is not None and not self._loop.is_closed():  # twice is fine
            self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(10)

    def __enter__(self) -> StandIn:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
