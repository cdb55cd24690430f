"""The conversation tool loop, streaming, class headers and history, against a fake server
that calls tools on cue."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import voluptuous as vol
from homeassistant.components import conversation
from homeassistant.components.homeassistant.exposed_entities import async_expose_entity
from homeassistant.const import CONF_LLM_HASS_API, STATE_OFF, STATE_ON
from homeassistant.core import Context, HomeAssistant
from homeassistant.helpers import area_registry as ar
from homeassistant.helpers import entity_registry as er
from homeassistant.helpers import floor_registry as fr
from homeassistant.helpers import llm
from homeassistant.helpers.json import json_dumps
from homeassistant.setup import async_setup_component
from pytest_homeassistant_custom_component.common import MockConfigEntry, MockUser

from custom_components.hearth.call_hint import FOLLOW_UPS
from custom_components.hearth.const import (
    CLASS_HEADER,
    CONF_CONFIRM_ACTIONS,
    CONF_MAX_HISTORY,
)

from .conftest import (
    CONVERSATION_OPTIONS,
    SHADOW_DESCRIPTION,
    FakeHearth,
    async_setup_hearth,
    entity_of,
    open_chat_session,
    text_chunks,
    tool_call_script,
    turn_on_tool,
)

pytestmark = pytest.mark.ha

# An agent that always asks the model again after its tools ran.
TWO_TURNS = {**CONVERSATION_OPTIONS, CONF_LLM_HASS_API: ["assist"], CONF_CONFIRM_ACTIONS: False}


@pytest.fixture
async def kitchen_light(hass: HomeAssistant) -> str:
    """An exposed switchable light (an input_boolean) the agent can turn on."""
    assert await async_setup_component(hass, "intent", {})
    assert await async_setup_component(
        hass,
        "input_boolean",
        {"input_boolean": {"kitchen_light": {"name": "Kitchen light", "initial": False}}},
    )
    await hass.async_block_till_done()
    async_expose_entity(hass, "conversation", "input_boolean.kitchen_light", True)
    return "input_boolean.kitchen_light"


async def test_tool_call_turns_the_light_on(
    hass: HomeAssistant,
    fake_hearth: FakeHearth,
    kitchen_light: str,
    hass_admin_user: MockUser,
) -> None:
    """The model calls HassTurnOn, the light turns on, the result goes back to the model and
    its final answer is spoken (actions not confirmed by Home Assistant's own sentence)."""
    assert hass.states.get(kitchen_light).state == STATE_OFF
    entry = await async_setup_hearth(hass, fake_hearth.url, conversation=TWO_TURNS)
    agent_id = entity_of(hass, entry, "conversation")

    result = await conversation.async_converse(
        hass,
        "Turn on the kitchen light",
        None,
        Context(user_id=hass_admin_user.id),
        agent_id=agent_id,
    )

    assert hass.states.get(kitchen_light).state == STATE_ON
    assert result.response.speech["plain"]["speech"] == "The kitchen light is on."
    assert len(fake_hearth.chat_requests) == 2
    first_headers, first = fake_hearth.chat_requests[0]
    assert first["stream"] is True
    assert first["priority"] == "chat"
    assert first_headers[CLASS_HEADER] == "chat"
    assert first["user"] == hass_admin_user.id
    assert first["tool_choice"] == "auto"
    tool_name = turn_on_tool(first)
    assert tool_name is not None

    _, second = fake_hearth.chat_requests[1]
    call_message, tool_message = second["messages"][-2:]
    assert call_message["role"] == "assistant"
    assert call_message["tool_calls"][0]["id"] == "call_1"
    assert call_message["tool_calls"][0]["function"]["name"] == tool_name
    assert tool_message["role"] == "tool"
    assert tool_message["tool_call_id"] == "call_1"
    # What the tool answered and whether it failed, as Home Assistant's own integrations send it.
    tool_answer = json.loads(tool_message["content"])
    assert tool_answer["error"] is False
    assert tool_answer["data"]["response_type"] == "action_done"
    assert tool_answer["data"]["data"]["success"]


@pytest.mark.parametrize(
    ("language", "speech"), [("en", "Turned on the switch."), ("de", None)]
)
async def test_a_done_action_is_confirmed_without_a_second_model_turn(
    hass: HomeAssistant,
    fake_hearth: FakeHearth,
    fake_entry: MockConfigEntry,
    kitchen_light: str,
    hass_admin_user: MockUser,
    language: str,
    speech: str | None,
) -> None:
    """When every call did what was asked, the turn ends with what Home Assistant's own agent
    says for the intent, in the turn's language, and the model is asked once (issue 30)."""
    result = await conversation.async_converse(
        hass, "Turn on the kitchen light", None, Context(user_id=hass_admin_user.id),
        agent_id=entity_of(hass, fake_entry, "conversation"), language=language,
    )

    assert hass.states.get(kitchen_light).state == STATE_ON
    said = result.response.speech["plain"]["speech"]
    assert len(fake_hearth.chat_requests) == 1
    if speech is not None:
        assert said == speech
    else:  # another language's own sentence, not English's, nor the model's
        assert said and said not in ("Turned on the switch.", "The kitchen light is on.")


async def test_a_failed_action_goes_back_to_the_model(
    hass: HomeAssistant,
    fake_hearth: FakeHearth,
    fake_entry: MockConfigEntry,
    kitchen_light: str,
    hass_admin_user: MockUser,
) -> None:
    """A call Home Assistant could not carry out is not confirmed: its result goes back to the
    model, which answers."""
    fake_hearth.chat_handler = lambda body: tool_call_script(body, {"name": "Garage door"})
    result = await conversation.async_converse(
        hass, "Open the garage door", None, Context(user_id=hass_admin_user.id),
        agent_id=entity_of(hass, fake_entry, "conversation"),
    )

    assert hass.states.get(kitchen_light).state == STATE_OFF
    assert len(fake_hearth.chat_requests) == 2
    assert result.response.speech["plain"]["speech"] == "The kitchen light is on."
    _, second = fake_hearth.chat_requests[1]
    assert second["messages"][-1]["role"] == "tool"


class _ShadowAPI(llm.API):
    """A second LLM API whose tools have the names Assist's HassTurnOn has (in one release or
    another), so that Home Assistant must tell them apart. They do nothing."""

    def __init__(self, hass: HomeAssistant) -> None:
        super().__init__(hass=hass, id="shadow", name="Shadow")

    async def async_get_api_instance(self, llm_context: llm.LLMContext) -> llm.APIInstance:
        tools = [_ShadowTool(name) for name in ("HassTurnOn", "intent__HassTurnOn")]
        return llm.APIInstance(self, "Shadow tools.", llm_context, tools)


class _ShadowTool(llm.Tool):
    description = SHADOW_DESCRIPTION
    parameters = vol.Schema({vol.Optional("name"): str})

    def __init__(self, name: str) -> None:
        self.name = name

    async def async_call(
        self, hass: HomeAssistant, tool_input: llm.ToolInput, llm_context: llm.LLMContext
    ) -> dict[str, Any]:
        raise AssertionError("the shadow tool must not be called")


async def test_namespaced_tools_from_two_apis(
    hass: HomeAssistant, fake_hearth: FakeHearth, kitchen_light: str, hass_admin_user: MockUser
) -> None:
    """With two APIs that offer tools of the same name, Home Assistant prefixes them with
    their API (``assist__...``); the model's call goes back under that name and reaches
    Assist's tool, not the other API's."""
    llm.async_register_api(hass, _ShadowAPI(hass))
    entry = await async_setup_hearth(
        hass,
        fake_hearth.url,
        conversation={**TWO_TURNS, CONF_LLM_HASS_API: ["assist", "shadow"]},
    )
    result = await conversation.async_converse(
        hass, "Turn on the kitchen light", None, Context(user_id=hass_admin_user.id),
        agent_id=entity_of(hass, entry, "conversation"),
    )

    assert hass.states.get(kitchen_light).state == STATE_ON
    assert result.response.speech["plain"]["speech"] == "The kitchen light is on."
    _, first = fake_hearth.chat_requests[0]
    tool_name = turn_on_tool(first)
    assert tool_name is not None
    assert tool_name.startswith("assist__")
    _, second = fake_hearth.chat_requests[1]
    assert second["messages"][-2]["tool_calls"][0]["function"]["name"] == tool_name
    # Only Assist's intent tools get exposed names to keep to; the other API's are left free.
    assert set(first["tool_argument_values"]) >= {tool_name}
    shadow = {t["function"]["name"] for t in first["tools"]
              if t["function"].get("description") == SHADOW_DESCRIPTION}
    assert shadow and not shadow & set(first["tool_argument_values"])


async def test_tool_arguments_are_held_to_exposed_names(
    hass: HomeAssistant,
    fake_hearth: FakeHearth,
    fake_entry: MockConfigEntry,
    kitchen_light: str,
    hass_admin_user: MockUser,
) -> None:
    """The agent tells the server which values each intent tool's ``name`` and ``area`` may
    take: the exposed entities' names and their areas' names and aliases (what the prompt
    lists), and nothing of an entity that is not exposed."""
    porch = ar.async_get(hass).async_create("Porch", aliases={"Outside"})
    ent_reg = er.async_get(hass)
    entry = ent_reg.async_get_or_create(
        "light", "test", "porch", suggested_object_id="porch", original_name="Porch light"
    )
    ent_reg.async_update_entity(entry.entity_id, area_id=porch.id)
    hass.states.async_set(entry.entity_id, STATE_OFF, {"friendly_name": "Porch light"})
    async_expose_entity(hass, "conversation", entry.entity_id, True)
    hidden = ent_reg.async_get_or_create("light", "test", "garage", suggested_object_id="garage")
    hass.states.async_set(hidden.entity_id, STATE_OFF, {"friendly_name": "Garage heater"})
    async_expose_entity(hass, "conversation", hidden.entity_id, False)

    await conversation.async_converse(
        hass, "Turn on the kitchen light", None, Context(user_id=hass_admin_user.id),
        agent_id=entity_of(hass, fake_entry, "conversation"),
    )

    _, first = fake_hearth.chat_requests[0]
    values = first["tool_argument_values"][turn_on_tool(first)]
    assert set(values["name"]) == {"Kitchen light", "Porch light"}
    assert set(values["area"]) == {"Porch", "Outside"}
    for tool_values in first["tool_argument_values"].values():
        assert "Garage heater" not in tool_values.get("name", [])


def _turn_on_params(body: dict[str, Any]) -> dict[str, Any]:
    name = turn_on_tool(body)
    return next(t["function"]["parameters"] for t in body["tools"]
                if t["function"]["name"] == name)


async def test_intent_domains_and_device_classes_keep_to_the_exposed_entities(
    hass: HomeAssistant,
    fake_hearth: FakeHearth,
    fake_entry: MockConfigEntry,
    kitchen_light: str,
    hass_admin_user: MockUser,
) -> None:
    """HassTurnOn offers every domain's device classes; the tool sent keeps to those of the
    exposed entities (none: the argument goes), so a small model cannot list thirty of
    them into a call that then matches nothing."""
    context = Context(user_id=hass_admin_user.id)
    agent = entity_of(hass, fake_entry, "conversation")
    await conversation.async_converse(hass, "Turn on the kitchen light", None, context,
                                      agent_id=agent)
    params = _turn_on_params(fake_hearth.chat_requests[-1][1])
    assert "device_class" not in params["properties"]  # the light (an input_boolean) has none
    domain = params["properties"]["domain"]
    assert (domain.get("items") or domain)["enum"] == ["input_boolean"]

    outlet = er.async_get(hass).async_get_or_create("switch", "test", "kettle",
                                                    suggested_object_id="kettle")
    hass.states.async_set(outlet.entity_id, STATE_OFF,
                          {"friendly_name": "Kettle", "device_class": "outlet"})
    async_expose_entity(hass, "conversation", outlet.entity_id, True)
    hidden = er.async_get(hass).async_get_or_create("cover", "test", "blind",
                                                    suggested_object_id="blind")
    hass.states.async_set(hidden.entity_id, "closed",
                          {"friendly_name": "Blind", "device_class": "blind"})
    async_expose_entity(hass, "conversation", hidden.entity_id, False)
    await conversation.async_converse(hass, "Turn on the kettle", None, context,
                                      agent_id=agent)
    params = _turn_on_params(fake_hearth.chat_requests[-1][1])
    device_class = params["properties"]["device_class"]
    assert (device_class.get("items") or device_class)["enum"] == ["outlet"]
    domain = params["properties"]["domain"]
    assert sorted((domain.get("items") or domain)["enum"]) == ["input_boolean", "switch"]
    assert "floor" not in params["properties"]  # a home without floors

    fr.async_get(hass).async_create("Ground floor", aliases={"Downstairs"})
    await conversation.async_converse(hass, "Turn on the kettle", None, context,
                                      agent_id=agent)
    floor = _turn_on_params(fake_hearth.chat_requests[-1][1])["properties"]["floor"]
    assert sorted((floor.get("items") or floor)["enum"]) == ["Downstairs", "Ground floor"]


def _light_set_params(body: dict[str, Any]) -> dict[str, Any] | None:
    return next((t["function"]["parameters"] for t in body["tools"]
                 if t["function"]["name"].endswith("HassLightSet")), None)


async def test_light_colour_arguments_only_where_a_light_has_colour(
    hass: HomeAssistant,
    fake_hearth: FakeHearth,
    fake_entry: MockConfigEntry,
    hass_admin_user: MockUser,
) -> None:
    """HassLightSet offers ``color`` and ``temperature``; a home whose exposed lights have
    only brightness is sent neither (a small model set both with the brightness, and Home
    Assistant refused the call). One light with a colour temperature brings both back: Home
    Assistant converts a colour for it."""
    assert await async_setup_component(hass, "intent", {})
    assert await async_setup_component(hass, "light", {})
    registry = er.async_get(hass)
    context = Context(user_id=hass_admin_user.id)
    agent = entity_of(hass, fake_entry, "conversation")

    def light(key: str, name: str, modes: list[str]) -> None:
        entry = registry.async_get_or_create("light", "test", key, suggested_object_id=key)
        hass.states.async_set(entry.entity_id, STATE_OFF,
                              {"friendly_name": name, "supported_color_modes": modes})
        async_expose_entity(hass, "conversation", entry.entity_id, True)

    light("desk", "Desk lamp", ["brightness"])
    await conversation.async_converse(hass, "Dim the desk lamp", None, context, agent_id=agent)
    if (params := _light_set_params(fake_hearth.chat_requests[-1][1])) is None:
        pytest.skip("this release offers no HassLightSet for lights of a test platform")
    props = params["properties"]
    assert "brightness" in props
    assert "color" not in props and "temperature" not in props

    light("hall", "Hall light", ["color_temp"])
    await conversation.async_converse(hass, "Warm the hall light", None, context, agent_id=agent)
    params = _light_set_params(fake_hearth.chat_requests[-1][1])
    assert params is not None
    assert {"brightness", "color", "temperature"} <= set(params["properties"])


async def test_a_call_naming_a_device_in_another_area_loses_the_area(
    hass: HomeAssistant,
    fake_hearth: FakeHearth,
    fake_entry: MockConfigEntry,
    kitchen_light: str,
    hass_admin_user: MockUser,
) -> None:
    """The model names the kitchen light and an area it is not in: Home Assistant would match
    nothing; the call runs without the area and the light turns on. The prompt carries the
    follow-up guidance after Home Assistant's own."""
    ar.async_get(hass).async_create("Porch")
    fake_hearth.chat_handler = lambda body: tool_call_script(
        body, {"name": "Kitchen light", "area": "Porch"})
    await conversation.async_converse(
        hass, "Turn on the kitchen light", None, Context(user_id=hass_admin_user.id),
        agent_id=entity_of(hass, fake_entry, "conversation"),
    )
    assert hass.states.get(kitchen_light).state == STATE_ON
    _, first = fake_hearth.chat_requests[0]
    assert first["messages"][0]["content"].rsplit("\n", 1)[1].startswith(FOLLOW_UPS)


async def test_exposed_names_go_once_to_a_server_that_takes_sets(
    hass: HomeAssistant,
    fake_hearth: FakeHearth,
    fake_entry: MockConfigEntry,
    kitchen_light: str,
    hass_admin_user: MockUser,
) -> None:
    """A server listing ``tool_argument_sets`` gets the exposed names once: each intent tool
    refers to them as "$names", and resolved they are the values it got before."""
    fake_hearth.features = ["tool_argument_sets"]
    assert await hass.config_entries.async_reload(fake_entry.entry_id)
    await hass.async_block_till_done()

    await conversation.async_converse(
        hass, "Turn on the kitchen light", None, Context(user_id=hass_admin_user.id),
        agent_id=entity_of(hass, fake_entry, "conversation"),
    )

    _, first = fake_hearth.chat_requests[0]
    sets = first["tool_argument_sets"]
    assert sets["names"] == ["Kitchen light"]
    narrowed = first["tool_argument_values"]
    assert len(narrowed) > 1  # several intent tools, one list
    assert all(args.get("name") == "$names" for args in narrowed.values() if "name" in args)
    assert first["tool_argument_values"][turn_on_tool(first)]["name"] == "$names"


def _calling(names: list[str]) -> Any:
    """A chat handler whose model calls HassTurnOn for the next of ``names`` on every turn
    (the last one again once they run out)."""
    turns: list[dict[str, Any]] = []

    def handler(body: dict[str, Any]) -> list[dict[str, Any]]:
        turns.append(body)
        name = names[min(len(turns), len(names)) - 1]
        return [
            {"choices": [{"index": 0, "delta": {"tool_calls": [{
                "index": 0, "id": f"call_{len(turns)}", "type": "function",
                "function": {"name": turn_on_tool(body), "arguments": json.dumps({"name": name})},
            }]}, "finish_reason": "tool_calls"}]}
        ]

    return handler


async def test_tool_loop_is_bounded(
    hass: HomeAssistant,
    fake_hearth: FakeHearth,
    kitchen_light: str,
) -> None:
    """A model that keeps calling tools, each time another, is stopped after ten rounds
    (actions not confirmed by Home Assistant: else the first call that works ends the turn),
    and the turn says what the tools said instead of Home Assistant's "Unable to get
    response"."""
    entry = await async_setup_hearth(hass, fake_hearth.url, conversation=TWO_TURNS)
    fake_hearth.chat_handler = _calling([f"Attic light {n}" for n in range(20)])
    result = await conversation.async_converse(
        hass, "Turn it on forever", None, Context(),
        agent_id=entity_of(hass, entry, "conversation"),
    )
    assert len(fake_hearth.chat_requests) == 10
    speech = result.response.speech["plain"]["speech"]
    assert speech.startswith("That did not work")
    if speech != "That did not work.":  # 2026.2 words a failed match as its repr: left out
        assert "Attic light 9" in speech  # the last round's error, as Home Assistant worded it


@pytest.mark.parametrize(("names", "said"), [
    (["Attic light"], "That did not work"),
    (["Kitchen light"], "The model used its tools but gave no answer."),
    (["Attic light", "Kitchen light", "Attic light"], "That did not work"),
])
async def test_a_repeated_call_ends_the_turn(
    hass: HomeAssistant,
    fake_hearth: FakeHearth,
    kitchen_light: str,
    names: list[str],
    said: str,
) -> None:
    """A round that only repeats calls the model made earlier in the turn ends it: a small
    model retries a failing call until the round limit. The turn says the tools' error, or
    that no answer came."""
    entry = await async_setup_hearth(hass, fake_hearth.url, conversation=TWO_TURNS)
    fake_hearth.chat_handler = _calling(names)
    result = await conversation.async_converse(
        hass, "Turn on the attic light", None, Context(),
        agent_id=entity_of(hass, entry, "conversation"),
    )
    assert len(fake_hearth.chat_requests) == len(names) + (names[-1] not in names[:-1])
    assert result.response.speech["plain"]["speech"].startswith(said)


@pytest.mark.parametrize(("answer", "said"), [
    ("", "The model gave no answer."), (" \n", "The model gave no answer."), ("Hi.", "Hi.")])
async def test_an_answer_with_neither_words_nor_calls_is_said_as_none(
    hass: HomeAssistant, fake_hearth: FakeHearth, fake_entry: MockConfigEntry,
    answer: str, said: str,
) -> None:
    """A model answer with no text and no call (the server cuts a made-up tool answer at its
    tag) is asked once more (:mod:`.described_call`), then said as such, once, rather than as
    silence; any text is the model's answer."""
    fake_hearth.chat_handler = lambda body: text_chunks(answer)
    result = await conversation.async_converse(
        hass, "And the porch light too.", None, Context(),
        agent_id=entity_of(hass, fake_entry, "conversation"),
    )
    assert result.response.speech["plain"]["speech"] == said
    assert len(fake_hearth.chat_requests) == (1 if answer.strip() else 2)


async def _pipeline_turn(
    hass: HomeAssistant, agent_id: str, text: str
) -> tuple[conversation.ConversationResult, list[dict[str, Any]], conversation.Content]:
    """A turn whose chat log streams to a listener, as every Assist pipeline run's does (the
    typed dialog's too): the result, the deltas the listener saw and the chat log's last
    entry."""
    deltas: list[dict[str, Any]] = []
    with (
        open_chat_session(hass) as session,
        conversation.async_get_chat_log(
            hass,
            session,
            conversation.ConversationInput(
                text=text, context=Context(), conversation_id=session.conversation_id,
                device_id=None, satellite_id=None, language="en", agent_id=agent_id,
            ),
            chat_log_delta_listener=lambda chat_log, delta: deltas.append(delta),
        ) as chat_log,
    ):
        result = await conversation.async_converse(
            hass, text, session.conversation_id, Context(), agent_id=agent_id
        )
        return result, deltas, chat_log.content[-1]


async def test_the_command_benchmark_reads_the_calls_from_the_pipeline_events(
    hass: HomeAssistant, fake_hearth: FakeHearth, fake_entry: MockConfigEntry,
    kitchen_light: str,
) -> None:
    """``make bench-commands`` reports what the model did from a pipeline run's events: each
    call with its arguments, a failed call's error, and the text it wrote (the deltas as the
    websocket sends them, through Home Assistant's JSON encoder)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts" / "demo"))
    from hearth_demo.haclient import model_text, tool_calls

    fake_hearth.chat_handler = lambda body: tool_call_script(body, {"name": "Garage door"})
    agent_id = entity_of(hass, fake_entry, "conversation")
    _, deltas, _ = await _pipeline_turn(hass, agent_id, "Open the garage door")

    events = [{"type": "intent-progress", "data": json.loads(json_dumps({"chat_log_delta": d}))}
              for d in deltas]
    calls = tool_calls(events)
    assert len(calls) == 2, calls
    assert calls[0].endswith('HassTurnOn({"name": "Garage door"})'), calls
    assert calls[1].startswith("  -> error: "), calls  # worded per release (2026.2: a repr)
    assert model_text(events) == "The kitchen light is on."  # the answer after the result


async def test_listened_turn_streams_and_stays_chat(
    hass: HomeAssistant, fake_hearth: FakeHearth, fake_entry: MockConfigEntry
) -> None:
    """A turn whose chat log has a delta listener but no device (the typed Assist dialog)
    is chat, and the answer reaches the listener piece by piece (a sentence at a time: an
    agent with tools holds each back until it ends, see test_described_call)."""
    fake_hearth.chat_handler = lambda body: text_chunks("It is sunny. It is warm today.")
    agent_id = entity_of(hass, fake_entry, "conversation")
    result, deltas, _ = await _pipeline_turn(hass, agent_id, "How is the weather?")

    assert result.response.speech["plain"]["speech"] == "It is sunny. It is warm today."
    headers, body = fake_hearth.chat_requests[-1]
    assert body["priority"] == "chat"
    assert headers[CLASS_HEADER] == "chat"
    pieces = [delta["content"] for delta in deltas if delta.get("content")]
    assert len(pieces) > 1
    assert "".join(pieces) == "It is sunny. It is warm today."
    assert hass.states.get(agent_id).attributes.get("supported_features") is not None


async def test_fixed_class_policy_and_history(
    hass: HomeAssistant, fake_hearth: FakeHearth
) -> None:
    """A pinned class is used even for a satellite; only the last rounds are sent along."""
    entry = await async_setup_hearth(
        hass,
        fake_hearth.url,
        conversation={
            **CONVERSATION_OPTIONS,
            "class_policy": "agent",
            CONF_MAX_HISTORY: 1,
            CONF_LLM_HASS_API: [],
        },
    )
    replies = iter(["First answer.", "Second answer.", "Third answer."])
    fake_hearth.chat_handler = lambda body: text_chunks(next(replies))
    agent_id = entity_of(hass, entry, "conversation")

    conversation_id = None
    for text in ("one", "two", "three"):
        result = await conversation.async_converse(
            hass, text, conversation_id, Context(), agent_id=agent_id,
            satellite_id="assist_satellite.hall",
        )
        conversation_id = result.conversation_id

    headers, body = fake_hearth.chat_requests[-1]
    assert body["priority"] == "agent"
    assert headers[CLASS_HEADER] == "agent"
    assert body["user"] == "assist_satellite.hall"
    roles = [message["role"] for message in body["messages"]]
    contents = [message["content"] for message in body["messages"]]
    assert roles == ["system", "user", "assistant", "user"]
    assert contents[1:] == ["two", "Second answer.", "three"]


async def test_reasoning_is_thinking_never_speech(
    hass: HomeAssistant, fake_hearth: FakeHearth, fake_entry: MockConfigEntry
) -> None:
    """The server's reasoning_content reaches Home Assistant as thinking content: kept in the
    chat log and streamed as thinking, never part of the spoken answer."""
    def reasoning_then_answer(body: dict[str, Any]) -> list[dict[str, Any]]:
        thoughts = [{"choices": [{"index": 0, "delta": {"reasoning_content": piece}}]}
                    for piece in ("The user wants ", "the weather.")]
        return [*thoughts, *text_chunks("It is sunny.")]

    fake_hearth.chat_handler = reasoning_then_answer
    agent_id = entity_of(hass, fake_entry, "conversation")
    result, deltas, answer = await _pipeline_turn(hass, agent_id, "How is the weather?")

    assert result.response.speech["plain"]["speech"] == "It is sunny."
    assert isinstance(answer, conversation.AssistantContent)
    assert answer.content == "It is sunny."
    assert answer.thinking_content == "The user wants the weather."
    thinking = "".join(d.get("thinking_content") or "" for d in deltas)
    spoken = "".join(d.get("content") or "" for d in deltas)
    assert thinking == "The user wants the weather."
    assert "weather" not in spoken
