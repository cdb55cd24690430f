"""What a native crash costs (issue 26): llama.cpp runs in a worker process per model, and a
worker that dies (SIGKILL, SIGSEGV, an illegal instruction at its canary, a request that kills
it every time) costs the requests in flight in it and a few seconds, never the server.

One server for the module, started with two test faults (hearth.runner.faults): its canary
dies with SIGILL on the first CPU rung (the best variant), as llama.cpp's AMX kernel does on CPUs
that report AMX they cannot run; and sampling for a grammar that names ``HEARTH_POISON`` segfaults.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from hearth_server import HearthServer

from hearth.llama.llama_backends import cpu_rungs

pytestmark = pytest.mark.model

POISON = "HEARTH_POISON"
RUNGS = cpu_rungs()  # scores the CPU variants' libraries; runs none of their kernels
FAULTS = f"sigill-at-canary:{RUNGS[0]},segv-on-grammar:{POISON}"
CRASHED_TWICE = "the model's worker crashed on this request twice"


@pytest.fixture(scope="module")
def crashy(tmp_path_factory):
    data = tmp_path_factory.mktemp("crashy")
    srv = HearthServer("--n-parallel", "4", env={"HEARTH_WORKER_FAULT": FAULTS}, data_dir=data)
    with srv:
        yield srv


def worker(srv: HearthServer) -> dict:
    status, q = srv.get("/v1/queue")
    assert status == 200
    return q["worker"]


def wait_serving(srv: HearthServer, old_pid: int, timeout: float = 60.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        w = worker(srv)
        if w["state"] == "serving" and w["pid"] not in (None, old_pid):
            return w
        time.sleep(0.1)
    raise AssertionError(f"the worker did not come back: {worker(srv)}")


class HealthWatch:
    """Polls /health every 100 ms in a thread, recording each answer's status and time."""

    def __init__(self, srv: HearthServer):
        self.srv, self.answers, self._stop = srv, [], threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            t0 = time.monotonic()
            try:
                with urllib.request.urlopen(self.srv.url + "/health", timeout=5) as r:
                    body = json.loads(r.read())
                    self.answers.append((r.status, body.get("status"), time.monotonic() - t0))
            except Exception as e:
                self.answers.append((None, repr(e), time.monotonic() - t0))
            self._stop.wait(0.1)

    def __enter__(self) -> HealthWatch:
        self._t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._t.join()


