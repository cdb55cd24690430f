"""Setting up, unloading and reloading; sensors; diagnostics."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from unittest.mock import patch

import pytest
from hearth_server import HearthServer, free_port
from homeassistant.components import conversation
from homeassistant.config_entries import SOURCE_REAUTH, ConfigEntryState
from homeassistant.const import (
    CONF_API_KEY,
    CONF_URL,
    STATE_OFF,
    STATE_ON,
    STATE_UNAVAILABLE,
    STATE_UNKNOWN,
    EntityCategory,
)
from homeassistant.core import HomeAssistant
from homeassistant.exceptions import ConfigEntryNotReady
from homeassistant.helpers import entity_registry as er
from homeassistant.util import dt as dt_util
from pytest_homeassistant_custom_component.common import MockConfigEntry, async_fire_time_changed
from pytest_homeassistant_custom_component.components.diagnostics import (
    get_diagnostics_for_config_entry,
)
from pytest_homeassistant_custom_component.typing import ClientSessionGenerator

import custom_components.hearth as hearth_init
from custom_components.hearth import async_setup_entry
from custom_components.hearth.const import CONF_PROMPT, DOMAIN

from .conftest import (
    API_KEY,
    CONVERSATION_OPTIONS,
    FakeHearth,
    async_queue,
    async_setup_hearth,
    async_wait_for,
    entity_of,
    sensor_of,
)

pytestmark = [pytest.mark.ha, pytest.mark.usefixtures("socket_enabled")]


async def test_setup_with_refused_key_starts_reauth(
    hass: HomeAssistant, hearth_server: HearthServer
) -> None:
    """A 401 while setting up puts the entry into reauth."""
    entry = MockConfigEntry(
        domain=DOMAIN, data={CONF_URL: hearth_server.url, CONF_API_KEY: "expired"}
    )
    entry.add_to_hass(hass)
    assert not await hass.config_entries.async_setup(entry.entry_id)
    await hass.async_block_till_done()
    assert entry.state is ConfigEntryState.SETUP_ERROR
    flows = hass.config_entries.flow.async_progress_by_handler(DOMAIN)
    assert [flow["context"]["source"] for flow in flows] == [SOURCE_REAUTH]


async def test_setup_retries_while_unreachable(hass: HomeAssistant) -> None:
    """No server yet: set-up is retried later."""
    entry = MockConfigEntry(domain=DOMAIN, data={CONF_URL: f"http://127.0.0.1:{free_port()}"})
    entry.add_to_hass(hass)
    await hass.config_entries.async_setup(entry.entry_id)
    await hass.async_block_till_done()
    assert entry.state is ConfigEntryState.SETUP_RETRY


async def test_sensors_from_queue(
    hass: HomeAssistant, fake_hearth: FakeHearth, fake_entry: MockConfigEntry
) -> None:
    """Sensor states, units and classes follow /v1/queue; no data reads as unknown."""
    def state(platform: str, key: str):
        return hass.states.get(sensor_of(hass, fake_entry, platform, key))

    assert state("sensor", "waiting_voice").state == "1"
    assert state("sensor", "waiting_background").state == "5"
    assert state("sensor", "running_chat").state == "1"
    ttft = state("sensor", "ttft_p95_voice")
    assert float(ttft.state) == pytest.approx(180.4)
    assert ttft.attributes["unit_of_measurement"] == "ms"
    assert ttft.attributes["device_class"] == "duration"
    assert ttft.attributes["state_class"] == "measurement"
    assert float(state("sensor", "itl_p95_voice").state) == pytest.approx(11.2)
    assert float(state("sensor", "queue_wait_p95_voice").state) == pytest.approx(2.5)
    # The chat class has no data in the window: null percentiles are unknown, not 0.
    assert state("sensor", "ttft_p95_chat").state == STATE_UNKNOWN
    assert state("sensor", "itl_p95_chat").state == STATE_UNKNOWN
    speed = state("sensor", "tokens_per_second")
    assert float(speed.state) == pytest.approx(12.3)
    assert speed.attributes["unit_of_measurement"] == "tok/s"
    assert "device_class" not in speed.attributes
    kv = state("sensor", "kv_cache_use")
    assert float(kv.state) == pytest.approx(25.0)
    assert kv.attributes["unit_of_measurement"] == "%"
    assert float(state("sensor", "prefix_cache_hit_rate").state) == pytest.approx(67.0)
    preemptions = state("sensor", "preemptions")
    assert preemptions.state == "4"
    assert preemptions.attributes["state_class"] == "total_increasing"
    assert state("sensor", "jobs_queued").state == "2"
    assert state("sensor", "jobs_failed").state == "1"
    reachable = state("binary_sensor", "reachable")
    assert reachable.state == STATE_ON
    assert reachable.attributes["device_class"] == "connectivity"

    registry = er.async_get(hass)
    preemptions_entry = registry.async_get(sensor_of(hass, fake_entry, "sensor", "preemptions"))
    assert preemptions_entry.entity_category is EntityCategory.DIAGNOSTIC
    assert preemptions_entry.translation_key == "preemptions"
    completed = registry.async_get(sensor_of(hass, fake_entry, "sensor", "completed_voice"))
    assert completed.disabled_by is er.RegistryEntryDisabler.INTEGRATION
    # Names come from the translations.
    assert ttft.attributes["friendly_name"] == "Hearth Voice time to first token (p95)"

    # New numbers arrive with the next poll.
    fake_hearth.queue["waiting"]["voice"] = 0
    fake_hearth.queue["classes"]["chat"]["ttft_ms"]["p95"] = 250.0
    coordinator = fake_entry.runtime_data.coordinator
    await coordinator.async_refresh()
    await hass.async_block_till_done()
    assert state("sensor", "waiting_voice").state == "0"
    assert float(state("sensor", "ttft_p95_chat").state) == pytest.approx(250.0)

    # The server goes away: reachable turns off, the numbers become unavailable.
    await fake_hearth.stop()
    await coordinator.async_refresh()
    await hass.async_block_till_done()
    assert state("binary_sensor", "reachable").state == STATE_OFF
    assert state("sensor", "waiting_voice").state == STATE_UNAVAILABLE


async def test_agents_unavailable_while_unreachable(
    hass: HomeAssistant, fake_hearth: FakeHearth, fake_entry: MockConfigEntry
) -> None:
    """The conversation agent and the AI Task entity follow the server's reachability."""
    agents = [entity_of(hass, fake_entry, domain) for domain in ("conversation", "ai_task")]
    assert all(hass.states.get(agent).state != STATE_UNAVAILABLE for agent in agents)
    port = fake_hearth.port

    await fake_hearth.stop()
    coordinator = fake_entry.runtime_data.coordinator
    await coordinator.async_refresh()
    await hass.async_block_till_done()
    assert [hass.states.get(agent).state for agent in agents] == [STATE_UNAVAILABLE] * 2

    await fake_hearth.start(port)
    await coordinator.async_refresh()
    await hass.async_block_till_done()
    assert all(hass.states.get(agent).state != STATE_UNAVAILABLE for agent in agents)


