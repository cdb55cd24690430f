"""Conversion between Home Assistant's chat log and the server's OpenAI-style chat messages."""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Collection, Iterable
from dataclasses import replace
from typing import Any

from homeassistant.components import conversation
from homeassistant.helpers import llm
from homeassistant.helpers.json import json_dumps
from homeassistant.util import slugify

from .compat import (
    schema_to_openapi,
    tool_error_delta,
    tool_result_data,
    tool_result_message,
    vol,
)
from .const import LOGGER
from .described_call import HeldSentences, Rescue
from .intent_tools import Call
from .questions import refusal


def _strict_schema(schema: dict[str, Any]) -> None:
    """Make a JSON schema fit OpenAI's strict structured-output rules, in place.

    Every object property becomes required (optional ones may be null instead) and no other
    properties are allowed.
    """
    schema_type = schema.get("type")
    if schema_type == "object":
        schema.setdefault("additionalProperties", False)
        properties = schema.get("properties")
        if not properties:
            return
        required = schema.setdefault("required", [])
        for name, prop in properties.items():
            _strict_schema(prop)
            if name not in required:
                if isinstance(prop.get("type"), str):
                    prop["type"] = [prop["type"], "null"]
                required.append(name)
    elif schema_type == "array" and isinstance(schema.get("items"), dict):
        _strict_schema(schema["items"])


def format_response_format(
    name: str, structure: vol.Schema, llm_api: llm.APIInstance | None
) -> dict[str, Any]:
    """Return the ``response_format`` that asks the server for JSON matching ``structure``."""
    schema = schema_to_openapi(
        structure, llm_api.custom_serializer if llm_api else llm.selector_serializer
    )
    _strict_schema(schema)
    return {
        "type": "json_schema",
        "json_schema": {"name": slugify(name) or "result", "schema": schema, "strict": True},
    }


def convert_content(content: conversation.Content) -> dict[str, Any]:
    """Convert one chat-log entry into an OpenAI chat message."""
    if isinstance(content, conversation.ToolResultContent):
        return {
            "role": "tool",
            "tool_call_id": content.tool_call_id,
            "content": json_dumps(tool_result_message(content)),
        }
    if isinstance(content, conversation.AssistantContent):
        message: dict[str, Any] = {"role": "assistant", "content": content.content or ""}
        if tool_calls := getattr(content, "tool_calls", None):
            message["tool_calls"] = [
                {
                    "id": tool_call.id,
                    "type": "function",
                    "function": {
                        "name": tool_call.tool_name,
                        "arguments": json_dumps(tool_call.tool_args),
                    },
                }
                # Also the calls Home Assistant made itself (``external``: a command its local
                # intents handled, a sentence trigger): their results follow in the log.
                for tool_call in tool_calls
            ]
        return message
    if isinstance(content, conversation.UserContent):
        # Attachments become content parts in async_add_attachments (it reads files).
        return {"role": "user", "content": content.content}
    if isinstance(content, conversation.SystemContent):
        return {"role": "system", "content": content.content}
    raise TypeError(f"Unexpected content type: {type(content)}")


def trim_history(messages: list[dict[str, Any]], max_history: int) -> list[dict[str, Any]]:
    """Keep the system prompt and the last ``max_history`` rounds before the current one.

    A round starts at a user message, so a tool call is never cut from its result.
    """
    if max_history < 1:
        return messages
    user_indexes = [i for i, message in enumerate(messages) if message["role"] == "user"]
    # The last user message is the one being answered; keep max_history rounds before it.
    if len(user_indexes) <= max_history + 1:
        return messages
    start = user_indexes[-(max_history + 1)]
    head = [message for message in messages[:1] if message["role"] == "system"]
    return [*head, *messages[start:]]


def _parse_arguments(raw: str) -> dict[str, Any]:
    """Decode tool-call arguments, dropping empty values small models like to add."""
    if not raw.strip():
        return {}
    try:
        args = json.loads(raw)
    except ValueError:
        LOGGER.warning("The model produced tool arguments that are not JSON: %s", raw)
        return {}
    if not isinstance(args, dict):
        return {}
    return {key: value for key, value in args.items() if value not in (None, "")}


