"""Fixtures for the Hearth integration's tests inside a real Home Assistant.

``custom_components`` is imported here, before Home Assistant's test plugin mounts its own test
config directory (which holds a ``custom_components`` package of its own), so the loader finds the
Hearth integration of this repository.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import socket
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
for _path in (ROOT, ROOT / "tests"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

import pytest  # noqa: E402
import pytest_socket  # noqa: E402
from hearth_server import HearthServer  # noqa: E402
from homeassistant.const import CONF_API_KEY, CONF_LLM_HASS_API, CONF_URL  # noqa: E402
from homeassistant.core import Context, Event, HomeAssistant  # noqa: E402
from homeassistant.helpers import chat_session  # noqa: E402
from homeassistant.helpers import entity_registry as er  # noqa: E402
from homeassistant.setup import async_setup_component  # noqa: E402
from pytest_homeassistant_custom_component.common import MockConfigEntry  # noqa: E402

import custom_components  # noqa: E402, F401  (must come before Home Assistant's test config)
from custom_components.hearth.const import (  # noqa: E402
    CONF_CLASS_POLICY,
    CONF_MAX_HISTORY,
    CONF_MAX_TOKENS,
    CONF_PROMPT,
    CONF_REQUEST_CLASS,
    CONF_TEMPERATURE,
    DOMAIN,
)

# The fake server lives in its own module; the tests import it from here with the fixtures.
from .fake_hearth import (  # noqa: E402, F401
    API_KEY,
    SHADOW_DESCRIPTION,
    FakeHearth,
    call_chunks,
    text_chunks,
    tool_call_script,
    turn_on_tool,
)

# Small answers keep the real model fast on two CPU cores.
CONVERSATION_OPTIONS: dict[str, Any] = {
    CONF_PROMPT: "You are a helpful assistant. Answer in one short sentence.",
    CONF_MAX_TOKENS: 24,
    CONF_TEMPERATURE: 0.0,
    CONF_MAX_HISTORY: 4,
    CONF_CLASS_POLICY: "auto",
}
AI_TASK_OPTIONS: dict[str, Any] = {CONF_REQUEST_CLASS: "background", CONF_MAX_TOKENS: 64}


@pytest.fixture(autouse=True)
async def setup_core(hass: HomeAssistant, enable_custom_integrations: None) -> None:
    """Let Home Assistant load the integration from this repository, with its core
    component set up first (conversation needs it)."""
    assert await async_setup_component(hass, "homeassistant", {})


def deprecation_reports(records: list[logging.LogRecord]) -> list[str]:
    """Home Assistant's reports of deprecated usage by this integration, among log records.

    Home Assistant reports them through ``helpers.frame`` ("Detected that custom integration
    'hearth' ...") or by naming the integration's code next to "deprecated".
    """
    reports = []
    for record in records:
        message = record.getMessage()
        ours = f"integration '{DOMAIN}'" in message or "custom_components.hearth" in message
        reported = record.name.startswith("homeassistant.helpers.frame") or "deprecat" in message
        if ours and reported:
            reports.append(message)
    return reports


@pytest.fixture(autouse=True)
def fail_on_deprecation(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    """Fail a test during which Home Assistant reported this integration's deprecated usage."""
    yield
    records = caplog.get_records("setup") + caplog.get_records("call")
    assert not (reports := deprecation_reports(records)), "\n".join(reports)


def start_real_server(tmp_path_factory: pytest.TempPathFactory, *args: str) -> HearthServer:
    """Start a real Hearth server (SmolLM2-135M, one thread) with extra flags ``args``."""
    # Home Assistant's plugin blocks sockets in tests; picking a port and waiting for /health
    # need them here.
    saved = socket.socket
    pytest_socket.enable_socket()
    try:
        server = HearthServer(*args, "--n-threads", "1",
                              data_dir=tmp_path_factory.mktemp("hearth-data"))
        server.start()
    finally:
        socket.socket = saved
    return server


@pytest.fixture(scope="session")
def hearth_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HearthServer]:
    """One real Hearth server (SmolLM2-135M, API key required) for the whole session."""
    server = start_real_server(tmp_path_factory, "--api-key", API_KEY)
    yield server
    server.stop()


def open_chat_session(hass: HomeAssistant, context: Context | None = None) -> Any:
    """``chat_session.async_get_chat_session``, with the context that releases since 2026.11
    require (None: the caller acts for no user, like a satellite); older ones take none."""
    if "context" in inspect.signature(chat_session.async_get_chat_session).parameters:
        return chat_session.async_get_chat_session(hass, context=context)
    return chat_session.async_get_chat_session(hass)


