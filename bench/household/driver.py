"""Replay a trace against an OpenAI-compatible server over HTTP and time it from the client.

Each call is one streamed ``/v1/chat/completions`` request (or one ``/v1/embeddings`` request);
with ``Target.api == "ollama"`` the same call goes to Ollama's ``/api/chat`` (``/api/embed``), its
class in the model alias (:mod:`.ollama_calls`).
Times are seconds from the start of the replay (``t0``) on the event loop's monotonic clock:
when the call was due, when it was sent, when its first content arrived, every content chunk,
and when it ended. TTFT is therefore queue-inclusive: it spans the server's queue, the prefill and
any 429 retries. A request the server answers 429 is retried after ``Retry-After`` and counted.

``/v1/queue`` (Hearth's queue health) is polled every ``poll_s`` for queue depth and tokens/s;
servers without it are simply not polled.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from hearth.fleet.sse import data_json

from . import ollama_calls
from .workload import Call, Session


@dataclass
class Target:
    """Where to send the workload and how to tag it."""

    name: str
    url: str
    model: str = "default"
    hearth: bool = True  # send Hearth's ``priority`` field (other servers get only the header)
    api_key: str | None = None
    embed_url: str | None = None  # where /v1/embeddings goes, if another server serves it
    api: str = "openai"  # or "ollama": Hearth's Ollama routes, the class as a model alias


@dataclass
class CallResult:
    session: str
    call: int
    cls: str
    user: str
    max_tokens: int
    due_s: float
    sent_s: float | None = None
    first_s: float | None = None
    end_s: float | None = None
    status: str = "pending"  # ok | error | unfinished
    error: str | None = None
    retries: int = 0
    retry_wait_s: float = 0.0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    chunk_s: list[float] = field(default_factory=list)

    def content_at(self, t: float) -> None:
        """A chunk with content (or a tool call) arrived at ``t``."""
        if self.first_s is None:
            self.first_s = round(t, 4)
        self.chunk_s.append(round(t, 4))

    def stream_ended(self) -> None:
        if not self.completion_tokens:  # no usage chunk: count chunks
            self.completion_tokens = len(self.chunk_s)
        self.status = "ok" if self.first_s is not None else "error"
        if self.first_s is None:
            self.error = "stream ended without content"


def call_seed(session_id: str, index: int) -> int:
    return zlib.crc32(f"{session_id}/{index}".encode()) & 0x7FFFFFFF


class Replay:
    def __init__(self, target: Target, sessions: list[Session], *, duration_s: float,
                 drain_timeout_s: float, poll_s: float = 0.5, request_timeout_s: float = 900,
                 max_retries: int = 100,
                 on_progress: Callable[[Replay], None] | None = None):
        self.target = target
        self.sessions = sessions
        self.duration_s = duration_s
        self.drain_timeout_s = drain_timeout_s
        self.poll_s = poll_s
        self.request_timeout_s = request_timeout_s
        self.max_retries = max_retries
        self.on_progress = on_progress
        self.results: list[CallResult] = []
        self.queue_samples: list[dict[str, Any]] = []
        self.queue_available: bool | None = None
        self.total_calls = sum(len(s.calls) for s in sessions)
        self.t0 = 0.0
        self.elapsed_s = 0.0
        self.end_s = 0.0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._http: aiohttp.ClientSession | None = None

    # -- bookkeeping ------------------------------------------------------------------------
    def now(self) -> float:
        assert self._loop is not None
        return self._loop.time() - self.t0

    @property
    def done(self) -> int:
        return sum(1 for r in self.results if r.end_s is not None)

    @property
    def in_flight(self) -> int:
        return sum(1 for r in self.results if r.sent_s is not None and r.end_s is None)

    def headers(self, cls: str, user: str | None = None) -> dict[str, str]:
        h = {"X-Hearth-Class": cls}
        if user is not None and self.target.api == "ollama":  # Ollama's bodies name no user
            h["X-Hearth-User"] = user
        if self.target.api_key:
            h["Authorization"] = f"Bearer {self.target.api_key}"
        return h

    # -- requests ---------------------------------------------------------------------------
    def chat_body(self, s: Session, index: int, call: Call) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.target.model, "messages": call.messages, "stream": True,
            "stream_options": {"include_usage": True}, "max_tokens": call.max_tokens,
            "ignore_eos": True, "temperature": 0.7, "seed": call_seed(s.id, index),
            "user": s.user}
        if self.target.hearth:
            body["priority"] = s.cls
        return body

    def embed_body(self, s: Session, call: Call) -> dict[str, Any]:
        body: dict[str, Any] = {"model": self.target.model, "input": call.inputs, "user": s.user}
        if self.target.hearth:
            body["priority"] = s.cls
        return body

    async def _chat(self, r: CallResult, s: Session, index: int, call: Call) -> None:
        if self.target.api == "ollama":
            await self._post(r, "/api/chat", ollama_calls.chat_body(self, s, index, call),
                             lambda resp: ollama_calls.read_stream(self, r, resp))
        else:
            await self._post(r, "/v1/chat/completions", self.chat_body(s, index, call),
                             lambda resp: self._stream(r, resp))

    async def _embed(self, r: CallResult, s: Session, call: Call) -> None:
        if self.target.api == "ollama":
            await self._post(r, "/api/embed", ollama_calls.embed_body(self, s, call),
                             lambda resp: ollama_calls.read_embedded(self, r, resp))
        else:
            await self._post(r, "/v1/embeddings", self.embed_body(s, call),
                             lambda resp: self._embedded(r, resp))

    async def _post(self, r: CallResult, path: str, body: dict[str, Any],
                    handle: Callable[[aiohttp.ClientResponse], Any]) -> None:
        assert self._http is not None
        base = self.target.embed_url if path == "/v1/embeddings" else None
        url = (base or self.target.url).rstrip("/") + path
        while True:
            async with self._http.post(url, json=body,
                                       headers=self.headers(r.cls, r.user)) as resp:
                if resp.status == 429 and r.retries < self.max_retries:
                    r.retries += 1
                    try:
                        wait = float(resp.headers.get("Retry-After", "1"))
                    except ValueError:
                        wait = 1.0
                    wait = min(max(wait, 0.1), 30.0)
                    r.retry_wait_s += wait
                    await resp.read()
                else:
                    if resp.status != 200:
                        text = (await resp.text())[:300]
                        r.status, r.error = "error", f"HTTP {resp.status}: {text}"
                        return
                    await handle(resp)
                    return
            await asyncio.sleep(wait)

    async def _stream(self, r: CallResult, resp: aiohttp.ClientResponse) -> None:
        async for chunk in data_json(resp.content):
            if "error" in chunk:
                r.status, r.error = "error", str(chunk["error"].get("message"))[:300]
                return
            for ch in chunk.get("choices") or []:
                delta = ch.get("delta") or {}
                if delta.get("content") or delta.get("tool_calls"):
                    r.content_at(self.now())
            usage = chunk.get("usage")
            if usage:
                r.prompt_tokens = int(usage.get("prompt_tokens") or 0)
                r.completion_tokens = int(usage.get("completion_tokens") or 0)
                details = usage.get("prompt_tokens_details") or {}
                r.cached_tokens = int(details.get("cached_tokens") or 0)
        r.stream_ended()

    async def _embedded(self, r: CallResult, resp: aiohttp.ClientResponse) -> None:
        out = await resp.json()
        r.first_s = round(self.now(), 4)
        r.prompt_tokens = int((out.get("usage") or {}).get("prompt_tokens") or 0)
        r.status = "ok"

    async def _call(self, s: Session, index: int, call: Call) -> None:
        r = CallResult(session=s.id, call=index, cls=s.cls, user=s.user,
                       max_tokens=call.max_tokens, due_s=round(self.now(), 4))
        self.results.append(r)
        r.sent_s = r.due_s
        try:
            if call.inputs is not None:
                await self._embed(r, s, call)
            else:
                await self._chat(r, s, index, call)
        except asyncio.CancelledError:
            r.status, r.error = "unfinished", "still running when the drain timeout ended"
            r.end_s = round(self.now(), 4)
            raise
        except (aiohttp.ClientError, TimeoutError, json.JSONDecodeError, ValueError) as e:
            r.status, r.error = "error", f"{type(e).__name__}: {e}"[:300]
        r.end_s = round(self.now(), 4)

    async def _session(self, s: Session) -> None:
        await asyncio.sleep(max(0.0, s.start_s - self.now()))
        for i, call in enumerate(s.calls):
            if i:
                await asyncio.sleep(call.delay_s)
            await self._call(s, i, call)

    # -- queue health -----------------------------------------------------------------------
    async def _poll(self) -> None:
        assert self._http is not None
        url = self.target.url.rstrip("/") + "/v1/queue"
        while True:
            t = self.now()
            try:
                async with self._http.get(url, headers=self.headers("voice"),
                                          timeout=aiohttp.ClientTimeout(total=5)) as resp:
                    if resp.status == 404:
                        self.queue_available = False
                        return
                    q = await resp.json()
                    self.queue_available = True
                    self.queue_samples.append({
                        "t": round(t, 3),
                        "waiting": q.get("waiting", {}), "running": q.get("running", {}),
                        "kv_use": (q.get("kv") or {}).get("use"),
                        "tokens_per_s": q.get("tokens_per_s"),
                        "prefix_hit_rate": (q.get("prefix_cache") or {}).get("token_hit_rate"),
                        "preemptions": q.get("preemptions"),
                        "users": {u: v.get("served_tokens")
                                  for u, v in (q.get("users") or {}).items()}})
            except (aiohttp.ClientError, TimeoutError, ValueError):
                pass
            await asyncio.sleep(max(0.0, self.poll_s - (self.now() - t)))

    async def _tick(self) -> None:
        while True:
            self.elapsed_s = self.now()
            if self.on_progress:
                self.on_progress(self)
            await asyncio.sleep(0.5)

    # -- the run ----------------------------------------------------------------------------
    async def warmup(self, calls: list[tuple[Session, Call]]) -> None:
        """Send a few unmeasured requests (the satellites' prompts) as a running home has."""
        for s, call in calls:
            r = CallResult(session=f"warmup-{s.id}", call=0, cls=s.cls, user=s.user,
                           max_tokens=call.max_tokens, due_s=0.0)
            if call.inputs is not None:
                await self._embed(r, s, call)
            else:
                await self._chat(r, s, 0, Call(max_tokens=2, messages=call.messages))
            if r.status != "ok":
                raise RuntimeError(f"warm-up request failed on {self.target.url}: {r.error}")

    async def run(self, warmup: list[tuple[Session, Call]] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        timeout = aiohttp.ClientTimeout(total=self.request_timeout_s)
        # force_close: llama-server closes a connection after a stream; a pooled one would
        # fail the next request (a fresh localhost connection costs well under a millisecond).
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, force_close=True),
                                         timeout=timeout) as http:
            self._http = http
            if warmup:
                self.t0 = self._loop.time()
                await self.warmup(warmup)
            self.t0 = self._loop.time()
            background = [asyncio.create_task(self._poll()), asyncio.create_task(self._tick())]
            tasks = [asyncio.create_task(self._session(s)) for s in self.sessions]
            _, pending = await asyncio.wait(tasks,
                                            timeout=self.duration_s + self.drain_timeout_s)
            for t in pending:
                t.cancel()
            if pending:
                await asyncio.gather(*pending, return_exceptions=True)
            self.end_s = self.now()
            self.elapsed_s = self.end_s
            for t in background:
                t.cancel()
            for t in background:
                with contextlib.suppress(asyncio.CancelledError):
                    await t
            if self.on_progress:
                self.on_progress(self)
        # Calls never sent (their session was cut by the drain timeout) count as unfinished.
        sent = {(r.session, r.call) for r in self.results}
        for s in self.sessions:
            for i, call in enumerate(s.calls):
                if (s.id, i) not in sent:
                    self.results.append(CallResult(
                        session=s.id, call=i, cls=s.cls, user=s.user, max_tokens=call.max_tokens,
                        due_s=s.start_s, status="unfinished", error="never sent"))
        self.results.sort(key=lambda r: (r.due_s, r.session, r.call))


def warmup_calls(sessions: list[Session]) -> list[tuple[Session, Call]]:
    """One short request per distinct voice system prompt (each satellite's), in trace order."""
    seen: set[str] = set()
    out: list[tuple[Session, Call]] = []
    for s in sessions:
        if s.cls != "voice" or not s.calls[0].messages:
            continue
        system = s.calls[0].messages[0]["content"]
        if system not in seen:
            seen.add(system)
            out.append((s, s.calls[0]))
    return out
