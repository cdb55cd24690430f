"""Warm-ups: the server computes an agent's prompt before the next voice command needs it.

Every request of a conversation agent starts with the same system prompt and tools (the
instructions, the exposed entities and areas, the tool schemas): hundreds to thousands of tokens
that a small server takes seconds to compute. The server keeps computed prompts in its prefix
cache, and ``POST /v1/cache/warm`` has it compute one as background work (no answer generated,
never delaying a voice request), so the next turn finds it cached.

An agent warms its prompt when it is added, once Home Assistant has started (before, not every
entity is there yet); when what the prompt says about the home changes (entities exposed to
Assist, their names, aliases and areas), debounced so that a burst of changes sends one
warm-up; and when the server answers again after being unreachable (it may have restarted with
another model); and when an entity appears or goes (one whose integration loads late). Changed
agent options reload the entity, which warms it again. A device in an area gets a prompt of its
own ("You are in area ..."): the devices whose voice turns used the agent are warmed too, and
remembered across reloads and restarts. An agent whose LLM API is for administrators only is
warmed for the last user who used it (a prompt for nobody cannot be built).
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Awaitable, Callable, Coroutine
from typing import TYPE_CHECKING, Any

from homeassistant.components.conversation import DOMAIN as CONVERSATION_DOMAIN
from homeassistant.components.homeassistant.exposed_entities import (
    async_listen_entity_updates,
)
from homeassistant.const import EVENT_STATE_CHANGED
from homeassistant.core import CALLBACK_TYPE, Event, HomeAssistant, callback
from homeassistant.helpers import area_registry as ar
from homeassistant.helpers import device_registry as dr
from homeassistant.helpers import entity_registry as er
from homeassistant.helpers import floor_registry as fr
from homeassistant.helpers.debounce import Debouncer
from homeassistant.helpers.start import async_at_started
from homeassistant.helpers.storage import Store

from .api import CannotConnect, HearthError, NotFound
from .const import DOMAIN, LOGGER

if TYPE_CHECKING:
    from . import HearthConfigEntry

# Seconds from a change to its warm-up; changes within it share one (tests shorten it).
WARM_UP_COOLDOWN = 5.0
# Devices (satellites) warmed besides the device-less prompt, the most recently heard first.
MAX_WARM_DEVICES = 4

# Registry changes that can change what the Assist API's prompt says about the home.
REGISTRY_EVENTS = (
    er.EVENT_ENTITY_REGISTRY_UPDATED,
    ar.EVENT_AREA_REGISTRY_UPDATED,
    dr.EVENT_DEVICE_REGISTRY_UPDATED,
    fr.EVENT_FLOOR_REGISTRY_UPDATED,
)

# Home Assistant ends a prompt that has no date-and-time tool with the time of day: a prompt
# that differs every second, though the cache shares all of it up to that line.
_TIME_OF_DAY = re.compile(r"Current time is [0-9:]+\. Today's date is [0-9-]+\.")


# How long a change of the devices and user heard waits before it is written to storage.
HEARD_SAVE_DELAY = 10.0


def heard_store(hass: HomeAssistant, subentry_id: str) -> Store[dict[str, Any]]:
    """Where an agent's warmer keeps the devices and the user it heard."""
    return Store(hass, 1, f"{DOMAIN}.heard.{subentry_id}")


@callback
def _entity_came_or_went(data: Any) -> bool:
    return data["old_state"] is None or data["new_state"] is None


def prompt_key(body: dict[str, Any]) -> str:
    """What tells two warm-up bodies apart, the time of day left out."""
    return _TIME_OF_DAY.sub("", json.dumps(body, sort_keys=True))


