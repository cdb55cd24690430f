"""The model's worker process (llama.cpp supervised in a process of its own, restarted when it
dies) seen from Home Assistant: its state and last crash, the crashes counter, the boundary's
cost, the model sensors' worker attributes, a warning when it fails, diagnostics, and older
servers that report no worker."""

from __future__ import annotations

import logging

import pytest
from homeassistant.config_entries import ConfigEntryState
from homeassistant.const import CONF_API_KEY, STATE_UNAVAILABLE, EntityCategory
from homeassistant.core import HomeAssistant
from homeassistant.helpers import entity_registry as er
from homeassistant.util import dt as dt_util
from pytest_homeassistant_custom_component.common import MockConfigEntry
from pytest_homeassistant_custom_component.components.diagnostics import (
    get_diagnostics_for_config_entry,
)
from pytest_homeassistant_custom_component.typing import ClientSessionGenerator

from .conftest import API_KEY, FakeHearth, async_setup_hearth
from .fake_hearth import SAMPLE_WORKER, SEGFAULT

pytestmark = [pytest.mark.ha, pytest.mark.usefixtures("socket_enabled")]

WORKER = "sensor.hearth_worker"
CRASHES = "sensor.hearth_worker_crashes"
BOUNDARY = "sensor.hearth_worker_boundary_overhead"
SIGILL = "SIGILL: an illegal instruction (a CPU kernel this CPU cannot run)"


async def _poll(hass: HomeAssistant, entry: MockConfigEntry) -> None:
    await entry.runtime_data.coordinator.async_refresh()
    await hass.async_block_till_done()


def _worker_entities(hass: HomeAssistant, entry: MockConfigEntry) -> list[str]:
    return sorted(
        e.unique_id.removeprefix(f"{entry.entry_id}_")
        for e in er.async_entries_for_config_entry(er.async_get(hass), entry.entry_id)
        if e.unique_id.removeprefix(f"{entry.entry_id}_").startswith("worker")
    )


async def test_worker_sensors_from_queue(
    hass: HomeAssistant, fake_hearth: FakeHearth, fake_entry: MockConfigEntry
) -> None:
    """A serving worker: its state, CPU rung and counters; no crash yet."""
    worker = hass.states.get(WORKER)
    assert worker.state == "serving"
    assert worker.attributes["device_class"] == "enum"
    assert worker.attributes["options"] == [
        "serving", "restarting", "failed", "starting", "stopped"]
    assert worker.attributes["friendly_name"] == "Hearth Worker"
    assert {k: worker.attributes[k] for k in (
        "cpu_rung", "cpu_variant", "rungs_skipped", "restarts", "quarantined")} == {
        "cpu_rung": "native", "cpu_variant": "native", "rungs_skipped": [], "restarts": 0,
        "quarantined": 0}
    # No crash, nothing about one; the numbers that move every poll are no attributes.
    assert not [k for k in worker.attributes if k.startswith("last_crash")]
    assert not {"boundary", "pid", "crashes", "per_iteration_us"} & set(worker.attributes)

    crashes = hass.states.get(CRASHES)
    assert crashes.state == "0"
    assert crashes.attributes["state_class"] == "total_increasing"

    registry = er.async_get(hass)
    assert registry.async_get(WORKER).entity_category is None
    assert registry.async_get(WORKER).translation_key == "worker"
    assert registry.async_get(CRASHES).entity_category is EntityCategory.DIAGNOSTIC
    boundary = registry.async_get(BOUNDARY)
    assert boundary.entity_category is EntityCategory.DIAGNOSTIC
    assert boundary.disabled_by is er.RegistryEntryDisabler.INTEGRATION
    assert hass.states.get(BOUNDARY) is None

    # Enabled, the boundary sensor reads the overhead per engine iteration in µs.
    registry.async_update_entity(BOUNDARY, disabled_by=None)
    assert await hass.config_entries.async_reload(fake_entry.entry_id)
    await hass.async_block_till_done()
    overhead = hass.states.get(BOUNDARY)
    assert float(overhead.state) == pytest.approx(440.2)
    assert overhead.attributes["unit_of_measurement"] == "μs"
    assert overhead.attributes["device_class"] == "duration"

    # The overhead moves with every poll; the worker's state row does not.
    updated = hass.states.get(WORKER).last_updated
    fake_hearth.worker["boundary"] = {"iterations": 900, "per_iteration_us": 512.0,
                                      "share_of_iteration": 0.02}
    await _poll(hass, fake_entry)
    assert float(hass.states.get(BOUNDARY).state) == pytest.approx(512.0)
    assert hass.states.get(WORKER).last_updated == updated

    # Before the worker's first iteration the server reports 0 (or, earlier, no numbers).
    for boundary in ({"iterations": 0, "per_iteration_us": 0.0, "share_of_iteration": 0.0},
                     None):
        fake_hearth.worker["boundary"] = boundary
        await _poll(hass, fake_entry)
        assert hass.states.get(BOUNDARY).state == "unknown"


