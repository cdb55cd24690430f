"""Sub-entry flows of the Hearth integration: a conversation agent's or an AI Task's options."""

from __future__ import annotations

from typing import Any

from homeassistant.config_entries import ConfigEntryState, ConfigSubentryFlow, SubentryFlowResult
from homeassistant.const import CONF_LLM_HASS_API, CONF_NAME
from homeassistant.core import HomeAssistant
from homeassistant.helpers import llm
from homeassistant.helpers.selector import (
    BooleanSelector,
    NumberSelector,
    NumberSelectorConfig,
    NumberSelectorMode,
    SelectOptionDict,
    SelectSelector,
    SelectSelectorConfig,
    SelectSelectorMode,
    TemplateSelector,
)
from homeassistant.helpers.typing import VolDictType

from .compat import vol
from .const import (
    CLASS_POLICY_AUTO,
    CONF_CLASS_POLICY,
    CONF_CONFIRM_ACTIONS,
    CONF_HOLD_AFTER,
    CONF_HOLD_PHRASE,
    CONF_MAX_HISTORY,
    CONF_MAX_TOKENS,
    CONF_MODEL,
    CONF_PROMPT,
    CONF_REQUEST_CLASS,
    CONF_TEMPERATURE,
    DEFAULT_AI_TASK_NAME,
    DEFAULT_CONVERSATION_NAME,
    DEFAULT_HOLD_AFTER,
    DEFAULT_HOLD_PHRASE,
    GENERATION_CLASSES,
    MODEL_CLASS_DEFAULT,
    RECOMMENDED_AI_TASK_OPTIONS,
    RECOMMENDED_CONVERSATION_OPTIONS,
)


class HearthSubentryFlowHandler(ConfigSubentryFlow):
    """Add or change a conversation agent or an AI Task entity."""

    @property
    def _is_new(self) -> bool:
        return self.source == "user"

    async def async_step_set_options(
        self, user_input: dict[str, Any] | None = None
    ) -> SubentryFlowResult:
        """Show and store the options."""
        if self._get_entry().state is not ConfigEntryState.LOADED:
            return self.async_abort(reason="entry_not_loaded")

        if user_input is not None:
            data = _clean_options(self._subentry_type, user_input)
            if self._is_new:
                return self.async_create_entry(title=data.pop(CONF_NAME), data=data)
            return self.async_update_and_abort(
                self._get_entry(), self._get_reconfigure_subentry(), data=data
            )

        if self._is_new:
            options: dict[str, Any] = dict(
                RECOMMENDED_AI_TASK_OPTIONS
                if self._subentry_type == "ai_task_data"
                else RECOMMENDED_CONVERSATION_OPTIONS
            )
        else:
            options = dict(self._get_reconfigure_subentry().data)
        # The server's models, as its last queue poll listed them (and the one picked before,
        # should the server no longer serve it).
        served = (self._get_entry().runtime_data.coordinator.data or {}).get("models") or {}
        models = [*served, *([options[CONF_MODEL]] if options.get(CONF_MODEL) else [])]
        return self.async_show_form(
            step_id="set_options",
            data_schema=self.add_suggested_values_to_schema(
                vol.Schema(
                    _options_schema(self.hass, self._subentry_type, self._is_new, models)
                ),
                _valid_api_selection(self.hass, options),
            ),
        )

    async_step_user = async_step_set_options
    async_step_reconfigure = async_step_set_options


def _valid_api_selection(hass: HomeAssistant, options: dict[str, Any]) -> dict[str, Any]:
    """Drop LLM APIs that no longer exist from the suggested values."""
    selected = options.get(CONF_LLM_HASS_API)
    if selected:
        if isinstance(selected, str):
            selected = [selected]
        valid = {api.id for api in llm.async_get_apis(hass)}
        options[CONF_LLM_HASS_API] = [api for api in selected if api in valid]
    return options


def _clean_options(subentry_type: str, user_input: dict[str, Any]) -> dict[str, Any]:
    data = dict(user_input)
    if not data.get(CONF_LLM_HASS_API):
        data.pop(CONF_LLM_HASS_API, None)
    if data.get(CONF_MODEL) in (None, "", MODEL_CLASS_DEFAULT):
        data.pop(CONF_MODEL, None)  # left to the server: each class's own model
    for key in (CONF_MAX_TOKENS, CONF_MAX_HISTORY):
        if data.get(key) is not None:
            data[key] = int(data[key])
    for key in (CONF_TEMPERATURE, CONF_HOLD_AFTER):
        if data.get(key) is not None:
            data[key] = float(data[key])
    return data


def _options_schema(
    hass: HomeAssistant, subentry_type: str, is_new: bool, models: list[str]
) -> VolDictType:
    schema: VolDictType = {}
    if is_new:
        default_name = (
            DEFAULT_AI_TASK_NAME if subentry_type == "ai_task_data" else DEFAULT_CONVERSATION_NAME
        )
        schema[vol.Required(CONF_NAME, default=default_name)] = str
    choices = [MODEL_CLASS_DEFAULT, *dict.fromkeys(m for m in models if m != MODEL_CLASS_DEFAULT)]
    schema[vol.Required(CONF_MODEL, default=MODEL_CLASS_DEFAULT)] = SelectSelector(
        SelectSelectorConfig(
            options=choices, translation_key="model", mode=SelectSelectorMode.DROPDOWN
        )
    )

    max_tokens = NumberSelector(
        NumberSelectorConfig(min=1, max=32768, step=1, mode=NumberSelectorMode.BOX)
    )
    if subentry_type == "ai_task_data":
        schema[vol.Required(CONF_REQUEST_CLASS)] = SelectSelector(
            SelectSelectorConfig(
                options=list(GENERATION_CLASSES),
                translation_key="request_class",
                mode=SelectSelectorMode.DROPDOWN,
            )
        )
        schema[vol.Required(CONF_MAX_TOKENS)] = max_tokens
        return schema

    schema.update(
        {
            vol.Optional(CONF_PROMPT): TemplateSelector(),
            vol.Optional(CONF_LLM_HASS_API): SelectSelector(
                SelectSelectorConfig(
                    options=[
                        SelectOptionDict(label=api.name, value=api.id)
                        for api in llm.async_get_apis(hass)
                    ],
                    multiple=True,
                )
            ),
            vol.Required(CONF_MAX_TOKENS): max_tokens,
            vol.Required(CONF_TEMPERATURE): NumberSelector(
                NumberSelectorConfig(min=0, max=2, step=0.05, mode=NumberSelectorMode.SLIDER)
            ),
            vol.Required(CONF_MAX_HISTORY): NumberSelector(
                NumberSelectorConfig(min=0, max=1000, step=1, mode=NumberSelectorMode.BOX)
            ),
            vol.Required(CONF_CONFIRM_ACTIONS, default=True): BooleanSelector(),
            vol.Required(CONF_HOLD_PHRASE, default=DEFAULT_HOLD_PHRASE): BooleanSelector(),
            vol.Required(CONF_HOLD_AFTER, default=DEFAULT_HOLD_AFTER): NumberSelector(
                NumberSelectorConfig(
                    min=0.5, max=30, step=0.5, mode=NumberSelectorMode.BOX,
                    unit_of_measurement="s",
                )
            ),
            vol.Required(CONF_CLASS_POLICY, default=CLASS_POLICY_AUTO): SelectSelector(
                SelectSelectorConfig(
                    options=[CLASS_POLICY_AUTO, *GENERATION_CLASSES],
                    translation_key="class_policy",
                    mode=SelectSelectorMode.DROPDOWN,
                )
            ),
        }
    )
    return schema
