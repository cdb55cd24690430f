"""Background-job actions and the hearth_job_finished event."""

from __future__ import annotations

import asyncio
from unittest.mock import patch

import pytest
from hearth_server import HearthServer
from homeassistant.core import Event, HomeAssistant, callback
from homeassistant.exceptions import ServiceValidationError
from pytest_homeassistant_custom_component.common import MockConfigEntry

from custom_components.hearth.const import DOMAIN, EVENT_JOB_FINISHED

from .conftest import FakeHearth, async_setup_hearth, async_wait_for

pytestmark = [pytest.mark.ha, pytest.mark.usefixtures("socket_enabled")]


def _collect(hass: HomeAssistant) -> list[Event]:
    events: list[Event] = []

    @callback
    def _on(event: Event) -> None:
        events.append(event)

    hass.bus.async_listen(EVENT_JOB_FINISHED, _on)
    return events


@pytest.mark.model
async def test_submit_job_fires_event_with_result(
    hass: HomeAssistant, hearth_server: HearthServer
) -> None:
    """hearth.submit_job answers with the job id at once; the finished event carries the
    model's text, the tag and timings; get_job shows the same."""
    await async_setup_hearth(hass, hearth_server.url)
    events = _collect(hass)

    response = await hass.services.async_call(
        DOMAIN,
        "submit_job",
        {
            "text": "The washing machine finished at 10:00. The dryer is still running.",
            "instructions": "Summarize in one sentence.",
            "max_tokens": 24,
            "tag": "laundry",
        },
        blocking=True,
        return_response=True,
    )
    job_id = response["job_id"]
    assert job_id.startswith("job_")

    await async_wait_for(lambda: [e for e in events if e.data["job_id"] == job_id], within=60)
    event = next(e for e in events if e.data["job_id"] == job_id)
    assert event.data["status"] == "done"
    assert event.data["tag"] == "laundry"
    assert event.data["class"] == "background"
    assert isinstance(event.data["result"], str)
    assert event.data["result"].strip()
    timings = event.data["timings"]
    assert timings["finished_at"] >= timings["created_at"]
    assert timings["total_ms"] >= 0

    job = await hass.services.async_call(
        DOMAIN, "get_job", {"job_id": job_id}, blocking=True, return_response=True
    )
    assert job["status"] == "done"
    assert job["result_text"] == event.data["result"]
    assert job["tag"] == "laundry"


@pytest.mark.model
async def test_cancel_and_unknown_job(hass: HomeAssistant, hearth_server: HearthServer) -> None:
    """A job can be cancelled (unless it already finished); unknown ids are refused."""
    await async_setup_hearth(hass, hearth_server.url)
    response = await hass.services.async_call(
        DOMAIN,
        "submit_job",
        {"messages": [{"role": "user", "content": "Write a long story about a cat."}],
         "max_tokens": 400, "class": "background"},
        blocking=True,
        return_response=True,
    )
    job = await hass.services.async_call(
        DOMAIN, "cancel_job", {"job_id": response["job_id"]},
        blocking=True, return_response=True,
    )
    assert job["job_id"] == response["job_id"]
    assert job["status"] in ("cancelled", "done")

    with pytest.raises(ServiceValidationError):
        await hass.services.async_call(
            DOMAIN, "get_job", {"job_id": "job_doesnotexist"},
            blocking=True, return_response=True,
        )


async def test_events_stream_and_request_body(
    hass: HomeAssistant, fake_hearth: FakeHearth
) -> None:
    """Finished jobs are learned from /v1/events; the job request carries the text under the
    instructions, the class and the tag."""
    fake_hearth.events_enabled = True
    entry = await async_setup_hearth(hass, fake_hearth.url)
    watcher = entry.runtime_data.jobs
    await async_wait_for(lambda: watcher.connected, within=10)
    events = _collect(hass)

    response = await hass.services.async_call(
        DOMAIN,
        "submit_job",
        {"text": "Door opened twice.", "class": "agent", "tag": "doors", "max_tokens": 50},
        blocking=True,
        return_response=True,
    )
    job_id = response["job_id"]
    body = fake_hearth.job_bodies[-1]
    assert body["class"] == "agent"
    assert body["tag"] == "doors"
    assert body["kind"] == "chat"
    assert body["request"]["max_tokens"] == 50
    messages = body["request"]["messages"]
    assert [m["role"] for m in messages] == ["system", "user"]
    assert messages[1]["content"] == "Door opened twice."

    fake_hearth.publish(fake_hearth.finish_job(job_id, "The door opened twice."))
    await async_wait_for(lambda: events, within=10)
    assert events[0].data["job_id"] == job_id
    assert events[0].data["result"] == "The door opened twice."
    assert events[0].data["tag"] == "doors"
    assert events[0].data["timings"]["queue_ms"] == pytest.approx(500.0)
    assert events[0].data["timings"]["ttft_ms"] == pytest.approx(50.0)
    assert watcher.last_event_id == "1"

    # A replayed event is not announced twice.
    fake_hearth.publish(fake_hearth.jobs[job_id])
    await async_wait_for(lambda: watcher.last_event_id == "2", within=10)
    await hass.async_block_till_done()
    assert len(events) == 1


