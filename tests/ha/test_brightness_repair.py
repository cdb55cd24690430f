"""A request stating a brightness answered with an on/off call of a light: the agent makes it
the brightness call (the 1.5B turned "dim the living room lamp to 20 percent" off), and leaves
every other round as the model made it."""

from __future__ import annotations

from typing import Any

import pytest
from homeassistant.components import conversation
from homeassistant.components.homeassistant.exposed_entities import async_expose_entity
from homeassistant.const import CONF_LLM_HASS_API, STATE_ON
from homeassistant.core import Context, HomeAssistant, ServiceCall
from homeassistant.helpers import entity_registry as er
from homeassistant.setup import async_setup_component
from pytest_homeassistant_custom_component.common import MockUser, async_mock_service

from custom_components.hearth.intent_tools import stated_percent

from .conftest import CONVERSATION_OPTIONS, FakeHearth, async_setup_hearth, entity_of, text_chunks
from .fake_hearth import call_chunks

pytestmark = pytest.mark.ha


@pytest.mark.parametrize(("text", "level"), [
    ("Dim the living room lamp to 20 percent.", 20),
    ("Make the living room lamp 60% bright.", 60),
    ("Kitchen light to 100 PERCENT", 100),
    ("lamp at 5 per cent", 5),
    ("lamp to 0 %", 0),
    ("Turn on the kitchen light.", None),
    ("Set the lamp to 150%.", None),  # no brightness past 100
    ("Between 20% and 30% please", None),  # two: which one?
    ("Set it to 20% and the other to 20%", 20),  # the same one twice
    ("version 2.5% of", None),  # not a whole number said as a percentage
])
def test_the_stated_percentage(text: str, level: int | None) -> None:
    assert stated_percent(text) == level


async def _turn(hass: HomeAssistant, fake_hearth: FakeHearth, user: MockUser, text: str,
                *calls: tuple[str, dict[str, Any]]) -> dict[str, list[ServiceCall]]:
    """The model answers ``text`` with ``calls`` (intent types; the tools' names are looked
    up in the request): the light and fan services Home Assistant then called."""
    assert await async_setup_component(hass, "intent", {})
    assert await async_setup_component(hass, "light", {})  # its intents: HassLightSet
    assert await async_setup_component(hass, "fan", {})
    registry = er.async_get(hass)
    for domain, key, name in (("light", "desk", "Desk lamp"), ("light", "porch", "Porch light"),
                              ("fan", "ceiling", "Ceiling fan")):
        entry = registry.async_get_or_create(domain, "test", key, suggested_object_id=key,
                                             original_name=name)
        hass.states.async_set(entry.entity_id, STATE_ON, {
            "friendly_name": name, "supported_color_modes": ["brightness"], "brightness": 255,
            "supported_features": 1})
        async_expose_entity(hass, "conversation", entry.entity_id, True)
    services = {f"{domain}.{service}": async_mock_service(hass, domain, service)
                for domain in ("light", "fan") for service in ("turn_on", "turn_off")}
    entry = await async_setup_hearth(hass, fake_hearth.url, conversation={
        **CONVERSATION_OPTIONS, CONF_LLM_HASS_API: ["assist"]})

    def answer(body: dict[str, Any]) -> list[dict[str, Any]]:
        if body["messages"][-1]["role"] == "tool":
            return text_chunks("Done.")
        offered = [tool["function"]["name"] for tool in body["tools"]]
        return call_chunks(*((next(n for n in offered if n.endswith(kind)), args)
                             for kind, args in calls))

    fake_hearth.chat_handler = answer
    await conversation.async_converse(hass, text, None, Context(user_id=user.id),
                                      agent_id=entity_of(hass, entry, "conversation"))
    return {name: list(calls) for name, calls in services.items() if calls}


@pytest.mark.parametrize(("text", "call"), [
    ("Dim the desk lamp to 20 percent.", ("HassTurnOff", {"name": "Desk lamp"})),
    ("Make the desk lamp 20% bright.",
     ("HassTurnOn", {"name": "Desk lamp", "domain": ["light", "sensor"]})),
])
async def test_an_on_off_call_for_a_stated_brightness_sets_it(
    hass: HomeAssistant, fake_hearth: FakeHearth, hass_admin_user: MockUser,
    text: str, call: tuple[str, dict[str, Any]],
) -> None:
    called = await _turn(hass, fake_hearth, hass_admin_user, text, call)
    assert list(called) == ["light.turn_on"]
    (service,) = called["light.turn_on"]
    entity = service.data["entity_id"]
    assert (entity if isinstance(entity, list) else [entity]) == ["light.desk"]
    assert service.data["brightness_pct"] == 20


@pytest.mark.parametrize(("text", "calls", "service"), [
    # no percentage: the model's call as it made it
    ("Turn off the desk lamp.", [("HassTurnOff", {"name": "Desk lamp"})], "light.turn_off"),
    # "off" said, and the call turns off: the percentage describes, it does not ask
    ("Turn off the desk lamp, it is at 20%.", [("HassTurnOff", {"name": "Desk lamp"})],
     "light.turn_off"),
    # another device named: the percentage may be the fan's
    ("Set the ceiling fan to 40% and switch off the desk lamp.",
     [("HassTurnOff", {"name": "Desk lamp"})], "light.turn_off"),
    # two calls: each made as the model made it
    ("Desk lamp and porch light to 30 percent.",
     [("HassTurnOn", {"name": "Desk lamp"}), ("HassTurnOn", {"name": "Porch light"})],
     "light.turn_on"),
    # not a light's call
    ("Ceiling fan on at 50%.", [("HassTurnOn", {"name": "Ceiling fan"})], "fan.turn_on"),
])
async def test_other_rounds_are_left_as_the_model_made_them(
    hass: HomeAssistant, fake_hearth: FakeHearth, hass_admin_user: MockUser,
    text: str, calls: list[tuple[str, dict[str, Any]]], service: str,
) -> None:
    called = await _turn(hass, fake_hearth, hass_admin_user, text, *calls)
    assert list(called) == [service]
    assert len(called[service]) == len(calls)
    assert all("brightness_pct" not in c.data for c in called[service])
