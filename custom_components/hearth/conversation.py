"""Conversation agents served by Hearth."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from homeassistant.components import conversation
from homeassistant.config_entries import ConfigSubentry
from homeassistant.const import CONF_LLM_HASS_API, MATCH_ALL
from homeassistant.core import HomeAssistant
from homeassistant.helpers import llm
from homeassistant.helpers.entity_platform import AddConfigEntryEntitiesCallback

from .compat import agent_llm_context, apis_require_admin
from .const import (
    CLASS_POLICY_AUTO,
    CONF_CLASS_POLICY,
    CONF_CONFIRM_ACTIONS,
    CONF_HOLD_AFTER,
    CONF_HOLD_PHRASE,
    CONF_PROMPT,
    DEFAULT_HOLD_AFTER,
    DEFAULT_HOLD_PHRASE,
    DOMAIN,
)
from .entity import HearthBaseLLMEntity, model_field, warm_up_body
from .hold import HoldPhrase, hold_phrase
from .reservations import SatelliteReservations
from .warm import PromptWarmer, heard_store

if TYPE_CHECKING:
    from . import HearthConfigEntry

# The server schedules concurrent requests itself (by class and fair share): no limit here.
PARALLEL_UPDATES = 0


async def async_setup_entry(
    hass: HomeAssistant,
    config_entry: HearthConfigEntry,
    async_add_entities: AddConfigEntryEntitiesCallback,
) -> None:
    """Set up one conversation agent per conversation subentry."""
    for subentry in config_entry.subentries.values():
        if subentry.subentry_type != "conversation":
            continue
        async_add_entities(
            [HearthConversationEntity(config_entry, subentry)],
            config_subentry_id=subentry.subentry_id,
        )


def request_class_for(policy: str, user_input: conversation.ConversationInput, heard: bool) -> str:
    """Pick the server class of a conversation turn.

    ``auto``: ``voice`` when the turn was spoken: it names a satellite or a device, or it is
    the intent stage of an Assist pipeline run that began with audio (``heard``: a browser's
    or the companion app's microphone). Typed turns are ``chat``, also those of Home
    Assistant's Assist dialog, whose pipeline runs listen to the chat log's deltas as a
    voice pipeline's do: a delta listener says nothing about speech.
    """
    if policy and policy != CLASS_POLICY_AUTO:
        return policy
    if getattr(user_input, "satellite_id", None) or getattr(user_input, "device_id", None):
        return "voice"
    return "voice" if heard else "chat"


# Pipeline event types (their values are stable across releases).
_AUDIO_STAGE_STARTS = frozenset({"wake_word-start", "stt-start"})


def started_from_audio(hass: HomeAssistant, user_input: conversation.ConversationInput) -> bool:
    """Whether ``user_input`` is the intent stage, now running, of an Assist pipeline run that
    began with a wake word or speech to text.

    Read from the pipeline runs' event record, which Home Assistant keeps for the pipeline
    debug view: the run whose open intent stage carries this text and conversation. A record
    missing or shaped otherwise reads as not heard (the turn is then ``chat``).
    """
    debug = getattr(hass.data.get("assist_pipeline"), "pipeline_debug", None)
    if not isinstance(debug, dict):
        return False
    for runs in debug.values():
        for run in list(getattr(runs, "values", list)()):
            heard = open_intent = False
            for event in getattr(run, "events", ()):
                kind = str(getattr(event, "type", ""))
                data = getattr(event, "data", None) or {}
                if kind in _AUDIO_STAGE_STARTS:
                    heard = True
                elif kind == "intent-start":
                    open_intent = data.get("intent_input") == user_input.text and (
                        data.get("conversation_id") == user_input.conversation_id
                    )
                elif kind == "intent-end":
                    open_intent = False
            if heard and open_intent:
                return True
    return False


def warm_up_class_for(policy: str) -> str:
    """The class an agent's prompt is warmed for: ``voice`` unless the agent is pinned to
    another class (a warm-up itself always runs as background work on the server)."""
    return "voice" if not policy or policy == CLASS_POLICY_AUTO else policy


def satellite_of(user_input: conversation.ConversationInput) -> str | None:
    """The satellite a spoken turn came from (its entity id, else its device): the name the
    server supersedes a waiting turn by, and the one its wake-word reservation was made for."""
    return getattr(user_input, "satellite_id", None) or getattr(user_input, "device_id", None)


def hold_for(options: Any, request_class: str, language: str | None) -> HoldPhrase | None:
    """The hold phrase of a turn: voice turns only, unless the agent's options turn it off."""
    if request_class != "voice" or not options.get(CONF_HOLD_PHRASE, DEFAULT_HOLD_PHRASE):
        return None
    after_s = float(options.get(CONF_HOLD_AFTER, DEFAULT_HOLD_AFTER))
    return HoldPhrase(hold_phrase(language), after_s)


def fairness_key_for(user_input: conversation.ConversationInput) -> str | None:
    """Whose turn this is for the server's fair share: the satellite (or device) it came from,
    otherwise the Home Assistant user."""
    return (
        getattr(user_input, "satellite_id", None)
        or getattr(user_input, "device_id", None)
        or (user_input.context.user_id if user_input.context else None)
    )


class HearthConversationEntity(
    conversation.ConversationEntity,
    conversation.AbstractConversationAgent,
    HearthBaseLLMEntity,
):
    """A Hearth conversation agent."""

    _attr_supports_streaming = True

    def __init__(self, entry: HearthConfigEntry, subentry: ConfigSubentry) -> None:
        """Initialize the agent."""
        super().__init__(entry, subentry)
        self.warmer: PromptWarmer | None = None
        self.reservations: SatelliteReservations | None = None
        if self.subentry.data.get(CONF_LLM_HASS_API):
            self._attr_supported_features = conversation.ConversationEntityFeature.CONTROL

    @property
    def supported_languages(self) -> list[str] | Literal["*"]:
        """Return the languages the agent speaks (the model decides)."""
        return MATCH_ALL

    async def async_added_to_hass(self) -> None:
        """Register the agent and keep its prompt warm on the server."""
        await super().async_added_to_hass()
        conversation.async_set_agent(self.hass, self.entry, self)
        self.warmer = PromptWarmer(
            self.hass,
            self.entry,
            self._async_warm_up_body,
            follow_home=bool(self.subentry.data.get(CONF_LLM_HASS_API)),
            store=heard_store(self.hass, self.subentry.subentry_id),
        )
        await self.warmer.async_load()
        self.async_on_remove(self.warmer.async_start())
        agents = [s for s in self.entry.subentries.values() if s.subentry_type == "conversation"]
        self.reservations = SatelliteReservations(
            self.hass,
            self.entry,
            self.entity_id,
            model=model_field(self.subentry.data).get("model"),
            build=self._async_warm_up_body,
            by_entry=len(agents) == 1,
        )
        self.async_on_remove(self.reservations.async_start())

    async def async_will_remove_from_hass(self) -> None:
        """Unregister the agent."""
        conversation.async_unset_agent(self.hass, self.entry)
        await super().async_will_remove_from_hass()

    async def _async_handle_message(
        self,
        user_input: conversation.ConversationInput,
        chat_log: conversation.ChatLog,
    ) -> conversation.ConversationResult:
        """Answer one conversation turn."""
        options = self.subentry.data
        try:
            await self._async_provide_llm_data(
                chat_log, user_input.as_llm_context(DOMAIN), user_input.extra_system_prompt
            )
        except conversation.ConverseError as err:
            return err.as_conversation_result()

        policy = options.get(CONF_CLASS_POLICY, CLASS_POLICY_AUTO)
        request_class = request_class_for(
            policy,
            user_input,
            policy == CLASS_POLICY_AUTO and started_from_audio(self.hass, user_input),
        )
        if self.warmer is not None:
            if request_class == "voice" and user_input.device_id:
                self.warmer.async_heard(user_input.device_id)
            if user_input.context and user_input.context.user_id:
                self.warmer.async_used_by(user_input.context.user_id)
        satellite = satellite_of(user_input) if request_class == "voice" else None
        if self.reservations is not None:
            self.reservations.async_turn(getattr(user_input, "satellite_id", None))
        await self._async_handle_chat_log(
            chat_log,
            request_class=request_class,
            user=fairness_key_for(user_input),
            confirm_actions=options.get(CONF_CONFIRM_ACTIONS, True),
            satellite=satellite,
            hold=hold_for(options, request_class, user_input.language),
        )
        return conversation.async_get_result_from_chat_log(user_input, chat_log)

    async def _async_provide_llm_data(
        self,
        chat_log: conversation.ChatLog,
        llm_context: llm.LLMContext,
        extra_system_prompt: str | None = None,
    ) -> None:
        """Give the chat log this agent's system prompt and tools (a turn's or a warm-up's)."""
        options = self.subentry.data
        await chat_log.async_provide_llm_data(
            llm_context,
            options.get(CONF_LLM_HASS_API),
            options.get(CONF_PROMPT),
            extra_system_prompt,
        )

    async def _async_warm_up_body(self, device_id: str | None) -> dict[str, Any] | None:
        """The warm-up of the prompt a voice turn from ``device_id`` (or none) starts with;
        for an LLM API that serves administrators only, of the last user's turn (None before
        the agent has had one).

        The chat log is a scratch one: Home Assistant's chat sessions never hold it.
        """
        user_id = None
        if apis_require_admin(self.hass, self.subentry.data.get(CONF_LLM_HASS_API)):
            user_id = self.warmer.user_id if self.warmer else None
            if user_id is None:
                return None
        chat_log = conversation.ChatLog(self.hass, f"{DOMAIN}_warm_up_{self.subentry.subentry_id}")
        await self._async_provide_llm_data(
            chat_log, agent_llm_context(self.hass, self.entity_id, device_id, user_id)
        )
        policy = self.subentry.data.get(CONF_CLASS_POLICY, CLASS_POLICY_AUTO)
        return warm_up_body(
            self.hass, chat_log, warm_up_class_for(policy), self.subentry.data,
            self.entry.runtime_data.health.get("features") or (),
        )
