"""Home Assistant's own Ollama integration (``homeassistant.components.ollama``) against the real
Hearth server (SmolLM2-135M), set up as a user does: the config flow with the server's URL, then
conversation and AI task subentries naming a model as /api/tags lists it.

The class a turn ran at is read from the server's own /v1/queue over HTTP.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import voluptuous as vol
from hearth_server import HearthServer
from homeassistant.components import ai_task
from homeassistant.config_entries import ConfigEntry, ConfigEntryState
from homeassistant.const import CONF_MODEL, CONF_NAME, CONF_URL
from homeassistant.core import HomeAssistant
from homeassistant.data_entry_flow import FlowResultType
from homeassistant.helpers import entity_registry as er
from homeassistant.helpers import intent
from homeassistant.setup import async_setup_component

from .conftest import async_server_get, async_wait_for, start_real_server

pytestmark = [pytest.mark.ha, pytest.mark.model, pytest.mark.usefixtures("socket_enabled")]

OLLAMA = "ollama"
ALIASES = ("voice", "chat", "agent", "background")
MAX_NAME = 24


@pytest.fixture(scope="module")
def ollama_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HearthServer]:
    """One real Hearth server for this module, without an API key: the Ollama integration of
    the oldest release tested (2026.2) cannot send one."""
    server = start_real_server(tmp_path_factory)
    yield server
    server.stop()


async def _server_get(hass: HomeAssistant, server: HearthServer, path: str) -> dict[str, Any]:
    """GET a path of the real (keyless) server without blocking the event loop."""
    return await async_server_get(hass, server, path, key=None)


async def _completed(hass: HomeAssistant, server: HearthServer) -> dict[str, int]:
    queue = await _server_get(hass, server, "/v1/queue")
    return {name: data["completed"] for name, data in queue["classes"].items()}


async def _async_served(
    hass: HomeAssistant, server: HearthServer, before: dict[str, int], request_class: str
) -> None:
    """Wait until the server counts one more completed request of ``request_class``; no other
    class may have moved (this module's server serves nothing else)."""

    async def counted() -> dict[str, int] | None:
        now = await _completed(hass, server)
        return now if now[request_class] > before[request_class] else None

    now = await async_wait_for(counted, within=20)
    assert now == {**before, request_class: before[request_class] + 1}, (before, now)


async def _listed_models(hass: HomeAssistant, server: HearthServer) -> list[str]:
    """The model names /api/tags lists, as Ollama's clients read them."""
    return [model["model"] for model in (await _server_get(hass, server, "/api/tags"))["models"]]


async def _latest(hass: HomeAssistant, server: HearthServer) -> str:
    models = await _listed_models(hass, server)
    assert models[0].endswith(":latest"), models
    return models[0]


async def _async_setup_ollama(hass: HomeAssistant, server: HearthServer) -> ConfigEntry:
    """Add the server through the Ollama integration's config flow; the loaded entry."""
    assert await async_setup_component(hass, "conversation", {})
    result = await hass.config_entries.flow.async_init(OLLAMA, context={"source": "user"})
    assert result["type"] is FlowResultType.FORM, result
    assert result["step_id"] == "user"
    result = await hass.config_entries.flow.async_configure(
        result["flow_id"], {CONF_URL: server.url}
    )
    assert result["type"] is FlowResultType.CREATE_ENTRY, result
    entry: ConfigEntry = result["result"]
    await hass.async_block_till_done()
    assert entry.data[CONF_URL].rstrip("/") == server.url
    assert entry.state is ConfigEntryState.LOADED
    return entry


def _model_options(form: dict[str, Any]) -> list[dict[str, str]]:
    """The model choices a subentry form offers."""
    for key, selector in form["data_schema"].schema.items():
        if str(key) == CONF_MODEL:
            return list(selector.config["options"])
    raise AssertionError("the form has no model field")


async def _async_add_subentry(
    hass: HomeAssistant, entry: ConfigEntry, subentry_type: str, data: dict[str, Any]
) -> str:
    """Run a subentry flow with the form's input ``data``; the new subentry's id, once the
    entry has reloaded with it."""
    form = await hass.config_entries.subentries.async_init(
        (entry.entry_id, subentry_type), context={"source": "user"}
    )
    assert form["type"] is FlowResultType.FORM, form
    assert form["step_id"] == "set_options"
    # The server's models are offered as downloaded: the integration parsed /api/tags.
    downloaded = [
        option["value"] for option in _model_options(form)
        if option["label"].endswith("(downloaded)")
    ]
    assert data[CONF_MODEL] in downloaded, downloaded
    result = await hass.config_entries.subentries.async_configure(form["flow_id"], data)
    # A model the server did not list would start a download (a progress step) instead.
    assert result["type"] is FlowResultType.CREATE_ENTRY, result
    await hass.async_block_till_done()
    assert entry.state is ConfigEntryState.LOADED
    (subentry_id,) = [
        subentry.subentry_id for subentry in entry.subentries.values()
        if subentry.subentry_type == subentry_type and subentry.title == data[CONF_NAME]
    ]
    assert entry.subentries[subentry_id].data[CONF_MODEL] == data[CONF_MODEL]
    return subentry_id


def _entity_of(hass: HomeAssistant, domain: str, subentry_id: str) -> str:
    """The entity the Ollama integration made for a subentry (its unique id)."""
    entity_id = er.async_get(hass).async_get_entity_id(domain, OLLAMA, subentry_id)
    assert entity_id, (domain, subentry_id)
    assert hass.states.get(entity_id) is not None
    return entity_id


async def _async_converse(hass: HomeAssistant, agent_id: str, text: str) -> str:
    """One turn through ``conversation.process``; the spoken answer."""
    response = await hass.services.async_call(
        "conversation",
        "process",
        {"agent_id": agent_id, "text": text},
        blocking=True,
        return_response=True,
    )
    result = response["response"]
    assert result["response_type"] == intent.IntentResponseType.ACTION_DONE.value, result
    speech: str = result["speech"]["plain"]["speech"]
    return speech


async def test_config_flow_and_conversation(
    hass: HomeAssistant, ollama_server: HearthServer
) -> None:
    """The user step accepts the server's URL, a conversation subentry offers the server's
    models and names one, and its agent answers through /api/chat."""
    models = await _listed_models(hass, ollama_server)
    base = models[0].removesuffix(":latest")
    assert models == [f"{base}:latest", *(f"{base}:{alias}" for alias in ALIASES)]

    entry = await _async_setup_ollama(hass, ollama_server)
    subentry_id = await _async_add_subentry(
        hass, entry, "conversation", {CONF_NAME: "Hearth chat", CONF_MODEL: models[0]}
    )
    agent_id = _entity_of(hass, "conversation", subentry_id)
    before = await _completed(hass, ollama_server)

    speech = await _async_converse(hass, agent_id, "What is the capital of France?")
    assert speech.strip()

    # The turn reached the real server: a plain name runs at /api/chat's default class.
    await _async_served(hass, ollama_server, before, "chat")


async def test_ai_task_structured_data(hass: HomeAssistant, ollama_server: HearthServer) -> None:
    """An AI task subentry on the ``:background`` alias generates data of a structure: Ollama's
    ``format`` carries the JSON schema and the server's grammar holds the answer to it, at the
    background class. The name is bounded: sampled at the server's default temperature (Home
    Assistant sends none) the small model now and then runs a free string past max_tokens, and
    a cut answer is not JSON."""
    entry = await _async_setup_ollama(hass, ollama_server)
    base = (await _latest(hass, ollama_server)).removesuffix(":latest")
    subentry_id = await _async_add_subentry(
        hass, entry, "ai_task_data", {CONF_NAME: "Hearth task", CONF_MODEL: f"{base}:background"}
    )
    before = await _completed(hass, ollama_server)

    result = await ai_task.async_generate_data(
        hass,
        task_name="Count fruit",
        entity_id=_entity_of(hass, "ai_task", subentry_id),
        instructions="Name one fruit and say how many of it are in a bowl.",
        structure=vol.Schema(
            {
                vol.Required("name", description="the fruit's name"): vol.All(
                    str, vol.Length(min=1, max=MAX_NAME)
                ),
                vol.Required("count", description="how many are in the bowl"): int,
            }
        ),
    )
    data = result.data
    assert isinstance(data, dict), data
    assert set(data) == {"name", "count"}
    assert isinstance(data["name"], str) and 1 <= len(data["name"]) <= MAX_NAME
    assert isinstance(data["count"], int) and not isinstance(data["count"], bool)
    await _async_served(hass, ollama_server, before, "background")


async def test_voice_alias_runs_at_voice_class(
    hass: HomeAssistant, ollama_server: HearthServer
) -> None:
    """A conversation subentry naming the ``:voice`` alias runs its turns in the voice class,
    as the server's own counters show."""
    entry = await _async_setup_ollama(hass, ollama_server)
    base = (await _latest(hass, ollama_server)).removesuffix(":latest")
    subentry_id = await _async_add_subentry(
        hass, entry, "conversation", {CONF_NAME: "Hearth voice", CONF_MODEL: f"{base}:voice"}
    )
    agent_id = _entity_of(hass, "conversation", subentry_id)
    before = await _completed(hass, ollama_server)

    speech = await _async_converse(hass, agent_id, "Hello, who are you?")
    assert speech.strip()

    # Only the voice class moved: the alias, not the endpoint's default (chat), chose it.
    await _async_served(hass, ollama_server, before, "voice")


def _as_the_frontend_fills(form: dict[str, Any]) -> dict[str, Any]:
    """The input Home Assistant's frontend submits for a form left as shown: each field's
    suggested value, else its default."""
    data: dict[str, Any] = {}
    for key in form["data_schema"].schema:
        suggested = (key.description or {}).get("suggested_value")
        if suggested is not None:
            data[str(key)] = suggested
        elif callable(key.default):
            data[str(key)] = key.default()
    return data


async def test_conversation_as_the_form_suggests(
    hass: HomeAssistant, ollama_server: HearthServer
) -> None:
    """A conversation subentry submitted with the form's suggested values, as the frontend
    sends them: its number fields (num_ctx, max_history, keep_alive) reach the integration as
    floats, and the agent still answers."""
    entry = await _async_setup_ollama(hass, ollama_server)
    model = await _latest(hass, ollama_server)
    form = await hass.config_entries.subentries.async_init(
        (entry.entry_id, "conversation"), context={"source": "user"}
    )
    data = {**_as_the_frontend_fills(form), CONF_NAME: "Hearth form", CONF_MODEL: model}
    assert {"prompt", "num_ctx", "max_history", "keep_alive", "think"} <= set(data), data
    result = await hass.config_entries.subentries.async_configure(form["flow_id"], data)
    assert result["type"] is FlowResultType.CREATE_ENTRY, result
    await hass.async_block_till_done()
    (subentry,) = [s for s in entry.subentries.values() if s.title == "Hearth form"]
    assert subentry.data["num_ctx"] == 8192 and isinstance(subentry.data["num_ctx"], float)
    before = await _completed(hass, ollama_server)

    agent_id = _entity_of(hass, "conversation", subentry.subentry_id)
    # The integration sends options={"num_ctx": 8192.0}; Ollama (and Hearth) take it as 8192.
    speech = await _async_converse(hass, agent_id, "Hello, who are you?")
    assert speech.strip()
    await _async_served(hass, ollama_server, before, "chat")
