"""Learns of finished background jobs and fires ``hearth_job_finished``.

The server's ``/v1/events`` stream reports job state changes. The watcher follows it, resuming with
``Last-Event-ID`` after a dropped connection (reconnecting with exponential backoff). While the
stream is down, or when the server has no event stream, it polls ``/v1/jobs/{id}`` for the jobs
submitted through this integration, so no finished job goes unannounced. Those jobs are kept in
Home Assistant's storage, so one that finishes while Home Assistant is down is announced once it
is back.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from homeassistant.core import CALLBACK_TYPE, HomeAssistant, callback
from homeassistant.helpers.storage import Store

from .api import HearthClient, HearthError, InvalidAuth, NotFound
from .const import (
    DOMAIN,
    EVENT_JOB_FINISHED,
    EVENTS_BACKOFF_MAX,
    EVENTS_BACKOFF_MIN,
    EVENTS_RETRY_UNSUPPORTED,
    JOB_POLL_INTERVAL,
    JOB_TERMINAL_STATES,
    LOGGER,
)

if TYPE_CHECKING:
    from . import HearthConfigEntry

# How many announced job ids to remember (so a replayed event is not announced twice).
_FIRED_MEMORY = 1000
# Jobs that finished this long before the watcher started are old news on a first connection.
_STALE_AFTER_S = 60.0
_STORAGE_VERSION = 1
# Submissions and announcements in a burst are written once.
_SAVE_DELAY_S = 1.0


def pending_store(hass: HomeAssistant, entry_id: str) -> Store[dict[str, Any]]:
    """The storage of one entry's unfinished jobs (id → tag)."""
    return Store(hass, _STORAGE_VERSION, f"{DOMAIN}.jobs.{entry_id}")


def job_result_text(job: dict[str, Any]) -> str | None:
    """Return the text a chat job produced, if any."""
    result = job.get("result")
    if not isinstance(result, dict):
        return None
    choices = result.get("choices")
    if not choices or not isinstance(choices, list):
        return None
    first = choices[0] or {}
    message = first.get("message")
    if isinstance(message, dict):
        content = message.get("content")
        if isinstance(content, list):  # a list of text parts
            return "".join(
                part.get("text", "") for part in content if isinstance(part, dict)
            )
        return content
    text = first.get("text")
    return text if isinstance(text, str) else None


def _ms(start: Any, end: Any) -> float | None:
    if isinstance(start, int | float) and isinstance(end, int | float):
        return round((end - start) * 1000.0, 1)
    return None


def job_timings(job: dict[str, Any]) -> dict[str, Any]:
    """Return when the job was created, started and finished, and how long each phase took."""
    created, started, finished = (
        job.get("created_at"),
        job.get("started_at"),
        job.get("finished_at"),
    )
    timings: dict[str, Any] = {
        "created_at": created,
        "started_at": started,
        "finished_at": finished,
        "queue_ms": _ms(created, started),
        "run_ms": _ms(started, finished),
        "total_ms": _ms(created, finished),
    }
    result = job.get("result")
    if isinstance(result, dict) and isinstance(server := result.get("hearth"), dict):
        for key in ("ttft_ms", "e2e_ms"):
            if isinstance(server.get(key), int | float):
                timings[key] = server[key]
    return timings


def job_queue(job: dict[str, Any]) -> dict[str, Any] | None:
    """Where a waiting job stands (``position``, 1 next, and ``eta_s`` to its first token), as
    the server reports it; None once it runs, or from servers without queue ETAs."""
    queue = job.get("queue")
    if not isinstance(queue, dict):
        return None
    return {key: queue.get(key) for key in ("position", "eta_s")}


def job_event_data(entry_id: str, job: dict[str, Any]) -> dict[str, Any]:
    """Build the data of a ``hearth_job_finished`` event."""
    result = job.get("result")
    usage = result.get("usage") if isinstance(result, dict) else None
    return {
        "config_entry_id": entry_id,
        "job_id": job.get("id"),
        "status": job.get("status"),
        "kind": job.get("kind"),
        "class": job.get("class"),
        "tag": job.get("tag"),
        "result": job_result_text(job),
        "error": job.get("error"),
        "usage": usage if isinstance(usage, dict) else None,
        "timings": job_timings(job),
    }