async def test_setup_retries_while_the_model_loads(
    hass: HomeAssistant, fake_hearth: FakeHearth
) -> None:
    """A server that answers 503 (model loading) puts the entry into retry with a message
    saying why, on Home Assistant's own back-off, and the entry loads once the model is."""
    fake_hearth.health_status = 503
    entry = MockConfigEntry(
        domain=DOMAIN, data={CONF_URL: fake_hearth.url, CONF_API_KEY: API_KEY}
    )
    entry.add_to_hass(hass)
    await hass.config_entries.async_setup(entry.entry_id)
    await hass.async_block_till_done()
    assert entry.state is ConfigEntryState.SETUP_RETRY
    assert "loading" in (entry.reason or "")

    # No retry_after: Home Assistant 2026.11 takes it as the least wait before the next try,
    # so any value could only delay the first retry (5 s).
    with pytest.raises(ConfigEntryNotReady) as raised:
        await async_setup_entry(hass, entry)
    assert raised.value.translation_key == "model_loading"
    assert getattr(raised.value, "retry_after", None) is None

    fake_hearth.health_status = None
    async_fire_time_changed(hass, dt_util.utcnow() + timedelta(seconds=6))
    await async_wait_for(lambda: entry.state is ConfigEntryState.LOADED, within=10)


