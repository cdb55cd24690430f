"""Warm-ups that depend on what the agent remembers or on what comes late: the satellites heard
survive a reload, an entity that appears re-warms, a server back after an outage is warmed
again, and an LLM API for administrators only is warmed for the agent's last user (against
the fake server)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any
from unittest.mock import patch

import pytest
from homeassistant.components import conversation
from homeassistant.components.homeassistant.exposed_entities import async_expose_entity
from homeassistant.const import CONF_LLM_HASS_API
from homeassistant.core import Context, HomeAssistant
from homeassistant.helpers import area_registry as ar
from homeassistant.helpers import device_registry as dr
from homeassistant.helpers import llm
from pytest_homeassistant_custom_component.common import MockUser

from .conftest import (
    CONVERSATION_OPTIONS,
    FakeHearth,
    async_setup_hearth,
    async_wait_for,
    entity_of,
    text_chunks,
)

pytestmark = [pytest.mark.ha, pytest.mark.usefixtures("socket_enabled")]

ASSIST = {**CONVERSATION_OPTIONS, CONF_LLM_HASS_API: ["assist"]}


@pytest.fixture(autouse=True)
def short_waits() -> Iterator[None]:
    """Warm-ups follow a change at once; what was heard is written at once."""
    with (
        patch("custom_components.hearth.warm.WARM_UP_COOLDOWN", 0.05),
        patch("custom_components.hearth.warm.HEARD_SAVE_DELAY", 0),
    ):
        yield


def _warmed(fake: FakeHearth, text: str) -> list[dict[str, Any]]:
    return [w for w in fake.warm_requests if text in w["messages"][0]["content"]]


async def test_satellites_heard_survive_a_reload(
    hass: HomeAssistant, fake_hearth: FakeHearth
) -> None:
    """A satellite that spoke to the agent has its own prompt warmed again after the entry is
    reloaded (as after a restart), before it speaks again."""
    fake_hearth.chat_handler = lambda body: text_chunks("Done.")
    # The prompt says where the satellite is once something is exposed.
    hass.states.async_set("switch.fan", "off", {"friendly_name": "Attic fan"})
    async_expose_entity(hass, "conversation", "switch.fan", True)
    entry = await async_setup_hearth(hass, fake_hearth.url, conversation=ASSIST)
    area = ar.async_get(hass).async_create("Attic")
    satellite = dr.async_get(hass).async_get_or_create(
        config_entry_id=entry.entry_id, identifiers={("test", "attic")}, name="Attic satellite"
    )
    dr.async_get(hass).async_update_device(satellite.id, area_id=area.id)
    await conversation.async_converse(
        hass, "Hello", None, Context(), agent_id=entity_of(hass, entry, "conversation"),
        device_id=satellite.id,
    )
    await hass.async_block_till_done()

    fake_hearth.warm_requests.clear()
    assert await hass.config_entries.async_reload(entry.entry_id)
    await hass.async_block_till_done()
    await async_wait_for(lambda: _warmed(fake_hearth, "You are in area Attic"), within=10)


async def test_an_entity_that_appears_warms_again(
    hass: HomeAssistant, fake_hearth: FakeHearth
) -> None:
    """An exposed entity whose integration sets up after the warm-up (no registry entry, only
    its state appears) is in the next warm-up."""
    await async_setup_hearth(hass, fake_hearth.url, conversation=ASSIST)
    await async_wait_for(lambda: fake_hearth.warm_requests, within=10)
    assert not _warmed(fake_hearth, "Garden fountain")
    hass.states.async_set("switch.fountain", "off", {"friendly_name": "Garden fountain"})
    async_expose_entity(hass, "conversation", "switch.fountain", True)
    await async_wait_for(lambda: _warmed(fake_hearth, "Garden fountain"), within=10)


async def test_server_back_warms_again(hass: HomeAssistant, fake_hearth: FakeHearth) -> None:
    """When the server answers again after an outage (perhaps restarted, with another model),
    the unchanged prompt is warmed again."""
    entry = await async_setup_hearth(hass, fake_hearth.url, conversation=ASSIST)
    await async_wait_for(lambda: fake_hearth.warm_requests, within=10)
    coordinator = entry.runtime_data.coordinator

    fake_hearth.queue_status = 500
    await coordinator.async_refresh()
    assert not coordinator.last_update_success
    fake_hearth.queue_status = None
    await coordinator.async_refresh()
    await async_wait_for(lambda: len(fake_hearth.warm_requests) >= 2, within=10)
    first, again = fake_hearth.warm_requests[:2]
    assert again == first


class AdminOnlyAPI(llm.API):
    """An LLM API for administrators only, as 2026.11's Home Assistant API is (Home
    Assistant refuses it to a turn of nobody, or of a user who is not an administrator)."""

    def __init__(self, hass: HomeAssistant) -> None:
        super().__init__(hass=hass, id="admin_only", name="Admin only")
        self.requires_admin = True  # a field since 2026.11, unknown before

    async def async_get_api_instance(self, llm_context: llm.LLMContext) -> llm.APIInstance:
        user = llm_context.context.user_id if llm_context.context else None
        assert user, "an API for administrators only built for nobody"
        return llm.APIInstance(
            api=self, api_prompt=f"Administering for {user}.", llm_context=llm_context, tools=[]
        )


async def test_admin_only_api_is_warmed_for_the_last_user(
    hass: HomeAssistant, fake_hearth: FakeHearth, hass_admin_user: MockUser,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """No warm-up (and no warning) before the agent has had a user; after an administrator's
    turn, its prompt is warmed for that user, also after a reload."""
    llm.async_register_api(hass, AdminOnlyAPI(hass))
    fake_hearth.chat_handler = lambda body: text_chunks("Done.")
    entry = await async_setup_hearth(
        hass, fake_hearth.url,
        conversation={**CONVERSATION_OPTIONS, CONF_LLM_HASS_API: ["admin_only"]},
    )
    await hass.async_block_till_done()
    assert fake_hearth.warm_requests == []
    assert "Could not build the prompt" not in caplog.text

    await conversation.async_converse(
        hass, "Hello", None, Context(user_id=hass_admin_user.id),
        agent_id=entity_of(hass, entry, "conversation"),
    )
    for_admin = f"Administering for {hass_admin_user.id}."
    await async_wait_for(lambda: _warmed(fake_hearth, for_admin), within=10)

    fake_hearth.warm_requests.clear()
    assert await hass.config_entries.async_reload(entry.entry_id)
    await async_wait_for(lambda: _warmed(fake_hearth, for_admin), within=10)
    assert "Could not build the prompt" not in caplog.text
