"""An answer that describes a tool call instead of making it: held back sentence by sentence,
then asked again with a call of the tool it named (custom_components.hearth.described_call)."""

from __future__ import annotations

from typing import Any

import pytest
from homeassistant.components import conversation
from homeassistant.const import STATE_OFF, STATE_ON
from homeassistant.core import Context, HomeAssistant

from custom_components.hearth.described_call import HeldSentences, Rescue, named_tool

from .conftest import (
    FakeHearth,
    async_setup_hearth,
    entity_of,
    text_chunks,
    tool_call_script,
    turn_on_tool,
)
from .test_tool_loop import TWO_TURNS, kitchen_light  # noqa: F401 - a fixture

pytestmark = pytest.mark.ha

OFFERED = {"intent__HassTurnOn", "homeassistant__GetLiveContext", "search"}


def _held(echoes: tuple[str, ...] = ()) -> HeldSentences:
    async def never(tool_choice: str) -> Any:
        raise AssertionError("not asked here")
        yield

    return HeldSentences(Rescue(OFFERED, never, echoes))


@pytest.mark.parametrize(("text", "named"), [
    ("Use the `intent__HassTurnOn` function.", "intent__HassTurnOn"),
    ("I would call HassTurnOn with the kitchen light.", "intent__HassTurnOn"),
    ("Let me check with GetLiveContext.", "homeassistant__GetLiveContext"),
    ("The kitchen light is on.", None),
    ("I can search the web for that.", None),  # a lower-case short name is a plain word
    ("HassTurnOnly is no tool.", None),
    ("Call assist__HassTurnOn.", "intent__HassTurnOn"),  # another prefix: the same tool
    ('{"name": "intent__HassGetLiveContext"}', "homeassistant__GetLiveContext"),  # run into
    ("Call getLiveContext.", None),
])
def test_named_tool(text: str, named: str | None) -> None:
    assert named_tool(text, OFFERED) == named


def test_sentences_pass_until_one_names_a_tool() -> None:
    held = _held()
    pieces = ["The kitchen ", "light is off. ", "To turn it on, use ", "the `intent__HassTurnOn",
              "` function. It turns ", "it on."]
    shown = "".join(held.feed(p) for p in pieces) + held.finish()
    assert shown == "The kitchen light is off. "
    assert held.named == "intent__HassTurnOn"
    assert held.held == "To turn it on, use the `intent__HassTurnOn` function. It turns it on."


def test_the_last_sentence_is_checked_at_the_end() -> None:
    held = _held()
    assert held.feed("Set it to 2.5 percent with intent__HassTurnOn") == ""
    assert held.finish() == ""
    assert held.named == "intent__HassTurnOn"
    plain = _held()
    assert plain.feed("It is 2.5 degrees") + plain.finish() == "It is 2.5 degrees"
    assert plain.named is None


def test_a_long_sentence_is_let_through_up_to_its_last_word() -> None:
    held = _held()
    words = ["word"] * 60
    shown = held.feed(" ".join(words))
    assert shown and len(shown) < len(" ".join(words)) and shown.endswith("word ")
    assert shown + held.finish() == " ".join(words)
    assert held.named is None


def test_an_echo_is_held_and_asks_again_only_when_nothing_else_was_said() -> None:
    held = _held(("Is the kitchen light on?", "To act, answer with the tool call alone."))
    assert held.feed("Is the kitchen light on? ") + held.finish() == ""
    assert held.retry == "auto" and held.held == "Is the kitchen light on? "
    mixed = _held(("Is the kitchen light on?",))
    said = mixed.feed("is the kitchen light ON?\nThe kitchen light is off.") + mixed.finish()
    assert said == "The kitchen light is off."
    assert mixed.retry is None
    tags = _held()
    assert tags.feed("<tools></tools>\n") + tags.finish() == ""
    assert tags.retry == "auto"
    described = _held()
    described.feed("Use HassTurnOn. ")
    assert described.retry == {"type": "function", "function": {"name": "intent__HassTurnOn"}}


def _describing(then_call: bool) -> Any:
    """A model that describes the call in words when free to answer, and makes it (or, with
    ``then_call`` false, describes it again) when a call of that tool is required."""

    def handler(body: dict[str, Any]) -> list[dict[str, Any]]:
        if body["messages"][-1]["role"] == "tool" or (
                then_call and body["tool_choice"] != "auto"):
            return tool_call_script(body)
        return text_chunks(f"Sure. To turn on the kitchen light, use the `{turn_on_tool(body)}` "
                           "function with the name Kitchen light.")

    return handler


