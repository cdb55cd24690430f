"""Subentry flows: conversation agents and AI Task entities."""

from __future__ import annotations

import pytest
from homeassistant import config_entries
from homeassistant.const import CONF_LLM_HASS_API, CONF_NAME, CONF_URL
from homeassistant.core import HomeAssistant
from homeassistant.data_entry_flow import FlowResultType
from homeassistant.helpers import device_registry as dr
from homeassistant.helpers import entity_registry as er
from pytest_homeassistant_custom_component.common import MockConfigEntry

from custom_components.hearth.const import (
    CONF_CLASS_POLICY,
    CONF_CONFIRM_ACTIONS,
    CONF_HOLD_AFTER,
    CONF_HOLD_PHRASE,
    CONF_MAX_HISTORY,
    CONF_MAX_TOKENS,
    CONF_PROMPT,
    CONF_REQUEST_CLASS,
    CONF_TEMPERATURE,
    DOMAIN,
)

from .conftest import CONVERSATION_OPTIONS, FakeHearth, async_setup_hearth

pytestmark = pytest.mark.ha


async def test_subentry_flows(hass: HomeAssistant, fake_entry: MockConfigEntry) -> None:
    """Add a conversation agent and an AI task; reconfigure the agent's class policy."""
    result = await hass.config_entries.subentries.async_init(
        (fake_entry.entry_id, "conversation"), context={"source": config_entries.SOURCE_USER}
    )
    assert result["type"] is FlowResultType.FORM
    assert result["step_id"] == "set_options"
    result = await hass.config_entries.subentries.async_configure(
        result["flow_id"],
        {
            CONF_NAME: "Kitchen agent",
            CONF_PROMPT: "Be brief.",
            CONF_LLM_HASS_API: ["assist"],
            CONF_MAX_TOKENS: 100.0,
            CONF_TEMPERATURE: 0.5,
            CONF_MAX_HISTORY: 5.0,
            CONF_CLASS_POLICY: "voice",
            CONF_CONFIRM_ACTIONS: False,
            CONF_HOLD_PHRASE: False,
            CONF_HOLD_AFTER: 3,
        },
    )
    assert result["type"] is FlowResultType.CREATE_ENTRY
    assert result["title"] == "Kitchen agent"
    assert result["data"] == {
        CONF_PROMPT: "Be brief.",
        CONF_LLM_HASS_API: ["assist"],
        CONF_MAX_TOKENS: 100,
        CONF_TEMPERATURE: 0.5,
        CONF_MAX_HISTORY: 5,
        CONF_CLASS_POLICY: "voice",
        CONF_CONFIRM_ACTIONS: False,
        CONF_HOLD_PHRASE: False,
        CONF_HOLD_AFTER: 3.0,
    }
    await hass.async_block_till_done()

    result = await hass.config_entries.subentries.async_init(
        (fake_entry.entry_id, "ai_task_data"), context={"source": config_entries.SOURCE_USER}
    )
    result = await hass.config_entries.subentries.async_configure(
        result["flow_id"],
        {CONF_NAME: "Agent tasks", CONF_REQUEST_CLASS: "agent", CONF_MAX_TOKENS: 300},
    )
    assert result["type"] is FlowResultType.CREATE_ENTRY
    assert result["data"] == {CONF_REQUEST_CLASS: "agent", CONF_MAX_TOKENS: 300}
    await hass.async_block_till_done()

    # The entry reloaded with the new subentries: two agents, two AI task entities.
    entities = er.async_entries_for_config_entry(er.async_get(hass), fake_entry.entry_id)
    assert sum(e.domain == "conversation" for e in entities) == 2
    assert sum(e.domain == "ai_task" for e in entities) == 2

    agent = next(s for s in fake_entry.subentries.values() if s.title == "Kitchen agent")
    result = await fake_entry.start_subentry_reconfigure_flow(hass, agent.subentry_id)
    assert result["type"] is FlowResultType.FORM
    result = await hass.config_entries.subentries.async_configure(
        result["flow_id"],
        {
            CONF_MAX_TOKENS: 64,
            CONF_TEMPERATURE: 0.2,
            CONF_MAX_HISTORY: 3,
            CONF_CLASS_POLICY: "auto",
        },
    )
    assert result["type"] is FlowResultType.ABORT
    assert result["reason"] == "reconfigure_successful"
    data = fake_entry.subentries[agent.subentry_id].data
    assert data[CONF_CLASS_POLICY] == "auto"
    # Left out of the form: the hold phrase on, after the default 2 s.
    assert (data[CONF_HOLD_PHRASE], data[CONF_HOLD_AFTER]) == (True, 2.0)
    assert CONF_LLM_HASS_API not in data
    await hass.async_block_till_done()


async def test_subentry_needs_loaded_entry(hass: HomeAssistant, fake_hearth: FakeHearth) -> None:
    """Subentries cannot be added while the server's entry is not loaded."""
    entry = MockConfigEntry(domain=DOMAIN, data={CONF_URL: fake_hearth.url})
    entry.add_to_hass(hass)
    result = await hass.config_entries.subentries.async_init(
        (entry.entry_id, "conversation"), context={"source": config_entries.SOURCE_USER}
    )
    assert result["type"] is FlowResultType.ABORT
    assert result["reason"] == "entry_not_loaded"


async def test_subentry_form_drops_vanished_apis(
    hass: HomeAssistant, fake_hearth: FakeHearth
) -> None:
    """An agent stored with one API as a plain string (older releases) and one API that no
    longer exists is offered for reconfiguration with only the APIs that still exist."""
    entry = await async_setup_hearth(
        hass,
        fake_hearth.url,
        conversation={**CONVERSATION_OPTIONS, CONF_LLM_HASS_API: "assist"},
    )
    agent = next(s for s in entry.subentries.values() if s.subentry_type == "conversation")
    result = await entry.start_subentry_reconfigure_flow(hass, agent.subentry_id)
    assert result["type"] is FlowResultType.FORM
    suggested = {
        str(key): key.description.get("suggested_value")
        for key in result["data_schema"].schema
        if key.description
    }
    assert suggested[CONF_LLM_HASS_API] == ["assist"]

    hass.config_entries.async_update_subentry(
        entry, agent, data={**agent.data, CONF_LLM_HASS_API: ["assist", "gone"]}
    )
    await hass.async_block_till_done()
    result = await entry.start_subentry_reconfigure_flow(hass, agent.subentry_id)
    suggested = {
        str(key): key.description.get("suggested_value")
        for key in result["data_schema"].schema
        if key.description
    }
    assert suggested[CONF_LLM_HASS_API] == ["assist"]


async def test_removed_subentry_takes_its_device(
    hass: HomeAssistant, fake_entry: MockConfigEntry
) -> None:
    """Removing an agent removes its entity and its device; the server's device stays."""
    def device_ids() -> set[str]:
        devices = dr.async_entries_for_config_entry(dr.async_get(hass), fake_entry.entry_id)
        return {ident for device in devices for _, ident in device.identifiers}

    agent = next(s for s in fake_entry.subentries.values() if s.subentry_type == "conversation")
    assert {agent.subentry_id, fake_entry.entry_id} <= device_ids()

    assert hass.config_entries.async_remove_subentry(fake_entry, agent.subentry_id)
    await hass.async_block_till_done()

    assert agent.subentry_id not in device_ids()
    assert fake_entry.entry_id in device_ids()
    entities = er.async_entries_for_config_entry(er.async_get(hass), fake_entry.entry_id)
    assert not any(e.domain == "conversation" for e in entities)
