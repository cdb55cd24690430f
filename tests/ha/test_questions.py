"""A question about the home is answered, never acted on (custom_components.hearth.questions):
the agent refuses a call of an intent that changes something when the user only asked."""

from __future__ import annotations

from typing import Any

import pytest
from homeassistant.const import STATE_OFF, STATE_ON
from homeassistant.core import HomeAssistant
from homeassistant.helpers import llm

from custom_components.hearth.call_hint import example_question
from custom_components.hearth.questions import ANSWER_NOW, REFUSED, changes_home, is_plain_question

from .conftest import (
    FakeHearth,
    call_chunks,
    text_chunks,
    turn_on_tool,
)
from .test_described_call import converse
from .test_tool_loop import kitchen_light  # noqa: F401 - a fixture

pytestmark = pytest.mark.ha


@pytest.mark.parametrize(("text", "plain"), [
    ("Is the porch light on?", True),
    ("Which lights are on right now?", True),
    ("what's the temperature in the living room", True),  # no mark: speech often has none
    ("So, are any lights on in the kitchen?", True),
    ("What can you do for me?", True),
    ("Is it warm? Is it dark?", True),
    ("Turn on the kitchen light.", False),
    ("Could you turn on the living room lamp?", False),  # a request phrased as a question
    ("Would you mind the lights?", False),
    ("Do you mind switching the fan off?", False),
    ("Is the porch light on? If so, turn it off.", False),
    ("Is the porch light on, and turn it off", False),
    ("It is too dark in the kitchen.", False),
    ("How do I make the lamp brighter?", False),  # an action named: the model may act
    ("Tell me a joke about lamps.", False),
    ("", False),
])
def test_plain_questions(text: str, plain: bool) -> None:
    assert is_plain_question(text) is plain


class _Tool:
    def __init__(self, name: str, read_only: bool | None = None) -> None:
        self.name = name
        if read_only is not None:
            self.annotations = llm.ToolAnnotations(read_only=read_only)  # type: ignore[attr-defined]


@pytest.mark.parametrize(("name", "changes"), [
    ("intent__HassTurnOff", True),
    ("HassTurnOn", True),  # 2026.2 names it without a prefix
    ("light__HassLightSet", True),
    ("assist__HassSetPosition", True),
    ("intent__HassGetState", False),
    ("HassTimerStatus", False),
    ("HassClimateGetTemperature", False),
    ("homeassistant__GetLiveContext", False),
    ("GetDateTime", False),
    ("script__wake_up", False),  # a script may do anything; questions do not call them
])
def test_tools_that_change_the_home(name: str, changes: bool) -> None:
    assert changes_home(_Tool(name)) is changes


def test_a_tool_home_assistant_marks_read_only_never_changes_it() -> None:
    if not hasattr(llm, "ToolAnnotations"):
        pytest.skip("tool annotations came with Home Assistant 2026.10")
    assert not changes_home(_Tool("intent__HassTurnOff", read_only=True))
    assert changes_home(_Tool("intent__HassTurnOff", read_only=False))


def _live_context(body: dict[str, Any]) -> str:
    return next(t["function"]["name"] for t in body["tools"]
                if t["function"]["name"].endswith("GetLiveContext"))