async def test_crash_restart_and_server_restart(
    hass: HomeAssistant, fake_hearth: FakeHearth, fake_entry: MockConfigEntry
) -> None:
    """serving → restarting (with the crash as attributes) → serving; the counter counts the
    crash once its worker is back, and starts again at 0 with a new server."""
    fake_hearth.crash_worker(SEGFAULT, during="decode_sample", requests_failed=2)
    await _poll(hass, fake_entry)
    worker = hass.states.get(WORKER)
    assert worker.state == "restarting"
    assert worker.attributes["last_crash_cause"] == SEGFAULT
    assert worker.attributes["last_crash_during"] == "decode_sample"
    assert worker.attributes["last_crash_requests_failed"] == 2
    crashed_at = worker.attributes["last_crash_at"]
    assert crashed_at == dt_util.utc_from_timestamp(1796248196.12).isoformat()
    assert dt_util.parse_datetime(crashed_at).tzinfo is not None
    assert hass.states.get(CRASHES).state == "0"

    fake_hearth.set_worker_state("serving")
    await _poll(hass, fake_entry)
    worker = hass.states.get(WORKER)
    assert worker.state == "serving"
    assert worker.attributes["restarts"] == 1
    assert worker.attributes["last_crash_cause"] == SEGFAULT  # kept: it explains the restart
    assert hass.states.get(CRASHES).state == "1"

    # An illegal instruction moved the worker one CPU rung down.
    fake_hearth.crash_worker(SIGILL, during="prefill", at=1796248300.0)
    fake_hearth.worker.update(cpu_rung="native+no-repack", rungs_skipped=["native"])
    fake_hearth.set_worker_state("serving")
    await _poll(hass, fake_entry)
    worker = hass.states.get(WORKER)
    assert worker.attributes["last_crash_cause"] == SIGILL
    assert worker.attributes["cpu_rung"] == "native+no-repack"
    assert worker.attributes["rungs_skipped"] == ["native"]
    assert hass.states.get(CRASHES).state == "2"

    # The server restarts: its count starts at 0 again (a new meter for total_increasing).
    fake_hearth.worker.update(restarts=0, last_crash=None, crashes=0)
    await _poll(hass, fake_entry)
    assert hass.states.get(CRASHES).state == "0"
    assert "last_crash_cause" not in hass.states.get(WORKER).attributes


async def test_model_sensor_shows_its_worker(
    hass: HomeAssistant, fake_hearth: FakeHearth
) -> None:
    """A local model's sensor carries its worker's state and last crash; a remote one none."""
    fake_hearth.queue["models"] = {
        "small": {"state": "ready", "classes": ["voice", "chat"], "pinned": True,
                  "worker": fake_hearth.worker},
        "big": {"state": "ready", "url": "http://gpu:8080", "kind": "openai",
                "classes": ["background"]},
    }
    entry = await async_setup_hearth(hass, fake_hearth.url)
    small = hass.states.get("sensor.hearth_model_small")
    assert small.attributes["worker"] == "serving"
    assert "worker_last_crash" not in small.attributes
    assert "worker" not in hass.states.get("sensor.hearth_model_big").attributes

    fake_hearth.crash_worker(SIGILL)
    await _poll(hass, entry)
    small = hass.states.get("sensor.hearth_model_small")
    assert small.state == "ready"
    assert small.attributes["worker"] == "restarting"
    assert small.attributes["worker_last_crash"] == SIGILL


