"""Ending a command's turn with Home Assistant's own confirmation instead of a second model turn.

A command through the model costs two turns: the call, then a sentence about Home Assistant's
result. On a CPU the second turn is half the wait (issue 30: a 1.5B model's turn p50 was about
6 s). When every call of the turn was one of Assist's intents and each did what was asked, the
agent says what Home Assistant's own agent would say for that intent, rendered from the
``home-assistant-intents`` responses in the turn's language, and the model is not asked again.
Anything else (a question, a failure, an intent without a response, a language without
responses) goes back to the model as before."""

from __future__ import annotations

import json
from collections.abc import Collection
from typing import Any

from home_assistant_intents import get_intents
from homeassistant.components import conversation
from homeassistant.core import HomeAssistant, State
from homeassistant.exceptions import TemplateError
from homeassistant.helpers import intent, template
from homeassistant.helpers.translation import async_get_exception_message

from .compat import tool_result_data
from .const import DOMAIN, LOGGER
from .questions import NOT_DONE

_RESPONSES: dict[str, dict[str, dict[str, str]]] = {}  # language -> intent -> key -> template

# The response key Home Assistant's agent picks from the sentence it matched; here from what
# was acted on. Keys a language lacks fall back to "default". These domains' responses are
# keyed by the domain's own name.
_DOMAIN_KEYS = frozenset({"cover", "scene", "script", "lock", "valve"})


async def _responses(hass: HomeAssistant, language: str) -> dict[str, dict[str, str]]:
    """The intents' response templates for ``language`` (or its base language), loaded once."""
    for lang in dict.fromkeys((language, language.split("-")[0])):
        if lang not in _RESPONSES:
            data = await hass.async_add_executor_job(get_intents, lang)
            _RESPONSES[lang] = (data or {}).get("responses", {}).get("intents", {})
        if _RESPONSES[lang]:
            return _RESPONSES[lang]
    return {}


def _response_key(kind: str, slots: dict[str, Any], states: list[State]) -> str:
    if kind == "HassLightSet":
        return next((k for k in ("brightness", "color", "temperature") if k in slots), "")
    domains = {state.domain for state in states}
    if len(domains) == 1 and (domain := next(iter(domains))) in _DOMAIN_KEYS:
        return domain
    if len(states) > 1 and domains <= {"light", "fan"}:
        plural = "lights" if domains == {"light"} else "fans"
        if "area" in slots:
            return f"{plural}_area"
        if "floor" in slots:
            return f"{plural}_floor"
        return f"{plural[:-1]}_all"
    return "default"


async def _speech(hass: HomeAssistant, response: intent.IntentResponse) -> str | None:
    """What Home Assistant's agent would say for ``response``, or None."""
    if response.response_type is not intent.IntentResponseType.ACTION_DONE:
        return None  # a question's answer, or an error: the model reads it
    if response.failed_results or not response.success_results or response.intent is None:
        return None
    if speech := response.speech.get("plain", {}).get("speech"):
        return str(speech)  # the handler spoke for itself (timers, ...)
    templates = (await _responses(hass, response.language)).get(response.intent.intent_type, {})
    slots = {k: v.get("value") for k, v in response.intent.slots.items()}
    source = templates.get(_response_key(response.intent.intent_type, slots,
                                         response.matched_states)) or templates.get("default")
    if not source:
        return None
    states = response.matched_states or response.unmatched_states
    rendered = template.Template(source, hass).async_render(
        {
            "slots": slots | response.speech_slots,
            "state": template.TemplateState(hass, states[0]) if states else None,
            "query": {
                "matched": [template.TemplateState(hass, s) for s in response.matched_states],
                "unmatched": [template.TemplateState(hass, s) for s in response.unmatched_states],
            },
        },
        parse_result=False,
    )
    return " ".join(str(rendered).split()) or None


