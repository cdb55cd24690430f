"""What an intent call acts on: the domain-alone call the agent's guidance asks for "all the
lights", and a call with no target at all held to the one device or area the request named
(a small model told about "all the lights" dropped the name of "the porch light" too)."""

from __future__ import annotations

from typing import Any

import pytest
from homeassistant.components import conversation
from homeassistant.components.homeassistant.exposed_entities import async_expose_entity
from homeassistant.const import CONF_LLM_HASS_API, STATE_OFF, STATE_ON
from homeassistant.core import Context, HomeAssistant
from homeassistant.setup import async_setup_component
from pytest_homeassistant_custom_component.common import MockUser

from custom_components.hearth.const import CONF_CONFIRM_ACTIONS
from custom_components.hearth.intent_tools import named_target

from .conftest import (
    CONVERSATION_OPTIONS,
    FakeHearth,
    async_setup_hearth,
    entity_of,
    tool_call_script,
    turn_on_tool,
)

pytestmark = pytest.mark.ha

LIGHTS = {"kitchen_light": ("Kitchen light", True), "porch_light": ("Porch light", True),
          "cellar_light": ("Cellar light", False)}  # key: (name, exposed)


async def _turn(hass: HomeAssistant, fake_hearth: FakeHearth, user: MockUser, text: str,
                call: dict[str, Any]) -> tuple[dict[str, str], dict[str, Any]]:
    """The model answers ``text`` with HassTurnOn(``call``): the lights' states after, and
    the request the server got."""
    assert await async_setup_component(hass, "intent", {})
    assert await async_setup_component(hass, "input_boolean", {"input_boolean": {
        key: {"name": name, "initial": False} for key, (name, _) in LIGHTS.items()}})
    await hass.async_block_till_done()
    for key, (_, exposed) in LIGHTS.items():
        async_expose_entity(hass, "conversation", f"input_boolean.{key}", exposed)
    entry = await async_setup_hearth(hass, fake_hearth.url, conversation={
        **CONVERSATION_OPTIONS, CONF_LLM_HASS_API: ["assist"], CONF_CONFIRM_ACTIONS: True})
    fake_hearth.chat_handler = lambda body: tool_call_script(body, call)
    await conversation.async_converse(hass, text, None, Context(user_id=user.id),
                                      agent_id=entity_of(hass, entry, "conversation"))
    states = {key: hass.states.get(f"input_boolean.{key}").state for key in LIGHTS}
    return states, fake_hearth.chat_requests[0][1]


@pytest.mark.parametrize(("text", "call", "on"), [
    # "all the lights" names nothing: the domain alone acts on every exposed one
    ("Turn on all the lights", {"domain": ["input_boolean"]}, {"kitchen_light", "porch_light"}),
    # one device named: a call without a target is held to it
    ("Switch on the porch light please", {"domain": ["input_boolean"]}, {"porch_light"}),
    ("PORCH LIGHT on", {"area": ""}, {"porch_light"}),  # an empty value is no target
    # a call with its own target keeps it, right or wrong: the repair only adds one
    ("Switch on the porch light", {"name": "Kitchen light"}, {"kitchen_light"}),
    # two devices named: each wants its own call; the model's call is left as it is
    ("Kitchen light and porch light on", {"domain": ["input_boolean"]},
     {"kitchen_light", "porch_light"}),
])
async def test_a_call_without_a_target_acts_on_what_the_request_named(
    hass: HomeAssistant, fake_hearth: FakeHearth, hass_admin_user: MockUser,
    text: str, call: dict[str, Any], on: set[str],
) -> None:
    states, body = await _turn(hass, fake_hearth, hass_admin_user, text, call)
    assert {key for key, state in states.items() if state == STATE_ON} == on
    assert states["cellar_light"] == STATE_OFF  # never an unexposed one
    params = next(t["function"]["parameters"] for t in body["tools"]
                  if t["function"]["name"] == turn_on_tool(body))
    assert "name" not in params.get("required", ())  # the domain-alone call fits the tool
    domain = params["properties"]["domain"]
    assert (domain.get("items") or domain)["enum"] == ["input_boolean"]


EXPOSED = {
    "light.kitchen": {"names": "Kitchen light", "areas": "Kitchen"},
    "light.porch": {"names": "Porch light, Door light", "areas": "Porch, Front"},
    "light.lamp": {"names": "Living room lamp", "areas": "Living Room"},
}


@pytest.mark.parametrize(("text", "target"), [
    ("Turn off the kitchen light.", {"name": "Kitchen light"}),
    ("Turn off the kitchen lights.", {"area": "Kitchen"}),  # "lights" is no device's name
    ("Someone is at the door, light up the porch.", {"area": "Porch"}),
    ("door light on", {"name": "Door light"}),  # an alias
    ("It is too dark in the living room", {"area": "Living Room"}),
    ("Turn on all the lights.", {}),
    ("I am going to bed, turn everything off.", {}),
    ("Kitchen light and the living room lamp off", {}),
    ("The kitchen and the porch", {}),
    ("Turn on the kitchenette", {}),  # whole words only
])
def test_the_target_a_request_names(text: str, target: dict[str, str]) -> None:
    assert named_target(text, EXPOSED) == target
