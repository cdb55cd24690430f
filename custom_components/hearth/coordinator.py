"""Polls the Hearth server's queue health."""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any

from homeassistant.core import HomeAssistant
from homeassistant.exceptions import ConfigEntryAuthFailed
from homeassistant.helpers.update_coordinator import DataUpdateCoordinator, UpdateFailed

from .api import HearthClient, HearthError, InvalidAuth
from .const import DOMAIN, LOGGER, QUEUE_SCAN_INTERVAL
from .issues import async_check_models
from .worker import failed_workers

if TYPE_CHECKING:
    from . import HearthConfigEntry


class HearthQueueCoordinator(DataUpdateCoordinator[dict[str, Any]]):
    """Fetches ``GET /v1/queue`` for the sensors."""

    config_entry: HearthConfigEntry

    def __init__(
        self, hass: HomeAssistant, entry: HearthConfigEntry, client: HearthClient
    ) -> None:
        """Initialize the coordinator."""
        super().__init__(
            hass,
            LOGGER,
            config_entry=entry,
            name=f"{DOMAIN} queue",
            update_interval=timedelta(seconds=QUEUE_SCAN_INTERVAL),
        )
        self.client = client
        # The models whose worker had failed at the last poll: warned about once.
        self.failed_workers: set[str] = set()

    async def _async_update_data(self) -> dict[str, Any]:
        try:
            data = await self.client.async_queue()
        except InvalidAuth as err:
            raise ConfigEntryAuthFailed(
                translation_domain=DOMAIN, translation_key="invalid_auth"
            ) from err
        except HearthError as err:
            raise UpdateFailed(
                translation_domain=DOMAIN,
                translation_key="cannot_connect",
                translation_placeholders={"url": self.client.url, "error": str(err)},
            ) from err
        self._warn_failed_workers(data)
        async_check_models(self.hass, self.config_entry, self.client.url, data)
        return data

    def _warn_failed_workers(self, data: dict[str, Any]) -> None:
        """Log once when a model's worker fails (and once when it serves again), not on
        every poll."""
        failed = failed_workers(data)
        for model in sorted(failed.keys() - self.failed_workers):
            LOGGER.warning(
                "The worker process of model %s on the Hearth server at %s failed (%s); "
                "the server keeps trying to restart it",
                model, self.client.url, failed[model],
            )
        for model in sorted(self.failed_workers - failed.keys()):
            LOGGER.info("The worker process of model %s on the Hearth server at %s is no "
                        "longer failed", model, self.client.url)
        self.failed_workers = set(failed)