async def converse(hass: HomeAssistant, fake_hearth: FakeHearth, handler: Any,
                    text: str = "Turn it on then.") -> str:
    """One turn of an agent that asks the model again after its tools ran: its speech (also
    test_questions')."""
    entry = await async_setup_hearth(hass, fake_hearth.url, conversation=TWO_TURNS)
    fake_hearth.chat_handler = handler
    result = await conversation.async_converse(
        hass, text, None, Context(), agent_id=entity_of(hass, entry, "conversation"))
    speech: str = result.response.speech["plain"]["speech"]
    return speech


async def test_a_described_call_is_made_after_all(
    hass: HomeAssistant, fake_hearth: FakeHearth, kitchen_light: str,  # noqa: F811
) -> None:
    """The description is neither said nor kept; the second ask, with the same messages and a
    call of the named tool required, turns the light on, and the turn goes on as for any
    call."""
    said = await converse(hass, fake_hearth, _describing(then_call=True))
    assert hass.states.get(kitchen_light).state == STATE_ON
    bodies = [body for _, body in fake_hearth.chat_requests]
    tool = turn_on_tool(bodies[0])
    assert [b["tool_choice"] for b in bodies] == [
        "auto", {"type": "function", "function": {"name": tool}}, "auto"]
    assert bodies[1]["messages"] == bodies[0]["messages"]  # the same prompt: its cache serves
    assert said == "The kitchen light is on."
    assistant = [m for m in bodies[2]["messages"] if m["role"] == "assistant"]
    assert assistant[-1]["content"] in ("", None, "Sure. ")
    assert not any("HassTurnOn" in (m.get("content") or "") for m in assistant)


async def test_a_description_without_a_call_is_said(
    hass: HomeAssistant, fake_hearth: FakeHearth, kitchen_light: str,  # noqa: F811
) -> None:
    """When the second ask brings no call either, the held text is the answer, whole."""
    said = await converse(hass, fake_hearth, _describing(then_call=False))
    assert hass.states.get(kitchen_light).state == STATE_OFF
    tool = turn_on_tool(fake_hearth.chat_requests[0][1])
    assert [b["tool_choice"] for _, b in fake_hearth.chat_requests] == [
        "auto", {"type": "function", "function": {"name": tool}}]
    assert said == (f"Sure. To turn on the kitchen light, use the `{tool}` function with the "
                    "name Kitchen light.")


async def test_only_a_turns_first_answer_is_asked_again(
    hass: HomeAssistant, fake_hearth: FakeHearth, kitchen_light: str,  # noqa: F811
) -> None:
    """An answer after tool results that names a tool is said as it is: it follows what the
    tools did, and a call asked for there could only repeat one."""

    def handler(body: dict[str, Any]) -> list[dict[str, Any]]:
        if body["messages"][-1]["role"] == "tool":
            return text_chunks(f"Done with {turn_on_tool(body)}.")
        return tool_call_script(body)

    said = await converse(hass, fake_hearth, handler)
    assert hass.states.get(kitchen_light).state == STATE_ON
    assert [b["tool_choice"] for _, b in fake_hearth.chat_requests] == ["auto", "auto"]
    assert said.startswith("Done with ")


async def test_an_answer_naming_no_tool_is_asked_once(
    hass: HomeAssistant, fake_hearth: FakeHearth, kitchen_light: str,  # noqa: F811
) -> None:
    said = await converse(hass, fake_hearth,
                           lambda body: text_chunks("The kitchen light is off. Shall I?"),
                           "Is the kitchen light on?")
    assert len(fake_hearth.chat_requests) == 1
    assert said == "The kitchen light is off. Shall I?"


async def test_an_answer_repeating_the_question_is_asked_again(
    hass: HomeAssistant, fake_hearth: FakeHearth, kitchen_light: str,  # noqa: F811
) -> None:
    """An answer that only repeats the user's question is not said; asked again as it was, the
    model's second answer is."""
    answers = iter(["What can you do?", "I can turn lights on and off."])
    said = await converse(hass, fake_hearth, lambda body: text_chunks(next(answers)),
                           "What can you do?")
    assert said == "I can turn lights on and off."
    bodies = [b for _, b in fake_hearth.chat_requests]
    assert [b["tool_choice"] for b in bodies] == ["auto", "auto"]
    assert bodies[1]["messages"] == bodies[0]["messages"]


async def test_an_empty_answer_is_asked_again(
    hass: HomeAssistant, fake_hearth: FakeHearth, kitchen_light: str,  # noqa: F811
) -> None:
    """An answer with neither words nor a call (a made-up tool result the server cut) is asked
    again as it was; the call the second ask makes runs."""
    answers = iter([text_chunks("")])
    said = await converse(hass, fake_hearth,
                           lambda body: next(answers, None) or tool_call_script(body))
    assert hass.states.get(kitchen_light).state == STATE_ON
    bodies = [b for _, b in fake_hearth.chat_requests]
    assert [b["tool_choice"] for b in bodies] == ["auto", "auto", "auto"]
    assert bodies[1]["messages"] == bodies[0]["messages"]
    assert said == "The kitchen light is on."