async def test_reconnects_and_resumes(hass: HomeAssistant, fake_hearth: FakeHearth) -> None:
    """After the stream drops, the watcher reconnects with Last-Event-ID."""
    fake_hearth.events_enabled = True
    with patch("custom_components.hearth.jobs.EVENTS_BACKOFF_MIN", 0.05):
        entry = await async_setup_hearth(hass, fake_hearth.url)
        watcher = entry.runtime_data.jobs
        await async_wait_for(lambda: watcher.connected, within=10)
        fake_hearth.publish({"id": "job_other", "status": "running"})
        await async_wait_for(lambda: watcher.last_event_id == "1", within=10)

        # Drop every open connection: the server restarts.
        port = fake_hearth.port
        await fake_hearth.stop()
        await async_wait_for(lambda: not watcher.connected, within=10)
        await _restart(fake_hearth, port)
        await async_wait_for(lambda: watcher.connected, within=10)
    assert fake_hearth.event_resume_ids[0] is None
    assert fake_hearth.event_resume_ids[-1] == "1"


async def _restart(server: FakeHearth, port: int) -> None:
    """Start the fake again on the same port."""
    for _ in range(50):
        try:
            await server.start(port)
            return
        except OSError:
            await asyncio.sleep(0.1)
    raise AssertionError("could not restart the fake server")


async def test_polls_when_server_has_no_event_stream(
    hass: HomeAssistant, fake_hearth: FakeHearth
) -> None:
    """Without /v1/events the watcher polls the jobs it submitted."""
    with patch("custom_components.hearth.jobs.JOB_POLL_INTERVAL", 0.05):
        entry = await async_setup_hearth(hass, fake_hearth.url)
        events = _collect(hass)
        response = await hass.services.async_call(
            DOMAIN, "submit_job", {"text": "Summarize nothing."},
            blocking=True, return_response=True,
        )
        job_id = response["job_id"]
        await async_wait_for(
            lambda: entry.runtime_data.jobs.events_supported is False, within=10
        )
        assert job_id in entry.runtime_data.jobs.pending
        fake_hearth.finish_job(job_id, "Nothing happened.")
        await async_wait_for(lambda: events, within=10)
    assert events[0].data["result"] == "Nothing happened."
    assert events[0].data["status"] == "done"
    assert not entry.runtime_data.jobs.pending


@pytest.mark.parametrize("events", [False, True], ids=["polling", "event-stream"])
async def test_a_job_that_finishes_while_home_assistant_is_down_is_announced(
    hass: HomeAssistant, fake_hearth: FakeHearth, hass_storage: dict, events: bool
) -> None:
    """Unfinished jobs outlive an unload (Home Assistant stopping) through storage."""
    fake_hearth.events_enabled = events
    with patch("custom_components.hearth.jobs.JOB_POLL_INTERVAL", 0.05):
        entry = await async_setup_hearth(hass, fake_hearth.url)
        response = await hass.services.async_call(
            DOMAIN, "submit_job", {"text": "Summarize the week.", "tag": "weekly"},
            blocking=True, return_response=True,
        )
        job_id = response["job_id"]
        assert await hass.config_entries.async_unload(entry.entry_id)
        stored = hass_storage[f"{DOMAIN}.jobs.{entry.entry_id}"]["data"]
        assert stored["pending"] == {job_id: "weekly"}

        fake_hearth.finish_job(job_id, "A quiet week.")  # while nobody listens
        events = _collect(hass)
        assert await hass.config_entries.async_setup(entry.entry_id)
        await async_wait_for(lambda: events, within=10)
        await hass.async_block_till_done()
    assert len(events) == 1
    assert events[0].data["job_id"] == job_id and events[0].data["tag"] == "weekly"
    assert events[0].data["result"] == "A quiet week."
    assert not entry.runtime_data.jobs.pending

    assert await hass.config_entries.async_remove(entry.entry_id)
    assert f"{DOMAIN}.jobs.{entry.entry_id}" not in hass_storage


async def test_action_needs_a_loaded_server(
    hass: HomeAssistant, fake_entry: MockConfigEntry
) -> None:
    """Naming an entry that is not Hearth's is refused."""
    with pytest.raises(ServiceValidationError):
        await hass.services.async_call(
            DOMAIN, "get_job", {"config_entry_id": "nope", "job_id": "job_1"},
            blocking=True, return_response=True,
        )
    await hass.config_entries.async_unload(fake_entry.entry_id)
    with pytest.raises(ServiceValidationError):
        await hass.services.async_call(
            DOMAIN, "get_job", {"job_id": "job_1"}, blocking=True, return_response=True,
        )
