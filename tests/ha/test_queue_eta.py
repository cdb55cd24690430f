"""Where the household stands in the queue: each class's expected wait and the waiting
requests on the queue sensors; a waiting job's position and ETA on the job sensor and the job
actions."""

from __future__ import annotations

import pytest
from homeassistant.core import HomeAssistant
from pytest_homeassistant_custom_component.common import MockConfigEntry

from custom_components.hearth.const import DOMAIN

from .conftest import FakeHearth, async_setup_hearth, async_wait_for, sensor_of

pytestmark = [pytest.mark.ha, pytest.mark.usefixtures("socket_enabled")]

WAITING = [
    {"id": "7", "class": "chat", "member": "u1", "position": 1, "eta_s": 1.5},
    {"id": "9", "class": "background", "member": None, "position": 2, "eta_s": 12.25},
]


async def test_class_sensors_carry_eta_and_waiting_requests(
    hass: HomeAssistant, fake_hearth: FakeHearth, fake_entry: MockConfigEntry
) -> None:
    """A server without ETAs adds nothing; one with them gives each class sensor the wait
    expected now and its own waiting requests."""
    def attributes(key: str) -> dict[str, object]:
        return dict(hass.states.get(sensor_of(hass, fake_entry, "sensor", key)).attributes)

    assert "eta_s" not in attributes("waiting_chat")
    fake_hearth.queue.update(
        eta_s={"voice": 0.2, "chat": 3.1, "agent": 3.1, "background": 14.0, "embedding": 0.0},
        waiting_requests=WAITING,
    )
    await fake_entry.runtime_data.coordinator.async_refresh()
    await hass.async_block_till_done()

    chat = attributes("waiting_chat")
    assert chat["eta_s"] == 3.1
    assert chat["requests"] == [{"id": "7", "member": "u1", "position": 1, "eta_s": 1.5}]
    assert attributes("waiting_voice")["eta_s"] == 0.2
    assert attributes("waiting_voice")["requests"] == []
    assert attributes("waiting_background")["requests"][0]["position"] == 2


async def test_waiting_job_shows_its_place(
    hass: HomeAssistant, fake_hearth: FakeHearth
) -> None:
    """A job submitted here shows its place and ETA while it waits (the submit and get_job
    answers, the jobs sensor's attributes, updated from the job events), none once it
    runs."""
    fake_hearth.events_enabled = True
    entry = await async_setup_hearth(hass, fake_hearth.url)
    await async_wait_for(lambda: fake_hearth.event_subscribers)
    jobs_sensor = sensor_of(hass, entry, "sensor", "jobs_queued")

    submitted = await hass.services.async_call(
        DOMAIN, "submit_job", {"text": "A long text.", "tag": "digest"},
        blocking=True, return_response=True,
    )
    job_id = submitted["job_id"]
    assert submitted["queue"] is None  # the fake says none at submission

    job = fake_hearth.jobs[job_id]
    job["queue"] = {"position": 3, "eta_s": 42.0}
    fake_hearth.publish(job)
    await async_wait_for(lambda: hass.states.get(jobs_sensor).attributes.get("jobs"))
    assert hass.states.get(jobs_sensor).attributes["jobs"] == [
        {"job_id": job_id, "position": 3, "eta_s": 42.0, "tag": "digest"}]
    answered = await hass.services.async_call(
        DOMAIN, "get_job", {"job_id": job_id}, blocking=True, return_response=True)
    assert answered["queue"] == {"position": 3, "eta_s": 42.0}

    job.update(status="running", queue=None)
    fake_hearth.publish(job)
    await async_wait_for(lambda: "jobs" not in hass.states.get(jobs_sensor).attributes)
