"""The wake word and the hold phrase against the real Hearth server (SmolLM2-135M): a satellite
that goes ``listening`` reserves the model there, its turn ends the reservation, one whose turn
never comes expires; a voice turn queued behind others says its hold phrase first."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any
from unittest.mock import patch

import pytest
from hearth_server import HearthServer
from homeassistant.components import conversation
from homeassistant.core import Context, HomeAssistant
from pytest_homeassistant_custom_component.typing import WebSocketGenerator

from custom_components.hearth.api import HearthClient, NotFound
from custom_components.hearth.const import CONF_HOLD_AFTER
from custom_components.hearth.sse import QueueStatus

from .conftest import (
    API_KEY,
    CONVERSATION_OPTIONS,
    async_setup_hearth,
    async_wait_for,
    entity_of,
    start_real_server,
)
from .satellite import PIPELINE_SELECT, async_add_satellite, async_create_pipeline

pytestmark = [pytest.mark.ha, pytest.mark.model, pytest.mark.usefixtures("socket_enabled")]

RESERVATION_S = 1.5  # the server's reservation time here: an expiry a test can wait for
LONG = {"messages": [{"role": "user", "content": "Tell a long story about a lighthouse."}],
        "max_tokens": 160, "ignore_eos": True, "temperature": 0, "priority": "voice"}


@pytest.fixture(scope="module")
def short_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HearthServer]:
    """A real server of its own: one sequence and short reservations."""
    server = start_real_server(
        tmp_path_factory, "--api-key", API_KEY, "--n-parallel", "1",
        "--reservation-s", str(RESERVATION_S))
    yield server
    server.stop()


@pytest.fixture
def reservations() -> Iterator[list[dict[str, Any]]]:
    """The server's answers to the integration's reservations."""
    answers: list[dict[str, Any]] = []
    reserve = HearthClient.async_reserve

    async def spy(self: HearthClient, *args: Any, **kwargs: Any) -> dict[str, Any]:
        answer = await reserve(self, *args, **kwargs)
        answers.append(answer)
        return answer

    with patch.object(HearthClient, "async_reserve", spy):
        yield answers


async def test_the_turn_ends_its_reservation_or_it_expires(
    hass: HomeAssistant, hass_ws_client: WebSocketGenerator, short_server: HearthServer,
    reservations: list[dict[str, Any]], caplog: pytest.LogCaptureFixture,
) -> None:
    """The server takes the reservation (the agent's prompt as its warm body, the voice
    model, the server's time); the satellite's turn ends it there. A wake word whose turn
    never comes: its reservation expires on the server by itself, and ending it once the
    satellite is idle again is quiet."""
    entry = await async_setup_hearth(hass, short_server.url)
    satellite = await async_add_satellite(hass)
    await async_create_pipeline(
        hass, hass_ws_client, entity_of(hass, entry, "conversation"), "Hearth")
    hass.states.async_set(PIPELINE_SELECT, "Hearth")
    client = entry.runtime_data.client

    satellite.go("listening")
    [answer] = await async_wait_for(lambda: reservations)
    assert answer["model"] == entry.runtime_data.health["model"]
    assert 0 < answer["expires_in_s"] <= RESERVATION_S
    satellite.go("processing")
    result = await conversation.async_converse(
        hass, "Hello.", None, Context(),
        agent_id=entity_of(hass, entry, "conversation"), satellite_id=satellite.entity_id,
    )
    assert result.response.speech["plain"]["speech"].strip()
    with pytest.raises(NotFound):  # the turn ended it
        await client.async_end_reservation(answer["id"])
    satellite.go("idle")

    satellite.go("listening")
    await async_wait_for(lambda: len(reservations) == 2)
    await asyncio.sleep(reservations[1]["expires_in_s"] + 0.5)  # its time on the server
    with pytest.raises(NotFound):
        await client.async_end_reservation(reservations[1]["id"])
    satellite.go("idle")
    await hass.async_block_till_done()
    agent = hass.data["conversation"].get_entity(entity_of(hass, entry, "conversation"))
    await asyncio.gather(*agent.reservations.tasks)
    assert not [r for r in caplog.records if r.levelname in ("WARNING", "ERROR")
                and r.name.startswith("custom_components.hearth")]


@pytest.fixture
def queue_statuses() -> Iterator[list[QueueStatus]]:
    """The queue statuses the integration's voice streams heard."""
    heard: list[QueueStatus] = []
    stream = HearthClient.async_chat_stream

    def spy(self: HearthClient, body: dict[str, Any], request_class: str | None = None,
            **kwargs: Any) -> AsyncIterator[dict[str, Any]]:
        on_queued = kwargs.get("on_queued")
        if on_queued is not None:
            def hear(status: QueueStatus) -> None:
                heard.append(status)
                on_queued(status)

            kwargs["on_queued"] = hear
        return stream(self, body, request_class, **kwargs)

    with patch.object(HearthClient, "async_chat_stream", spy):
        yield heard


async def test_voice_turn_queued_behind_others_says_the_phrase_first(
    hass: HomeAssistant, short_server: HearthServer, queue_statuses: list[QueueStatus]
) -> None:
    """Voice's places held by three long turns: the satellite's turn waits, the server tells
    it so with an ETA past the threshold, and the reply starts with the hold phrase before
    the model's answer."""
    entry = await async_setup_hearth(
        hass, short_server.url, conversation={**CONVERSATION_OPTIONS, CONF_HOLD_AFTER: 1.0})
    headers = {"Authorization": f"Bearer {API_KEY}"}
    blockers = [
        threading.Thread(target=short_server.post, args=(
            "/v1/chat/completions", {**LONG, "user": f"v{i}"}), kwargs={"headers": headers,
                                                                       "timeout": 300})
        for i in range(3)
    ]
    for thread in blockers:
        thread.start()
    try:
        await async_wait_for(lambda: _running_voice(hass, short_server), within=60)
        result = await conversation.async_converse(
            hass, "What time is it?", None, Context(),
            agent_id=entity_of(hass, entry, "conversation"),
            satellite_id="assist_satellite.kitchen",
        )
    finally:
        for thread in blockers:
            await hass.async_add_executor_job(thread.join, 300)
    speech = result.response.speech["plain"]["speech"]
    assert speech.startswith("One moment. "), speech
    assert speech.removeprefix("One moment. ").strip()  # the answer follows
    assert any(s.eta_s is not None and s.eta_s > 1.0 for s in queue_statuses), queue_statuses


async def _running_voice(hass: HomeAssistant, server: HearthServer) -> bool:
    """Whether voice's three places are taken on the server."""
    def read() -> int:
        status, queue = server.get(
            "/v1/queue", headers={"Authorization": f"Bearer {API_KEY}"})
        return int(queue["running"]["voice"]) if status == 200 else 0

    return await hass.async_add_executor_job(read) == 3
