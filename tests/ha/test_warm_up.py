"""Warm-ups of the agents' prompts, the voice prefix-cache sensors.

Against the real Hearth server (SmolLM2-135M) what counts is read from the server's own report
(``/v1/queue``'s prefix cache) and from the token counts it returns; the fake server shows the
exact bodies and the failures.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any
from unittest.mock import patch

import pytest
from hearth_server import HearthServer
from homeassistant.components import conversation
from homeassistant.components.homeassistant.exposed_entities import async_expose_entity
from homeassistant.config_entries import ConfigEntryState
from homeassistant.const import (
    CONF_LLM_HASS_API,
    EVENT_HOMEASSISTANT_STARTED,
)
from homeassistant.core import Context, CoreState, HomeAssistant
from homeassistant.helpers import area_registry as ar
from homeassistant.helpers import device_registry as dr
from homeassistant.helpers import entity_registry as er
from homeassistant.setup import async_setup_component
from homeassistant.util import dt as dt_util

from custom_components.hearth.api import HearthClient
from custom_components.hearth.const import CONF_CLASS_POLICY, CONF_PROMPT
from custom_components.hearth.warm import PromptWarmer

from .conftest import (
    CONVERSATION_OPTIONS,
    FakeHearth,
    async_queue,
    async_setup_hearth,
    async_wait_for,
    entity_of,
    sensor_of,
)

pytestmark = [pytest.mark.ha, pytest.mark.usefixtures("socket_enabled")]

LIGHTS = ("Kitchen light", "Hall light")


@pytest.fixture(autouse=True)
def short_cooldown() -> Iterator[None]:
    """Warm-ups follow a change at once rather than after seconds."""
    with patch("custom_components.hearth.warm.WARM_UP_COOLDOWN", 0.05):
        yield


@pytest.fixture
async def lights(hass: HomeAssistant) -> list[str]:
    """A few switchable lights (input_booleans) exposed to Assist, and one not exposed yet."""
    assert await async_setup_component(hass, "intent", {})
    names = {f"light_{i}": {"name": name} for i, name in enumerate((*LIGHTS, "Porch light"))}
    assert await async_setup_component(hass, "input_boolean", {"input_boolean": names})
    await hass.async_block_till_done()
    entity_ids = [f"input_boolean.{key}" for key in names]
    for entity_id in entity_ids:
        async_expose_entity(hass, "conversation", entity_id, entity_id != entity_ids[-1])
    return entity_ids


# The real server's cache outlives a test: a prompt of this session's own that no earlier run
# left cached (the tests after the first find it warm, which keeps them short).
SESSION_PROMPT = f"You are house {uuid.uuid4().hex[:8]}'s voice. Answer in one sentence."


ASSIST_OPTIONS = {
    **CONVERSATION_OPTIONS, CONF_PROMPT: SESSION_PROMPT, CONF_LLM_HASS_API: ["assist"]
}


# Against the real server


async def _server_idle(hass: HomeAssistant, server: HearthServer) -> dict[str, Any]:
    """Wait until the server runs and queues nothing (earlier tests' work done); its queue."""

    async def idle() -> dict[str, Any] | None:
        queue = await async_queue(hass, server)
        busy = sum(queue["waiting"].values()) + sum(queue["running"].values())
        return None if busy else queue

    return await async_wait_for(idle, within=120)


async def _warm_ups_reach(
    hass: HomeAssistant, server: HearthServer, count: int
) -> dict[str, Any]:
    """Wait until the server has admitted ``count`` warm-ups and run them; its queue."""

    async def reached() -> dict[str, Any] | None:
        queue = await async_queue(hass, server)
        done = not queue["running"]["background"] and not queue["waiting"]["background"]
        return queue if queue["prefix_cache"]["warm_ups"] >= count and done else None

    queue = await async_wait_for(reached, within=120)
    assert queue["prefix_cache"]["warm_ups"] == count
    return queue


@pytest.fixture
def usage_spy() -> Iterator[list[dict[str, Any]]]:
    """The usage the server reports for each streamed chat completion (the integration's
    requests asked for it too; the prompt is unchanged)."""
    usages: list[dict[str, Any]] = []
    stream = HearthClient.async_chat_stream

    async def with_usage(
        self: HearthClient, body: dict[str, Any], request_class: str | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[dict[str, Any]]:
        body = {**body, "stream_options": {"include_usage": True}}
        async for chunk in stream(self, body, request_class, **kwargs):
            if chunk.get("usage"):
                usages.append(chunk["usage"])
            yield chunk

    with patch.object(HearthClient, "async_chat_stream", with_usage):
        yield usages


@pytest.mark.model
async def test_setup_warms_the_prompt_a_voice_turn_then_finds(
    hass: HomeAssistant,
    hearth_server: HearthServer,
    lights: list[str],
    usage_spy: list[dict[str, Any]],
) -> None:
    """Setting up an agent warms its prompt on the server (one more warm-up, a voice entry);
    the next voice turn finds all of it cached but the turn's own tokens, and the sensors show
    the server's voice cache."""
    before = (await _server_idle(hass, hearth_server))["prefix_cache"]
    entry = await async_setup_hearth(hass, hearth_server.url, conversation=ASSIST_OPTIONS)

    queue = await _warm_ups_reach(hass, hearth_server, before["warm_ups"] + 1)
    voice = queue["prefix_cache"]["by_class"]["voice"]
    assert voice["entries"] >= 1
    assert voice["lookups"] == before["by_class"]["voice"]["lookups"]  # a warm-up is no lookup

    result = await conversation.async_converse(
        hass, "Hi.", None, Context(), agent_id=entity_of(hass, entry, "conversation"),
        satellite_id="assist_satellite.kitchen",
    )
    assert result.response.speech["plain"]["speech"].strip()

    queue = await async_queue(hass, hearth_server)
    voice = queue["prefix_cache"]["by_class"]["voice"]
    assert voice["lookups"] == before["by_class"]["voice"]["lookups"] + 1
    assert voice["hit_rate"] > 0
    (usage,) = usage_spy
    cached = usage["prompt_tokens_details"]["cached_tokens"]
    # Computed: the user's words and the turn markers. Cached: the system prompt and the tools
    # (SmolLM2's template does not take tools: the server lists them in the system message;
    # 900-odd tokens on 2026.2 since the intent tools keep to the exposed domains).
    assert cached > 600, usage
    assert usage["prompt_tokens"] - cached <= 12, usage

    await entry.runtime_data.coordinator.async_refresh()
    await hass.async_block_till_done()
    queue = await async_queue(hass, hearth_server)
    voice = queue["prefix_cache"]["by_class"]["voice"]

    def state(key: str) -> Any:
        return hass.states.get(sensor_of(hass, entry, "sensor", key))

    assert float(state("prefix_cache_voice_hit_rate").state) == pytest.approx(
        voice["hit_rate"] * 100, abs=0.01
    )
    entries = state("prefix_cache_voice_entries")
    assert int(entries.state) == voice["entries"]
    assert entries.attributes["cells"] == voice["cells"]
    cached_at = dt_util.parse_datetime(state("prefix_cache_voice_oldest").state)
    assert (dt_util.utcnow() - cached_at).total_seconds() == pytest.approx(
        voice["oldest_s"], abs=5
    )
    assert int(state("prefix_cache_warm_ups").state) == queue["prefix_cache"]["warm_ups"]


@pytest.mark.model
async def test_exposing_an_entity_warms_again(
    hass: HomeAssistant, hearth_server: HearthServer, lights: list[str]
) -> None:
    """One more exposed entity changes the prompt: one more warm-up follows (waited for until
    the server admits it; the test's end cancels what it has left to compute)."""
    before = (await _server_idle(hass, hearth_server))["prefix_cache"]["warm_ups"]
    await async_setup_hearth(hass, hearth_server.url, conversation=ASSIST_OPTIONS)
    await _warm_ups_reach(hass, hearth_server, before + 1)

    async_expose_entity(hass, "conversation", lights[-1], True)

    async def admitted() -> int | None:
        count = (await async_queue(hass, hearth_server))["prefix_cache"]["warm_ups"]
        return count if count > before + 1 else None

    assert await async_wait_for(admitted, within=60) == before + 2


# Against the fake server: the exact bodies, failures, triggers


Refreshes = list[asyncio.Task[None] | None]


@pytest.fixture
def refreshes() -> Iterator[Refreshes]:
    """One item per finished rebuild of an agent's warm-up bodies: the task sending what it
    queued, if any (so a test can tell that a change was looked at and what it sent)."""
    done: Refreshes = []
    refresh = PromptWarmer._async_refresh

    async def counted(self: PromptWarmer) -> None:
        await refresh(self)
        done.append(self._sender)

    with patch.object(PromptWarmer, "_async_refresh", counted):
        yield done


async def _settled(refreshes: Refreshes, count: int) -> None:
    """Wait for ``count`` rebuilds, then for the warm-ups they queued to be sent."""
    await async_wait_for(lambda: len(refreshes) >= count, within=10)
    await asyncio.gather(*(task for task in refreshes if task is not None))


async def _warm_requests(fake: FakeHearth, count: int) -> list[dict[str, Any]]:
    await async_wait_for(lambda: len(fake.warm_requests) >= count, within=10)
    return fake.warm_requests


async def test_warm_up_is_how_a_voice_turn_starts(
    hass: HomeAssistant, fake_hearth: FakeHearth, lights: list[str], refreshes: Refreshes
) -> None:
    """The warm-up carries exactly the system message and tools of the next voice turn, for the
    voice class; the registry changes of setting up, which leave the prompt as it was, send no
    second one."""
    entry = await async_setup_hearth(hass, fake_hearth.url, conversation=ASSIST_OPTIONS)
    (warm,) = await _warm_requests(fake_hearth, 1)
    await _settled(refreshes, len(refreshes))

    await conversation.async_converse(
        hass, "Turn on the hall light", None, Context(),
        agent_id=entity_of(hass, entry, "conversation"), satellite_id="assist_satellite.hall",
    )
    _, turn = fake_hearth.chat_requests[0]
    assert turn["priority"] == "voice"
    assert warm["priority"] == "voice"
    assert warm["messages"] == turn["messages"][:1]
    assert warm["messages"][0]["role"] == "system"
    assert "Hall light" in warm["messages"][0]["content"]
    assert warm["tools"] == turn["tools"]
    assert warm["tool_choice"] == turn["tool_choice"] == "auto"
    assert warm["tool_argument_values"] == turn["tool_argument_values"]
    assert "max_tokens" not in warm
    assert len(fake_hearth.warm_requests) == 1


async def test_changes_warm_once_and_only_when_the_prompt_changes(
    hass: HomeAssistant, fake_hearth: FakeHearth, lights: list[str], refreshes: Refreshes
) -> None:
    """A burst of changes (exposing, an alias, an area) sends one warm-up with all of them;
    a change the prompt does not show sends none."""
    await async_setup_hearth(hass, fake_hearth.url, conversation=ASSIST_OPTIONS)
    await _warm_requests(fake_hearth, 1)
    await _settled(refreshes, len(refreshes))

    registry = er.async_get(hass)
    area = ar.async_get(hass).async_create("Porch")
    async_expose_entity(hass, "conversation", lights[-1], True)
    registry.async_update_entity(lights[-1], aliases={"Front light"}, area_id=area.id)
    first, second = (w["messages"][0]["content"] for w in await _warm_requests(fake_hearth, 2))
    assert "Front light" not in first
    assert "Front light" in second  # exposed under its alias, in its area
    assert "Porch" in second.replace("Porch light", "")

    seen = len(refreshes)
    registry.async_update_entity(
        entity_of(hass, hass.config_entries.async_entries("hearth")[0], "conversation"),
        name="Agent",  # not exposed: not in the prompt
    )
    await _settled(refreshes, seen + 1)
    assert len(fake_hearth.warm_requests) == 2


async def test_warm_up_class_follows_the_agent_class(
    hass: HomeAssistant, fake_hearth: FakeHearth
) -> None:
    """An agent pinned to a class warms its prompt for that class; one without an LLM API
    warms its plain prompt (no tools)."""
    await async_setup_hearth(
        hass, fake_hearth.url, conversation={**CONVERSATION_OPTIONS, CONF_CLASS_POLICY: "chat"}
    )
    (warm,) = await _warm_requests(fake_hearth, 1)
    assert warm["priority"] == "chat"
    assert "tools" not in warm
    assert warm["messages"][0]["content"].startswith(CONVERSATION_OPTIONS[CONF_PROMPT])


@pytest.mark.parametrize(("status", "warned"), [(500, True), (404, False)])
async def test_failed_warm_up_does_not_break_setup(
    hass: HomeAssistant,
    fake_hearth: FakeHearth,
    lights: list[str],
    refreshes: Refreshes,
    caplog: pytest.LogCaptureFixture,
    status: int,
    warned: bool,
) -> None:
    """A server that fails the warm-up (or, older, has none: 404) leaves the entry loaded and
    the agent answering; a failure is a warning, a missing endpoint is not. The next change
    tries the same prompt again."""
    fake_hearth.warm_status = status
    with caplog.at_level(logging.DEBUG, logger="custom_components.hearth"):
        entry = await async_setup_hearth(hass, fake_hearth.url, conversation=ASSIST_OPTIONS)
        await _warm_requests(fake_hearth, 1)
        await _settled(refreshes, len(refreshes))
    assert entry.state is ConfigEntryState.LOADED
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING and "warm" in r.message]
    assert bool(warnings) is warned
    assert any("warm" in r.message for r in caplog.records)

    result = await conversation.async_converse(
        hass, "Turn on the hall light", None, Context(),
        agent_id=entity_of(hass, entry, "conversation"),
    )
    assert result.response.speech["plain"]["speech"]

    fake_hearth.warm_status = None
    er.async_get(hass).async_update_entity(lights[0], icon="mdi:ceiling-light")  # same prompt
    retried = await _warm_requests(fake_hearth, 2)
    assert retried[1] == retried[0]


async def test_warm_up_waits_for_home_assistant_to_start(
    hass: HomeAssistant, fake_hearth: FakeHearth, lights: list[str], refreshes: Refreshes
) -> None:
    """Set up while Home Assistant starts, an agent warms once it has started (not before:
    the entities are not all there yet)."""
    hass.set_state(CoreState.starting)
    await async_setup_hearth(hass, fake_hearth.url, conversation=ASSIST_OPTIONS)
    async_expose_entity(hass, "conversation", lights[-1], True)
    await hass.async_block_till_done()
    assert refreshes == []  # nothing even looked at


    hass.set_state(CoreState.running)
    hass.bus.async_fire(EVENT_HOMEASSISTANT_STARTED)
    (warm,) = await _warm_requests(fake_hearth, 1)
    assert "Porch light" in warm["messages"][0]["content"]


async def test_satellite_prompt_is_warmed_too(
    hass: HomeAssistant, fake_hearth: FakeHearth, lights: list[str], refreshes: Refreshes
) -> None:
    """A satellite in an area gets a prompt of its own: once it has spoken to the agent, a
    change warms its prompt as well, and its next turn starts with exactly that."""
    entry = await async_setup_hearth(hass, fake_hearth.url, conversation=ASSIST_OPTIONS)
    await _warm_requests(fake_hearth, 1)
    area = ar.async_get(hass).async_create("Kitchen")
    satellite = dr.async_get(hass).async_get_or_create(
        config_entry_id=entry.entry_id, identifiers={("test", "satellite")}, name="Satellite"
    )
    dr.async_get(hass).async_update_device(satellite.id, area_id=area.id)
    await _settled(refreshes, len(refreshes))
    agent_id = entity_of(hass, entry, "conversation")

    async def turn() -> dict[str, Any]:
        await conversation.async_converse(
            hass, "Turn on the lights", None, Context(), agent_id=agent_id,
            device_id=satellite.id,
        )
        return fake_hearth.chat_requests[-1][1]

    first = await turn()
    assert "You are in area Kitchen" in first["messages"][0]["content"]
    warmed = len(fake_hearth.warm_requests)

    async_expose_entity(hass, "conversation", lights[-1], True)

    def exposed(in_kitchen: bool) -> list[dict[str, Any]]:
        # The device registry's own change may still send the old kitchen prompt first: what
        # matters is the warm-up that carries the new entity, for each of the two prompts.
        return [
            w for w in fake_hearth.warm_requests[warmed:]
            if "Porch light" in (content := w["messages"][0]["content"])
            and ("You are in area Kitchen" in content) == in_kitchen
        ]

    await async_wait_for(lambda: exposed(True) and exposed(False), within=10)
    second = await turn()
    assert second["messages"][0]["content"] != first["messages"][0]["content"]
    (in_kitchen,) = exposed(True)
    assert in_kitchen["messages"] == second["messages"][:1]
    assert in_kitchen["tools"] == second["tools"]
