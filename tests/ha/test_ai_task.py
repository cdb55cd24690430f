"""AI Task entities against the real Hearth server (SmolLM2-135M)."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import pytest
import voluptuous as vol
from hearth_server import HearthServer
from homeassistant.components import ai_task, conversation
from homeassistant.core import HomeAssistant
from homeassistant.exceptions import HomeAssistantError
from homeassistant.helpers.entity_component import DATA_INSTANCES
from pytest_homeassistant_custom_component.common import MockConfigEntry

from custom_components.hearth.const import CONF_MODEL, CONF_TEMPERATURE

from .conftest import (
    AI_TASK_OPTIONS,
    FakeHearth,
    async_queue,
    async_setup_hearth,
    async_wait_for,
    entity_of,
    open_chat_session,
    text_chunks,
)

pytestmark = [pytest.mark.ha, pytest.mark.usefixtures("socket_enabled")]


async def _background_completed(hass: HomeAssistant, server: HearthServer) -> int:
    return (await async_queue(hass, server))["classes"]["background"]["completed"]


@pytest.mark.model
async def test_generate_structured_data(
    hass: HomeAssistant, hearth_server: HearthServer
) -> None:
    """With a structure the answer is JSON matching it, served at the background class.
    Greedy: sampled at the default temperature, the small test model now and then invents a
    name that runs past max_tokens, and a cut answer is not JSON."""
    entry = await async_setup_hearth(
        hass, hearth_server.url, ai_task={**AI_TASK_OPTIONS, CONF_TEMPERATURE: 0.0}
    )
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


VISION_MODEL = {"classes": ["chat", "background"], "aliases": ["seer:chat"],
                "capabilities": ["completion", "vision"]}
TEXT_MODEL = {"classes": ["voice", "background"], "capabilities": ["completion", "tools"]}


async def _serve(
    hass: HomeAssistant, fake_hearth: FakeHearth, entry: MockConfigEntry,
    models: dict[str, dict[str, Any]],
) -> None:
    """Have the fake server list ``models`` in its queue health, and poll it."""
    fake_hearth.queue["models"] = models
    await entry.runtime_data.coordinator.async_refresh()
    await hass.async_block_till_done()


def _takes_attachments(hass: HomeAssistant, entry: MockConfigEntry) -> bool:
    state = hass.states.get(entity_of(hass, entry, "ai_task"))
    features = state.attributes["supported_features"]
    return bool(features & ai_task.AITaskEntityFeature.SUPPORT_ATTACHMENTS)


async def test_attachments_declared_only_with_vision(
    hass: HomeAssistant, fake_hearth: FakeHearth, fake_entry: MockConfigEntry
) -> None:
    """No vision in the model serving the task's class (or none said): Home Assistant refuses
    a task with a picture before anything reaches the server. A subentry that picked a vision
    model takes pictures."""
    assert not _takes_attachments(hass, fake_entry)  # the server lists no capabilities
    await _serve(hass, fake_hearth, fake_entry, {"small": TEXT_MODEL, "seer": VISION_MODEL})
    assert not _takes_attachments(hass, fake_entry)
    with pytest.raises(HomeAssistantError) as raised:
        await ai_task.async_generate_data(
            hass,
            task_name="Look",
            entity_id=entity_of(hass, fake_entry, "ai_task"),
            instructions="What is at the door?",
            attachments=[{"media_content_id": "media-source://camera/door",
                          "media_content_type": "image/jpeg"}],
        )
    # Older releases say it in English only, newer by a translation key.
    assert "attachments" in (raised.value.translation_key or str(raised.value))
    assert fake_hearth.chat_requests == []

    subentry = next(
        s for s in fake_entry.subentries.values() if s.subentry_type == "ai_task_data"
    )
    hass.config_entries.async_update_subentry(
        fake_entry, subentry, data={**subentry.data, CONF_MODEL: "seer:chat"}  # an alias
    )
    await hass.async_block_till_done()
    assert _takes_attachments(hass, fake_entry)


async def _handle_with_attachment(
    hass: HomeAssistant, entry: MockConfigEntry, attachment: conversation.Attachment
) -> None:
    """Run the AI Task entity on a chat log whose user turn carries one attachment."""
    entity = hass.data[DATA_INSTANCES]["ai_task"].get_entity(entity_of(hass, entry, "ai_task"))
    with (
        open_chat_session(hass) as session,
        conversation.async_get_chat_log(hass, session) as chat_log,
    ):
        chat_log.async_add_user_content(
            conversation.UserContent("What is in the picture?", attachments=[attachment])
        )
        await entity._async_handle_chat_log(chat_log, request_class="background", user="t")


async def test_image_attachment_goes_as_an_image_part(
    hass: HomeAssistant, fake_hearth: FakeHearth, fake_entry: MockConfigEntry, tmp_path: Path
) -> None:
    """With a vision model serving its class, the entity says it takes attachments, and an
    attached image reaches the server as an OpenAI image part (a base64 data URL) after the
    question's text."""
    await _serve(hass, fake_hearth, fake_entry, {"fake-model": VISION_MODEL})
    assert _takes_attachments(hass, fake_entry)
    picture = tmp_path / "door.png"
    picture.write_bytes(b"\x89PNG\r\n\x1a\n-a-tiny-picture")
    fake_hearth.chat_handler = lambda body: text_chunks("A closed door.")
    door = conversation.Attachment("media-source://camera/door", "image/png", picture)
    await _handle_with_attachment(hass, fake_entry, door)
    _, body = fake_hearth.chat_requests[-1]
    user = body["messages"][-1]
    assert user["role"] == "user"
    assert user["content"] == [
        {"type": "text", "text": "What is in the picture?"},
        {"type": "image_url", "image_url": {
            "url": "data:image/png;base64," + base64.b64encode(picture.read_bytes()).decode()}},
    ]


async def test_other_attachments_are_refused_by_name(
    hass: HomeAssistant, fake_hearth: FakeHearth, fake_entry: MockConfigEntry, tmp_path: Path
) -> None:
    """A file that is not an image is refused before anything is sent, naming its type."""
    notes = tmp_path / "notes.pdf"
    notes.write_bytes(b"%PDF-1.7")
    with pytest.raises(HomeAssistantError) as raised:
        await _handle_with_attachment(
            hass, fake_entry, conversation.Attachment("media-source://x", "application/pdf", notes)
        )
    assert raised.value.translation_key == "unsupported_attachments"
    assert raised.value.translation_placeholders == {"mime_type": "application/pdf"}
    assert fake_hearth.chat_requests == []
