"""Base entities for the Hearth integration."""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

import voluptuous as vol
from homeassistant.components import conversation
from homeassistant.config_entries import ConfigSubentry
from homeassistant.core import HomeAssistant
from homeassistant.exceptions import HomeAssistantError
from homeassistant.helpers import device_registry as dr
from homeassistant.helpers import llm
from homeassistant.helpers.entity import Entity
from homeassistant.helpers.json import json_dumps
from homeassistant.helpers.update_coordinator import CoordinatorEntity
from homeassistant.util import slugify

from .api import HearthError, InvalidAuth
from .attachments import async_add_attachments
from .compat import device_link, exposed_names, schema_to_openapi, tool_result_message
from .const import (
    CONF_MAX_HISTORY,
    CONF_MAX_TOKENS,
    CONF_MODEL,
    CONF_TEMPERATURE,
    DEFAULT_MAX_HISTORY,
    DEFAULT_MAX_TOKENS,
    DEFAULT_NAME,
    DOMAIN,
    LOGGER,
    MAX_TOOL_ITERATIONS,
    MODEL_CLASS_DEFAULT,
)
from .coordinator import HearthQueueCoordinator

if TYPE_CHECKING:
    from . import HearthConfigEntry


def server_device_info(entry: HearthConfigEntry) -> dr.DeviceInfo:
    """Return the device that stands for the Hearth server itself."""
    health = entry.runtime_data.health
    return dr.DeviceInfo(
        identifiers={(DOMAIN, entry.entry_id)},
        name=entry.title or DEFAULT_NAME,
        manufacturer="Hearth",
        model=health.get("model"),
        sw_version=health.get("version"),
        entry_type=dr.DeviceEntryType.SERVICE,
        configuration_url=entry.runtime_data.client.url,
    )


class HearthServerEntity(CoordinatorEntity[HearthQueueCoordinator]):
    """An entity on the server's device, fed by the queue coordinator."""

    _attr_has_entity_name = True

    def __init__(self, entry: HearthConfigEntry, key: str) -> None:
        """Initialize the entity."""
        super().__init__(entry.runtime_data.coordinator)
        self._attr_unique_id = f"{entry.entry_id}_{key}"
        self._attr_device_info = server_device_info(entry)


# Conversion between Home Assistant's chat log and OpenAI-style chat messages.


def _format_tool(
    tool: llm.Tool, custom_serializer: Callable[[Any], Any] | None
) -> dict[str, Any]:
    """Describe a Home Assistant LLM tool as an OpenAI function tool."""
    function: dict[str, Any] = {
        "name": tool.name,
        "parameters": schema_to_openapi(tool.parameters, custom_serializer),
    }
    if tool.description:
        function["description"] = tool.description
    return {"type": "function", "function": function}


def intent_argument_values(
    hass: HomeAssistant, llm_api: llm.APIInstance, formatted: list[dict[str, Any]]
) -> dict[str, dict[str, list[str]]]:
    """For each intent tool, the values its ``name`` and ``area`` arguments may take: the
    exposed entity and area names. The server holds a call the model opens to them, so a small
    model cannot name a light that does not exist (it may still answer without a call)."""
    names, areas = exposed_names(hass, llm_api.llm_context.assistant or "conversation")
    values: dict[str, dict[str, list[str]]] = {}
    for tool, described in zip(llm_api.tools, formatted, strict=True):
        base = getattr(tool, "tool", tool)  # a namespaced tool wraps the original
        # Timer intents use ``name`` for the timer's own name, not an entity's.
        if not isinstance(base, llm.IntentTool) or "Timer" in base.name:
            continue
        keys = described["function"]["parameters"].get("properties") or {}
        narrow = {arg: v for arg, v in (("name", names), ("area", areas)) if arg in keys and v}
        if narrow:
            values[tool.name] = narrow
    return values


def tool_fields(hass: HomeAssistant, llm_api: llm.APIInstance | None) -> dict[str, Any]:
    """The request fields that offer the model a chat log's tools: ``tools``, ``tool_choice``
    and the values intent arguments may take (none without an LLM API).

    A turn and a warm-up of the same agent both take their tools from here and their system
    prompt from the chat log's first message, so the server renders both the same way and the
    warm-up's cached tokens are the ones the turn starts with.
    """
    if not llm_api:
        return {}
    tools = [_format_tool(tool, llm_api.custom_serializer) for tool in llm_api.tools]
    if not tools:
        return {}
    fields: dict[str, Any] = {"tools": tools, "tool_choice": "auto"}
    if argument_values := intent_argument_values(hass, llm_api, tools):
        fields["tool_argument_values"] = argument_values
    return fields


def model_field(options: Mapping[str, Any]) -> dict[str, Any]:
    """``{"model": name}`` for a subentry that picked one of the server's models; nothing for
    one that leaves it to the server (each class goes to its own model there)."""
    model = options.get(CONF_MODEL)
    return {"model": model} if model and model != MODEL_CLASS_DEFAULT else {}