class HearthJobWatcher:
    """Follows one server's job events for as long as its config entry is loaded."""

    def __init__(
        self, hass: HomeAssistant, entry: HearthConfigEntry, client: HearthClient
    ) -> None:
        """Initialize the watcher."""
        self.hass = hass
        self.entry = entry
        self.client = client
        self.connected = False
        self.events_supported: bool | None = None
        self.last_event_id: str | None = None
        self._pending: dict[str, str | None] = {}
        self._fired: OrderedDict[str, None] = OrderedDict()
        self._started = time.time()
        self._task: asyncio.Task[None] | None = None
        self._poll_now = asyncio.Event()
        self._store = pending_store(hass, entry.entry_id)
        # Where the jobs submitted here stand while they wait (id → position and ETA).
        self.queued: dict[str, dict[str, Any]] = {}
        self._listeners: list[Callable[[], None]] = []

    @property
    def pending(self) -> dict[str, str | None]:
        """Return the jobs submitted here that have not finished (id → tag)."""
        return dict(self._pending)

    @property
    def task(self) -> asyncio.Task[None] | None:
        """Return the background task following the server."""
        return self._task

    async def async_load(self) -> None:
        """Take back the jobs that were unfinished when Home Assistant last stopped."""
        data = await self._store.async_load()
        if isinstance(data, dict) and isinstance(pending := data.get("pending"), dict):
            self._pending.update(pending)

    async def async_save(self) -> None:
        """Write the unfinished jobs now (on unload: a delayed write would be lost)."""
        await self._store.async_save(self._stored())

    def _stored(self) -> dict[str, Any]:
        return {"pending": dict(self._pending)}

    @callback
    def _async_pending_changed(self) -> None:
        self._store.async_delay_save(self._stored, _SAVE_DELAY_S)

    @callback
    def async_add_listener(self, update: Callable[[], None]) -> CALLBACK_TYPE:
        """Call ``update`` when a waiting job's place in the queue changes."""
        self._listeners.append(update)
        return lambda: self._listeners.remove(update)

    @callback
    def _async_note_queue(self, job: dict[str, Any]) -> None:
        job_id = job.get("id")
        if not isinstance(job_id, str):
            return
        waiting = job_id in self._pending and job.get("status") not in JOB_TERMINAL_STATES
        where = job_queue(job) if waiting else None
        if where is not None:
            where["tag"] = self._pending[job_id]
            if self.queued.get(job_id) == where:
                return
            self.queued[job_id] = where
        elif self.queued.pop(job_id, None) is None:
            return
        for update in list(self._listeners):
            update()

    @callback
    def async_start(self) -> None:
        """Start following the server; the task ends when the entry unloads."""
        self._task = self.entry.async_create_background_task(
            self.hass, self._async_run(), name=f"hearth job watcher {self.entry.entry_id}"
        )

    @callback
    def async_track(self, job: dict[str, Any]) -> None:
        """Remember a job submitted through this integration until it finishes."""
        job_id = job.get("id")
        if not job_id:
            return
        if job.get("status") in JOB_TERMINAL_STATES:
            self._async_job_update(job)
            return
        self._pending[job_id] = job.get("tag")
        self._async_pending_changed()
        self._async_note_queue(job)
        if not self.connected:
            self._poll_now.set()

    @callback
    def _async_job_update(self, job: dict[str, Any], *, replayed: bool = False) -> None:
        """Handle a job's new state; announce it once when it has finished."""
        self._async_note_queue(job)
        job_id = job.get("id")
        if not job_id or job.get("status") not in JOB_TERMINAL_STATES:
            return
        tracked = job_id in self._pending
        if tracked:
            self._pending.pop(job_id)
            self._async_pending_changed()
        if job_id in self._fired:
            return
        finished = job.get("finished_at")
        if (
            replayed
            and not tracked
            and isinstance(finished, int | float)
            and finished < self._started - _STALE_AFTER_S
        ):
            return
        self._fired[job_id] = None
        while len(self._fired) > _FIRED_MEMORY:
            self._fired.popitem(last=False)
        LOGGER.debug("Job %s finished: %s", job_id, job.get("status"))
        self.hass.bus.async_fire(EVENT_JOB_FINISHED, job_event_data(self.entry.entry_id, job))

    async def _async_run(self) -> None:
        backoff = EVENTS_BACKOFF_MIN
        while True:
            try:
                await self._async_follow_events()
            except NotFound:
                LOGGER.debug("%s has no event stream; polling jobs", self.client.url)
                self.events_supported = False
                self.connected = False
                await self._async_poll_for(EVENTS_RETRY_UNSUPPORTED)
                continue
            except InvalidAuth:
                LOGGER.warning("Hearth refused the API key on its event stream")
                self.entry.async_start_reauth(self.hass)
            except HearthError as err:
                LOGGER.debug("Hearth event stream interrupted: %s", err)
            if self.connected:
                backoff = EVENTS_BACKOFF_MIN
            self.connected = False
            await self._async_poll_for(backoff * random.uniform(0.8, 1.2))
            backoff = min(backoff * 2, EVENTS_BACKOFF_MAX)

    async def _async_follow_events(self) -> None:
        first_connection = self.last_event_id is None
        async for event in self.client.async_events(self.last_event_id, on_open=self._opened):
            if event.id is not None:
                self.last_event_id = event.id
            if event.event not in ("job", "message"):
                continue
            try:
                data = event.json()
            except ValueError:
                LOGGER.debug("Skipping an event that is not JSON: %s", event.data)
                continue
            if not isinstance(data, dict):
                continue
            job = data.get("job") if data.get("type", "job") == "job" else None
            if isinstance(job, dict):
                self._async_job_update(job, replayed=first_connection)

    @callback
    def _opened(self) -> None:
        """Run when the event stream is open: catch up on what happened while it was not."""
        self.connected = True
        self.events_supported = True
        if self._pending:
            self.entry.async_create_background_task(
                self.hass, self._async_poll_pending(), name="hearth job catch-up"
            )

    async def _async_poll_for(self, seconds: float) -> None:
        """Poll the pending jobs until ``seconds`` have passed."""
        deadline = time.monotonic() + seconds
        while (remaining := deadline - time.monotonic()) > 0:
            await self._async_poll_pending()
            self._poll_now.clear()
            try:
                async with asyncio.timeout(min(JOB_POLL_INTERVAL, remaining)):
                    await self._poll_now.wait()
            except TimeoutError:
                pass

    async def _async_poll_pending(self) -> None:
        for job_id in list(self._pending):
            try:
                job = await self.client.async_get_job(job_id)
            except NotFound:  # deleted on the server: nothing will ever finish
                self._pending.pop(job_id, None)
                self._async_pending_changed()
                continue
            except HearthError as err:
                LOGGER.debug("Cannot poll job %s: %s", job_id, err)
                return
            self._async_job_update(job)
