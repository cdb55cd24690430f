"""The history a turn sends: every tool call right before its result, also the calls Home
Assistant's local intents made in the same conversation; no orphans either way; no sentence
that only confirmed a done action."""

from __future__ import annotations

from typing import Any

import pytest
from homeassistant.components import conversation
from homeassistant.components.homeassistant.exposed_entities import async_expose_entity
from homeassistant.const import CONF_LLM_HASS_API, STATE_ON
from homeassistant.core import Context, HomeAssistant
from homeassistant.setup import async_setup_component
from pytest_homeassistant_custom_component.common import MockConfigEntry, MockUser

from custom_components.hearth.const import CONF_CONFIRM_ACTIONS
from custom_components.hearth.messages import offered_call_names, paired_tool_messages

from .conftest import (
    CONVERSATION_OPTIONS,
    FakeHearth,
    async_setup_hearth,
    entity_of,
    text_chunks,
    tool_call_script,
    turn_on_tool,
)

pytestmark = pytest.mark.ha


def assert_paired(messages: list[dict[str, Any]]) -> None:
    """Each tool message answers a call of the assistant message before its run of tool
    messages, and each call is answered there."""
    calls: set[str] = set()
    for message in messages:
        if message["role"] == "tool":
            assert message["tool_call_id"] in calls, messages
            calls.discard(message["tool_call_id"])
            continue
        assert not calls, f"unanswered calls {calls}: {messages}"
        calls = {call["id"] for call in message.get("tool_calls") or ()}
    assert not calls, messages


async def test_local_intent_call_sent_with_its_result(
    hass: HomeAssistant,
    fake_hearth: FakeHearth,
    fake_entry: MockConfigEntry,
    hass_admin_user: MockUser,
) -> None:
    """A command Home Assistant's own intents handled, then a turn to the Hearth agent in the
    same conversation: the model sees the local call and its result as a pair."""
    assert await async_setup_component(hass, "intent", {})
    assert await async_setup_component(
        hass, "input_boolean", {"input_boolean": {"kitchen_light": {"name": "Kitchen light"}}}
    )
    await hass.async_block_till_done()
    async_expose_entity(hass, "conversation", "input_boolean.kitchen_light", True)
    context = Context(user_id=hass_admin_user.id)

    local = await conversation.async_converse(
        hass, "turn on the kitchen light", None, context,
        agent_id=conversation.HOME_ASSISTANT_AGENT,
    )
    assert hass.states.get("input_boolean.kitchen_light").state == STATE_ON
    assert fake_hearth.chat_requests == []

    fake_hearth.chat_handler = lambda body: text_chunks("It is on.")
    await conversation.async_converse(
        hass, "Is it on now?", local.conversation_id, context,
        agent_id=entity_of(hass, fake_entry, "conversation"),
    )
    body = fake_hearth.chat_requests[-1][1]
    messages = body["messages"]
    assert_paired(messages)
    [local_call] = [
        call for message in messages for call in message.get("tool_calls") or ()
    ]
    # named as the tool the model is offered (intent__HassTurnOn where the release namespaces
    # it), not only as the intent Home Assistant ran
    assert local_call["function"]["name"] == turn_on_tool(body)
    index = next(i for i, m in enumerate(messages) if m.get("tool_calls"))
    assert messages[index + 1]["role"] == "tool"
    assert messages[index + 1]["tool_call_id"] == local_call["id"]
    # Home Assistant's "Turned on" is not sent: the call and its result say it (see below)
    assert messages[index + 2:] == [{"role": "user", "content": "Is it on now?"}]


