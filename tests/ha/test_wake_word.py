"""The wake word as a signal (custom_components.hearth.reservations): a satellite whose
pipeline uses a Hearth agent goes ``listening`` and the server is told, with the agent's model
and prompt; the voice turn that follows names the satellite.

The fake server shows the exact calls; the real server (SmolLM2-135M) takes the reservation,
ends it with the turn, and lets it expire.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from homeassistant.components import conversation
from homeassistant.core import Context, HomeAssistant
from pytest_homeassistant_custom_component.common import MockConfigEntry
from pytest_homeassistant_custom_component.typing import WebSocketGenerator

from custom_components.hearth.const import CONF_MODEL

from .conftest import (
    CONVERSATION_OPTIONS,
    FakeHearth,
    async_setup_hearth,
    async_wait_for,
    entity_of,
    text_chunks,
)
from .satellite import PIPELINE_SELECT, Satellite, async_add_satellite, async_create_pipeline

pytestmark = [pytest.mark.ha, pytest.mark.usefixtures("socket_enabled")]


async def _hearth_satellite(
    hass: HomeAssistant,
    hass_ws_client: WebSocketGenerator,
    url: str,
    options: dict[str, Any] | None = None,
    *,
    selected: str = "Hearth",
) -> tuple[MockConfigEntry, Satellite]:
    """A Hearth entry and a satellite whose pipeline select names the pipeline ``selected``
    (the pipeline "Hearth" uses the entry's agent)."""
    entry = await async_setup_hearth(hass, url, conversation=options)
    satellite = await async_add_satellite(hass)  # before the websocket starts the HTTP server
    await async_create_pipeline(
        hass, hass_ws_client, entity_of(hass, entry, "conversation"), "Hearth")
    hass.states.async_set(PIPELINE_SELECT, selected)
    return entry, satellite


@pytest.fixture
def reserving(fake_hearth: FakeHearth) -> FakeHearth:
    """The fake server, taking reservations and answering in a sentence."""
    fake_hearth.features = ["reservation"]
    fake_hearth.chat_handler = lambda body: text_chunks("It is noon.")
    return fake_hearth


async def _settled(hass: HomeAssistant, entry: MockConfigEntry) -> None:
    """Wait until the agent's reservation calls under way are done (its state listener
    starts them as a satellite's state is written)."""
    await hass.async_block_till_done()
    agent = hass.data["conversation"].get_entity(entity_of(hass, entry, "conversation"))
    await asyncio.gather(*agent.reservations.tasks)


async def _reservations(fake: FakeHearth, count: int) -> list[dict[str, Any]]:
    await async_wait_for(lambda: len(fake.voice.reservations) >= count)
    return fake.voice.reservations


async def test_listening_reserves_the_agents_model_and_prompt(
    hass: HomeAssistant, hass_ws_client: WebSocketGenerator, reserving: FakeHearth
) -> None:
    """Listening: one reservation naming the satellite, the agent's model and the warm-up
    body of its prompt; the voice turn then names the satellite (the server ends the
    reservation with it), so nothing is ended afterwards."""
    options = {**CONVERSATION_OPTIONS, CONF_MODEL: "fake-model"}
    entry, satellite = await _hearth_satellite(
        hass, hass_ws_client, reserving.url, options)

    satellite.go("listening")
    [body] = await _reservations(reserving, 1)
    assert body["satellite"] == satellite.entity_id
    assert body["model"] == "fake-model"
    assert body["ttl_s"] is None  # the server's own setting
    warm = body["warm"]
    assert warm["priority"] == "voice" and warm["model"] == "fake-model"
    assert warm["messages"][0]["role"] == "system"
    assert CONVERSATION_OPTIONS["prompt"] in warm["messages"][0]["content"]

    satellite.go("processing")
    result = await conversation.async_converse(
        hass, "What time is it?", None, Context(),
        agent_id=entity_of(hass, entry, "conversation"), satellite_id=satellite.entity_id,
    )
    assert result.response.speech["plain"]["speech"] == "It is noon."
    headers, _ = reserving.chat_requests[-1]
    assert headers["X-Hearth-Satellite"] == satellite.entity_id
    assert headers["X-Hearth-Class"] == "voice"
    satellite.go("responding")
    satellite.go("idle")
    await _settled(hass, entry)
    assert reserving.voice.live == {} and reserving.voice.ended == []


async def test_wake_word_without_a_turn_ends_its_reservation(
    hass: HomeAssistant, hass_ws_client: WebSocketGenerator, reserving: FakeHearth
) -> None:
    """A satellite that goes back to idle without a turn (nothing heard) ends its
    reservation; the next wake word makes a new one. The class-default agent names no
    model."""
    _, satellite = await _hearth_satellite(hass, hass_ws_client, reserving.url)

    satellite.go("listening")
    [body] = await _reservations(reserving, 1)
    assert body["model"] is None and "model" not in body["warm"]
    satellite.go("idle")
    await async_wait_for(lambda: reserving.voice.ended == ["res_1"])

    satellite.go("listening")
    await _reservations(reserving, 2)
    assert reserving.voice.live == {"res_2": satellite.entity_id}


async def test_reservation_already_gone_is_quiet(
    hass: HomeAssistant, hass_ws_client: WebSocketGenerator, reserving: FakeHearth,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Ending a reservation that expired on the server (404) logs no warning or error."""
    entry, satellite = await _hearth_satellite(hass, hass_ws_client, reserving.url)
    satellite.go("listening")
    await _reservations(reserving, 1)
    reserving.voice.delete_status["res_1"] = 404  # it expired
    satellite.go("idle")
    await _settled(hass, entry)
    assert not [r for r in caplog.records if r.levelname in ("WARNING", "ERROR")
                and "hearth" in r.name]


@pytest.mark.parametrize("selected", ["preferred", "Another pipeline"])
async def test_satellite_of_another_agent_reserves_nothing(
    hass: HomeAssistant, hass_ws_client: WebSocketGenerator, reserving: FakeHearth,
    selected: str,
) -> None:
    """A satellite whose pipeline is the preferred one (Home Assistant's own agent) or
    names no pipeline Hearth serves reserves nothing."""
    entry, satellite = await _hearth_satellite(
        hass, hass_ws_client, reserving.url, selected=selected)
    satellite.go("listening")
    await _settled(hass, entry)
    assert reserving.voice.calls == 0


async def test_preferred_hearth_pipeline_reserves(
    hass: HomeAssistant, hass_ws_client: WebSocketGenerator, reserving: FakeHearth
) -> None:
    """A satellite without a pipeline select runs the preferred pipeline: a Hearth one
    reserves."""
    entry = await async_setup_hearth(hass, reserving.url)
    satellite = await async_add_satellite(hass, pipeline_entity_id=None)
    pipeline_id = await async_create_pipeline(
        hass, hass_ws_client, entity_of(hass, entry, "conversation"), "Hearth")
    client = await hass_ws_client(hass)
    await client.send_json_auto_id(
        {"type": "assist_pipeline/pipeline/set_preferred", "pipeline_id": pipeline_id})
    assert (await client.receive_json())["success"]

    satellite.go("listening")
    [body] = await _reservations(reserving, 1)
    assert body["satellite"] == satellite.entity_id


async def test_server_without_reservations_gets_no_call(
    hass: HomeAssistant, hass_ws_client: WebSocketGenerator, fake_hearth: FakeHearth
) -> None:
    """A server whose /health names no ``reservation`` feature is not called on the wake
    word; the turn still names its satellite."""
    fake_hearth.chat_handler = lambda body: text_chunks("It is noon.")
    entry, satellite = await _hearth_satellite(hass, hass_ws_client, fake_hearth.url)

    satellite.go("listening")
    await _settled(hass, entry)
    assert fake_hearth.voice.calls == 0
    await conversation.async_converse(
        hass, "What time is it?", None, Context(),
        agent_id=entity_of(hass, entry, "conversation"), satellite_id=satellite.entity_id,
    )
    assert fake_hearth.chat_requests[-1][0]["X-Hearth-Satellite"] == satellite.entity_id
