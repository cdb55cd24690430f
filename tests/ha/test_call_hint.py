"""The guidance after the system prompt of an agent offered Assist's intent tools: example
calls of the tools as offered, on one of the home's lights, in place of Home Assistant's
sentence asking for an area; said in words where the home has no light."""

from __future__ import annotations

import json
from typing import Any

import pytest
from homeassistant.components import conversation
from homeassistant.components.homeassistant.exposed_entities import async_expose_entity
from homeassistant.const import CONF_LLM_HASS_API, STATE_OFF
from homeassistant.core import Context, HomeAssistant
from homeassistant.helpers import entity_registry as er
from homeassistant.setup import async_setup_component
from pytest_homeassistant_custom_component.common import MockUser

from custom_components.hearth.call_hint import ACT_ALONE, ALL_IN_WORDS, FOLLOW_UPS

from .conftest import CONVERSATION_OPTIONS, FakeHearth, async_setup_hearth, entity_of
from .fake_hearth import text_chunks

pytestmark = pytest.mark.ha


async def _first_request(hass: HomeAssistant, fake_hearth: FakeHearth, user: MockUser
                         ) -> dict[str, Any]:
    entry = await async_setup_hearth(hass, fake_hearth.url, conversation={
        **CONVERSATION_OPTIONS, CONF_LLM_HASS_API: ["assist"]})
    fake_hearth.chat_handler = lambda body: text_chunks("Done.")
    await conversation.async_converse(hass, "Turn off all the lights", None,
                                      Context(user_id=user.id),
                                      agent_id=entity_of(hass, entry, "conversation"))
    return fake_hearth.chat_requests[0][1]


def _calls(text: str) -> list[Any]:
    """Every JSON object in ``text`` that opens with its "name"."""
    decoder, found, at = json.JSONDecoder(), [], text.find('{"name"')
    while at >= 0:
        obj, end = decoder.raw_decode(text, at)
        found.append(obj)
        at = text.find('{"name"', end)
    return found


async def test_the_guidance_shows_the_calls_on_a_light_of_the_home(
    hass: HomeAssistant, fake_hearth: FakeHearth, hass_admin_user: MockUser
) -> None:
    """One device by name, its brightness, all the lights by their domain alone, a question
    as a read of the home: calls of the tools the request offers (those the release has), on
    the light whose name sorts first."""
    assert await async_setup_component(hass, "intent", {})
    assert await async_setup_component(hass, "light", {})  # its intents: HassLightSet
    registry = er.async_get(hass)
    for key, name in (("porch", "Porch light"), ("desk", "Desk lamp")):
        entry = registry.async_get_or_create("light", "test", key, suggested_object_id=key,
                                             original_name=name)
        hass.states.async_set(entry.entity_id, STATE_OFF,
                              {"friendly_name": name, "supported_color_modes": ["onoff"]})
        async_expose_entity(hass, "conversation", entry.entity_id, True)
    body = await _first_request(hass, fake_hearth, hass_admin_user)
    system = body["messages"][0]["content"]
    offered = {tool["function"]["name"] for tool in body["tools"]}
    off = next(name for name in offered if name.endswith("HassTurnOff"))

    assert "specify an area" not in system  # asked for an area, the 1.5B named one light
    hint = system.rsplit("\n", 1)[1]
    assert hint.startswith(FOLLOW_UPS) and hint.endswith(ACT_ALONE)
    assert '"turn off the desk lamp"' in hint and '"is the desk lamp on?"' in hint
    dim = [{"name": name, "arguments": {"name": "Desk lamp", "brightness": 50}}
           for name in offered if name.endswith("HassLightSet")]
    live = [{"name": name, "arguments": {}} for name in offered
            if name.endswith("GetLiveContext")]
    assert _calls(hint) == [
        {"name": off, "arguments": {"name": "Desk lamp", "domain": ["light"]}}, *dim,
        {"name": off, "arguments": {"domain": ["light"]}}, *live]
    assert dim, "no HassLightSet offered: the brightness example went untested"
    assert ALL_IN_WORDS not in hint


async def test_without_a_light_the_guidance_is_said_in_words(
    hass: HomeAssistant, fake_hearth: FakeHearth, hass_admin_user: MockUser
) -> None:
    """A home whose exposed devices include no light gets the sentences without examples (an
    example naming a light the home lacks would be copied)."""
    assert await async_setup_component(hass, "intent", {})
    assert await async_setup_component(hass, "input_boolean", {"input_boolean": {
        "kettle": {"name": "Kettle", "initial": False}}})
    await hass.async_block_till_done()
    async_expose_entity(hass, "conversation", "input_boolean.kettle", True)
    body = await _first_request(hass, fake_hearth, hass_admin_user)
    hint = body["messages"][0]["content"].rsplit("\n", 1)[1]
    assert hint.startswith(FOLLOW_UPS) and ALL_IN_WORDS in hint and hint.endswith(ACT_ALONE)
    assert _calls(hint) == []
