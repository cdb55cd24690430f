"""A real Hearth server with two models, seen from inside Home Assistant: one sensor per model
with its state, and subentries that pick a model or leave it to the class's default. Both
entries load SmolLM2-135M (the model every test environment has; the server tests run Gemma 3
270M beside it): what is tested is which entry serves, loads and reports."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from hearth_server import HearthServer
from homeassistant import config_entries
from homeassistant.components import ai_task
from homeassistant.const import CONF_NAME
from homeassistant.core import HomeAssistant
from homeassistant.data_entry_flow import FlowResultType

from custom_components.hearth.const import CONF_MAX_TOKENS, CONF_MODEL, CONF_REQUEST_CLASS

from .conftest import (
    AI_TASK_OPTIONS,
    API_KEY,
    async_queue,
    async_setup_hearth,
    async_wait_for,
    entity_of,
    sensor_of,
    start_real_server,
)

pytestmark = [pytest.mark.ha, pytest.mark.model, pytest.mark.usefixtures("socket_enabled")]


@pytest.fixture(scope="module")
def two_models(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HearthServer]:
    models = [{"name": "small", "classes": ["voice", "chat"], "pinned": True},
              {"name": "summariser", "classes": ["background"]}]
    server = start_real_server(tmp_path_factory, "--api-key", API_KEY, "--n-ctx", "4096",
                               "--n-parallel", "2", "--models", json.dumps(models))
    yield server
    server.stop()


async def test_each_model_has_a_sensor_and_a_subentry_can_pick_one(
    hass: HomeAssistant, two_models: HearthServer
) -> None:
    entry = await async_setup_hearth(
        hass, two_models.url, ai_task={**AI_TASK_OPTIONS, CONF_MODEL: "summariser"}
    )
    small = hass.states.get(sensor_of(hass, entry, "sensor", "model_small"))
    summariser = hass.states.get(sensor_of(hass, entry, "sensor", "model_summariser"))
    assert small.state == "ready" and small.attributes["classes"] == [
        "voice", "chat", "agent", "embedding"]
    assert summariser.state == "unloaded" and summariser.attributes["classes"] == ["background"]
    assert summariser.attributes["memory_bytes"] > 50_000_000

    # The AI Task subentry picked summariser: its request loads it there and is answered by it.
    result = await ai_task.async_generate_data(
        hass, task_name="Name a colour", entity_id=entity_of(hass, entry, "ai_task"),
        instructions="Name one colour.")
    assert result.data
    models = (await async_queue(hass, two_models))["models"]
    assert models["summariser"]["state"] == "ready" and models["summariser"]["loads"] == 1
    await entry.runtime_data.coordinator.async_refresh()
    await async_wait_for(lambda: hass.states.get(summariser.entity_id).state == "ready")

    # The subentry form offers the server's models beside the class default.
    flow = await hass.config_entries.subentries.async_init(
        (entry.entry_id, "ai_task_data"), context={"source": config_entries.SOURCE_USER})
    assert flow["type"] is FlowResultType.FORM
    selector = flow["data_schema"].schema[CONF_MODEL]
    assert selector.config["options"] == ["class_default", "small", "summariser"]
    done = await hass.config_entries.subentries.async_configure(
        flow["flow_id"], {CONF_NAME: "Summaries", CONF_REQUEST_CLASS: "background",
                          CONF_MAX_TOKENS: 50, CONF_MODEL: "class_default"})
    assert done["type"] is FlowResultType.CREATE_ENTRY
    assert CONF_MODEL not in done["data"]  # left to the server
