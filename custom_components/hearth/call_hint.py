"""The guidance after the system prompt of an agent offered Assist's intent tools: a few
sentences, and example calls built from the home's own tools and its first light. Measured with
direct requests to the server on the demo's prompt and with ``make bench-commands
MODEL=qwen1.5b`` (README, issue 30)."""

from __future__ import annotations

import json
import re
from typing import Any

from homeassistant.helpers import llm

from .compat import listed
from .intent_tools import intent_tools, offered_tool

# Small models answered follow-ups ("and the porch light too", "turn it back on") by copying
# the last turn's "Turned on the light" without a call, and explained calls in prose. With
# the first sentence the 1.5B made the follow-up call 7 of 12 times, without it 3 of 12.
FOLLOW_UPS = (
    "Each request to control a device needs its own tool call in that turn, also when it "
    'follows an earlier one ("and the porch light too", "turn it back on"): never say a '
    "device was changed without calling the tool."
)
ACT_ALONE = "To act, answer with the tool call alone, not with an explanation of it."
# Said in words only, where the home has no light or the tools no HassTurnOff to show it with.
ALL_IN_WORDS = (
    "For all the lights, or everything, call the tool once with their domain alone, without "
    "a name or area."
)
QUESTION_IN_WORDS = "A question about a device changes nothing."
# Home Assistant's prompt asks the model to ask for an area when told "all the lights"; the
# guidance below says what to call instead, and the two together left the 1.5B naming one
# light. 2026.2 writes "ask user", later releases "ask the user".
_ASK_FOR_AREA = re.compile(
    r"When a user asks to turn on all devices of a specific type, ask (?:the )?user to "
    r"specify an area, unless there is only one device of that type\.\n?"
)


def _example(tool: str, args: dict[str, Any]) -> str:
    return json.dumps({"name": tool, "arguments": args}, ensure_ascii=False)


def _first_light(exposed: dict[str, dict[str, Any]]) -> str | None:
    """The exposed light whose name sorts first: the one device the examples name."""
    names = [n for entity_id, info in exposed.items() if entity_id.startswith("light.")
             for n in listed(info, "names")[:1]]
    return min(names, key=str.casefold, default=None)


def call_examples(llm_api: llm.APIInstance, exposed: dict[str, dict[str, Any]]) -> str:
    """One device by name, its brightness, all the lights by their domain alone, a question
    answered by reading the home: each as a call of the tools offered, on one of the home's
    lights.

    Told in words, the 1.5B named one light in 9 of 24 calls for "all the lights" or
    "everything"; shown these calls, in none of 9, and no question of 6 changed anything
    where 3 of 8 did (the demo's prompt, temperature 0.7; README). One example alone, for all
    the lights, was copied: "turn on the kitchen light" and "is the kitchen light on?" then
    turned on every light.
    Without the brightness example, "set … to 60%" became HassTurnOn more often, and its
    tool's name took the on/off examples' prefix (``intent__HassLightSet``)."""
    off, light = offered_tool(llm_api, "HassTurnOff"), _first_light(exposed)
    if off is None or light is None:
        return f"{ALL_IN_WORDS} {QUESTION_IN_WORDS}"
    said = light.casefold()
    text = f'For one device, name it: "turn off the {said}" is ' + _example(
        off, {"name": light, "domain": ["light"]})
    if (dim := offered_tool(llm_api, "HassLightSet")) is not None:
        text += f', and "set the {said} to 50%" is ' + _example(
            dim, {"name": light, "brightness": 50})
    text += ('. For all the lights, or everything, give their domain alone, without a name or '
             'area: "turn off all the lights" is ' + _example(off, {"domain": ["light"]}) + ".")
    if (live := offered_tool(llm_api, "GetLiveContext")) is None:
        return f"{text} {QUESTION_IN_WORDS}"
    return f'{text} A question changes nothing: "{example_question(exposed)}" is ' + (
        f"{_example(live, {})}.")


def example_question(exposed: dict[str, dict[str, Any]]) -> str | None:
    """The question the examples show answered by reading the home, on the first light: an
    answer that only repeats it says nothing (the 1.5B, asked "are any lights on in the
    kitchen?", answered "Is the kitchen light on?")."""
    light = _first_light(exposed)
    return None if light is None else f"is the {light.casefold()} on?"


def call_hint(llm_api: llm.APIInstance, exposed: dict[str, dict[str, Any]]) -> str:
    """The sentences that follow the system prompt of an agent offered intent tools."""
    return f"{FOLLOW_UPS} {call_examples(llm_api, exposed)} {ACT_ALONE}"


def with_call_hint(message: dict[str, Any], llm_api: llm.APIInstance | None,
                   exposed: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The system ``message`` with :func:`call_hint` after it when the model is offered intent
    tools, and without Home Assistant's sentence asking for an area. A turn and its warm-up
    both go through here with the same exposed entities: the prompt they share must match."""
    if message.get("role") != "system" or llm_api is None or not intent_tools(llm_api):
        return message
    content = _ASK_FOR_AREA.sub("", str(message.get("content") or ""))
    return {**message, "content": f"{content}\n{call_hint(llm_api, exposed)}"}
