"""Queue health pushed by the server (GET /v1/queue/events, issue 29): the sensors follow the
pushes with no poll in between, a dropped stream is checked and reconnected, an older server
without the stream is polled every minute."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from hearth_server import HearthServer
from homeassistant.config_entries import SOURCE_REAUTH
from homeassistant.const import STATE_OFF, STATE_ON, STATE_UNAVAILABLE
from homeassistant.core import HomeAssistant
from homeassistant.util import dt as dt_util
from pytest_homeassistant_custom_component.common import async_fire_time_changed

from custom_components.hearth import coordinator as coordinator_module
from custom_components.hearth.const import DOMAIN

from .conftest import (
    API_KEY,
    FakeHearth,
    async_queue,
    async_setup_hearth,
    async_wait_for,
    sensor_of,
    state_changes,
)
from .fake_queue_stream import FEATURE

pytestmark = [pytest.mark.ha, pytest.mark.usefixtures("socket_enabled")]


def _state(hass: HomeAssistant, entity_id: str) -> str:
    state = hass.states.get(entity_id)
    assert state is not None, entity_id
    return state.state


async def test_sensors_follow_pushes_without_polling(
    hass: HomeAssistant, fake_hearth: FakeHearth
) -> None:
    """A server that offers the stream is followed, not polled: a pushed change shows at
    once with no time passing and no GET /v1/queue; a push that changes nothing writes no
    state."""
    fake_hearth.features = [FEATURE]
    entry = await async_setup_hearth(hass, fake_hearth.url)
    coordinator = entry.runtime_data.coordinator
    assert coordinator.update_interval is None  # no polling at all
    stream = fake_hearth.queue_stream
    await async_wait_for(lambda: coordinator.connected and stream.subscribers == 1)
    polls = fake_hearth.queue_requests  # the first refresh at set-up
    waiting = sensor_of(hass, entry, "sensor", "waiting_voice")
    assert _state(hass, waiting) == "1"
    changes = state_changes(hass, waiting)

    stream.push()  # the same document again
    fake_hearth.queue["waiting"]["voice"] = 4
    stream.push()
    await async_wait_for(lambda: _state(hass, waiting) == "4", within=5)
    await hass.async_block_till_done()
    assert len(changes) == 1  # the repeated document wrote nothing
    assert fake_hearth.queue_requests == polls
    assert stream.connections == 1


async def test_dropped_stream_checks_the_server_and_reconnects(
    hass: HomeAssistant,
    fake_hearth: FakeHearth,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """When the stream drops, one GET /v1/queue says whether the server is there: a server
    gone reads as unreachable with its sensors unavailable (logged once); once it answers
    again the coordinator reconnects, the sensors show the document it pushes first, and the
    recovery is logged once."""
    monkeypatch.setattr(coordinator_module, "EVENTS_BACKOFF_MIN", 0.05)
    monkeypatch.setattr(coordinator_module, "EVENTS_BACKOFF_MAX", 0.2)
    fake_hearth.features = [FEATURE]
    entry = await async_setup_hearth(hass, fake_hearth.url)
    coordinator = entry.runtime_data.coordinator
    stream = fake_hearth.queue_stream
    await async_wait_for(lambda: stream.subscribers == 1)
    reachable = sensor_of(hass, entry, "binary_sensor", "reachable")
    waiting = sensor_of(hass, entry, "sensor", "waiting_voice")
    assert _state(hass, reachable) == STATE_ON

    fake_hearth.queue_status = stream.status = 500  # the server breaks and drops the stream
    stream.end()
    await async_wait_for(lambda: _state(hass, reachable) == STATE_OFF, within=5)
    assert _state(hass, waiting) == STATE_UNAVAILABLE
    assert not coordinator.connected

    fake_hearth.queue_status = stream.status = None
    fake_hearth.queue["waiting"]["voice"] = 7
    await async_wait_for(lambda: stream.subscribers == 1, within=5)
    await async_wait_for(lambda: _state(hass, waiting) == "7", within=5)
    assert _state(hass, reachable) == STATE_ON
    assert stream.connections >= 2
    assert caplog.text.count("Error fetching hearth queue data") == 1
    assert caplog.text.count("Fetching hearth queue data recovered") == 1


async def test_refused_key_on_the_stream_starts_reauth(
    hass: HomeAssistant, fake_hearth: FakeHearth, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server that stops taking the key drops the stream and refuses it again: the
    entry asks to be re-authenticated."""
    monkeypatch.setattr(coordinator_module, "EVENTS_BACKOFF_MIN", 0.05)
    fake_hearth.features = [FEATURE]
    entry = await async_setup_hearth(hass, fake_hearth.url)
    await async_wait_for(lambda: fake_hearth.queue_stream.subscribers == 1)
    fake_hearth.api_key = "another-key"
    fake_hearth.queue_stream.end()

    def reauth_flows() -> list[dict[str, Any]]:
        return [
            flow
            for flow in hass.config_entries.flow.async_progress_by_handler(DOMAIN)
            if flow["context"]["source"] == SOURCE_REAUTH
            and flow["context"]["entry_id"] == entry.entry_id
        ]

    await async_wait_for(reauth_flows, within=5)


async def test_older_server_is_polled_every_minute(
    hass: HomeAssistant, fake_hearth: FakeHearth
) -> None:
    """A server whose /health does not name the stream is polled, once a minute (not every
    10 s), and never subscribed to."""
    entry = await async_setup_hearth(hass, fake_hearth.url)
    coordinator = entry.runtime_data.coordinator
    assert coordinator.update_interval == timedelta(seconds=60)
    waiting = sensor_of(hass, entry, "sensor", "waiting_voice")
    polls = fake_hearth.queue_requests
    fake_hearth.queue["waiting"]["voice"] = 3

    async_fire_time_changed(hass, dt_util.utcnow() + timedelta(seconds=30))
    await hass.async_block_till_done()
    assert fake_hearth.queue_requests == polls
    assert _state(hass, waiting) == "1"

    async_fire_time_changed(hass, dt_util.utcnow() + timedelta(seconds=61))
    await async_wait_for(lambda: _state(hass, waiting) == "3", within=5)
    assert fake_hearth.queue_requests == polls + 1
    assert not coordinator.connected
    assert fake_hearth.queue_stream.connections == 0


async def test_real_server_pushes_a_warm_up(
    hass: HomeAssistant, hearth_server: HearthServer
) -> None:
    """Against the real server: the stream is used, and a prompt warmed up behind Home
    Assistant's back shows in the warm-ups sensor with no refresh."""
    entry = await async_setup_hearth(hass, hearth_server.url)
    coordinator = entry.runtime_data.coordinator
    assert coordinator.push and coordinator.update_interval is None
    await async_wait_for(lambda: coordinator.connected)
    warm_ups = sensor_of(hass, entry, "sensor", "prefix_cache_warm_ups")
    before = int(_state(hass, warm_ups))

    status, answer = await hass.async_add_executor_job(
        lambda: hearth_server.post(
            "/v1/cache/warm",
            {"messages": [{"role": "system", "content": "You are a push test."}]},
            headers={"Authorization": f"Bearer {API_KEY}"},
        )
    )
    assert status == 200, answer
    # The agent's own warm-ups may land too: the sensor reaches at least the server's count
    # read after this one.
    counted = (await async_queue(hass, hearth_server))["prefix_cache"]["warm_ups"]
    assert counted > before
    await async_wait_for(lambda: int(_state(hass, warm_ups)) >= counted, within=30)