def server_get(server: HearthServer, path: str, key: str | None = API_KEY) -> dict[str, Any]:
    """GET ``path`` from the real server (blocking; call it in an executor)."""
    headers = {"Authorization": f"Bearer {key}"} if key else None
    status, data = server.get(path, headers=headers)
    assert status == 200, (path, data)
    return data


def server_queue(server: HearthServer) -> dict[str, Any]:
    """Read /v1/queue from the real server (blocking; call it in an executor)."""
    return server_get(server, "/v1/queue")


async def async_server_get(hass: HomeAssistant, server: HearthServer, path: str,
                           key: str | None = API_KEY) -> dict[str, Any]:
    """GET ``path`` from the real server without blocking the event loop."""
    return await hass.async_add_executor_job(server_get, server, path, key)


async def async_queue(hass: HomeAssistant, server: HearthServer) -> dict[str, Any]:
    """Read /v1/queue from the real server without blocking the event loop."""
    return await async_server_get(hass, server, "/v1/queue")


def subentry(
    subentry_type: str, data: dict[str, Any], title: str | None = None
) -> dict[str, Any]:
    """Describe a subentry for MockConfigEntry."""
    return {
        "data": data,
        "subentry_type": subentry_type,
        "title": title or f"Hearth {subentry_type}",
        "unique_id": None,
    }


async def async_setup_hearth(
    hass: HomeAssistant,
    url: str,
    *,
    api_key: str | None = API_KEY,
    conversation: dict[str, Any] | None = None,
    ai_task: dict[str, Any] | None = None,
    unique_id: str | None = None,
) -> MockConfigEntry:
    """Set up Home Assistant's core pieces and one Hearth entry."""
    assert await async_setup_component(hass, "homeassistant", {})
    assert await async_setup_component(hass, "conversation", {})
    data = {CONF_URL: url}
    if api_key:
        data[CONF_API_KEY] = api_key
    entry = MockConfigEntry(
        domain=DOMAIN,
        title="Hearth",
        data=data,
        unique_id=unique_id,
        subentries_data=[
            subentry("conversation", conversation or CONVERSATION_OPTIONS),
            subentry("ai_task_data", ai_task or AI_TASK_OPTIONS),
        ],
    )
    entry.add_to_hass(hass)
    assert await hass.config_entries.async_setup(entry.entry_id)
    await hass.async_block_till_done()
    return entry


def state_changes(hass: HomeAssistant, entity_id: str) -> list[Event]:
    """The state_changed events of ``entity_id`` from now on."""
    events: list[Event] = []
    hass.bus.async_listen(
        "state_changed",
        lambda event: events.append(event) if event.data["entity_id"] == entity_id else None,
    )
    return events


def entity_of(hass: HomeAssistant, entry: MockConfigEntry, domain: str) -> str:
    """Return the id of the entry's (first) entity of a domain."""
    for entity in er.async_entries_for_config_entry(er.async_get(hass), entry.entry_id):
        if entity.domain == domain:
            return entity.entity_id
    raise AssertionError(f"no {domain} entity")


def sensor_of(hass: HomeAssistant, entry: MockConfigEntry, platform: str, key: str) -> str:
    """Return the entity id of one of the server's sensors."""
    entity_id = er.async_get(hass).async_get_entity_id(
        platform, DOMAIN, f"{entry.entry_id}_{key}"
    )
    assert entity_id, key
    return entity_id


async def async_wait_for(predicate: Callable[[], Any], within: float = 30.0) -> Any:
    """Wait until predicate() is truthy (it may be a coroutine function)."""
    async with asyncio.timeout(within):
        while True:
            value = predicate()
            if asyncio.iscoroutine(value):
                value = await value
            if value:
                return value
            await asyncio.sleep(0.1)


@pytest.fixture
async def fake_hearth(socket_enabled: None) -> AsyncIterator[FakeHearth]:
    """A running fake Hearth server."""
    server = FakeHearth()
    await server.start()
    yield server
    await server.stop()


@pytest.fixture
async def fake_entry(hass: HomeAssistant, fake_hearth: FakeHearth) -> MockConfigEntry:
    """A Hearth entry set up against the fake server, its agent allowed to control HA."""
    return await async_setup_hearth(
        hass,
        fake_hearth.url,
        conversation={**CONVERSATION_OPTIONS, CONF_LLM_HASS_API: ["assist"]},
    )
