"""A small Home Assistant client for the demo: onboarding, login, REST and websocket calls.

Only talks to the local Home Assistant the demo started (127.0.0.1). Every call has a timeout.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

import aiohttp

CALL_TIMEOUT = 30.0  # one REST call or websocket command (a conversation may take longer)


class HAError(RuntimeError):
    """Home Assistant answered something the demo did not expect."""


class _Expired(Exception):
    """The access token expired: refresh it and ask again."""


class HomeAssistantClient:
    """REST + websocket access to one Home Assistant, logged in as one user."""

    def __init__(self, url: str, session: aiohttp.ClientSession) -> None:
        self.url = url.rstrip("/")
        self.client_id = self.url + "/"
        self.session = session
        self.access_token: str | None = None
        self.refresh_token: str | None = None
        self._ws: aiohttp.ClientWebSocketResponse | None = None
        self._ids = itertools.count(1)
        self._ws_lock = asyncio.Lock()

    # -- plain HTTP ---------------------------------------------------------------------------

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.access_token}"} if self.access_token else {}

    async def request(self, method: str, path: str, *, json: Any = None, data: Any = None,
                      timeout_s: float = CALL_TIMEOUT, ok: tuple[int, ...] = (200, 201)) -> Any:
        try:
            return await self._request(method, path, json, data, timeout_s, ok)
        except _Expired:
            # An access token lives 30 minutes; a benchmark on a household model runs longer.
            token = await self._request("POST", "/auth/token", None, {
                "grant_type": "refresh_token", "refresh_token": self.refresh_token,
                "client_id": self.client_id}, CALL_TIMEOUT, (200,))
            self.access_token = token["access_token"]
            return await self._request(method, path, json, data, timeout_s, ok)

    async def _request(self, method: str, path: str, json: Any, data: Any, timeout_s: float,
                       ok: tuple[int, ...]) -> Any:
        async with self.session.request(
            method, self.url + path, json=json, data=data, headers=self._headers(),
            timeout=aiohttp.ClientTimeout(total=timeout_s),
        ) as resp:
            body = await resp.read()
            if resp.status == 401 and self.refresh_token and path != "/auth/token":
                raise _Expired
            if resp.status not in ok:
                raise HAError(f"{method} {path} -> {resp.status}: {body[:500]!r}")
            if not body:
                return None
            try:
                return await resp.json(content_type=None)
            except ValueError:
                return body.decode(errors="replace")

    async def get(self, path: str, **kw: Any) -> Any:
        return await self.request("GET", path, **kw)

    async def post(self, path: str, json: Any = None, **kw: Any) -> Any:
        return await self.request("POST", path, json=json, **kw)

    async def wait_http(self, timeout_s: float, is_alive: Any = None) -> None:
        """Wait until Home Assistant's HTTP server answers (its login providers: 200, or 400
        ``onboarding_required`` before onboarding)."""
        deadline = time.monotonic() + timeout_s
        last: Exception | None = None
        while time.monotonic() < deadline:
            if is_alive is not None and not is_alive():
                raise HAError("Home Assistant exited while starting (see its log)")
            try:
                await self.get("/auth/providers", timeout_s=5, ok=(200, 400))
                return
            except (aiohttp.ClientError, TimeoutError, HAError) as err:
                last = err
            await asyncio.sleep(1)
        raise TimeoutError(f"Home Assistant did not answer within {timeout_s:.0f}s ({last})")

    # -- onboarding and login -----------------------------------------------------------------

    async def onboarding_status(self) -> dict[str, bool]:
        """Which onboarding steps are done; all, once onboarding is over (the onboarding API
        is then not served: 404)."""
        steps = await self.get("/api/onboarding", ok=(200, 404))
        if not isinstance(steps, list):
            return dict.fromkeys(("user", "core_config", "analytics", "integration"), True)
        return {s["step"]: s["done"] for s in steps}

    async def onboard(self, name: str, username: str, password: str, language: str = "en") -> None:
        """Run the onboarding steps that are not done yet, creating the owner user."""
        status = await self.onboarding_status()
        if not status.get("user"):
            answer = await self.post("/api/onboarding/users", {
                "client_id": self.client_id, "name": name, "username": username,
                "password": password, "language": language,
            })
            await self._token_from_code(answer["auth_code"])
        else:
            await self.login(username, password)
        status = await self.onboarding_status()
        if not status.get("analytics"):
            await self.post("/api/onboarding/analytics", {})
        if not status.get("integration"):
            await self.post("/api/onboarding/integration", {
                "client_id": self.client_id, "redirect_uri": self.client_id + "?auth_callback=1",
            })
        if not status.get("core_config"):
            # The config writer pre-marks this step done: finishing it through the API starts
            # flows for integrations that reach the internet (met, radio_browser, …).
            raise HAError("onboarding step core_config is not done (config dir not from the demo?)")

    async def login(self, username: str, password: str) -> None:
        """Log in through the login flow, the way the frontend does."""
        flow = await self.post("/auth/login_flow", {
            "client_id": self.client_id, "handler": ["homeassistant", None],
            "redirect_uri": self.client_id,
        })
        result = await self.post(f"/auth/login_flow/{flow['flow_id']}", {
            "client_id": self.client_id, "username": username, "password": password,
        })
        if result.get("type") != "create_entry":
            raise HAError(f"login as {username!r} failed: {result.get('errors') or result}")
        await self._token_from_code(result["result"])

    async def _token_from_code(self, code: str) -> None:
        token = await self.post("/auth/token", json=None, data={
            "grant_type": "authorization_code", "code": code, "client_id": self.client_id,
        })
        self.access_token = token["access_token"]
        self.refresh_token = token.get("refresh_token")

    # -- websocket ----------------------------------------------------------------------------

    async def ws_connect(self) -> None:
        ws_url = self.url.replace("http", "ws", 1) + "/api/websocket"
        self._ws = await self.session.ws_connect(ws_url, heartbeat=30,
                                                 timeout=aiohttp.ClientWSTimeout(ws_close=5))
        hello = await self._ws.receive_json(timeout=CALL_TIMEOUT)
        if hello.get("type") != "auth_required":
            raise HAError(f"unexpected websocket greeting {hello}")
        await self._ws.send_json({"type": "auth", "access_token": self.access_token})
        answer = await self._ws.receive_json(timeout=CALL_TIMEOUT)
        if answer.get("type") != "auth_ok":
            raise HAError(f"websocket auth failed: {answer}")

    async def _replies(self, type_: str, fields: dict[str, Any],
                       timeout_s: float) -> AsyncIterator[dict[str, Any]]:
        """Send one command and yield the messages answering it until the caller stops or
        ``timeout_s`` passes (TimeoutError); a failed result raises. It holds the websocket
        lock until closed: use it under ``aclosing``."""
        if self._ws is None:
            await self.ws_connect()
        assert self._ws is not None
        async with self._ws_lock:
            msg_id = next(self._ids)
            await self._ws.send_json({"id": msg_id, "type": type_, **fields})
            async with asyncio.timeout(timeout_s):
                while True:
                    msg = await self._ws.receive_json()
                    if msg.get("id") != msg_id:
                        continue
                    if msg.get("type") == "result" and not msg.get("success"):
                        raise HAError(f"{type_} failed: {msg.get('error')}")
                    yield msg

    async def ws(self, type_: str, timeout_s: float = CALL_TIMEOUT, **fields: Any) -> Any:
        """Send one command and return its result."""
        async with aclosing(self._replies(type_, fields, timeout_s)) as replies:
            async for msg in replies:
                if msg.get("type") == "result":
                    return msg.get("result")

    async def ws_events(self, type_: str, fields: dict[str, Any],
                        timeout_s: float) -> list[dict[str, Any]]:
        """Send a subscription-style command (e.g. assist_pipeline/run) and collect its events
        until the run ends."""
        events: list[dict[str, Any]] = []
        async with aclosing(self._replies(type_, fields, timeout_s)) as replies:
            async for msg in replies:
                if msg.get("type") == "result":
                    continue
                event = msg.get("event") or {}
                events.append(event)
                if event.get("type") in ("run-end", "error"):
                    return events

    async def close(self) -> None:
        if self._ws is not None:
            await self._ws.close()
            self._ws = None

    # -- higher level helpers -----------------------------------------------------------------

    async def state(self, entity_id: str) -> dict[str, Any] | None:
        try:
            return await self.get(f"/api/states/{entity_id}")
        except HAError as err:
            if "-> 404" in str(err):
                return None
            raise

    async def converse(self, text: str, agent_id: str, conversation_id: str | None = None,
                       timeout_s: float = 120) -> dict[str, Any]:
        """A typed (chat-class) turn through the conversation REST API."""
        body: dict[str, Any] = {"text": text, "agent_id": agent_id, "language": "en"}
        if conversation_id:
            body["conversation_id"] = conversation_id
        return await self.post("/api/conversation/process", body, timeout_s=timeout_s)

    async def voice_turn(self, text: str, pipeline_id: str, device_id: str | None,
                         timeout_s: float = 120) -> str:
        """A turn through an Assist pipeline's intent stage, as a voice satellite sends it
        (names the device; the pipeline streams the answer) — Hearth classes it ``voice``."""
        turn = await self.pipeline_turn(text, pipeline_id, device_id=device_id,
                                        timeout_s=timeout_s)
        return turn["speech"]

    async def pipeline_turn(self, text: str, pipeline_id: str, *,
                            conversation_id: str | None = None, device_id: str | None = None,
                            timeout_s: float = 120) -> dict[str, Any]:
        """One text turn through the pipeline's intent stage: the spoken answer, the
        conversation to continue, whether Home Assistant's own intents handled it
        (``local``) rather than the conversation agent, the agent's tool ``calls`` and the
        text its model ``wrote`` (which the spoken answer may replace)."""
        fields: dict[str, Any] = {
            "start_stage": "intent", "end_stage": "intent", "input": {"text": text},
            "pipeline": pipeline_id, "device_id": device_id, "timeout": int(timeout_s)}
        if conversation_id:
            fields["conversation_id"] = conversation_id
        events = await self.ws_events("assist_pipeline/run", fields, timeout_s=timeout_s + 5)
        calls = tool_calls(events)
        for event in events:
            if event.get("type") == "error":
                raise HAError(f"assist pipeline error: {event.get('data')}")
            if event.get("type") == "intent-end":
                data = event.get("data") or {}
                output = data.get("intent_output") or {}
                speech = ((output.get("response") or {}).get("speech") or {}).get("plain") or {}
                return {"speech": str(speech.get("speech", "")),
                        "conversation_id": output.get("conversation_id"),
                        "local": bool(data.get("processed_locally")), "calls": calls,
                        "wrote": model_text(events)}
        kinds = [event.get("type") for event in events]
        raise HAError(f"assist pipeline ended without an answer: {kinds}; last {events[-2:]}")


def tool_calls(events: list[dict[str, Any]]) -> list[str]:
    """The tool calls a pipeline run's streamed chat log made, as ``name(arguments)``, each
    followed by its result's error where it failed: what the model did, beside what it said."""
    out: list[str] = []
    for event in events:
        if event.get("type") != "intent-progress":
            continue
        delta = (event.get("data") or {}).get("chat_log_delta") or {}
        for call in delta.get("tool_calls") or ():
            args = json.dumps(call.get("tool_args"), sort_keys=True)
            out.append(f"{call.get('tool_name')}({args})")
        result = delta.get("tool_result")  # the result's data, in every release tested
        if not isinstance(result, dict):
            continue
        if "error" in result:  # the tool raised
            out.append(f"  -> error: {str(result.get('error_text') or result['error'])[:120]}")
        elif result.get("response_type") == "error":  # the intent answered with an error
            speech = ((result.get("speech") or {}).get("plain") or {}).get("speech")
            out.append(f"  -> error: {str(speech)[:120]}")
    return out


def model_text(events: list[dict[str, Any]]) -> str:
    """The text a pipeline run's streamed chat log received from the agent, its messages
    joined by " | ": what the model wrote, calls aside."""
    messages: list[str] = []
    for event in events:
        if event.get("type") != "intent-progress":
            continue
        delta = (event.get("data") or {}).get("chat_log_delta") or {}
        if delta.get("role") == "assistant":
            messages.append("")
        if isinstance(content := delta.get("content"), str) and messages:
            messages[-1] += content
    return " | ".join(m for m in messages if m)
