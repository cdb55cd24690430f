"""Follows the Hearth server's queue health.

A server whose /health features name ``queue_events`` pushes it: the coordinator keeps one
connection to ``/v1/queue/events`` and hands each event to the entities as it comes (the server
sends the document on connecting and then only when it changed, at most once a second), like
Home Assistant core's push coordinators (no update interval). When the stream drops, one
``GET /v1/queue`` says whether the server is still there (the entities go unavailable if not, and
a refused key starts re-authentication) before it reconnects with exponential back-off. Older
servers are polled every ``QUEUE_POLL_INTERVAL`` seconds instead.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterable
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from homeassistant.core import HomeAssistant, callback
from homeassistant.exceptions import ConfigEntryAuthFailed
from homeassistant.helpers.update_coordinator import DataUpdateCoordinator, UpdateFailed

from .api import HearthClient, HearthError, InvalidAuth, NotFound
from .const import (
    DOMAIN,
    EVENTS_BACKOFF_MAX,
    EVENTS_BACKOFF_MIN,
    EVENTS_RETRY_UNSUPPORTED,
    LOGGER,
    QUEUE_EVENTS_FEATURE,
    QUEUE_POLL_INTERVAL,
)
from .issues import async_check_models, async_check_step_downs
from .worker import failed_workers

if TYPE_CHECKING:
    from . import HearthConfigEntry

POLL_INTERVAL = timedelta(seconds=QUEUE_POLL_INTERVAL)


class HearthQueueCoordinator(DataUpdateCoordinator[dict[str, Any]]):
    """Queue health (the ``GET /v1/queue`` document) for the sensors: pushed, or polled."""

    config_entry: HearthConfigEntry

    def __init__(
        self,
        hass: HomeAssistant,
        entry: HearthConfigEntry,
        client: HearthClient,
        features: Iterable[str] = (),
    ) -> None:
        """Initialize the coordinator; ``features``: those the server's /health names."""
        self.push = QUEUE_EVENTS_FEATURE in features
        super().__init__(
            hass,
            LOGGER,
            config_entry=entry,
            name=f"{DOMAIN} queue",
            update_interval=None if self.push else POLL_INTERVAL,
        )
        self.client = client
        # Whether the queue stream is open now.
        self.connected = False
        # The models whose worker had failed at the last update: warned about once.
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
        self._async_read(data)
        return data

    @callback
    def _async_read(self, data: dict[str, Any]) -> None:
        """What every new document is checked for, pushed or polled."""
        self._warn_failed_workers(data)
        async_check_models(self.hass, self.config_entry, self.client.url, data)
        async_check_step_downs(self.hass, self.config_entry, data)

    @callback
    def async_start(self) -> None:
        """Follow the server's queue stream (when it has one) until the entry unloads."""
        if self.push:
            self.config_entry.async_create_background_task(
                self.hass,
                self._async_follow(),
                name=f"hearth queue stream {self.config_entry.entry_id}",
            )

    async def _async_follow(self) -> None:
        backoff = EVENTS_BACKOFF_MIN
        while True:
            try:
                await self._async_read_stream()
            except NotFound:
                # The server no longer offers the stream (an older one at the same address):
                # poll, and look for the stream again later.
                LOGGER.debug("%s has no queue stream; polling", self.client.url)
                self.connected = False
                self.update_interval = POLL_INTERVAL
                await self.async_refresh()
                await asyncio.sleep(EVENTS_RETRY_UNSUPPORTED)
                self.update_interval = None
                continue
            except HearthError as err:
                LOGGER.debug("Hearth queue stream interrupted: %s", err)
            if self.connected:
                backoff = EVENTS_BACKOFF_MIN
            self.connected = False
            # Is the server still there? (A refused key starts re-authentication here.)
            await self.async_refresh()
            await asyncio.sleep(backoff * random.uniform(0.8, 1.2))
            backoff = min(backoff * 2, EVENTS_BACKOFF_MAX)

    async def _async_read_stream(self) -> None:
        async for event in self.client.async_queue_events(on_open=self._async_opened):
            if event.event != "queue":
                continue
            try:
                data = event.json()
            except ValueError:
                LOGGER.debug("Skipping a queue event that is not JSON: %s", event.data)
                continue
            if isinstance(data, dict):
                if not self.last_update_success:  # as a refresh that succeeds again logs
                    self.logger.info("Fetching %s data recovered", self.name)
                self._async_read(data)
                self.async_set_updated_data(data)

    @callback
    def _async_opened(self) -> None:
        self.connected = True

    def _warn_failed_workers(self, data: dict[str, Any]) -> None:
        """Log once when a model's worker fails (and once when it serves again), not on
        every update."""
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
