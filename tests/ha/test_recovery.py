"""An entry whose set-up failed comes back once its flow fixes it: re-authentication after a
refused key, reconfigure after an unreachable URL; no restart needed."""

from __future__ import annotations

import pytest
from hearth_server import free_port
from homeassistant.config_entries import SOURCE_REAUTH, ConfigEntryState
from homeassistant.const import CONF_API_KEY, CONF_URL, STATE_UNAVAILABLE
from homeassistant.core import HomeAssistant
from homeassistant.setup import async_setup_component
from pytest_homeassistant_custom_component.common import MockConfigEntry

from custom_components.hearth.const import DOMAIN

from .conftest import (
    AI_TASK_OPTIONS,
    API_KEY,
    CONVERSATION_OPTIONS,
    FakeHearth,
    entity_of,
    subentry,
)

pytestmark = [pytest.mark.ha, pytest.mark.usefixtures("socket_enabled")]


async def _failed_entry(hass: HomeAssistant, data: dict[str, str]) -> MockConfigEntry:
    assert await async_setup_component(hass, "conversation", {})
    entry = MockConfigEntry(
        domain=DOMAIN,
        title="Hearth",
        data=data,
        subentries_data=[
            subentry("conversation", CONVERSATION_OPTIONS),
            subentry("ai_task_data", AI_TASK_OPTIONS),
        ],
    )
    entry.add_to_hass(hass)
    await hass.config_entries.async_setup(entry.entry_id)
    await hass.async_block_till_done()
    return entry


def _assert_serving(hass: HomeAssistant, entry: MockConfigEntry) -> None:
    assert entry.state is ConfigEntryState.LOADED
    for domain in ("conversation", "ai_task", "binary_sensor"):
        state = hass.states.get(entity_of(hass, entry, domain))
        assert state is not None and state.state != STATE_UNAVAILABLE, domain


async def test_reauth_brings_a_failed_entry_back(
    hass: HomeAssistant, fake_hearth: FakeHearth
) -> None:
    """SETUP_ERROR (refused key) → re-authentication with the right key → LOADED, with its
    agents and sensors."""
    entry = await _failed_entry(hass, {CONF_URL: fake_hearth.url, CONF_API_KEY: "expired"})
    assert entry.state is ConfigEntryState.SETUP_ERROR
    [flow] = hass.config_entries.flow.async_progress_by_handler(DOMAIN)
    assert flow["context"]["source"] == SOURCE_REAUTH

    result = await hass.config_entries.flow.async_configure(
        flow["flow_id"], {CONF_API_KEY: API_KEY}
    )
    await hass.async_block_till_done()
    assert result["reason"] == "reauth_successful"
    assert entry.data[CONF_API_KEY] == API_KEY
    _assert_serving(hass, entry)


async def test_reconfigure_brings_a_retrying_entry_back(
    hass: HomeAssistant, fake_hearth: FakeHearth
) -> None:
    """SETUP_RETRY (nothing at the URL) → reconfigure to the server's URL → LOADED at once,
    not at the next retry of Home Assistant's back-off."""
    entry = await _failed_entry(
        hass, {CONF_URL: f"http://127.0.0.1:{free_port()}", CONF_API_KEY: API_KEY}
    )
    assert entry.state is ConfigEntryState.SETUP_RETRY

    result = await entry.start_reconfigure_flow(hass)
    result = await hass.config_entries.flow.async_configure(
        result["flow_id"], {CONF_URL: fake_hearth.url, CONF_API_KEY: API_KEY}
    )
    await hass.async_block_till_done()
    assert result["reason"] == "reconfigure_successful"
    _assert_serving(hass, entry)
    assert entry.runtime_data.client.url == fake_hearth.url