async def transform_stream(
    chunks: AsyncIterator[dict[str, Any]],
    repair: Callable[[list[Call]], list[Call]] | None = None,
    rescue: Rescue | None = None,
    refuse: Collection[str] = (),
) -> AsyncGenerator[
    conversation.AssistantContentDeltaDict | conversation.ToolResultContentDeltaDict
]:
    """Turn OpenAI chat-completion chunks into chat-log deltas.

    Text is passed on as it arrives (so a voice pipeline can start speaking), or with
    ``rescue`` a sentence at a time, an answer that is no answer held back and asked again
    (:mod:`.described_call`); tool calls are assembled from their fragments and handed over
    when the stream ends, the round through ``repair`` (its calls' names and arguments) where
    given.
    A call of a tool in ``refuse`` is not run: it is answered with :func:`.questions.refusal`
    (a question asked, :mod:`.questions`).
    """
    yield {"role": "assistant"}
    calls: dict[int, dict[str, str]] = {}
    held = HeldSentences(rescue) if rescue else None
    async for delta in _deltas(chunks, calls, held):
        yield delta
    if held is not None:
        if rest := held.finish():
            yield {"content": rest}
        if not calls and (tool_choice := held.retry):
            LOGGER.info("The model's answer %s: asking again",
                        f"described a call to {held.named}" if held.named else "said nothing")
            # A call asked for has no text; an answer asked again is held as the first was.
            again = HeldSentences(replace(held.rescue, described=False))
            async for delta in _deltas(held.rescue.ask(tool_choice), calls, again):
                if held.named is None:
                    yield delta
            if (rest := again.finish()) and held.named is None:
                yield {"content": rest}
            if not calls and (held.named or not again.shown):  # nothing better: the first
                yield {"content": held.held}
        elif held.named:  # it described a call and made one: nothing of it is lost
            yield {"content": held.held}
    if tool_calls := _tool_inputs(calls, repair):
        refused = [call for call in tool_calls if call.tool_name in refuse]
        for call in refused:
            call.external = True  # Home Assistant leaves it to this stream to answer
        yield {"tool_calls": tool_calls}
        for call in refused:
            LOGGER.info("Not running %s: the user asked a question", call.tool_name)
            yield tool_error_delta(call, refusal())


async def _deltas(
    chunks: AsyncIterator[dict[str, Any]],
    calls: dict[int, dict[str, str]],
    held: HeldSentences | None,
) -> AsyncGenerator[conversation.AssistantContentDeltaDict]:
    """The thinking and the text of a stream as deltas (the text through ``held``), its
    tool-call fragments added to ``calls``."""
    async for chunk in chunks:
        for choice in chunk.get("choices") or ():
            delta = choice.get("delta") or {}
            # The server's reasoning_content is thinking to Home Assistant: shown, never spoken.
            if thinking := delta.get("reasoning_content"):
                yield {"thinking_content": thinking}
            if (content := delta.get("content")) and held is not None:
                content = held.feed(content)
            if content:
                yield {"content": content}
            _add_fragments(calls, delta)


def _add_fragments(calls: dict[int, dict[str, str]], delta: dict[str, Any]) -> None:
    """Add a delta's tool-call fragments to the calls being assembled."""
    for fragment in delta.get("tool_calls") or ():
        index = fragment.get("index")
        if not isinstance(index, int):
            index = len(calls)
        call = calls.setdefault(index, {"id": "", "name": "", "arguments": ""})
        if fragment.get("id"):
            call["id"] = fragment["id"]
        function = fragment.get("function") or {}
        if function.get("name"):
            call["name"] += function["name"]
        if function.get("arguments"):
            arguments = function["arguments"]
            call["arguments"] += arguments if isinstance(arguments, str) else json.dumps(arguments)


def _tool_inputs(
    calls: dict[int, dict[str, str]],
    repair: Callable[[list[Call]], list[Call]] | None,
) -> list[llm.ToolInput]:
    """The assembled calls as Home Assistant's tool inputs (nameless fragments dropped), the
    round through ``repair`` where given."""
    named = [calls[index] for index in sorted(calls) if calls[index]["name"]]
    parsed = [(call["name"], _parse_arguments(call["arguments"])) for call in named]
    if repair is not None:
        repaired = repair(parsed)
        if len(repaired) == len(parsed):  # a repair keeps one call per call: ids stay theirs
            parsed = repaired
    return [
        llm.ToolInput(tool_name=name, tool_args=args, id=call["id"])
        if call["id"]  # else Home Assistant gives the call an id of its own
        else llm.ToolInput(tool_name=name, tool_args=args)
        for call, (name, args) in zip(named, parsed, strict=True)
    ]


