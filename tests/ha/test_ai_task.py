"""AI Task entities against the real Hearth server (SmolLM2-135M)."""

from __future__ import annotations

import pytest
import voluptuous as vol
from hearth_server import HearthServer
from homeassistant.components import ai_task
from homeassistant.core import HomeAssistant
from pytest_homeassistant_custom_component.common import MockConfigEntry

from .conftest import FakeHearth, async_queue, async_setup_hearth, async_wait_for, entity_of

pytestmark = [pytest.mark.ha, pytest.mark.usefixtures("socket_enabled")]


async def _background_completed(hass: HomeAssistant, server: HearthServer) -> int:
    return (await async_queue(hass, server))["classes"]["background"]["completed"]


@pytest.mark.model
async def test_generate_structured_data(
    hass: HomeAssistant, hearth_server: HearthServer
) -> None:
    """With a structure the answer is JSON matching it, served at the background class."""
    entry = await async_setup_hearth(hass, hearth_server.url)
    before = await _background_completed(hass, hearth_server)

    result = await ai_task.async_generate_data(
        hass,
        task_name="Describe a person",
        entity_id=entity_of(hass, entry, "ai_task"),
        instructions="Invent a person: give their name and their age in years.",
        structure=vol.Schema(
            {
                vol.Required("name", description="the person's name"): str,
                vol.Required("age", description="age in years"): int,
            }
        ),
    )
    assert isinstance(result.data, dict)
    assert set(result.data) == {"name", "age"}
    assert isinstance(result.data["name"], str)
    assert isinstance(result.data["age"], int)

    async def counted() -> bool:
        return await _background_completed(hass, hearth_server) > before

    await async_wait_for(counted, within=20)


@pytest.mark.model
async def test_generate_text(hass: HomeAssistant, hearth_server: HearthServer) -> None:
    """Without a structure the answer is the model's text."""
    entry = await async_setup_hearth(hass, hearth_server.url)
    result = await ai_task.async_generate_data(
        hass,
        task_name="Greeting",
        entity_id=entity_of(hass, entry, "ai_task"),
        instructions="Write a one-line greeting for a family.",
    )
    assert isinstance(result.data, str)
    assert result.data.strip()


async def test_structured_request_format(
    hass: HomeAssistant, fake_hearth: FakeHearth, fake_entry: MockConfigEntry
) -> None:
    """The structure goes to the server as a strict JSON-schema response_format."""
    fake_hearth.chat_handler = lambda body: [
        {"choices": [{"index": 0, "delta": {"content": '{"colour": "red", "count": 3'}}]},
        {"choices": [{"index": 0, "delta": {"content": ', "note": null}'}}]},
    ]
    result = await ai_task.async_generate_data(
        hass,
        task_name="Count things",
        entity_id=entity_of(hass, fake_entry, "ai_task"),
        instructions="Count the red things.",
        structure=vol.Schema(
            {
                vol.Required("colour"): str,
                vol.Required("count"): int,
                vol.Optional("note"): str,
            }
        ),
    )
    assert result.data == {"colour": "red", "count": 3, "note": None}
    headers, body = fake_hearth.chat_requests[-1]
    assert body["priority"] == "background"
    assert headers["X-Hearth-Class"] == "background"
    assert body["max_tokens"] == 64
    response_format = body["response_format"]
    assert response_format["type"] == "json_schema"
    assert response_format["json_schema"]["name"] == "count_things"
    assert response_format["json_schema"]["strict"] is True
    schema = response_format["json_schema"]["schema"]
    assert schema["type"] == "object"
    assert schema["additionalProperties"] is False
    assert sorted(schema["required"]) == ["colour", "count", "note"]
    assert schema["properties"]["count"]["type"] == "integer"
    assert schema["properties"]["note"]["type"] == ["string", "null"]
