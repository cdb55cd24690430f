"""Config flow for the Hearth integration."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import voluptuous as vol
from homeassistant.config_entries import (
    ConfigEntry,
    ConfigEntryState,
    ConfigFlow,
    ConfigFlowResult,
    ConfigSubentryFlow,
    SubentryFlowResult,
)
from homeassistant.const import CONF_API_KEY, CONF_LLM_HASS_API, CONF_NAME, CONF_URL
from homeassistant.core import HomeAssistant, callback
from homeassistant.helpers import config_validation as cv
from homeassistant.helpers import llm
from homeassistant.helpers.aiohttp_client import async_get_clientsession
from homeassistant.helpers.selector import (
    NumberSelector,
    NumberSelectorConfig,
    NumberSelectorMode,
    SelectOptionDict,
    SelectSelector,
    SelectSelectorConfig,
    SelectSelectorMode,
    TemplateSelector,
    TextSelector,
    TextSelectorConfig,
    TextSelectorType,
)
from homeassistant.helpers.service_info.hassio import HassioServiceInfo
from homeassistant.helpers.typing import VolDictType

from .api import CannotConnect, HearthClient, HearthError, InvalidAuth, normalize_url
from .const import (
    CLASS_POLICY_AUTO,
    CONF_CLASS_POLICY,
    CONF_MAX_HISTORY,
    CONF_MAX_TOKENS,
    CONF_MODEL,
    CONF_PROMPT,
    CONF_REQUEST_CLASS,
    CONF_TEMPERATURE,
    DEFAULT_AI_TASK_NAME,
    DEFAULT_CONVERSATION_NAME,
    DEFAULT_NAME,
    DOMAIN,
    GENERATION_CLASSES,
    LOGGER,
    MODEL_CLASS_DEFAULT,
    RECOMMENDED_AI_TASK_OPTIONS,
    RECOMMENDED_CONVERSATION_OPTIONS,
)

DEFAULT_URL = "http://127.0.0.1:8080"


def _connection_schema(url: str | None = None) -> vol.Schema:
    return vol.Schema(
        {
            vol.Required(CONF_URL, default=url or DEFAULT_URL): TextSelector(
                TextSelectorConfig(type=TextSelectorType.URL)
            ),
            vol.Optional(CONF_API_KEY): TextSelector(
                TextSelectorConfig(type=TextSelectorType.PASSWORD)
            ),
        }
    )


STEP_REAUTH_SCHEMA = vol.Schema(
    {
        vol.Optional(CONF_API_KEY): TextSelector(
            TextSelectorConfig(type=TextSelectorType.PASSWORD)
        ),
    }
)


async def _async_validate(hass: HomeAssistant, url: str, api_key: str | None) -> dict[str, str]:
    """Check the server; return form errors (empty when it is ready and takes the key)."""
    client = HearthClient(async_get_clientsession(hass), url, api_key)
    try:
        await client.async_validate()
    except InvalidAuth:
        return {"base": "invalid_auth"}
    except CannotConnect:
        return {"base": "cannot_connect"}
    except HearthError:
        LOGGER.exception("Unexpected answer from the Hearth server at %s", url)
        return {"base": "unknown"}
    return {}


def _entry_data(url: str, api_key: str | None) -> dict[str, Any]:
    data: dict[str, Any] = {CONF_URL: url}
    if api_key:
        data[CONF_API_KEY] = api_key
    return data


def _default_subentries() -> list[dict[str, Any]]:
    return [
        {
            "subentry_type": "conversation",
            "data": dict(RECOMMENDED_CONVERSATION_OPTIONS),
            "title": DEFAULT_CONVERSATION_NAME,
            "unique_id": None,
        },
        {
            "subentry_type": "ai_task_data",
            "data": dict(RECOMMENDED_AI_TASK_OPTIONS),
            "title": DEFAULT_AI_TASK_NAME,
            "unique_id": None,
        },
    ]


class HearthConfigFlow(ConfigFlow, domain=DOMAIN):
    """Set up a Hearth server: by URL, or discovered as a Supervisor add-on."""

    VERSION = 1
    MINOR_VERSION = 1

    def __init__(self) -> None:
        """Initialize the flow."""
        self._discovered: dict[str, Any] = {}
        self._addon_name = DEFAULT_NAME

    async def async_step_user(
        self, user_input: dict[str, Any] | None = None
    ) -> ConfigFlowResult:
        """Ask for the server's URL and optional API key."""
        errors: dict[str, str] = {}
        if user_input is not None:
            try:
                url = normalize_url(cv.url(user_input[CONF_URL]))
            except vol.Invalid:
                errors[CONF_URL] = "invalid_url"
            else:
                self._async_abort_entries_match({CONF_URL: url})
                api_key = user_input.get(CONF_API_KEY)
                errors = await _async_validate(self.hass, url, api_key)
                if not errors:
                    return self.async_create_entry(
                        title=DEFAULT_NAME,
                        data=_entry_data(url, api_key),
                        subentries=_default_subentries(),
                    )
        return self.async_show_form(
            step_id="user",
            data_schema=self.add_suggested_values_to_schema(_connection_schema(), user_input),
            errors=errors,
        )

    async def async_step_hassio(
        self, discovery_info: HassioServiceInfo
    ) -> ConfigFlowResult:
        """Handle the Hearth add-on announced by the Supervisor."""
        config = discovery_info.config
        url = normalize_url(f"http://{config['host']}:{config['port']}")
        data = _entry_data(url, config.get(CONF_API_KEY))

        await self.async_set_unique_id(discovery_info.uuid)
        # Known add-on: follow it to its new address (the entry's update listener reloads it).
        self._abort_if_unique_id_configured(updates=data, reload_on_update=False)
        # Already set up by hand at the same address.
        self._async_abort_entries_match({CONF_URL: url})

        self._discovered = data
        self._addon_name = discovery_info.name or DEFAULT_NAME
        self.context["title_placeholders"] = {"name": self._addon_name}
        return await self.async_step_hassio_confirm()

    async def async_step_hassio_confirm(
        self, user_input: dict[str, Any] | None = None
    ) -> ConfigFlowResult:
        """Let the user confirm the discovered add-on before anything is created."""
        errors: dict[str, str] = {}
        if user_input is not None:
            errors = await _async_validate(
                self.hass, self._discovered[CONF_URL], self._discovered.get(CONF_API_KEY)
            )
            if not errors:
                return self.async_create_entry(
                    title=self._addon_name,
                    data=self._discovered,
                    subentries=_default_subentries(),
                )
        return self.async_show_form(
            step_id="hassio_confirm",
            description_placeholders={"addon": self._addon_name},
            errors=errors,
        )

    async def async_step_reauth(
        self, entry_data: Mapping[str, Any]
    ) -> ConfigFlowResult:
        """The server refused the API key."""
        return await self.async_step_reauth_confirm()

    async def async_step_reauth_confirm(
        self, user_input: dict[str, Any] | None = None
    ) -> ConfigFlowResult:
        """Ask for a new API key."""
        entry = self._get_reauth_entry()
        errors: dict[str, str] = {}
        if user_input is not None:
            api_key = user_input.get(CONF_API_KEY)
            errors = await _async_validate(self.hass, entry.data[CONF_URL], api_key)
            if not errors:
                return self._async_update_and_reload(
                    entry, _entry_data(entry.data[CONF_URL], api_key)
                )
        return self.async_show_form(
            step_id="reauth_confirm",
            data_schema=STEP_REAUTH_SCHEMA,
            description_placeholders={"url": entry.data[CONF_URL]},
            errors=errors,
        )

    async def async_step_reconfigure(
        self, user_input: dict[str, Any] | None = None
    ) -> ConfigFlowResult:
        """Change the server's URL or API key."""
        entry = self._get_reconfigure_entry()
        errors: dict[str, str] = {}
        if user_input is not None:
            try:
                url = normalize_url(cv.url(user_input[CONF_URL]))
            except vol.Invalid:
                errors[CONF_URL] = "invalid_url"
            else:
                for other in self._async_current_entries(include_ignore=False):
                    if other.entry_id != entry.entry_id and other.data.get(CONF_URL) == url:
                        return self.async_abort(reason="already_configured")
                api_key = user_input.get(CONF_API_KEY)
                errors = await _async_validate(self.hass, url, api_key)
                if not errors:
                    return self._async_update_and_reload(entry, _entry_data(url, api_key))
        suggested = user_input or {
            CONF_URL: entry.data[CONF_URL],
            CONF_API_KEY: entry.data.get(CONF_API_KEY, ""),
        }
        return self.async_show_form(
            step_id="reconfigure",
            data_schema=self.add_suggested_values_to_schema(
                _connection_schema(entry.data[CONF_URL]), suggested
            ),
            errors=errors,
        )

    def _async_update_and_reload(
        self, entry: ConfigEntry, data: dict[str, Any]
    ) -> ConfigFlowResult:
        """Store the new connection data and have the entry set up again with it.

        A loaded entry is reloaded by its update listener. An entry whose set-up failed
        (a refused key, an unreachable URL) registered none: the flow reloads it itself,
        so its agents and sensors come back without a restart.
        """
        if entry.update_listeners:
            return self.async_update_and_abort(entry, data=data)
        return self.async_update_reload_and_abort(entry, data=data)

    @classmethod
    @callback
    def async_get_supported_subentry_types(
        cls, config_entry: ConfigEntry
    ) -> dict[str, type[ConfigSubentryFlow]]:
        """Return the subentries Hearth supports."""
        return {
            "conversation": HearthSubentryFlowHandler,
            "ai_task_data": HearthSubentryFlowHandler,
        }


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
    if data.get(CONF_TEMPERATURE) is not None:
        data[CONF_TEMPERATURE] = float(data[CONF_TEMPERATURE])
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
