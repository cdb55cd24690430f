"""Durable jobs, the event stream, auth, overload, Supervisor discovery and model download —
each against a real server process."""

from __future__ import annotations

import asyncio
import hashlib
import json
import shutil
import signal
import socket
import sqlite3
import threading
import time
import urllib.request

import pytest
from aiohttp import web
from hearth_server import HearthServer

from hearth.fleet.models import packaged_model

pytestmark = pytest.mark.model

SUMMARY = {"messages": [{"role": "user", "content": "Summarise: the heating is on."}],
           "max_tokens": 16, "temperature": 0}


def wait_job(server, job_id, statuses=("done", "failed", "cancelled"), timeout=120):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        _, job = server.get(f"/v1/jobs/{job_id}")
        if job.get("status") in statuses:
            return job
        time.sleep(0.2)
    raise AssertionError(f"job {job_id} still {job.get('status')}")


def read_events(url: str, last_id: int | None, want: int, timeout: float = 60,
                until: str | None = None) -> list[dict]:
    """``want`` events from after ``last_id``, or, with ``until``, every event up to the first
    that says that job is done."""
    headers = {"Last-Event-ID": str(last_id)} if last_id is not None else {}
    req = urllib.request.Request(url + "/v1/events", headers=headers)
    out: list[dict] = []
    with urllib.request.urlopen(req, timeout=timeout) as r:
        ev: dict = {}
        for raw in r:
            line = raw.decode().rstrip("\n")
            if line.startswith("id: "):
                ev["id"] = int(line[4:])
            elif line.startswith("data: "):
                ev["data"] = json.loads(line[6:])
            elif line == "" and "data" in ev:
                out.append(ev)
                ev = {}
                job = out[-1]["data"].get("job") or {}
                if (len(out) >= want if until is None
                        else job.get("id") == until and job.get("status") == "done"):
                    return out
    return out


def test_job_lifecycle_and_events(server):
    status, job = server.post("/v1/jobs", {"request": SUMMARY, "tag": "nightly"})
    assert status == 202 and job["status"] == "queued" and job["class"] == "background"
    done = wait_job(server, job["id"])
    assert done["status"] == "done" and done["tag"] == "nightly"
    assert done["result"]["choices"][0]["message"]["content"]
    assert done["result"]["hearth"]["class"] == "background"
    _, listing = server.get("/v1/jobs?status=done")
    assert job["id"] in [j["id"] for j in listing["data"]]
    # The event stream replays this job's transitions from a cursor, in order.
    evs = read_events(server.url, job["seq"] - 1, want=0, until=job["id"])
    mine = [e for e in evs if e["data"]["job"]["id"] == job["id"]]
    states = [e["data"]["job"]["status"] for e in mine]
    assert [s for i, s in enumerate(states) if not i or s != states[i - 1]] == [
        "queued", "running", "done"]
    # A state said again is a progress event: where the job waits in the engine's queue.
    assert all(e["data"]["job"].get("queue") for i, e in enumerate(mine)
               if i and states[i] == states[i - 1])
    assert [e["id"] for e in evs] == sorted(e["id"] for e in evs)
    # Resuming after the second event gives only what came later.
    resumed = read_events(server.url, mine[1]["id"], want=1)
    assert resumed[0]["id"] > mine[1]["id"]


def test_job_cancel_and_validation(server):
    body = {**SUMMARY, "max_tokens": 2000, "ignore_eos": True}
    _, job = server.post("/v1/jobs", {"request": body, "class": "background"})
    wait_job(server, job["id"], statuses=("running",))
    status, cancelled = server.post("/v1/jobs", {"request": {"messages": []}})
    assert status == 400 and cancelled["error"]["param"].startswith("request")
    req = urllib.request.Request(f"{server.url}/v1/jobs/{job['id']}", method="DELETE")
    with urllib.request.urlopen(req) as r:
        assert json.loads(r.read())["status"] == "cancelled"
    assert wait_job(server, job["id"])["status"] == "cancelled"
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        _, q = server.get("/v1/queue")
        if sum(q["running"].values()) == 0:
            break
        time.sleep(0.2)
    assert sum(q["running"].values()) == 0  # the engine sequence was freed too
    status, _ = server.post("/v1/jobs", {"request": SUMMARY, "class": "urgent"})
    assert status == 400


def test_embedding_job(server):
    _, job = server.post("/v1/jobs", {"kind": "embeddings", "request": {"input": ["a", "b"]}})
    done = wait_job(server, job["id"])
    assert done["status"] == "done" and len(done["result"]["data"]) == 2
    assert done["class"] == "background"


def test_sigterm_requeues_running_jobs(tmp_path):
    srv = HearthServer(data_dir=tmp_path).start()
    _, job = srv.post("/v1/jobs", {"request": {**SUMMARY, "max_tokens": 3000,
                                               "ignore_eos": True}})
    wait_job(srv, job["id"], statuses=("running",))
    assert srv.stop(signal.SIGTERM) == 0
    db = sqlite3.connect(tmp_path / "jobs.sqlite3")
    assert db.execute("SELECT status FROM jobs WHERE id=?", (job["id"],)).fetchone()[0] == \
        "queued"