@pytest.mark.parametrize(("confirm", "target", "kept"), [
    (True, "Kitchen light", False),  # Home Assistant's own confirmation ended the turn
    (False, "Kitchen light", False),  # the model's sentence about a done action
    (False, "Garage door", True),  # the model's answer to a failure stays
])
async def test_a_follow_up_sees_the_last_command_answered_by_its_call(
    hass: HomeAssistant,
    fake_hearth: FakeHearth,
    hass_admin_user: MockUser,
    confirm: bool,
    target: str,
    kept: bool,
) -> None:
    """A command, then a follow-up in the same conversation: the follow-up's history ends with
    the command's call and result, without the sentence that confirmed it. The 1.5B copied
    that sentence ("Turned on the porch light.") instead of calling the tool (issue 30)."""
    assert await async_setup_component(hass, "intent", {})
    assert await async_setup_component(
        hass, "input_boolean", {"input_boolean": {"kitchen_light": {"name": "Kitchen light"}}}
    )
    await hass.async_block_till_done()
    async_expose_entity(hass, "conversation", "input_boolean.kitchen_light", True)
    entry = await async_setup_hearth(hass, fake_hearth.url, conversation={
        **CONVERSATION_OPTIONS, CONF_LLM_HASS_API: ["assist"], CONF_CONFIRM_ACTIONS: confirm})
    agent_id, context = entity_of(hass, entry, "conversation"), Context(user_id=hass_admin_user.id)
    fake_hearth.chat_handler = lambda body: tool_call_script(body, {"name": target})
    first = await conversation.async_converse(
        hass, "Turn on the kitchen light", None, context, agent_id=agent_id)
    assert first.response.speech["plain"]["speech"]  # something was said, by someone

    await conversation.async_converse(
        hass, "And again.", first.conversation_id, context, agent_id=agent_id)
    _, body = next(r for r in fake_hearth.chat_requests if r[1]["messages"][-1]["content"]
                   == "And again.")
    messages = body["messages"]
    assert_paired(messages)
    index = next(i for i, m in enumerate(messages) if m.get("tool_calls"))
    assert messages[index + 1]["role"] == "tool"
    after = [m["role"] for m in messages[index + 2:]]
    assert after == (["assistant", "user"] if kept else ["user"]), messages


def test_orphans_are_left_out() -> None:
    """A call without its result (a turn that ended in an error) and a result without its
    call are dropped; a pair, and the text around, stay."""
    pair_call = {"id": "a", "type": "function", "function": {"name": "T", "arguments": "{}"}}
    lost_call = {**pair_call, "id": "b"}
    messages = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "u1"},
        {"role": "assistant", "content": "", "tool_calls": [pair_call, lost_call]},
        {"role": "tool", "tool_call_id": "a", "content": "{}"},
        {"role": "assistant", "content": "done"},
        {"role": "user", "content": "u2"},
        {"role": "tool", "tool_call_id": "x", "content": "{}"},
        {"role": "assistant", "content": "", "tool_calls": [lost_call]},
        {"role": "assistant", "content": "Error: boom"},
        {"role": "user", "content": "u3"},
    ]
    paired = paired_tool_messages(messages)
    assert_paired(paired)
    assert paired == [
        messages[0],
        messages[1],
        {"role": "assistant", "content": "", "tool_calls": [pair_call]},
        messages[3],
        messages[4],
        messages[5],
        messages[8],
        messages[9],
    ]


def test_calls_are_named_as_the_offered_tools() -> None:
    """A call is renamed only to the one offered tool of its name; one already offered, one
    that fits none or two offered tools, stays."""
    def call(name: str) -> dict[str, Any]:
        return {"id": name, "type": "function", "function": {"name": name, "arguments": "{}"}}

    history = [{"role": "assistant", "content": "",
                "tool_calls": [call("HassTurnOn"), call("HassTurnOff"), call("GetLiveContext"),
                               call("Unknown")]}]
    offered = {"intent__HassTurnOn", "intent__HassTurnOff", "shadow__HassTurnOff",
               "GetLiveContext"}
    [renamed] = offered_call_names(history, offered)
    assert [c["function"]["name"] for c in renamed["tool_calls"]] == [
        "intent__HassTurnOn", "HassTurnOff", "GetLiveContext", "Unknown"]
    assert history[0]["tool_calls"][0]["function"]["name"] == "HassTurnOn"  # a copy
