"""Supervisor discovery announcement, against a fake Supervisor on 127.0.0.1."""

from __future__ import annotations

import logging
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from hearth.discovery import announce
from hearth.settings import Settings

TOKEN = "supervisor-token-123"
API_KEY = "hearth-secret-key-456"


@dataclass
class FakeSupervisor:
    url: str = ""
    statuses: list[int] = field(default_factory=list)  # answers in order; then 200
    requests: list[dict[str, Any]] = field(default_factory=list)

    async def handle(self, request: web.Request) -> web.Response:
        self.requests.append({
            "method": request.method,
            "path": request.path,
            "authorization": request.headers.get("Authorization"),
            "json": await request.json(),
        })
        status = self.statuses.pop(0) if self.statuses else 200
        if status >= 300:
            # a misbehaving Supervisor echoing the request must not leak the key into our log
            return web.json_response(
                {"result": "error", "message": f"echo {await request.text()}"}, status=status)
        return web.json_response({"result": "ok", "data": {"uuid": "abc123"}}, status=status)


@pytest.fixture
async def supervisor() -> AsyncIterator[FakeSupervisor]:
    fake = FakeSupervisor()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", fake.handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    fake.url = f"http://127.0.0.1:{port}"
    try:
        yield fake
    finally:
        await runner.cleanup()


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


@pytest.fixture(autouse=True)
def _no_env_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SUPERVISOR_TOKEN", raising=False)


async def test_announces_without_api_key(supervisor: FakeSupervisor, session) -> None:
    settings = Settings(port=8123)
    ok = await announce(settings, session, supervisor_url=supervisor.url, token=TOKEN,
                        hostname="abcd1234-hearth")
    assert ok is True
    assert len(supervisor.requests) == 1
    req = supervisor.requests[0]
    assert req["method"] == "POST"
    assert req["path"] == "/discovery"
    assert req["authorization"] == f"Bearer {TOKEN}"
    assert req["json"] == {"service": "hearth",
                           "config": {"host": "abcd1234-hearth", "port": 8123}}
    assert "api_key" not in req["json"]["config"]


async def test_announces_api_key_when_set(supervisor: FakeSupervisor, session, caplog) -> None:
    caplog.set_level(logging.DEBUG, logger="hearth")
    settings = Settings(api_key=API_KEY)
    ok = await announce(settings, session, supervisor_url=supervisor.url + "/", token=TOKEN,
                        hostname="h")
    assert ok is True
    [req] = supervisor.requests
    assert req["path"] == "/discovery"
    assert req["json"]["config"] == {"host": "h", "port": 8080, "api_key": API_KEY}
    assert API_KEY not in caplog.text
    assert TOKEN not in caplog.text


async def test_token_and_hostname_from_environment(supervisor: FakeSupervisor, session,
                                                   monkeypatch) -> None:
    monkeypatch.setenv("SUPERVISOR_TOKEN", "from-env")
    ok = await announce(Settings(), session, supervisor_url=supervisor.url)
    assert ok is True
    [req] = supervisor.requests
    assert req["authorization"] == "Bearer from-env"
    assert req["json"]["config"]["host"] == socket.gethostname()


async def test_no_token_sends_nothing(supervisor: FakeSupervisor, session) -> None:
    assert await announce(Settings(), session, supervisor_url=supervisor.url) is False
    assert supervisor.requests == []


async def test_server_error_returns_false_after_retries(supervisor: FakeSupervisor, session,
                                                        caplog) -> None:
    caplog.set_level(logging.DEBUG, logger="hearth")
    supervisor.statuses = [500, 500, 500]
    ok = await announce(Settings(api_key=API_KEY), session, supervisor_url=supervisor.url,
                        token=TOKEN, hostname="h", attempts=3, backoff=0)
    assert ok is False
    assert len(supervisor.requests) == 3
    assert "500" in caplog.text
    assert API_KEY not in caplog.text
    assert TOKEN not in caplog.text


async def test_transient_error_is_retried(supervisor: FakeSupervisor, session) -> None:
    supervisor.statuses = [503]
    ok = await announce(Settings(), session, supervisor_url=supervisor.url, token=TOKEN,
                        hostname="h", attempts=3, backoff=0)
    assert ok is True
    assert len(supervisor.requests) == 2


async def test_client_error_is_not_retried(supervisor: FakeSupervisor, session) -> None:
    supervisor.statuses = [400]
    ok = await announce(Settings(), session, supervisor_url=supervisor.url, token=TOKEN,
                        hostname="h", attempts=3, backoff=0)
    assert ok is False
    assert len(supervisor.requests) == 1


async def test_unreachable_supervisor_returns_false(session) -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ok = await announce(Settings(), session, supervisor_url=f"http://127.0.0.1:{port}",
                        token=TOKEN, hostname="h", attempts=2, backoff=0, request_timeout=2)
    assert ok is False
