"""A job's place in its model's queue (issue 45): progress events in the job store while its
request waits, null on every other event, and the watcher that writes them."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

from hearth.jobs import queue as job_queue
from hearth.jobs.store import JobStore


def _events(store: JobStore) -> list[dict]:
    return [json.loads(p)["job"] for _, p in store.events_after(0)]


def test_progress_events_carry_the_queue_and_others_none(tmp_path):
    store = JobStore(tmp_path / "jobs.sqlite3")
    job = store.create("chat", "background", None, {"messages": []})
    assert store.progress(job["id"], {"position": 2, "eta_s": 4.0}) is None  # not running
    store.start(job["id"])
    assert store.progress(job["id"], {"position": 2, "eta_s": 4.0}) is not None
    store.finish(job["id"], {"ok": True})
    events = _events(store)
    assert [e["status"] for e in events] == ["queued", "running", "running", "done"]
    assert [e["queue"] for e in events] == [None, None, {"position": 2, "eta_s": 4.0}, None]
    store.close()


def test_the_watcher_writes_when_the_place_changes_and_stops_once_admitted(tmp_path):
    store = JobStore(tmp_path / "jobs.sqlite3")
    job = store.create("chat", "background", None, {"messages": []})
    store.start(job["id"])
    r = SimpleNamespace(first_admitted_at=None, finished=False, meta={})
    places = iter([(3, 9.0), (3, 8.0), (1, 2.0)])

    class Eta:
        @staticmethod
        def position(req):
            return next(places, None) if req.first_admitted_at is None else None

    comp = SimpleNamespace(rt=SimpleNamespace(core=SimpleNamespace(queue_eta=Eta())), request=r)
    told = []

    async def notify() -> None:
        told.append(1)

    asyncio.run(asyncio.wait_for(job_queue.watch(store, job["id"], comp, notify, 0.01), 10))
    queued = [e["queue"] for e in _events(store) if e["queue"]]
    assert queued == [{"position": 3, "eta_s": 9.0}, {"position": 1, "eta_s": 2.0}]
    assert len(told) == 2
    store.close()


def _runner(comp, waiting: list[dict]):
    core = SimpleNamespace(queue_state=lambda: {"waiting_requests": waiting,
                                                "eta_s": {"background": 7.5}})
    return SimpleNamespace(_tasks={"j": (None, comp)}, model_for=lambda req, cls: "m",
                           fleet=SimpleNamespace(state="ready",
                                                 workers={"m": SimpleNamespace(
                                                     rt=SimpleNamespace(core=core))}))


def test_a_running_job_whose_completion_is_not_built_says_where_it_will_wait():
    """Between the runner taking a job and its completion being built and submitted (a model
    to load, a prompt to render), the job is about to wait behind its class's queue: it says
    so, not null (a CI flake's cause)."""
    runner = _runner(None, [{"class": "voice"}, {"class": "background"}, {"class": "embedding"}])
    job = {"id": "j", "kind": "chat", "status": "running", "class": "background", "request": {}}
    assert job_queue.queue_of(runner, job) == {"position": 3, "eta_s": 7.5}

    class Admitted:  # its request runs: no place any more
        @staticmethod
        def position(req):
            return None

    r = SimpleNamespace(first_admitted_at=1.0, finished=False, meta={})
    comp = SimpleNamespace(rt=SimpleNamespace(core=SimpleNamespace(queue_eta=Admitted())),
                           request=r)
    runner._tasks["j"] = (None, comp)
    assert job_queue.queue_of(runner, job) is None
    assert job_queue.queue_of(runner, {**job, "status": "done"}) is None
    runner._tasks["j"] = (None, None)  # an embeddings job runs with no completion
    assert job_queue.queue_of(runner, {**job, "kind": "embeddings"}) is None
