"""What the sensors hand the recorder: state classes that hold for long-term statistics, no new
state on a poll where nothing but a clock moved; the voice prefix-cache sensors."""

from __future__ import annotations

from typing import Any

import pytest
from freezegun.api import FrozenDateTimeFactory
from homeassistant.const import STATE_UNKNOWN
from homeassistant.core import HomeAssistant
from homeassistant.util import dt as dt_util
from pytest_homeassistant_custom_component.common import MockConfigEntry

from .conftest import FakeHearth, async_setup_hearth, sensor_of, state_changes

pytestmark = [pytest.mark.ha, pytest.mark.usefixtures("socket_enabled")]

MODEL = {"state": "ready", "classes": ["voice"], "aliases": ["m:voice"], "keep_alive_s": 300,
         "expires_in_s": 300.0, "waiting": 0, "running": 0, "in_use": 0}


def _voice_cache(oldest_s: float) -> dict[str, Any]:
    voice = {"entries": 1, "cells": 100, "kept": 1, "oldest_s": oldest_s, "lookups": 1,
             "hit_rate": 1.0}
    return {"voice": voice}


async def _poll(hass: HomeAssistant, entry: MockConfigEntry) -> None:
    await entry.runtime_data.coordinator.async_refresh()
    await hass.async_block_till_done()


def _seconds_from_now(moment: str) -> float:
    return (dt_util.parse_datetime(moment) - dt_util.utcnow()).total_seconds()


async def test_jobs_failed_is_a_measurement(
    hass: HomeAssistant, fake_hearth: FakeHearth
) -> None:
    """The failed jobs the server keeps shrink when it purges old ones: a measurement, not a
    total_increasing counter (which would read the drop as a meter reset)."""
    entry = await async_setup_hearth(hass, fake_hearth.url)
    entity_id = sensor_of(hass, entry, "sensor", "jobs_failed")
    assert hass.states.get(entity_id).attributes["state_class"] == "measurement"
    fake_hearth.queue["jobs"]["failed"] = 0
    await _poll(hass, entry)
    assert hass.states.get(entity_id).state == "0"


async def test_ages_do_not_write_a_state_each_poll(
    hass: HomeAssistant, fake_hearth: FakeHearth, freezer: FrozenDateTimeFactory
) -> None:
    """The oldest cached voice prompt (a time, not an age) and a model's unload time (a time,
    not a countdown) stay the same while only the clock moves; a new oldest prompt is a new
    state."""
    fake_hearth.queue["prefix_cache"]["by_class"] = _voice_cache(100.0)
    fake_hearth.queue["models"] = {"m": MODEL}
    entry = await async_setup_hearth(hass, fake_hearth.url)
    oldest = sensor_of(hass, entry, "sensor", "prefix_cache_voice_oldest")
    model = sensor_of(hass, entry, "sensor", "model_m")
    cached_at = hass.states.get(oldest).state
    assert _seconds_from_now(cached_at) == pytest.approx(-100, abs=1)
    expires_at = hass.states.get(model).attributes["expires_at"]
    assert _seconds_from_now(expires_at) == pytest.approx(300, abs=1)
    assert "expires_in_s" not in hass.states.get(model).attributes
    oldest_changes, model_changes = state_changes(hass, oldest), state_changes(hass, model)

    for poll in range(1, 4):  # 10 s apart; the server's ages jitter by a few tenths
        freezer.tick(10)
        fake_hearth.queue["prefix_cache"]["by_class"] = _voice_cache(100.0 + 10 * poll + 0.3)
        fake_hearth.queue["models"]["m"] = {**MODEL, "expires_in_s": 300.0 - 10 * poll - 0.4}
        await _poll(hass, entry)
    assert (oldest_changes, model_changes) == ([], [])
    assert hass.states.get(oldest).state == cached_at
    assert hass.states.get(model).attributes["expires_at"] == expires_at

    fake_hearth.queue["prefix_cache"]["by_class"] = _voice_cache(5.0)  # the oldest was evicted
    await _poll(hass, entry)
    assert len(oldest_changes) == 1
    assert dt_util.parse_datetime(hass.states.get(oldest).state) > dt_util.parse_datetime(
        cached_at
    )


async def test_voice_cache_sensors(hass: HomeAssistant, fake_hearth: FakeHearth) -> None:
    """The voice cache sensors read /v1/queue's prefix cache by class; on an older server that
    has no such report they are unknown."""
    entry = await async_setup_hearth(hass, fake_hearth.url)
    coordinator = entry.runtime_data.coordinator

    def state(key: str) -> Any:
        return hass.states.get(sensor_of(hass, entry, "sensor", key))

    keys = ("voice_hit_rate", "voice_entries", "voice_oldest", "warm_ups")
    for key in keys:
        assert state(f"prefix_cache_{key}").state == STATE_UNKNOWN

    voice = {"entries": 3, "cells": 2400, "kept": 2, "oldest_s": 125.4, "lookups": 8,
             "hit_rate": 0.875}
    fake_hearth.queue["prefix_cache"].update(
        warm_ups=5, by_class={"voice": voice, "chat": {**voice, "entries": 0}}
    )
    await coordinator.async_refresh()
    await hass.async_block_till_done()
    assert float(state("prefix_cache_voice_hit_rate").state) == pytest.approx(87.5)
    entries = state("prefix_cache_voice_entries")
    assert entries.state == "3"
    assert entries.attributes["cells"] == 2400
    assert entries.attributes["kept"] == 2
    oldest = state("prefix_cache_voice_oldest")
    cached_at = dt_util.parse_datetime(oldest.state)
    assert (dt_util.utcnow() - cached_at).total_seconds() == pytest.approx(125.4, abs=2)
    assert oldest.attributes["device_class"] == "timestamp"
    assert state("prefix_cache_warm_ups").state == "5"

    # No voice turn has looked yet: no hit rate rather than 0 %.
    fake_hearth.queue["prefix_cache"]["by_class"]["voice"].update(lookups=0, hit_rate=0.0)
    await coordinator.async_refresh()
    await hass.async_block_till_done()
    assert state("prefix_cache_voice_hit_rate").state == STATE_UNKNOWN