def _act_then_answer(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The 1.5B's mistake: having read the home, act on what was only asked about; told
    nothing was done, answer in words."""
    if sum(m["role"] == "tool" for m in body["messages"]) < 2:
        return call_chunks((turn_on_tool(body), {"name": "Kitchen light"}))
    return text_chunks("The kitchen light is off.")


async def test_a_question_is_answered_not_acted_on(
    hass: HomeAssistant, fake_hearth: FakeHearth, kitchen_light: str,  # noqa: F811
) -> None:
    """The agent's read runs, the model's action does not: the model reads why as the call's
    result, with the rest of the turn's messages as they were (the server's cache serves
    them), and its words are the answer."""
    said = await converse(hass, fake_hearth, _act_then_answer, "Is the kitchen light on?")
    assert hass.states.get(kitchen_light).state == STATE_OFF
    assert said == "The kitchen light is off."
    bodies = [body for _, body in fake_hearth.chat_requests]
    assert len(bodies) == 2
    ask_now = {"role": "user", "content": ANSWER_NOW + "Is the kitchen light on?"}
    assert [b["messages"][-1] for b in bodies] == [ask_now, ask_now]
    assert bodies[1]["messages"].count(ask_now) == 1  # in the request, never the chat log
    sent, last = bodies[0]["messages"][:-1], bodies[1]["messages"][:-1]
    assert sent == last[: len(sent)]  # the turn so far, as cached: only the nudge moves
    assert REFUSED in last[-1]["content"]
    assert last[-2]["tool_calls"][0]["function"]["name"] == turn_on_tool(bodies[0])
    assert REFUSED not in sent[-1]["content"]  # the read's result is its own
    assert "Kitchen light" in sent[-1]["content"]


async def test_a_request_phrased_as_a_question_acts(
    hass: HomeAssistant, fake_hearth: FakeHearth, kitchen_light: str,  # noqa: F811
) -> None:
    """Nothing read first, nothing refused, no question asked again."""
    await converse(hass, fake_hearth, _act_then_answer, "Could you turn on the kitchen light?")
    assert hass.states.get(kitchen_light).state == STATE_ON
    assert not any(m["role"] == "tool" for m in fake_hearth.chat_requests[0][1]["messages"])
    assert all(ANSWER_NOW not in str(body) for _, body in fake_hearth.chat_requests)


async def test_only_the_action_of_a_round_is_refused(
    hass: HomeAssistant, fake_hearth: FakeHearth, kitchen_light: str,  # noqa: F811
) -> None:
    """A round that reads and acts at once (a question naming nothing of the home, so the
    agent did not read first): the read answers as always, the action is refused, and the
    model answers from both."""

    def handler(body: dict[str, Any]) -> list[dict[str, Any]]:
        if any(m["role"] == "tool" for m in body["messages"]):
            return text_chunks("It is off.")
        return call_chunks((_live_context(body), {}),
                           (turn_on_tool(body), {"name": "Kitchen light"}))

    said = await converse(hass, fake_hearth, handler, "Is it on?")
    assert hass.states.get(kitchen_light).state == STATE_OFF
    assert said == "It is off."
    results = [m for m in fake_hearth.chat_requests[-1][1]["messages"] if m["role"] == "tool"]
    assert len(results) == 2
    assert sum(REFUSED in m["content"] for m in results) == 1
    assert "Kitchen light" in next(m["content"] for m in results if REFUSED not in m["content"])


@pytest.mark.parametrize(("reads", "said"), [
    (1, "The kitchen light is off."),  # read again once: then asked for its answer
    (2, "The model used its tools but gave no answer."),  # again and again: the turn ends
])
async def test_reading_again_once_is_answered(
    hass: HomeAssistant, fake_hearth: FakeHearth, kitchen_light: str,  # noqa: F811
    reads: int, said: str,
) -> None:
    """A round that only reads what the turn already read is run and the model asked once
    more; a second such round ends the turn, as a repeated action's first does."""

    def handler(body: dict[str, Any]) -> list[dict[str, Any]]:
        if sum(m["role"] == "tool" for m in body["messages"]) <= reads:
            return call_chunks((_live_context(body), {}))
        return text_chunks("The kitchen light is off.")

    assert await converse(hass, fake_hearth, handler, "Is the kitchen light on?") == said
    assert len(fake_hearth.chat_requests) == reads + (reads < 2)


async def test_an_action_asked_again_after_its_refusal_ends_the_turn(
    hass: HomeAssistant, fake_hearth: FakeHearth, kitchen_light: str,  # noqa: F811
) -> None:
    """A model that insists on acting on a question: refused each time, the turn ends after
    the repeated round, saying no answer came (not the refusal, which is the agent's words to
    the model)."""

    def handler(body: dict[str, Any]) -> list[dict[str, Any]]:
        return call_chunks((turn_on_tool(body), {"name": "Kitchen light"}))

    said = await converse(hass, fake_hearth, handler, "Is the kitchen light on?")
    assert hass.states.get(kitchen_light).state == STATE_OFF
    assert len(fake_hearth.chat_requests) == 2
    assert said == "The model used its tools but gave no answer."


@pytest.mark.parametrize(("text", "reads_first"), [
    ("Is the kitchen light on?", True),  # its name
    ("Are any lights on?", True),  # its domain, plural
    ("What can you do for me?", False),  # nothing of the home
    ("Turn on the kitchen light.", False),  # not a question
])
async def test_a_question_about_the_home_reads_it_first(
    hass: HomeAssistant, fake_hearth: FakeHearth, kitchen_light: str,  # noqa: F811
    text: str, reads_first: bool,
) -> None:
    """A model that would answer from nothing ("Yes, it is on."): asked about the home, the
    agent reads the whole live context before the model answers, and asks the question again
    after it; the model answers from what was read."""

    def handler(body: dict[str, Any]) -> list[dict[str, Any]]:
        if results := [m for m in body["messages"] if m["role"] == "tool"]:
            return text_chunks("It is off." if "'off'" in results[-1]["content"] else "It is on.")
        return text_chunks("Yes, it is on.")

    said = await converse(hass, fake_hearth, handler, text)
    (_, body), = fake_hearth.chat_requests
    assert body["tool_choice"] == "auto"
    if reads_first:
        call, result, again = body["messages"][-3:]
        assert call["tool_calls"][0]["function"] == {
            "name": _live_context(body), "arguments": "{}"}  # whole: no filter to get wrong
        assert result["role"] == "tool" and "Kitchen light" in result["content"]
        assert again == {"role": "user", "content": ANSWER_NOW + text}
        assert said == "It is off."
    else:
        assert body["messages"][-1] == {"role": "user", "content": text}
        assert said == "Yes, it is on."


def test_the_examples_question_is_an_echo() -> None:
    """The guidance's example question, repeated as an answer to another, says nothing."""
    exposed = {"light.porch": {"names": "Porch light"}, "light.kitchen": {"names": "Kitchen light"},
               "sensor.t": {"names": "Attic temperature"}}
    assert example_question(exposed) == "is the kitchen light on?"
    assert example_question({"sensor.t": {"names": "Attic temperature"}}) is None
