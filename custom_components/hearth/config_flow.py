"""Config flow for the Hearth integration."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from homeassistant.config_entries import (
    SOURCE_HASSIO,
    ConfigEntry,
    ConfigFlow,
    ConfigFlowResult,
    ConfigSubentryData,
    ConfigSubentryFlow,
)
from homeassistant.const import CONF_API_KEY, CONF_URL
from homeassistant.core import HomeAssistant, callback
from homeassistant.helpers import config_validation as cv
from homeassistant.helpers.aiohttp_client import async_get_clientsession
from homeassistant.helpers.selector import (
    TextSelector,
    TextSelectorConfig,
    TextSelectorType,
)
from homeassistant.helpers.service_info.hassio import HassioServiceInfo

from .api import (
    CannotConnect,
    HearthClient,
    HearthError,
    InvalidAuth,
    normalize_url,
    server_id,
)
from .compat import vol
from .const import (
    DEFAULT_AI_TASK_NAME,
    DEFAULT_CONVERSATION_NAME,
    DEFAULT_NAME,
    DOMAIN,
    LOGGER,
    RECOMMENDED_AI_TASK_OPTIONS,
    RECOMMENDED_CONVERSATION_OPTIONS,
)
from .subentry_flow import HearthSubentryFlowHandler

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


async def _async_validate(
    hass: HomeAssistant, url: str, api_key: str | None
) -> tuple[dict[str, str], dict[str, Any]]:
    """Check the server; return form errors (empty when it is ready and takes the key) and
    its /health."""
    client = HearthClient(async_get_clientsession(hass), url, api_key)
    try:
        health = await client.async_validate()
    except InvalidAuth:
        return {"base": "invalid_auth"}, {}
    except CannotConnect:
        return {"base": "cannot_connect"}, {}
    except HearthError:
        LOGGER.exception("Unexpected answer from the Hearth server at %s", url)
        return {"base": "unknown"}, {}
    return {}, health


def _entry_data(url: str, api_key: str | None) -> dict[str, Any]:
    data: dict[str, Any] = {CONF_URL: url}
    if api_key:
        data[CONF_API_KEY] = api_key
    return data


def _default_subentries() -> list[ConfigSubentryData]:
    return [
        ConfigSubentryData(
            subentry_type="conversation",
            data=dict(RECOMMENDED_CONVERSATION_OPTIONS),
            title=DEFAULT_CONVERSATION_NAME,
            unique_id=None,
        ),
        ConfigSubentryData(
            subentry_type="ai_task_data",
            data=dict(RECOMMENDED_AI_TASK_OPTIONS),
            title=DEFAULT_AI_TASK_NAME,
            unique_id=None,
        ),
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
                errors, health = await _async_validate(self.hass, url, api_key)
                if not errors:
                    # The same server under another address (or discovered as the add-on).
                    if found := server_id(health):
                        await self.async_set_unique_id(found)
                        self._abort_if_unique_id_configured()
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

        # The server's own id, where it answers and says one: the same server set up by hand
        # at another address is then known too.
        _, health = await _async_validate(self.hass, url, data.get(CONF_API_KEY))
        found = server_id(health)
        for unique_id in (discovery_info.uuid, found):
            known = unique_id and self.hass.config_entries.async_entry_for_domain_unique_id(
                DOMAIN, unique_id
            )
            if known:
                if known.source == SOURCE_HASSIO or unique_id == discovery_info.uuid:
                    self._async_follow_addon(known, data)
                return self.async_abort(reason="already_configured")
        await self.async_set_unique_id(found or discovery_info.uuid)
        # Already set up by hand at the same address (a server that says no id).
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
            errors, _ = await _async_validate(
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
            errors, _ = await _async_validate(self.hass, entry.data[CONF_URL], api_key)
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
                errors, _ = await _async_validate(self.hass, url, api_key)
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

    @callback
    def _async_follow_addon(self, entry: ConfigEntry, data: dict[str, Any]) -> None:
        """The entry made from the add-on's discovery follows it to its new address (reloaded
        by its listener, or here when its set-up had failed). An entry set up by hand is not
        passed here: it keeps the address its user chose."""
        if dict(entry.data) == data:
            return
        self.hass.config_entries.async_update_entry(entry, data=data)
        if not entry.update_listeners:
            self.hass.config_entries.async_schedule_reload(entry.entry_id)

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