def test_a_cpu_that_lies_at_the_canary_moves_down_a_rung_and_serves(crashy):
    status, health = crashy.get("/health")
    assert status == 200
    # Ready one rung down (the next variant with its repacked weights, or on a build with one
    # variant the same without them), saying why and what it costs: not degraded.
    assert health["status"] == "ready", health
    assert health["cpu"]["rung"] == RUNGS[1]
    assert health["cpu"]["rungs_skipped"] == [RUNGS[0]]
    step = health["cpu"]["step_down"]
    assert step["from"] == RUNGS[0] and step["to"] == RUNGS[1] and step["why"].startswith("SIGILL")
    assert "repacked weights" in step["cost"]
    w = worker(crashy)
    assert w["last_crash"]["cause"].startswith("SIGILL")
    assert w["last_crash"]["rung"] == RUNGS[0] and w["step_down"] == step
    # Its whole output from its start is kept in a file of its own, under its cause.
    kept = Path(w["last_crash"]["output_log"]).read_text()
    assert kept.startswith("SIGILL") and "(while starting)" in kept, kept[-2000:]
    status, out = crashy.post("/v1/chat/completions", {
        "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 8})
    assert status == 200 and out["choices"][0]["message"]["content"]


def stream_lines(srv: HearthServer, body: dict):
    req = urllib.request.Request(srv.url + "/v1/chat/completions",
                                 data=json.dumps({**body, "stream": True}).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        for raw in r:
            line = raw.decode().strip()
            if line.startswith("data: ") and line != "data: [DONE]":
                yield json.loads(line[6:])


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGSEGV], ids=["SIGKILL", "SIGSEGV"])
def test_a_worker_killed_mid_stream_costs_only_that_stream(crashy, sig):
    # The chat prompt of the first test is saved while the server idles (every minute): the
    # next worker gets it back.
    deadline = time.monotonic() + 90
    while not crashy.get("/v1/queue")[1]["prefix_cache"]["store"]["files"]:
        assert time.monotonic() < deadline, "no prefix was saved"
        time.sleep(0.5)
    before = worker(crashy)
    chunks, errors = 0, []
    with HealthWatch(crashy) as watch:
        for chunk in stream_lines(crashy, {
                "messages": [{"role": "user", "content": f"Tell me a long story ({sig.name})."}],
                "max_tokens": 400, "ignore_eos": True}):
            if "error" in chunk:
                errors.append(chunk["error"])
                continue
            chunks += 1
            if chunks == 5:
                os.kill(before["pid"], sig)
        after = wait_serving(crashy, before["pid"])
        status, voice = crashy.post("/v1/chat/completions", {
            "messages": [{"role": "user", "content": "Turn on the light."}],
            "max_tokens": 8, "priority": "voice"})
    assert status == 200 and voice["choices"][0]["message"]["content"]
    assert len(errors) == 1 and errors[0]["code"] == "worker_crashed", errors
    assert sig.name in errors[0]["message"]
    assert after["restarts"] == before["restarts"] + 1
    assert crashy.get("/v1/queue")[1]["prefix_cache"]["store"]["restored"] >= 1
    assert after["last_crash"]["cause"].startswith(sig.name)
    # /health answered throughout, quickly, and said what happened.
    assert watch.answers and all(code == 200 for code, _, _ in watch.answers), watch.answers
    assert max(t for _, _, t in watch.answers) < 1.0
    status, health = crashy.get("/health")
    assert health["status"] == "degraded" and sig.name in health["reason"]
    with urllib.request.urlopen(crashy.url + "/metrics", timeout=10) as r:
        metrics = r.read().decode()
    assert f'hearth_worker_restarts_total{{model="{health["model"]}"}} {after["restarts"]}.0' \
        in metrics
    assert f'hearth_worker_serving{{model="{health["model"]}"}} 1.0' in metrics


def job_done_events(data_dir, job_id: str) -> int:
    db = sqlite3.connect(data_dir / "jobs.sqlite3")
    try:
        return db.execute("SELECT COUNT(*) FROM events WHERE job_id = ? AND payload LIKE "
                          "'%\"status\": \"done\"%'", (job_id,)).fetchone()[0]
    finally:
        db.close()


def wait_job(srv: HearthServer, job_id: str, timeout: float = 180.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        _, job = srv.get(f"/v1/jobs/{job_id}")
        if job["status"] in ("done", "failed", "cancelled"):
            return job
        time.sleep(0.2)
    raise AssertionError(f"job {job_id} still {job['status']}")


def test_a_job_whose_worker_is_killed_mid_run_finishes_exactly_once(crashy):
    status, job = crashy.post("/v1/jobs", {"request": {
        "messages": [{"role": "user", "content": "Summarise the week."}],
        "max_tokens": 150, "ignore_eos": True}})
    assert status == 202
    pid = worker(crashy)["pid"]
    deadline = time.monotonic() + 60
    while crashy.get("/v1/queue")[1]["running"].get("background", 0) == 0:
        assert time.monotonic() < deadline, "the job never ran"
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    done = wait_job(crashy, job["id"])
    assert done["status"] == "done", done
    assert done["result"]["usage"]["completion_tokens"] == 150
    assert job_done_events(crashy.data_dir, job["id"]) == 1


def poisoned_body() -> dict:
    schema = {"type": "object", "properties": {POISON: {"type": "string"}},
              "required": [POISON]}
    return {"messages": [{"role": "user", "content": "Fill the form."}], "max_tokens": 16,
            "response_format": {"type": "json_schema",
                                "json_schema": {"name": "form", "schema": schema}}}


def test_a_request_that_kills_its_worker_twice_is_quarantined(crashy):
    crashes = worker(crashy)["crashes"]
    status, bad = crashy.post("/v1/jobs", {"request": poisoned_body()})
    assert status == 202
    status, good = crashy.post("/v1/jobs", {"request": {
        "messages": [{"role": "user", "content": "Summarise the day."}], "max_tokens": 40}})
    assert status == 202
    failed = wait_job(crashy, bad["id"])
    assert failed["status"] == "failed" and failed["error"] == CRASHED_TWICE
    assert wait_job(crashy, good["id"])["status"] == "done"  # the rest of the queue goes on
    w = wait_serving(crashy, -1)
    assert w["crashes"] == crashes + 2 and w["quarantined"] >= 1
    # Sent again, it is refused before it reaches a worker.
    status, err = crashy.post("/v1/chat/completions", poisoned_body())
    assert status == 422 and err["error"]["code"] == "worker_crashed_twice"
    assert worker(crashy)["crashes"] == crashes + 2
    # A restarted server neither runs the failed job again nor accepts the request, and starts
    # on the CPU rung that served (no SIGILL at its canary this time).
    crashy.stop()
    crashy.start()
    status, health = crashy.get("/health")
    assert status == 200 and health["status"] == "ready"
    assert worker(crashy)["last_crash"] is None
    assert crashy.get(f"/v1/jobs/{bad['id']}")[1]["status"] == "failed"
    status, err = crashy.post("/v1/chat/completions", poisoned_body())
    assert status == 422 and err["error"]["message"] == CRASHED_TWICE