async def test_reconfigure_reloads_once(
    hass: HomeAssistant, fake_hearth: FakeHearth, fake_entry: MockConfigEntry
) -> None:
    """A reconfigured entry is reloaded once, by its update listener (the flow itself does
    not reload too, as current Home Assistant asks)."""
    other = FakeHearth()
    await other.start()
    try:
        setups = 0
        real_setup = hearth_init.async_setup_entry

        async def counting_setup(hass: HomeAssistant, entry: MockConfigEntry) -> bool:
            nonlocal setups
            setups += 1
            return await real_setup(hass, entry)

        with patch.object(hearth_init, "async_setup_entry", counting_setup):
            result = await fake_entry.start_reconfigure_flow(hass)
            result = await hass.config_entries.flow.async_configure(
                result["flow_id"], {CONF_URL: other.url, CONF_API_KEY: API_KEY}
            )
            await hass.async_block_till_done()
        assert result["reason"] == "reconfigure_successful"
        assert setups == 1
        assert fake_entry.state is ConfigEntryState.LOADED
        assert fake_entry.runtime_data.client.url == other.url
    finally:
        await other.stop()


async def test_diagnostics_redact_key(
    hass: HomeAssistant,
    hass_client: ClientSessionGenerator,
    fake_entry: MockConfigEntry,
) -> None:
    """Diagnostics carry the queue snapshot but not the API key, nor the agents' prompts."""
    diagnostics = await get_diagnostics_for_config_entry(hass, hass_client, fake_entry)
    assert diagnostics["entry"]["data"][CONF_API_KEY] == "**REDACTED**"
    assert API_KEY not in str(diagnostics)
    assert CONVERSATION_OPTIONS[CONF_PROMPT] not in str(diagnostics)
    agent = next(
        sub for sub in diagnostics["entry"]["subentries"] if sub["subentry_type"] == "conversation"
    )
    assert agent["data"][CONF_PROMPT] == "**REDACTED**"
    assert diagnostics["queue"]["tokens_per_s"] == pytest.approx(12.3)
    assert diagnostics["server"]["model"] == "fake-model"
    assert len(diagnostics["entry"]["subentries"]) == 2


@pytest.mark.model
async def test_unload_and_reload(hass: HomeAssistant, hearth_server: HearthServer) -> None:
    """Unloading stops the job watcher, the polling and the agents; reloading brings them
    back once."""
    entry = await async_setup_hearth(hass, hearth_server.url)
    assert entry.state is ConfigEntryState.LOADED
    agent_id = entity_of(hass, entry, "conversation")
    watcher = entry.runtime_data.jobs
    coordinator = entry.runtime_data.coordinator
    assert watcher.task is not None
    assert not watcher.task.done()
    queue = await async_queue(hass, hearth_server)
    assert "waiting" in queue

    assert await hass.config_entries.async_unload(entry.entry_id)
    await hass.async_block_till_done()
    assert entry.state is ConfigEntryState.NOT_LOADED
    assert watcher.task.done()
    assert not list(coordinator.async_contexts())
    assert not [
        task for task in asyncio.all_tasks()
        if "hearth" in task.get_name() and not task.done()
    ]
    assert hass.states.get(agent_id).state == STATE_UNAVAILABLE
    assert conversation.async_get_agent(hass, agent_id) is None

    assert await hass.config_entries.async_setup(entry.entry_id)
    await hass.async_block_till_done()
    assert entry.state is ConfigEntryState.LOADED
    assert entry.runtime_data.jobs is not watcher
    assert not entry.runtime_data.jobs.task.done()
    entities = er.async_entries_for_config_entry(er.async_get(hass), entry.entry_id)
    assert sum(e.domain == "conversation" for e in entities) == 1
    assert hass.states.get(agent_id).state != STATE_UNAVAILABLE

    assert await hass.config_entries.async_reload(entry.entry_id)
    await hass.async_block_till_done()
    assert entry.state is ConfigEntryState.LOADED
    running = [
        task for task in asyncio.all_tasks()
        if task.get_name().startswith("hearth job watcher") and not task.done()
    ]
    assert len(running) == 1