class PromptWarmer:
    """Keeps one conversation agent's prompts warm on the server.

    Changes trigger a rebuild of the warm-up bodies (cheap, in Home Assistant); only a body that
    differs from the one last sent for its device goes to the server, one request at a time.
    """

    def __init__(
        self,
        hass: HomeAssistant,
        entry: HearthConfigEntry,
        build: Callable[[str | None], Awaitable[dict[str, Any] | None]],
        *,
        follow_home: bool,
        store: Store[dict[str, Any]] | None = None,
    ) -> None:
        """Initialize; ``build(device_id)`` returns the warm-up body for a device (or none),
        None when there is nothing to warm yet.

        ``follow_home``: re-warm when exposed entities, the registries or the set of entities
        change (an agent without an LLM API says nothing about the home). ``store``: where the
        devices and the user heard are kept (see ``heard_store``).
        """
        self.hass = hass
        self.entry = entry
        self._build = build
        self._follow_home = follow_home
        self._store = store
        # Devices whose voice turns this agent answered, the most recent last.
        self.devices: dict[str, None] = {}
        # The Home Assistant user of the agent's last turn that named one.
        self.user_id: str | None = None
        # Per device (None: no device), the key of the body last queued or warmed.
        self._wanted: dict[str | None, str] = {}
        self._pending: dict[str | None, tuple[str, dict[str, Any]]] = {}
        self._force = False
        self._started = False  # nothing is warmed before Home Assistant has started
        self._tasks: set[asyncio.Task[None]] = set()
        self._sender: asyncio.Task[None] | None = None
        self._server_up = entry.runtime_data.coordinator.last_update_success
        self._debouncer: Debouncer[Coroutine[Any, Any, None]] = Debouncer(
            hass, LOGGER, cooldown=WARM_UP_COOLDOWN, immediate=False, function=self._async_refresh
        )

    async def async_load(self) -> None:
        """Take back the devices and the user heard before a reload or restart."""
        data = await self._store.async_load() if self._store else None
        if not isinstance(data, dict):
            return
        for device_id in data.get("devices") or ():
            if isinstance(device_id, str):
                self.devices[device_id] = None
        while len(self.devices) > MAX_WARM_DEVICES:
            del self.devices[next(iter(self.devices))]
        if isinstance(user_id := data.get("user_id"), str):
            self.user_id = user_id

    @callback
    def _async_save(self) -> None:
        if self._store is not None:
            self._store.async_delay_save(
                lambda: {"devices": list(self.devices), "user_id": self.user_id},
                HEARD_SAVE_DELAY,
            )

    @callback
    def async_start(self) -> CALLBACK_TYPE:
        """Warm once Home Assistant has started and follow the changes; returns the stop."""
        hass = self.hass
        unsubs = [
            async_at_started(hass, self._async_started),
            self.entry.runtime_data.coordinator.async_add_listener(self._async_server_update),
        ]
        if self._follow_home:
            unsubs.append(
                async_listen_entity_updates(hass, CONVERSATION_DOMAIN, self.async_schedule)
            )
            unsubs += [
                hass.bus.async_listen(event_type, self._async_registry_updated)
                for event_type in REGISTRY_EVENTS
            ]
            # An entity that appears (its integration set up after Home Assistant started) or
            # goes changes the prompt without a registry event.
            unsubs.append(
                hass.bus.async_listen(
                    EVENT_STATE_CHANGED,
                    self._async_registry_updated,
                    event_filter=_entity_came_or_went,
                )
            )

        @callback
        def stop() -> None:
            for unsub in unsubs:
                unsub()
            self._debouncer.async_shutdown()
            for task in (*self._tasks, self._sender):
                if task is not None:
                    task.cancel()

        return stop

    @callback
    def async_schedule(self) -> None:
        """Warm after the cooldown (changes within it share that warm-up)."""
        if self._started:
            self._debouncer.async_schedule_call()

    @callback
    def async_heard(self, device_id: str) -> None:
        """A voice turn from ``device_id`` used this agent: warm its prompt from now on (this
        turn's own prompt is cached by the server as it finishes)."""
        if list(self.devices)[-1:] == [device_id]:
            return
        self.devices.pop(device_id, None)
        self.devices[device_id] = None
        while len(self.devices) > MAX_WARM_DEVICES:
            forgotten = next(iter(self.devices))
            del self.devices[forgotten]
            self._wanted.pop(forgotten, None)
        self._async_save()

    @callback
    def async_used_by(self, user_id: str) -> None:
        """A turn of ``user_id`` used this agent: the user a prompt for administrators only is
        warmed for (warmed now if there was none)."""
        if user_id == self.user_id:
            return
        first, self.user_id = self.user_id is None, user_id
        self._async_save()
        if first:
            self.async_schedule()

    @callback
    def _async_started(self, hass: HomeAssistant) -> None:
        self._started = True
        self._async_refresh_now()

    @callback
    def _async_registry_updated(self, event: Event[Any]) -> None:
        self.async_schedule()

    @callback
    def _async_server_update(self) -> None:
        """Warm again, even an unchanged prompt, when the server answers after an outage."""
        server_up = self.entry.runtime_data.coordinator.last_update_success
        if server_up and not self._server_up and self._started:
            self._force = True
            self._async_refresh_now()
        self._server_up = server_up

    @callback
    def _async_refresh_now(self) -> None:
        task = self.entry.async_create_background_task(
            self.hass, self._async_refresh(), "hearth prompt warm-up"
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _async_refresh(self) -> None:
        """Rebuild the warm-up bodies and queue those that changed."""
        force, self._force = self._force, False
        registry = dr.async_get(self.hass)
        for removed in [d for d in self.devices if registry.async_get(d) is None]:
            del self.devices[removed]  # a device removed from Home Assistant
            self._wanted.pop(removed, None)
        for device_id in (None, *reversed(self.devices)):
            try:
                body = await self._build(device_id)
            except Exception as err:  # a warm-up never breaks the agent, whatever went wrong
                LOGGER.warning("Could not build the prompt to warm up: %s", err)
                return
            if body is None:
                continue
            key = prompt_key(body)
            if not force and self._wanted.get(device_id) == key:
                continue
            self._wanted[device_id] = key
            self._pending[device_id] = (key, body)
        if self._pending and self._sender is None:
            self._sender = self.entry.async_create_background_task(
                self.hass, self._async_send(), "hearth prompt warm-up send"
            )

    async def _async_send(self) -> None:
        """Send the queued warm-ups one after the other (each is prompt computation)."""
        try:
            while self._pending:
                device_id = next(iter(self._pending))
                key, body = self._pending.pop(device_id)
                if not await self._async_warm(body) and self._wanted.get(device_id) == key:
                    del self._wanted[device_id]  # not warmed: the next change tries again
        finally:
            self._sender = None

    async def _async_warm(self, body: dict[str, Any]) -> bool:
        client = self.entry.runtime_data.client
        try:
            result = await client.async_warm(body)
        except NotFound as err:
            LOGGER.debug("The Hearth server offers no warm-ups (an older version): %s", err)
        except CannotConnect as err:
            LOGGER.debug("Could not warm the prompt up, server unreachable: %s", err)
        except HearthError as err:
            LOGGER.warning("The Hearth server could not warm the prompt up: %s", err)
        else:
            LOGGER.debug(
                "Warmed a %s prompt of %s tokens (%s computed) in %s s",
                result.get("class"),
                result.get("prompt_tokens"),
                result.get("computed_tokens"),
                result.get("seconds"),
            )
            return True
        return False
