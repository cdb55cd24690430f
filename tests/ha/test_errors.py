"""What a conversation turn or an action does when the server refuses it: a refused key starts
re-authentication, an error inside the stream ends the turn with the server's message, an
action names the entry it cannot use."""

from __future__ import annotations

import pytest
from homeassistant.components import conversation
from homeassistant.config_entries import SOURCE_REAUTH
from homeassistant.core import Context, HomeAssistant
from homeassistant.exceptions import HomeAssistantError, ServiceValidationError
from homeassistant.helpers import intent
from pytest_homeassistant_custom_component.common import MockConfigEntry

from custom_components.hearth.const import DOMAIN

from .conftest import FakeHearth, async_setup_hearth, entity_of

pytestmark = [pytest.mark.ha, pytest.mark.usefixtures("socket_enabled")]


async def _failed_turn(hass: HomeAssistant, entry: MockConfigEntry) -> str:
    """A turn that fails: what it says."""
    result = await conversation.async_converse(
        hass, "Hello", None, Context(), agent_id=entity_of(hass, entry, "conversation")
    )
    assert result.response.response_type is intent.IntentResponseType.ERROR
    return result.response.speech["plain"]["speech"]


async def test_refused_key_mid_session_starts_reauth(
    hass: HomeAssistant, fake_hearth: FakeHearth, fake_entry: MockConfigEntry
) -> None:
    """The server starts refusing the key during a turn: the turn says so, and Home Assistant
    asks for a new key."""
    fake_hearth.api_key = "rotated"
    assert "refused the API key" in await _failed_turn(hass, fake_entry)
    await hass.async_block_till_done()
    flows = hass.config_entries.flow.async_progress_by_handler(DOMAIN)
    assert [flow["context"]["source"] for flow in flows] == [SOURCE_REAUTH]


async def test_error_inside_the_stream_ends_the_turn(
    hass: HomeAssistant, fake_hearth: FakeHearth, fake_entry: MockConfigEntry,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An error event in the answer's stream (the server failed after it began) ends the turn
    with the server's message, logged as an error."""
    fake_hearth.chat_handler = lambda body: [
        {"error": {"message": "the worker crashed", "type": "server_error"}}
    ]
    assert "the worker crashed" in await _failed_turn(hass, fake_entry)
    assert any(
        r.levelname == "ERROR" and "the worker crashed" in r.getMessage() for r in caplog.records
    )
    assert hass.config_entries.flow.async_progress_by_handler(DOMAIN) == []


async def _get_job(hass: HomeAssistant, data: dict[str, str]) -> None:
    await hass.services.async_call(
        DOMAIN, "get_job", {"job_id": "job_1", **data}, blocking=True, return_response=True
    )


async def test_actions_name_the_entry_they_cannot_use(
    hass: HomeAssistant, fake_hearth: FakeHearth, fake_entry: MockConfigEntry
) -> None:
    """An action refuses, by name, an id that is not a Hearth entry, an entry that is not
    loaded, and a call without an id while two servers are loaded; the server's own failure
    is a server error, a refused key starts re-authentication."""
    other = await async_setup_hearth(hass, fake_hearth.url)
    cases = [
        ({"config_entry_id": "nope"}, "invalid_config_entry"),
        ({}, "multiple_entries"),
    ]
    for data, key in cases:
        with pytest.raises(ServiceValidationError) as raised:
            await _get_job(hass, data)
        assert raised.value.translation_key == key, data
    await hass.config_entries.async_unload(other.entry_id)
    with pytest.raises(ServiceValidationError) as raised:
        await _get_job(hass, {"config_entry_id": other.entry_id})
    assert raised.value.translation_key == "entry_not_loaded"

    fake_hearth.api_key = "rotated"
    with pytest.raises(HomeAssistantError) as raised:
        await _get_job(hass, {})
    assert raised.value.translation_key == "invalid_auth"
    await hass.async_block_till_done()
    assert hass.config_entries.flow.async_progress_by_handler(DOMAIN)
