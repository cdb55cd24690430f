"""Conversation agents against the real Hearth server (SmolLM2-135M).

The class a turn is served at is read from the server's own per-class counters.
"""

from __future__ import annotations

import pytest
from hearth_server import HearthServer
from homeassistant.components import conversation
from homeassistant.core import Context, HomeAssistant
from homeassistant.helpers import intent
from pytest_homeassistant_custom_component.common import MockConfigEntry, MockUser

from .conftest import async_queue, async_setup_hearth, async_wait_for, entity_of, sensor_of

pytestmark = [pytest.mark.ha, pytest.mark.model, pytest.mark.usefixtures("socket_enabled")]


@pytest.fixture
async def entry(hass: HomeAssistant, hearth_server: HearthServer) -> MockConfigEntry:
    """A Hearth entry on the real server."""
    return await async_setup_hearth(hass, hearth_server.url)


async def _completed(hass: HomeAssistant, server: HearthServer) -> dict[str, int]:
    queue = await async_queue(hass, server)
    return {name: data["completed"] for name, data in queue["classes"].items()}


async def _served_as(
    hass: HomeAssistant, server: HearthServer, before: dict[str, int], request_class: str
) -> dict[str, int]:
    """Wait until the server counts one more request of ``request_class``; return counts."""

    async def counted() -> dict[str, int] | None:
        now = await _completed(hass, server)
        return now if now[request_class] > before[request_class] else None

    now = await async_wait_for(counted, within=20)
    assert now[request_class] == before[request_class] + 1
    # The other interactive class must not have moved (background work of other tests may).
    other = "chat" if request_class == "voice" else "voice"
    assert now[other] == before[other], (before, now)
    return now


async def test_typed_conversation_is_chat(
    hass: HomeAssistant,
    entry: MockConfigEntry,
    hearth_server: HearthServer,
    hass_admin_user: MockUser,
) -> None:
    """conversation.process returns the model's answer, served at the chat class with the
    Home Assistant user as fairness key."""
    agent_id = entity_of(hass, entry, "conversation")
    before = await _completed(hass, hearth_server)

    response = await hass.services.async_call(
        "conversation",
        "process",
        {"agent_id": agent_id, "text": "What is the capital of France?"},
        blocking=True,
        return_response=True,
        context=Context(user_id=hass_admin_user.id),
    )
    result = response["response"]
    assert result["response_type"] == intent.IntentResponseType.ACTION_DONE.value
    speech = result["speech"]["plain"]["speech"]
    assert speech.strip()

    await _served_as(hass, hearth_server, before, "chat")
    queue = await async_queue(hass, hearth_server)
    assert hass_admin_user.id in queue["users"]


async def test_satellite_and_device_turns_are_voice(
    hass: HomeAssistant, entry: MockConfigEntry, hearth_server: HearthServer
) -> None:
    """A turn from a satellite, or naming a device, is served at the voice class with the
    satellite (or device) as fairness key."""
    agent_id = entity_of(hass, entry, "conversation")

    before = await _completed(hass, hearth_server)
    result = await conversation.async_converse(
        hass,
        "Turn on the lights.",
        None,
        Context(),
        agent_id=agent_id,
        satellite_id="assist_satellite.kitchen",
    )
    assert result.response.speech["plain"]["speech"].strip()
    before = await _served_as(hass, hearth_server, before, "voice")

    result = await conversation.async_converse(
        hass, "Hello.", None, Context(), agent_id=agent_id, device_id="kitchen-speaker"
    )
    assert result.response.speech["plain"]["speech"].strip()
    await _served_as(hass, hearth_server, before, "voice")

    users = (await async_queue(hass, hearth_server))["users"]
    assert "assist_satellite.kitchen" in users
    assert "kitchen-speaker" in users


async def test_sensors_reflect_server_queue(
    hass: HomeAssistant, entry: MockConfigEntry, hearth_server: HearthServer
) -> None:
    """After a voice turn the sensors show what /v1/queue says."""
    agent_id = entity_of(hass, entry, "conversation")
    before = await _completed(hass, hearth_server)
    await conversation.async_converse(
        hass, "Hi.", None, Context(), agent_id=agent_id, device_id="hall-speaker"
    )
    await _served_as(hass, hearth_server, before, "voice")

    # Another stream (an earlier test's turn ending late) may finish between the sensors' read
    # and ours: compare a read that the server's figures did not change across.
    for _ in range(20):
        before_refresh = await async_queue(hass, hearth_server)
        await entry.runtime_data.coordinator.async_refresh()
        await hass.async_block_till_done()
        queue = await async_queue(hass, hearth_server)
        if queue["classes"] == before_refresh["classes"]:
            break
    else:
        pytest.fail("the server's per-class figures kept changing")

    def value(key: str) -> str:
        return hass.states.get(sensor_of(hass, entry, "sensor", key)).state

    voice = queue["classes"]["voice"]
    assert float(value("ttft_p95_voice")) == pytest.approx(voice["ttft_ms"]["p95"])
    assert float(value("itl_p95_voice")) == pytest.approx(voice["itl_ms"]["p95"])
    assert float(value("queue_wait_p95_voice")) == pytest.approx(voice["queue_ms"]["p95"])
    assert value("waiting_voice") == str(queue["waiting"]["voice"])
    assert value("running_chat") == str(queue["running"]["chat"])
    assert value("preemptions") == str(queue["preemptions"])
    assert float(value("kv_cache_use")) == pytest.approx(queue["kv"]["use"] * 100, abs=0.5)
    assert float(value("prefix_cache_hit_rate")) == pytest.approx(
        queue["prefix_cache"]["hit_rate"] * 100, abs=0.5
    )
    assert hass.states.get(sensor_of(hass, entry, "binary_sensor", "reachable")).state == "on"