async def test_failed_worker_warns_once(
    hass: HomeAssistant, fake_hearth: FakeHearth, caplog: pytest.LogCaptureFixture
) -> None:
    """A failed worker is logged once, not on every poll (the voice model's worker is also
    under "models": still once); again only after it served in between."""
    fake_hearth.queue["models"] = {"small": {"state": "ready", "worker": fake_hearth.worker}}
    entry = await async_setup_hearth(hass, fake_hearth.url)

    def warnings() -> list[str]:
        return [r.getMessage() for r in caplog.records
                if r.levelno == logging.WARNING and r.name.startswith("custom_components.hearth")]

    fake_hearth.crash_worker(SIGILL)
    fake_hearth.set_worker_state("failed")
    for _ in range(3):
        await _poll(hass, entry)
    assert hass.states.get(WORKER).state == "failed"
    assert len(warnings()) == 1
    assert "small" in warnings()[0] and SIGILL in warnings()[0]
    assert entry.runtime_data.coordinator.failed_workers == {"small"}

    fake_hearth.set_worker_state("serving")
    await _poll(hass, entry)
    assert entry.runtime_data.coordinator.failed_workers == set()
    fake_hearth.set_worker_state("failed")
    await _poll(hass, entry)
    await _poll(hass, entry)
    assert len(warnings()) == 2


async def test_older_server_without_worker(
    hass: HomeAssistant, fake_hearth: FakeHearth
) -> None:
    """A server before worker processes: no worker sensors, the rest as before; they appear
    once the server reports its worker, and are unavailable while it reports none (a remote
    voice model)."""
    del fake_hearth.queue["worker"]
    entry = await async_setup_hearth(hass, fake_hearth.url)
    assert entry.state is ConfigEntryState.LOADED
    assert _worker_entities(hass, entry) == []
    assert hass.states.get(WORKER) is None
    assert hass.states.get("sensor.hearth_voice_requests_waiting").state == "1"

    # Upgraded: the next poll brings the worker and its sensors.
    fake_hearth.queue["worker"] = {**SAMPLE_WORKER, "restarts": 3}
    await _poll(hass, entry)
    assert _worker_entities(hass, entry) == [
        "worker", "worker_boundary_overhead", "worker_crashes"]
    assert hass.states.get(WORKER).state == "serving"
    assert hass.states.get(CRASHES).state == "3"

    # The voice model becomes a remote one: no worker to report.
    fake_hearth.queue["worker"] = None
    await _poll(hass, entry)
    assert hass.states.get(WORKER).state == STATE_UNAVAILABLE
    assert hass.states.get(CRASHES).state == STATE_UNAVAILABLE
    assert hass.states.get("sensor.hearth_voice_requests_waiting").state == "1"


async def test_remote_voice_model_has_no_worker_sensors(
    hass: HomeAssistant, fake_hearth: FakeHearth
) -> None:
    fake_hearth.queue["worker"] = None
    entry = await async_setup_hearth(hass, fake_hearth.url)
    assert _worker_entities(hass, entry) == []


async def test_sets_up_while_the_worker_restarts(
    hass: HomeAssistant, fake_hearth: FakeHearth
) -> None:
    """/health says degraded (200) while the worker restarts: the entry still sets up."""
    fake_hearth.crash_worker()
    entry = await async_setup_hearth(hass, fake_hearth.url)
    assert entry.state is ConfigEntryState.LOADED
    assert entry.runtime_data.health["status"] == "degraded"
    assert hass.states.get(WORKER).state == "restarting"


async def test_diagnostics_include_the_worker(
    hass: HomeAssistant,
    hass_client: ClientSessionGenerator,
    fake_hearth: FakeHearth,
) -> None:
    fake_hearth.queue["models"] = {"small": {"state": "ready", "worker": fake_hearth.worker},
                                   "big": {"state": "ready", "url": "http://gpu:8080"}}
    fake_hearth.crash_worker()
    entry = await async_setup_hearth(hass, fake_hearth.url)
    diagnostics = await get_diagnostics_for_config_entry(hass, hass_client, entry)
    worker = diagnostics["worker"]
    assert worker["voice_model"]["state"] == "restarting"
    assert worker["voice_model"]["last_crash"]["cause"] == SEGFAULT
    assert list(worker["models"]) == ["small"]
    assert worker["failed"] == []
    assert diagnostics["server"]["cpu"]["rung"] == "native"
    assert API_KEY not in str(diagnostics)
    assert diagnostics["entry"]["data"][CONF_API_KEY] == "**REDACTED**"
