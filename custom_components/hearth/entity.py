"""Base entities for the Hearth integration."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Collection, Mapping
from typing import TYPE_CHECKING, Any

from homeassistant.components import conversation
from homeassistant.config_entries import ConfigSubentry
from homeassistant.core import HomeAssistant
from homeassistant.exceptions import HomeAssistantError
from homeassistant.helpers import device_registry as dr
from homeassistant.helpers import llm
from homeassistant.helpers.entity import Entity
from homeassistant.helpers.update_coordinator import CoordinatorEntity

from .api import HearthError, InvalidAuth, Superseded
from .attachments import async_add_attachments
from .call_hint import ACT_ALONE, example_question, with_call_hint
from .compat import exposed_entities, schema_to_openapi, vol, with_parent
from .confirm import (
    action_confirmation,
    repeats_earlier_calls,
    said_nothing,
    unanswered_outcome,
)
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
from .described_call import Rescue
from .hold import HoldPhrase
from .intent_tools import (
    call_repair,
    intent_argument_values,
    narrow_intent_kinds,
    shared_argument_sets,
)
from .messages import (
    convert_all,
    convert_content,
    format_response_format,
    offered_call_names,
    paired_tool_messages,
    transform_stream,
    trim_history,
    without_confirmations,
)
from .questions import QuestionTurn

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


# The tools of a chat log as the server takes them.


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


def turn_exposed(hass: HomeAssistant, llm_api: llm.APIInstance | None) -> dict[str, dict[str, Any]]:
    """The entities the Assist API exposes to the turn's assistant (none without an API):
    read once a turn, for the tools' values and the calls' repair."""
    if not llm_api:
        return {}
    return exposed_entities(hass, llm_api.llm_context.assistant or "conversation")


def tool_fields(
    hass: HomeAssistant,
    llm_api: llm.APIInstance | None,
    features: Collection[str] = (),
    exposed: dict[str, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The request fields that offer the model a chat log's tools: ``tools``, ``tool_choice``
    and the values intent arguments may take (none without an LLM API); the exposed names
    once, not once per intent tool, where the server's ``features`` allow it.

    A turn and a warm-up of the same agent both take their tools from here and their system
    prompt from the chat log's first message, so the server renders both the same way and the
    warm-up's cached tokens are the ones the turn starts with.
    """
    if not llm_api:
        return {}
    tools = [_format_tool(tool, llm_api.custom_serializer) for tool in llm_api.tools]
    if not tools:
        return {}
    if exposed is None:
        exposed = turn_exposed(hass, llm_api)
    narrow_intent_kinds(hass, llm_api, tools, exposed)
    fields: dict[str, Any] = {"tools": tools, "tool_choice": "auto"}
    if argument_values := intent_argument_values(llm_api, tools, exposed):
        if "tool_argument_sets" in features:
            shared, sets = shared_argument_sets(argument_values)
            fields.update(tool_argument_values=shared, tool_argument_sets=sets)
        else:
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
    features: Collection[str] = (),
) -> dict[str, Any]:
    """The ``/v1/cache/warm`` body for a chat log given its system prompt and tools: what every
    request of that log starts with, to be cached for ``request_class`` on the model its turns
    go to."""
    exposed = turn_exposed(hass, chat_log.llm_api)
    system = convert_content(chat_log.content[0])
    return {
        "messages": [with_call_hint(system, chat_log.llm_api, exposed)],
        "priority": request_class,
        **model_field(options),
        **tool_fields(hass, chat_log.llm_api, features, exposed),
    }


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
        self._attr_device_info = with_parent(
            dr.DeviceInfo(
                identifiers={(DOMAIN, subentry.subentry_id)},
                name=subentry.title,
                manufacturer="Hearth",
                model=health.get("model"),
                sw_version=health.get("version"),
                entry_type=dr.DeviceEntryType.SERVICE,
            ),
            entry.runtime_data.server_device_id,
            (DOMAIN, entry.entry_id),
        )

    @property
    def available(self) -> bool:
        """Unavailable while the server does not answer (its queue stream or poll)."""
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
        confirm_actions: bool = False,
        satellite: str | None = None,
        hold: HoldPhrase | None = None,
    ) -> None:
        """Answer the chat log, running the tools the model calls (up to 10 rounds). With
        ``confirm_actions``, a turn whose calls all did what was asked ends with Home
        Assistant's own confirmation instead of a second model turn (:mod:`.confirm`).
        ``satellite``: the voice turn's, sent so that a newer turn of it supersedes this one
        while it waits (the turn then ends quietly); ``hold``: its hold phrase (:mod:`.hold`).
        """
        options = self.subentry.data
        data = self.entry.runtime_data

        # No "model" unless the subentry picked one: the server sends each class to its own
        # model, so swapping models there needs no reconfiguration here.
        body: dict[str, Any] = {
            "max_tokens": int(max_tokens or options.get(CONF_MAX_TOKENS, DEFAULT_MAX_TOKENS)),
            "priority": request_class,
            **model_field(options),
        }
        exposed = turn_exposed(self.hass, chat_log.llm_api)
        features = data.health.get("features") or ()
        body.update(tool_fields(self.hass, chat_log.llm_api, features, exposed))
        asked = next((c.content for c in reversed(chat_log.content)
                      if isinstance(c, conversation.UserContent)), "")
        repair = call_repair(chat_log.llm_api, body.get("tools") or [], exposed, asked)
        # A question is answered from what is read, never acted on (:mod:`.questions`); a
        # structured answer (an AI Task's) is the task's to shape.
        question = QuestionTurn.of(
            self.hass, chat_log.llm_api, exposed, "" if structure else asked)
        if (temperature := options.get(CONF_TEMPERATURE)) is not None:
            body["temperature"] = float(temperature)
        if user:
            body["user"] = user
        if structure:
            body["response_format"] = format_response_format(
                structure_name or "result", structure, chat_log.llm_api
            )

        max_history = int(options.get(CONF_MAX_HISTORY, DEFAULT_MAX_HISTORY))
        history = without_confirmations(chat_log.content)
        messages = convert_all(history)
        messages[:1] = [with_call_hint(m, chat_log.llm_api, exposed) for m in messages[:1]]
        await async_add_attachments(self.hass, history, messages)
        offered = {tool["function"]["name"] for tool in body.get("tools") or ()}
        messages = trim_history(
            offered_call_names(paired_tool_messages(messages), offered), max_history
        )

        if question.read_first:
            messages.extend(await self._read_live_context(chat_log, question.read_first))
        echoes = (asked, ACT_ALONE, example_question(exposed) or "")
        for iteration in range(MAX_TOOL_ITERATIONS):
            request = question.request(
                {**body, "messages": messages}, bool(iteration or question.read_first))
            # An answer that is no answer is asked again (:mod:`.described_call`): a described
            # call only in a turn's first answer, as later ones follow tool results.
            rescue = None
            if offered and structure is None:

                def ask(tool_choice: str | dict[str, Any], sent: dict[str, Any] = request
                        ) -> AsyncIterator[dict[str, Any]]:
                    return data.client.async_chat_stream(
                        {**sent, "tool_choice": tool_choice}, request_class,
                        satellite=satellite)

                rescue = Rescue(
                    offered,
                    ask,
                    echoes=echoes,
                    described=iteration == 0 and not question.read_first,
                )
            chunks = data.client.async_chat_stream(
                request, request_class, satellite=satellite,
                on_queued=hold.queued if hold else None)
            try:
                stream: AsyncIterator[Any] = transform_stream(
                    hold.watch(chunks) if hold else chunks, repair, rescue, question.refuse)
                if hold:
                    stream = hold.speak(stream)
                messages.extend(
                    [
                        convert_content(content)
                        async for content in chat_log.async_add_delta_content_stream(
                            self.entity_id, stream
                        )
                    ]
                )
            except InvalidAuth as err:
                self.entry.async_start_reauth(self.hass)
                raise HomeAssistantError(
                    translation_domain=DOMAIN, translation_key="invalid_auth"
                ) from err
            except Superseded as err:
                # A newer turn of the satellite took its place: nothing to say (the satellite
                # has moved on to that turn).
                LOGGER.info("Voice turn from %s superseded: %s", satellite, err)
                chat_log.async_add_assistant_content_without_tools(
                    conversation.AssistantContent(agent_id=self.entity_id, content="")
                )
                return
            except HearthError as err:
                LOGGER.error("Error talking to the Hearth server: %s", err)
                raise HomeAssistantError(
                    translation_domain=DOMAIN,
                    translation_key="server_error",
                    translation_placeholders={"error": str(err)},
                ) from err

            if not chat_log.unresponded_tool_results:
                break
            if confirm_actions and (said := await action_confirmation(self.hass, chat_log)):
                chat_log.async_add_assistant_content_without_tools(
                    conversation.AssistantContent(agent_id=self.entity_id, content=said)
                )
                break
            if repeats_earlier_calls(chat_log, question.reading):
                break  # it would only retry them until the round limit
        said = None
        if chat_log.unresponded_tool_results:  # no answer of the model's: say what happened
            said = unanswered_outcome(chat_log)
        elif structure is None:
            said = said_nothing(chat_log)
        if said:
            chat_log.async_add_assistant_content_without_tools(
                conversation.AssistantContent(agent_id=self.entity_id, content=said)
            )

    async def _read_live_context(
        self, chat_log: conversation.ChatLog, tool: str
    ) -> list[dict[str, Any]]:
        """Read the whole live context for a question, as a call of the agent's own: the
        model answers from it (:mod:`.questions`). The call and its result as messages."""
        content = conversation.AssistantContent(
            agent_id=self.entity_id, tool_calls=[llm.ToolInput(tool_name=tool, tool_args={})])
        results = [result async for result in chat_log.async_add_assistant_content(content)]
        return [convert_content(content), *map(convert_content, results)]