async def action_confirmation(hass: HomeAssistant, chat_log: conversation.ChatLog) -> str | None:
    """The confirmation that ends this turn, or None to ask the model: only when every tool
    result since the model's last message is a successful action of an Assist intent."""
    results: list[Any] = []
    for content in reversed(chat_log.content):
        if not isinstance(content, conversation.ToolResultContent):
            break
        results.append(content)
    sentences: dict[str, None] = {}
    for content in reversed(results):
        response = getattr(tool_result_data(content), "original", None)
        if not isinstance(response, intent.IntentResponse):
            return None  # not an intent's (a script, live context, another API's tool)
        try:
            speech = await _speech(hass, response)
        except (TemplateError, LookupError, TypeError, ValueError) as err:
            # A response this code cannot render is the model's to put in words.
            LOGGER.debug("No confirmation for %s: %s", content.tool_name, err)
            return None
        if speech is None:
            return None
        sentences[speech if speech[-1:] in ".!?" else f"{speech}."] = None
    return " ".join(sentences) or None


def _call_key(call: Any) -> str:
    return f"{call.tool_name}:{json.dumps(call.tool_args, sort_keys=True, default=str)}"


def repeats_earlier_calls(chat_log: conversation.ChatLog, reads: Collection[str] = ()) -> bool:
    """Whether the model's last round of calls only repeats calls it already made in this
    turn: a small model retries a call that failed (or that worked) until the round limit
    (the 0.5B for 13-22 s, then Home Assistant said "Unable to get response").

    A first such round of tools that only read (``reads``) is let through, to be answered:
    the 1.5B, having read the live context for a question, read it again in 2 of 6 questions
    and was cut off there; shown the result twice, it answered in 6 of 10 replays, and most
    of the rest only repeated the question, which is asked again (:mod:`.described_call`)."""
    rounds: list[set[str]] = []
    names: list[set[str]] = []
    for content in reversed(chat_log.content):
        if isinstance(content, conversation.UserContent):
            break
        if isinstance(content, conversation.AssistantContent) and content.tool_calls:
            rounds.append({_call_key(call) for call in content.tool_calls})
            names.append({call.tool_name for call in content.tool_calls})
    repeated = [i for i in range(len(rounds) - 1)
                if rounds[i] <= set().union(*rounds[i + 1:])]
    if not repeated or repeated[0] != 0:
        return False
    return len(repeated) > 1 or not names[0] <= set(reads)


def unanswered_outcome(chat_log: conversation.ChatLog) -> str:
    """What the turn says when the model's tools ran and it gave no answer of its own: the
    tools' errors as Home Assistant worded them, or that no answer came."""
    errors: dict[str, None] = {}
    failed = False
    for content in reversed(chat_log.content):
        if not isinstance(content, conversation.ToolResultContent):
            break
        data = tool_result_data(content)
        if isinstance(data, dict) and data.get("error") == NOT_DONE:
            continue  # the agent's own refusal (:mod:`.questions`): not the tool's failure
        if isinstance(data, dict) and (text := data.get("error_text") or data.get("error")):
            failed = True
            if not str(text).startswith("<"):  # 2026.2 words a failed match as its repr
                errors[str(text)] = None
    if errors:
        return async_get_exception_message(
            DOMAIN, "tools_failed", {"error": " ".join(reversed(list(errors)))}
        )
    key = "tools_failed_unworded" if failed else "tools_unanswered"
    return async_get_exception_message(DOMAIN, key) + "."


def said_nothing(chat_log: conversation.ChatLog) -> str | None:
    """What the turn says when the model's last answer has neither a word nor a call, or
    None: a small model that wrote a tool's answer instead of calling the tool, which the
    server cuts at the tool's tag (the 1.5B, asked "and the porch light too"). An empty
    answer adds nothing to the chat log, where Home Assistant says "Unable to get response",
    as if the server had failed."""
    last = chat_log.content[-1] if chat_log.content else None
    if isinstance(last, conversation.AssistantContent):
        if last.tool_calls or (last.content or "").strip():
            return None
    elif not isinstance(last, conversation.UserContent):
        return None
    return async_get_exception_message(DOMAIN, "no_answer") + "."
