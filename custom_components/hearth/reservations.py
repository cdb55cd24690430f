"""The wake word as a signal: a satellite that starts listening reserves the server.

An Assist satellite's entity goes ``listening`` when its wake word is heard, seconds before the
conversation agent gets the text (speech to text runs in between). For the satellites whose
pipeline's conversation agent is this Hearth agent, that moment is passed on to servers whose
/health features name ``reservation`` (``POST /v1/reservations``): for a few seconds the server
starts no lower-class work on the agent's model and computes the agent's prompt (its warm-up
body) as voice work, so the turn finds both the model free and its prompt cached. The server
ends a reservation when the voice request arrives (the ``X-Hearth-Satellite`` header names the
satellite) or when it expires; one whose turn never came (the satellite went back to idle) is
ended here.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from typing import TYPE_CHECKING, Any

from homeassistant.const import EVENT_STATE_CHANGED
from homeassistant.core import CALLBACK_TYPE, Event, HomeAssistant, callback
from homeassistant.helpers import entity_registry as er

from .api import CannotConnect, HearthError, NotFound
from .const import LOGGER, RESERVATION_FEATURE

if TYPE_CHECKING:
    from . import HearthConfigEntry

SATELLITE_DOMAIN = "assist_satellite"
PIPELINE_DOMAIN = "assist_pipeline"
LISTENING = "listening"
# The states of a turn under way: a reservation not used by the time the satellite leaves them
# is ended.
TURN_STATES = frozenset({LISTENING, "processing"})
PREFERRED = "preferred"  # the pipeline select's option for the preferred pipeline


@callback
def _is_satellite(data: Any) -> bool:
    return str(data["entity_id"]).startswith(f"{SATELLITE_DOMAIN}.")


@callback
def satellite_pipeline_id(hass: HomeAssistant, satellite_id: str) -> str | None:
    """The id of the pipeline the satellite runs next, as its pipeline select names it; None
    for the preferred pipeline (no select, or "preferred", or a name no pipeline has)."""
    from homeassistant.components import assist_pipeline

    component = hass.data.get(SATELLITE_DOMAIN)
    satellite = component.get_entity(satellite_id) if component is not None else None
    select_id = getattr(satellite, "pipeline_entity_id", None)
    if not select_id or (state := hass.states.get(select_id)) is None:
        return None
    if state.state == PREFERRED:
        return None
    return next(
        (p.id for p in assist_pipeline.async_get_pipelines(hass) if p.name == state.state), None
    )


@callback
def satellite_agent(hass: HomeAssistant, satellite_id: str) -> str | None:
    """The conversation agent (an entity id, or a config entry id for agents registered by
    entry) of the pipeline the satellite runs next; None without pipelines."""
    if PIPELINE_DOMAIN not in hass.config.components:
        return None
    from homeassistant.components import assist_pipeline

    try:
        pipeline = assist_pipeline.async_get_pipeline(
            hass, satellite_pipeline_id(hass, satellite_id)
        )
    except Exception:  # no such pipeline (each release raises its own): no agent
        return None
    engine = getattr(pipeline, "conversation_engine", None)
    return engine if isinstance(engine, str) else None


class _Held:
    """One reservation: asked for, then (once the server answered) known by its id."""

    __slots__ = ("id",)

    def __init__(self) -> None:
        self.id: str | None = None


class SatelliteReservations:
    """Reserves the server when a satellite that uses one Hearth agent hears its wake word."""

    def __init__(
        self,
        hass: HomeAssistant,
        entry: HearthConfigEntry,
        agent_id: str,
        *,
        model: str | None,
        build: Callable[[str | None], Awaitable[dict[str, Any] | None]],
        by_entry: bool = False,
    ) -> None:
        """``agent_id``: the agent's entity id; ``by_entry``: a pipeline naming the config
        entry means this agent too (it is the entry's only one). ``build(device_id)``: the
        warm-up body of the agent's prompt for a satellite's device (None: none)."""
        self.hass = hass
        self.entry = entry
        self.agent_id = agent_id
        self.model = model
        self._build = build
        self._by_entry = by_entry
        # Per satellite, the reservation of the turn under way (until its turn reaches the
        # server, or the satellite leaves the turn).
        self._held: dict[str, _Held] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def tasks(self) -> set[asyncio.Task[None]]:
        """The reservation calls under way (asking for one, or ending one)."""
        return set(self._tasks)

    @property
    def supported(self) -> bool:
        """Whether the server takes reservations."""
        return RESERVATION_FEATURE in (self.entry.runtime_data.health.get("features") or ())

    @callback
    def async_start(self) -> CALLBACK_TYPE:
        """Follow the satellites (nothing against a server without reservations); returns
        the stop."""
        if not self.supported:
            return lambda: None
        unsub = self.hass.bus.async_listen(
            EVENT_STATE_CHANGED, self._async_state_changed, event_filter=_is_satellite
        )

        @callback
        def stop() -> None:
            unsub()
            for task in self._tasks:
                task.cancel()

        return stop

    @callback
    def serves(self, satellite_id: str) -> bool:
        """Whether the satellite's next turn goes to this agent."""
        agent = satellite_agent(self.hass, satellite_id)
        return agent == self.agent_id or (self._by_entry and agent == self.entry.entry_id)

    @callback
    def async_turn(self, satellite_id: str | None) -> None:
        """A voice turn of the satellite goes to the server now: the server ends its
        reservation as the request arrives."""
        if satellite_id:
            self._held.pop(satellite_id, None)

    @callback
    def _async_state_changed(self, event: Event[Any]) -> None:
        satellite_id = event.data["entity_id"]
        new, old = event.data["new_state"], event.data["old_state"]
        state = new.state if new is not None else None
        if state == LISTENING and (old is None or old.state != LISTENING):
            if self.serves(satellite_id):
                held = self._held[satellite_id] = _Held()
                self._spawn(self._async_reserve(satellite_id, held))
        elif state not in TURN_STATES:
            self._async_left(satellite_id)

    @callback
    def _async_left(self, satellite_id: str) -> None:
        """The satellite left its turn: end the reservation its turn did not use (one still
        being asked for is ended when the answer comes)."""
        held = self._held.pop(satellite_id, None)
        if held is not None and held.id is not None:
            self._spawn(self._async_end(held.id))

    def _spawn(self, job: Coroutine[Any, Any, None]) -> None:
        task = self.entry.async_create_background_task(
            self.hass, job, "hearth wake-word reservation"
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _async_reserve(self, satellite_id: str, held: _Held) -> None:
        registry_entry = er.async_get(self.hass).async_get(satellite_id)
        device_id = registry_entry.device_id if registry_entry else None
        try:
            warm = await self._build(device_id)
        except Exception as err:  # the reservation goes without its prompt
            LOGGER.debug("No prompt to warm with the reservation of %s: %s", satellite_id, err)
            warm = None
        client = self.entry.runtime_data.client
        try:
            answer = await client.async_reserve(satellite_id, model=self.model, warm=warm)
        except (NotFound, CannotConnect) as err:
            LOGGER.debug("No reservation for %s: %s", satellite_id, err)
            return
        except HearthError as err:
            LOGGER.warning("The Hearth server refused a reservation for %s: %s",
                           satellite_id, err)
            return
        reservation_id = answer.get("id")
        if not isinstance(reservation_id, str):
            return
        LOGGER.debug("Reserved %s for %s (%s s)", answer.get("model"), satellite_id,
                     answer.get("expires_in_s"))
        held.id = reservation_id
        if self._held.get(satellite_id) is not held:
            # The satellite left the turn while the server answered: unless its request came
            # (then the server ended it already), nothing will use it.
            await self._async_end(reservation_id)

    async def _async_end(self, reservation_id: str) -> None:
        try:
            await self.entry.runtime_data.client.async_end_reservation(reservation_id)
        except NotFound:
            pass  # it ended on its own (expired, or the voice request came)
        except HearthError as err:
            LOGGER.debug("Could not end the reservation %s: %s", reservation_id, err)