def test_api_key_guards_everything_but_health(tmp_path):
    with HearthServer(data_dir=tmp_path, env={"HEARTH_API_KEY": "s3cret-key"}) as srv:
        assert srv.get("/health")[0] == 200
        for path in ("/v1/models", "/v1/queue", "/v1/jobs", "/metrics", "/openapi.json"):
            status, body = srv.get(path)
            assert status == 401 and body["error"]["code"] == "invalid_api_key", path
        assert srv.get("/v1/models", {"Authorization": "Bearer wrong"})[0] == 401
        ok = {"Authorization": "Bearer s3cret-key"}
        assert srv.get("/v1/models", ok)[0] == 200
        status, _ = srv.post("/v1/chat/completions", {
            "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}, ok)
        assert status == 200
        assert "s3cret-key" not in srv.log()


def test_full_queue_answers_429_for_that_class_while_voice_gets_in(tmp_path):
    with HearthServer("--max-queue", "2", "--n-parallel", "1", data_dir=tmp_path) as srv:
        # A long chat holds the only slot (background cannot preempt it), so the two background
        # requests behind it stay queued while the third is refused: nothing can finish in
        # between and free a place, as a short request in the slot once did.
        blocker = {"messages": [{"role": "user", "content": "Tell a long story."}],
                   "max_tokens": 1500, "ignore_eos": True, "priority": "chat"}
        long = {"messages": [{"role": "user", "content": "Write a story."}],
                "max_tokens": 300, "ignore_eos": True, "priority": "background"}
        results: list = []

        def send(body):
            results.append(srv.post("/v1/chat/completions", body, timeout=300))

        def wait_queue(cond) -> None:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                if cond(srv.get("/v1/queue")[1]):
                    return
                time.sleep(0.05)
            raise AssertionError("the queue never reached the expected state")

        threads = [threading.Thread(target=send, args=(blocker,))]
        threads[0].start()
        wait_queue(lambda q: q["running"]["chat"] == 1)
        threads += [threading.Thread(target=send, args=(long,)) for _ in range(2)]
        for t in threads[1:]:
            t.start()
        wait_queue(lambda q: q["waiting"]["background"] == 2)
        req = urllib.request.Request(srv.url + "/v1/chat/completions", method="POST",
                                     data=json.dumps(long).encode(),
                                     headers={"Content-Type": "application/json"})
        try:
            urllib.request.urlopen(req, timeout=30)
            raise AssertionError("expected 429")
        except urllib.error.HTTPError as e:
            assert e.code == 429 and int(e.headers["Retry-After"]) >= 1
            assert json.loads(e.read())["error"]["code"] == "queue_full"
        _, q = srv.get("/v1/queue")
        assert q["running"]["chat"] == 1  # the blocker was still running: the queue was full
        status, _ = srv.post("/v1/chat/completions", {
            "messages": [{"role": "user", "content": "lights off"}], "max_tokens": 4,
            "priority": "voice"})
        assert status == 200
        for t in threads:
            t.join()
        assert [s for s, _ in results] == [200, 200, 200]
        _, q = srv.get("/v1/queue")
        assert q["classes"]["background"]["rejected"] == 1


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalHttp:
    """An aiohttp server on 127.0.0.1 in a thread (a fake Supervisor, or a model host)."""

    def __init__(self, app: web.Application):
        self.app = app
        self.port = _free_port()
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()

    def __enter__(self):
        def run():
            asyncio.set_event_loop(self.loop)
            runner = web.AppRunner(self.app)
            self.loop.run_until_complete(runner.setup())
            self.loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", self.port).start())
            self.runner = runner
            self.ready.set()
            self.loop.run_forever()
            self.loop.run_until_complete(runner.cleanup())

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()
        self.ready.wait(10)
        return self

    def __exit__(self, *exc):
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


def test_announces_itself_to_the_supervisor(tmp_path):
    seen: list = []

    async def discovery(request: web.Request) -> web.Response:
        seen.append((request.headers.get("Authorization"), await request.json()))
        return web.json_response({"result": "ok", "data": {"uuid": "x"}})

    app = web.Application()
    app.router.add_post("/discovery", discovery)
    with LocalHttp(app) as sup:
        env = {"SUPERVISOR_TOKEN": "tok", "HEARTH_SUPERVISOR_URL": f"http://127.0.0.1:{sup.port}",
               "HEARTH_API_KEY": "k1"}
        with HearthServer(data_dir=tmp_path, env=env) as srv:
            deadline = time.monotonic() + 20
            while not seen and time.monotonic() < deadline:
                time.sleep(0.1)
            port = srv.port
    assert seen, "no announcement"
    auth, body = seen[0]
    assert auth == "Bearer tok" and body["service"] == "hearth"
    assert body["config"]["port"] == port and body["config"]["api_key"] == "k1"


def test_model_downloaded_once_from_a_url_with_resume(tmp_path):
    src = packaged_model()
    served = tmp_path / "www"
    served.mkdir()
    shutil.copy(src, served / "tiny.gguf")
    ranges: list = []

    async def file(request: web.Request) -> web.StreamResponse:
        ranges.append(request.headers.get("Range"))
        return web.FileResponse(served / "tiny.gguf")

    app = web.Application()
    app.router.add_get("/models/tiny.gguf", file)
    models = tmp_path / "data" / "models"
    models.mkdir(parents=True)
    # A download interrupted earlier left a partial file behind.
    (models / "tiny.gguf.part").write_bytes((served / "tiny.gguf").read_bytes()[:10_000_000])
    with LocalHttp(app) as host:
        url = f"http://127.0.0.1:{host.port}/models/tiny.gguf"
        with HearthServer("--model", url, data_dir=tmp_path / "data") as srv:
            assert srv.get("/v1/models")[1]["data"][0]["id"] == "tiny"
            assert "downloading tiny.gguf" in srv.log() and "MB/s" in srv.log()
        assert ranges == ["bytes=10000000-"]
        with HearthServer("--model", url, data_dir=tmp_path / "data") as srv:
            assert srv.get("/health")[0] == 200
        assert len(ranges) == 1  # already there: not fetched again

    def digest(p):
        return hashlib.sha256(p.read_bytes()).hexdigest()

    assert digest(models / "tiny.gguf") == digest(src)
    assert not (models / "tiny.gguf.part").exists()
