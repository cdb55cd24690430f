"""A question about the home is answered from what is read, never acted on.

Asked "Is the porch light on?", the 1.5B read the home and then turned the light off, in 2 of
4 benchmark runs (issue 30): it had seen commands answered by calls, and a question that names a
device looks like one. Home Assistant runs whatever the model calls, so the agent refuses such a
call itself: the model is told, as the call's result, that nothing was changed because the user
asked a question, and answers in words next. Asked about the home without reading it first, the
same model made answers up ("72 degrees Fahrenheit", "Yes, the kitchen light is on" of a light
that was off), so for a question that names something of the home the agent reads the whole
live context itself before the model answers (asked to call it, the model filtered it by the
wrong domain: "light" for a temperature), and every answer after tools ran is asked with the
question again (:data:`ANSWER_NOW`).

Only a plain question counts: every sentence of the request opens with a question word ("is",
"which", "what's"...) and none names an action ("turn", "set", "open"...). "Could you turn on
the lamp?" is a request and "Is the porch light on? If so turn it off." asks for an action:
neither is guarded. Only Assist's intents that change something are refused (``HassTurnOff``,
``HassLightSet``...); the ones that read (``HassGetState``, ``HassTimerStatus``), the live
context and any other API's tools run as asked.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from homeassistant.core import HomeAssistant
from homeassistant.helpers import llm

from .compat import exposed_kinds, exposed_names
from .intent_tools import offered_tool

# What a plain question opens with, after a filler word or two ("so, is ...", "hey, which ...").
_OPENING = re.compile(
    r"^(?:(?:hey|so|ok|okay|and|but|well|um|uh|now|then)\b[\s,]*)*"
    r"(?:is|isn't|are|aren't|was|wasn't|were|which|what|what's|whats|where|where's|who|"
    r"who's|when|how|how's|does|doesn't|do|don't|did|didn't|has|have)\b",
    re.IGNORECASE,
)
# Words that ask for an action: a request phrased as a question ("do you mind turning on..."),
# or a question with a command beside it, is not a plain question.
_ACTION = re.compile(
    r"\b(?:turn|turning|switch|switching|set|setting|dim|brighten|open|opening|close|closing|"
    r"lock|unlock|start|stop|pause|play|resume|toggle|raise|lower|increase|decrease|activate|"
    r"run|change|put|make|cancel|add|remove|mute|unmute|arm|disarm|mind)\b",
    re.IGNORECASE,
)
_SENTENCE = re.compile(r"[^.!?]+[.!?]*")
# Tools that only read, by name: Assist's (``HassGetState``, ``HassTimerStatus``), the live
# context (``GetLiveContext``) and the date (``GetDateTime``).
_READS = re.compile(r"Get|Status|LastItems")
_NO_EFFECT = frozenset({"HassNevermind", "HassRespond"})
NOT_DONE = "NotDone"  # the error a refused call's result carries

REFUSED = (
    "Nothing was done: the user asked a question and did not ask to change anything. "
    "Answer the question in words, from what you have read."
)


def is_plain_question(text: str) -> bool:
    """Whether ``text`` only asks about something: every sentence opens with a question word
    and none asks for an action."""
    sentences = [s.strip() for s in _SENTENCE.findall(text) if s.strip(" \t\n,;")]
    return bool(sentences) and not _ACTION.search(text) and all(
        _OPENING.match(s) for s in sentences
    )


_WORD = re.compile(r"[^\W\d_]{3,}")
_NOT_NAMES = frozenset({"the", "and", "for", "with", "all", "any", "main"})


def home_words(names: Iterable[str]) -> frozenset[str]:
    """The words that name something of the home: those of the exposed entities' names and
    areas, their domains and device classes (``light``, ``temperature``), lower case."""
    return frozenset(
        word for name in names for word in _WORD.findall(name.replace("_", " ").casefold())
    ) - _NOT_NAMES


def asks_about_home(text: str, words: frozenset[str]) -> bool:
    """Whether ``text`` names something of the home (a word of ``words``, or its plural): a
    question about it is answered from the live context, read first."""
    return any(word in words or word.removesuffix("s") in words
               for word in _WORD.findall(text.casefold()))


def reads(tool: Any) -> bool:
    """Whether an LLM tool only reads: Home Assistant marks it read-only (annotations, since
    2026.10) or its name says so, under any prefix (``homeassistant__GetLiveContext``)."""
    annotations = getattr(tool, "annotations", None)
    return bool(getattr(annotations, "read_only", False)
                or _READS.search(str(tool.name).rpartition("__")[2]))


def changes_home(tool: Any) -> bool:
    """Whether an LLM tool is one of Assist's intents that changes something (under any
    prefix: ``intent__HassTurnOff``, ``light__HassLightSet``)."""
    name = str(tool.name).rpartition("__")[2]
    return name.startswith("Hass") and name not in _NO_EFFECT and not reads(tool)


def refusal() -> dict[str, Any]:
    """The result a refused call gets, worded as Home Assistant words a tool's error."""
    return {"error": NOT_DONE, "error_text": REFUSED}


# Appended (to the request only) after the tools ran for a plain question: shown the live
# context, the 1.5B answered a question with a question ("Is the kitchen light on?"), read out
# the context or acted; asked this after it, it answered right in 33 of 36 replays of three
# such turns and called nothing (21 of 36 and 5 actions without; temperature 0.7).
ANSWER_NOW = "Answer my question in one sentence from what you read: "


@dataclass(frozen=True)
class QuestionTurn:
    """What a turn does for the user's request: nothing unless it is a plain question."""

    reading: frozenset[str] = frozenset()  # the tools that only read (any turn)
    refuse: frozenset[str] = frozenset()  # the calls not run for it
    read_first: str | None = None  # the live context's tool, read before the model answers
    asked: str = ""  # the question, asked again after the tools ran

    @classmethod
    def of(cls, hass: HomeAssistant, llm_api: llm.APIInstance | None,
           exposed: dict[str, dict[str, Any]], asked: str) -> QuestionTurn:
        tools = llm_api.tools if llm_api else []
        reading = frozenset(tool.name for tool in tools if reads(tool))
        if llm_api is None or not is_plain_question(asked):
            return cls(reading)
        return cls(reading, frozenset(tool.name for tool in tools if changes_home(tool)),
                   _live_context(hass, llm_api, exposed, asked), asked)

    def request(self, body: dict[str, Any], after_tools: bool) -> dict[str, Any]:
        """``body`` (with the turn's messages) as it is sent, ``after_tools`` ran."""
        if not (self.asked and after_tools):
            return body
        return {**body, "messages": [
            *body["messages"], {"role": "user", "content": ANSWER_NOW + self.asked}]}


def _live_context(
    hass: HomeAssistant, llm_api: llm.APIInstance, exposed: dict[str, dict[str, Any]], asked: str,
) -> str | None:
    """The live context's tool, for a question that names something of the home; else None."""
    if (live := offered_tool(llm_api, "GetLiveContext")) is None:
        return None
    names, areas = exposed_names(exposed)
    domains, classes = exposed_kinds(hass, exposed)
    if not asks_about_home(asked, home_words([*names, *areas, *domains, *classes])):
        return None
    return live
