"""AI Task entities served by Hearth."""

from __future__ import annotations

from collections.abc import Mapping
from json import JSONDecodeError
from typing import TYPE_CHECKING, Any

from homeassistant.components import ai_task, conversation
from homeassistant.core import HomeAssistant
from homeassistant.exceptions import HomeAssistantError
from homeassistant.helpers.entity_platform import AddConfigEntryEntitiesCallback
from homeassistant.util.json import json_loads

from .const import (
    CONF_MAX_TOKENS,
    CONF_MODEL,
    CONF_REQUEST_CLASS,
    DEFAULT_AI_TASK_CLASS,
    DEFAULT_AI_TASK_MAX_TOKENS,
    DOMAIN,
    LOGGER,
    MODEL_CLASS_DEFAULT,
)
from .entity import HearthBaseLLMEntity

if TYPE_CHECKING:
    from . import HearthConfigEntry

# The server schedules concurrent requests itself (by class and fair share): no limit here.
PARALLEL_UPDATES = 0


async def async_setup_entry(
    hass: HomeAssistant,
    config_entry: HearthConfigEntry,
    async_add_entities: AddConfigEntryEntitiesCallback,
) -> None:
    """Set up one AI Task entity per ai_task_data subentry."""
    for subentry in config_entry.subentries.values():
        if subentry.subentry_type != "ai_task_data":
            continue
        async_add_entities(
            [HearthTaskEntity(config_entry, subentry)],
            config_subentry_id=subentry.subentry_id,
        )


def model_has_vision(queue: dict[str, Any] | None, options: Mapping[str, Any]) -> bool:
    """Whether the server's last queue health lists ``vision`` among the capabilities of the
    model an AI Task with these options goes to: the one it picked, else the model serving
    its class. A server that lists no capabilities has none."""
    models = (queue or {}).get("models")
    if not isinstance(models, dict):
        return False
    name = options.get(CONF_MODEL)
    if not name or name == MODEL_CLASS_DEFAULT:
        request_class = options.get(CONF_REQUEST_CLASS, DEFAULT_AI_TASK_CLASS)
        name = next(
            (n for n, m in models.items() if request_class in (m.get("classes") or ())), None
        )
    model = models.get(name) if name else None
    if model is None and name:  # picked by one of its aliases
        model = next((m for m in models.values() if name in (m.get("aliases") or ())), None)
    return isinstance(model, dict) and "vision" in (model.get("capabilities") or ())


class HearthTaskEntity(ai_task.AITaskEntity, HearthBaseLLMEntity):
    """Generates data with the Hearth server, at the background class by default."""

    @property
    def supported_features(self) -> ai_task.AITaskEntityFeature:
        """Generating data; taking attachments (images) only while the model the task goes to
        has vision, so Home Assistant refuses a task with a picture up front otherwise."""
        features = ai_task.AITaskEntityFeature.GENERATE_DATA
        if model_has_vision(self.entry.runtime_data.coordinator.data, self.subentry.data):
            features |= ai_task.AITaskEntityFeature.SUPPORT_ATTACHMENTS
        return features

    async def _async_generate_data(
        self,
        task: ai_task.GenDataTask,
        chat_log: conversation.ChatLog,
    ) -> ai_task.GenDataTaskResult:
        """Handle a generate-data task."""
        options = self.subentry.data
        structure = getattr(task, "structure", None)
        await self._async_handle_chat_log(
            chat_log,
            request_class=options.get(CONF_REQUEST_CLASS, DEFAULT_AI_TASK_CLASS),
            user=f"ai_task:{self.entity_id}",
            structure_name=task.name,
            structure=structure,
            max_tokens=options.get(CONF_MAX_TOKENS, DEFAULT_AI_TASK_MAX_TOKENS),
        )

        last = chat_log.content[-1]
        if not isinstance(last, conversation.AssistantContent):
            raise HomeAssistantError(
                translation_domain=DOMAIN, translation_key="no_answer"
            )
        text = last.content or ""
        if not structure:
            return ai_task.GenDataTaskResult(
                conversation_id=chat_log.conversation_id, data=text
            )
        try:
            data = json_loads(text)
        except JSONDecodeError as err:
            LOGGER.error("The model's answer is not valid JSON: %s", text)
            raise HomeAssistantError(
                translation_domain=DOMAIN, translation_key="invalid_structured_answer"
            ) from err
        return ai_task.GenDataTaskResult(conversation_id=chat_log.conversation_id, data=data)
