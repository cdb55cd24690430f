"""The Hearth integration: a local LLM server shared by the household."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from homeassistant.config_entries import ConfigEntry
from homeassistant.const import CONF_API_KEY, CONF_URL, Platform
from homeassistant.core import HomeAssistant
from homeassistant.exceptions import ConfigEntryAuthFailed, ConfigEntryNotReady
from homeassistant.helpers import config_validation as cv
from homeassistant.helpers import device_registry as dr
from homeassistant.helpers.aiohttp_client import async_get_clientsession
from homeassistant.helpers.typing import ConfigType

from .api import HearthClient, HearthError, InvalidAuth, NotReady, server_id
from .const import DOMAIN, LOGGER
from .coordinator import HearthQueueCoordinator
from .entity import server_device_info
from .issues import async_clear_issues
from .jobs import HearthJobWatcher, pending_store
from .services import async_setup_services
from .warm import heard_store

PLATFORMS = (
    Platform.AI_TASK,
    Platform.BINARY_SENSOR,
    Platform.CONVERSATION,
    Platform.SENSOR,
)

CONFIG_SCHEMA = cv.config_entry_only_config_schema(DOMAIN)


@dataclass(slots=True)
class HearthData:
    """What a loaded Hearth entry holds."""

    client: HearthClient
    coordinator: HearthQueueCoordinator
    jobs: HearthJobWatcher
    health: dict[str, Any]
    server_device_id: str = ""


HearthConfigEntry = ConfigEntry[HearthData]


async def async_setup(hass: HomeAssistant, config: ConfigType) -> bool:
    """Set up the Hearth actions."""
    async_setup_services(hass)
    return True


# Setup and unload return a boolean: Home Assistant 2026.2 (the oldest release supported) fails
# an entry whose setup returns None; newer releases accept both from custom integrations.
async def async_setup_entry(hass: HomeAssistant, entry: HearthConfigEntry) -> bool:
    """Set up Hearth from a config entry."""
    client = HearthClient(
        async_get_clientsession(hass), entry.data[CONF_URL], entry.data.get(CONF_API_KEY)
    )
    try:
        health = await client.async_validate()
    except InvalidAuth as err:
        raise ConfigEntryAuthFailed(
            translation_domain=DOMAIN, translation_key="invalid_auth"
        ) from err
    except NotReady as err:
        # The server is up and loading its model. No retry_after: Home Assistant 2026.11 reads
        # it as the least wait before the next try (its back-off stays the floor), so it could
        # only delay the retry; the back-off starts at 5 s.
        raise ConfigEntryNotReady(
            translation_domain=DOMAIN, translation_key="model_loading"
        ) from err
    except HearthError as err:
        raise ConfigEntryNotReady(
            translation_domain=DOMAIN,
            translation_key="cannot_connect",
            translation_placeholders={"url": client.url, "error": str(err)},
        ) from err

    _async_adopt_server_id(hass, entry, health)
    coordinator = HearthQueueCoordinator(hass, entry, client, health.get("features") or ())
    await coordinator.async_config_entry_first_refresh()

    jobs = HearthJobWatcher(hass, entry, client)
    await jobs.async_load()
    entry.runtime_data = HearthData(client, coordinator, jobs, health)
    # The server's device first: the agents' devices hang off it.
    entry.runtime_data.server_device_id = (
        dr.async_get(hass)
        .async_get_or_create(config_entry_id=entry.entry_id, **server_device_info(entry))
        .id
    )

    await hass.config_entries.async_forward_entry_setups(entry, PLATFORMS)
    jobs.async_start()
    coordinator.async_start()
    entry.async_on_unload(entry.add_update_listener(_async_update_listener))
    LOGGER.debug("Hearth at %s serves %s", client.url, health.get("model"))
    return True


async def async_unload_entry(hass: HomeAssistant, entry: HearthConfigEntry) -> bool:
    """Unload a config entry; the job watcher's task is cancelled with it."""
    unloaded = await hass.config_entries.async_unload_platforms(entry, PLATFORMS)
    if unloaded:
        await entry.runtime_data.jobs.async_save()
    return unloaded


async def async_remove_entry(hass: HomeAssistant, entry: HearthConfigEntry) -> None:
    """Forget the entry's unfinished jobs and its repair issues with it."""
    await pending_store(hass, entry.entry_id).async_remove()
    for subentry_id in entry.subentries:
        await heard_store(hass, subentry_id).async_remove()
    async_clear_issues(hass, entry.entry_id)


async def _async_update_listener(hass: HomeAssistant, entry: HearthConfigEntry) -> None:
    """Reload when the entry or its subentries change."""
    await hass.config_entries.async_reload(entry.entry_id)


def _async_adopt_server_id(
    hass: HomeAssistant, entry: HearthConfigEntry, health: dict[str, Any]
) -> None:
    """Identify the entry by the id its server gives itself, so the same server is not added
    again at another address or by discovery (entries made before servers said one)."""
    found = server_id(health)
    if not found or entry.unique_id == found:
        return
    if hass.config_entries.async_entry_for_domain_unique_id(DOMAIN, found) is None:
        hass.config_entries.async_update_entry(entry, unique_id=found)