def warm_up_body(
    hass: HomeAssistant,
    chat_log: conversation.ChatLog,
    request_class: str,
    options: Mapping[str, Any],
) -> dict[str, Any]:
    """The ``/v1/cache/warm`` body for a chat log given its system prompt and tools: what every
    request of that log starts with, to be cached for ``request_class`` on the model its turns
    go to."""
    return {
        "messages": [convert_content(chat_log.content[0])],
        "priority": request_class,
        **model_field(options),
        **tool_fields(hass, chat_log.llm_api),
    }


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
                for tool_call in tool_calls
                if not getattr(tool_call, "external", False)
            ] or None
            if message["tool_calls"] is None:
                del message["tool_calls"]
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
) -> AsyncGenerator[conversation.AssistantContentDeltaDict]:
    """Turn OpenAI chat-completion chunks into chat-log deltas.

    Text is passed on as it arrives (so a voice pipeline can start speaking); tool calls are
    assembled from their fragments and handed over when the stream ends.
    """
    yield {"role": "assistant"}
    calls: dict[int, dict[str, str]] = {}
    async for chunk in chunks:
        for choice in chunk.get("choices") or ():
            delta = choice.get("delta") or {}
            # The server's reasoning_content is thinking to Home Assistant: shown, never spoken.
            if thinking := delta.get("reasoning_content"):
                yield {"thinking_content": thinking}
            if content := delta.get("content"):
                yield {"content": content}
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
                    call["arguments"] += (
                        arguments if isinstance(arguments, str) else json.dumps(arguments)
                    )
    if calls:
        tool_calls = []
        for index in sorted(calls):
            call = calls[index]
            if not call["name"]:
                continue
            extra = {"id": call["id"]} if call["id"] else {}
            tool_calls.append(
                llm.ToolInput(
                    tool_name=call["name"],
                    tool_args=_parse_arguments(call["arguments"]),
                    **extra,
                )
            )
        if tool_calls:
            yield {"tool_calls": tool_calls}


class HearthBaseLLMEntity(Entity):
    """Base of the conversation and AI Task entities of one subentry."""

    _attr_has_entity_name = True
    _attr_name = None

    def __init__(self, entry: HearthConfigEntry, subentry: ConfigSubentry) -> None:
        """Initialize the entity."""
        self.entry = entry
        self.subentry = subentry
        self._attr_unique_id = subentry.subentry_id
        health = entry.runtime_data.health
        self._attr_device_info = dr.DeviceInfo(
            identifiers={(DOMAIN, subentry.subentry_id)},
            name=subentry.title,
            manufacturer="Hearth",
            model=health.get("model"),
            sw_version=health.get("version"),
            entry_type=dr.DeviceEntryType.SERVICE,
            **device_link(entry.runtime_data.server_device_id, (DOMAIN, entry.entry_id)),
        )

    @property
    def available(self) -> bool:
        """Unavailable while the server does not answer its queue poll."""
        return self.entry.runtime_data.coordinator.last_update_success

    async def async_added_to_hass(self) -> None:
        """Follow the server's reachability."""
        await super().async_added_to_hass()
        self.async_on_remove(
            self.entry.runtime_data.coordinator.async_add_listener(self.async_write_ha_state)
        )

    async def _async_handle_chat_log(
        self,
        chat_log: conversation.ChatLog,
        *,
        request_class: str,
        user: str | None,
        structure_name: str | None = None,
        structure: vol.Schema | None = None,
        max_tokens: int | None = None,
    ) -> None:
        """Answer the chat log, running the tools the model calls (up to 10 rounds)."""
        options = self.subentry.data
        data = self.entry.runtime_data

        # No "model" unless the subentry picked one: the server sends each class to its own
        # model, so swapping models there needs no reconfiguration here.
        body: dict[str, Any] = {
            "max_tokens": int(max_tokens or options.get(CONF_MAX_TOKENS, DEFAULT_MAX_TOKENS)),
            "priority": request_class,
            **model_field(options),
            **tool_fields(self.hass, chat_log.llm_api),
        }
        if (temperature := options.get(CONF_TEMPERATURE)) is not None:
            body["temperature"] = float(temperature)
        if user:
            body["user"] = user
        if structure:
            body["response_format"] = format_response_format(
                structure_name or "result", structure, chat_log.llm_api
            )

        max_history = int(options.get(CONF_MAX_HISTORY, DEFAULT_MAX_HISTORY))
        messages = _convert_all(chat_log.content)
        await async_add_attachments(self.hass, chat_log.content, messages)
        messages = trim_history(messages, max_history)

        for _iteration in range(MAX_TOOL_ITERATIONS):
            try:
                stream = data.client.async_chat_stream(
                    {**body, "messages": messages}, request_class
                )
                messages.extend(
                    [
                        convert_content(content)
                        async for content in chat_log.async_add_delta_content_stream(
                            self.entity_id, transform_stream(stream)
                        )
                    ]
                )
            except InvalidAuth as err:
                self.entry.async_start_reauth(self.hass)
                raise HomeAssistantError(
                    translation_domain=DOMAIN, translation_key="invalid_auth"
                ) from err
            except HearthError as err:
                LOGGER.error("Error talking to the Hearth server: %s", err)
                raise HomeAssistantError(
                    translation_domain=DOMAIN,
                    translation_key="server_error",
                    translation_placeholders={"error": str(err)},
                ) from err

            if not chat_log.unresponded_tool_results:
                break


def _convert_all(contents: Iterable[conversation.Content]) -> list[dict[str, Any]]:
    return [convert_content(content) for content in contents]