def convert_all(contents: Iterable[conversation.Content]) -> list[dict[str, Any]]:
    """The chat log's entries as messages, one for one (``paired_tool_messages`` then drops
    the unpaired ones)."""
    return [convert_content(content) for content in contents]


def without_confirmations(contents: Iterable[conversation.Content]) -> list[conversation.Content]:
    """The chat log without the sentences that confirmed a done action ("Turned on the
    light"): a reply with no call right after tool results that each did what was asked.

    Whoever wrote it (the confirmation step, Home Assistant's local intents, the model), it
    says nothing the results do not, and the 1.5B copied it as its answer to the next command
    ("and the porch light too": "Turned on the porch light.", no call). Without it the last
    thing the model sees before a follow-up is a command answered by a call (direct requests,
    the demo's history: a call 3 of 4 times instead of 0 of 4; issue 30). Answers after a
    question's result (live context) stay.
    """
    kept: list[conversation.Content] = []
    results: list[conversation.Content] = []  # the tool results right before this entry
    for content in contents:
        if (isinstance(content, conversation.AssistantContent) and not content.tool_calls
                and results and all(_done(result) for result in results)):
            results = []
            continue
        if isinstance(content, conversation.ToolResultContent):
            results.append(content)
        else:
            results = []
        kept.append(content)
    return kept


def _done(content: conversation.Content) -> bool:
    """Whether a tool result is an action that succeeded on everything it targeted."""
    data = tool_result_data(content)
    if not isinstance(data, dict) or data.get("response_type") != "action_done":
        return False
    outcome = data.get("data")
    return not (isinstance(outcome, dict) and outcome.get("failed"))


def paired_tool_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The history with every tool call right before its result and every result right after
    its call.

    A call without a result (a turn that ended in an error) or a result without its call is
    left out: chat templates that check the pairing, and remote OpenAI-style workers, refuse
    such a history. An assistant message left with neither text nor calls goes too.
    """
    paired: list[dict[str, Any]] = []
    index = 0
    while index < len(messages):
        message = messages[index]
        index += 1
        if message["role"] == "tool":
            continue  # a result whose call is not right before it
        if message["role"] != "assistant" or "tool_calls" not in message:
            paired.append(message)
            continue
        results = []
        while index < len(messages) and messages[index]["role"] == "tool":
            results.append(messages[index])
            index += 1
        called = {call["id"] for call in message["tool_calls"]}
        results = [r for r in results if r.get("tool_call_id") in called]
        answered = {r["tool_call_id"] for r in results}
        calls = [call for call in message["tool_calls"] if call["id"] in answered]
        message = {key: value for key, value in message.items() if key != "tool_calls"}
        if calls:
            message["tool_calls"] = calls
        elif not message.get("content"):
            continue
        paired.append(message)
        paired.extend(results)
    return paired


def offered_call_names(messages: list[dict[str, Any]], offered: set[str]) -> list[dict[str, Any]]:
    """The history with each call named as the tool the model is offered.

    A call Home Assistant's local intents made is named by its intent (``HassTurnOn``) while
    the model is offered the tool under a namespace (``intent__HassTurnOn`` since 2026.10):
    shown a call of a tool it does not have, the 1.5B answered the next command by copying
    the last reply ("Turned on the light") without a call. A name that fits no offered tool,
    or more than one, stays.
    """
    by_base: dict[str, list[str]] = {}
    for name in offered:
        by_base.setdefault(name.rpartition("__")[2], []).append(name)
    renamed = []
    for message in messages:
        calls = message.get("tool_calls")
        if calls and any(c["function"]["name"] not in offered for c in calls):
            message = {**message, "tool_calls": [_offered(c, offered, by_base) for c in calls]}
        renamed.append(message)
    return renamed


def _offered(call: dict[str, Any], offered: set[str], by_base: dict[str, list[str]]
             ) -> dict[str, Any]:
    name = call["function"]["name"]
    match = by_base.get(name, [])
    if name in offered or len(match) != 1:
        return call
    return {**call, "function": {**call["function"], "name": match[0]}}
