"""Remote workers: a real second Hearth on another loopback port, and a stand-in for a vLLM box
that can be slow or fail. Background work goes to the remote with its class; when the remote
fails or is saturated, requests fall back to the local model; a durable job whose worker dies
mid-run finishes locally, once; when the remote comes back, routing returns to it."""

from __future__ import annotations

import json
import signal
import threading
import time
import urllib.request

import pytest
from hearth_server import HearthServer, free_port
from standin_openai import StandIn

POOL = ("--n-ctx", "4096", "--n-parallel", "4")


def chat(s: HearthServer, cls: str, **extra) -> tuple[int, dict]:
    return s.post("/v1/chat/completions", {
        "messages": [{"role": "user", "content": "Summarise the day."}], "max_tokens": 8,
        "temperature": 0, "priority": cls, **extra}, timeout=180)


def worker(s: HearthServer, name: str) -> dict:
    status, q = s.get("/v1/queue")
    assert status == 200, q
    return q["models"][name]


def wait_state(s: HearthServer, name: str, state: str, timeout: float = 60.0) -> dict:
    """Polls the server's report until the worker is in ``state`` (health checks run every
    2 s; a worker whose request failed waits 10 s before one may bring it back)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        w = worker(s, name)
        if w["state"] == state:
            return w
        time.sleep(0.2)
    raise AssertionError(f"{name} never became {state}: {worker(s, name)}")


@pytest.fixture(scope="module")
def standin():
    with StandIn("big-model") as s:
        yield s


@pytest.fixture(scope="module")
def front(tmp_path_factory, standin):
    models = [{"name": "local", "classes": ["voice", "chat"], "pinned": True},
              {"name": "vllm-box", "url": standin.url + "/v1", "kind": "vllm",
               "remote_model": "big-model", "classes": ["background"], "fallback": "local",
               "timeout_s": 2, "max_concurrency": 2},
              # The same box behind credentials: they must never be shown or logged.
              {"name": "keyed-box", "url": standin.url.replace("http://", "http://hearth:"
                                                               "pw-S3CRET@") + "/v1",
               "kind": "vllm", "remote_model": "big-model"}]
    with HearthServer(*POOL, "--load-wait-s", "20", "--models", json.dumps(models),
                      data_dir=tmp_path_factory.mktemp("front")) as s:
        wait_state(s, "vllm-box", "ready")
        yield s


@pytest.fixture
def healthy(front, standin):
    standin.mode, standin.waiting = "ok", 0
    wait_state(front, "vllm-box", "ready")
    return front


def test_background_work_goes_to_the_remote_with_its_class(healthy, standin):
    status, answer = chat(healthy, "background")
    assert status == 200 and answer["model"] == "vllm-box", answer
    assert answer["choices"][0]["message"]["content"] == "Stand-in summary done."
    sent = standin.bodies[-1]
    # vLLM's priority scheduling runs lower values first: the class rank goes as it is.
    assert sent["model"] == "big-model" and sent["priority"] == 3
    assert "tool_argument_values" not in sent and "reasoning_format" not in sent
    status, voice = chat(healthy, "voice")
    assert status == 200 and voice["model"] == "local"
    # Ollama's API, streamed, reaches the remote the same way.
    req = urllib.request.Request(healthy.url + "/api/chat", data=json.dumps({
        "model": "vllm-box", "messages": [{"role": "user", "content": "Summarise."}]}).encode(),
        headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        lines = [json.loads(x) for x in r.read().splitlines() if x.strip()]
    assert "".join(x["message"]["content"] for x in lines) == "Stand-in summary done."
    assert lines[-1]["done"] is True and lines[-1]["eval_count"] == 3
    assert standin.bodies[-1]["stream"] is True


def test_a_failing_remote_falls_back_and_routing_returns(healthy, standin):
    standin.mode = "error"
    answered = [chat(healthy, "background") for _ in range(2)]
    # The first may reach it (a 502 naming the worker) before a health check sees it down;
    # by the second, requests go to the fallback.
    assert answered[-1][0] == 200 and answered[-1][1]["model"] == "local", answered
    for status, body in answered[:-1]:
        assert status == 200 or (status == 502 and "vllm-box" in body["error"]["message"])
    w = worker(healthy, "vllm-box")
    assert w["state"] == "unreachable" and w["error"]
    standin.mode = "ok"
    wait_state(healthy, "vllm-box", "ready")
    status, answer = chat(healthy, "background")
    assert status == 200 and answer["model"] == "vllm-box"


def test_a_remote_that_does_not_answer_in_time_is_cut_at_its_timeout(healthy, standin):
    standin.mode, standin.delay_s = "slow", 6.0
    t0 = time.monotonic()
    status, err = chat(healthy, "background")
    took = time.monotonic() - t0
    assert status == 502 and "no answer within 2 s" in err["error"]["message"], err
    assert 2.0 <= took < 5.0, took
    # Its health checks pass (/v1/models is quick), but after a failed request it is left
    # out for a while: the next request goes to the fallback at once.
    status, answer = chat(healthy, "background")
    assert status == 200 and answer["model"] == "local"


def test_a_saturated_remote_sends_the_overflow_to_the_fallback(healthy, standin):
    standin.mode, standin.delay_s = "slow", 1.0
    results: list[tuple[int, dict]] = []
    threads = [threading.Thread(target=lambda: results.append(chat(healthy, "background")))
               for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    models = sorted(body["model"] for _, body in results)
    assert models == ["local", "vllm-box", "vllm-box"], results  # max_concurrency 2
    # The remote's own queue counts too (vLLM's num_requests_waiting in /metrics).
    standin.mode, standin.waiting = "ok", 5
    deadline = time.monotonic() + 30
    while worker(healthy, "vllm-box")["waiting"] != 5:
        assert time.monotonic() < deadline, worker(healthy, "vllm-box")
        time.sleep(0.2)
    status, answer = chat(healthy, "background")
    assert status == 200 and answer["model"] == "local"


def test_a_remote_found_down_before_it_took_the_request_sends_it_to_the_fallback(tmp_path):
    """No connection at all (the box is off): the request has not reached it, so it goes to
    the fallback at once, streamed or whole, instead of a 502."""
    with StandIn("big-model") as box:
        models = [{"name": "local", "classes": ["voice", "chat"], "pinned": True},
                  {"name": "box", "url": box.url, "kind": "vllm", "classes": ["background"],
                   "fallback": "local"}]
        with HearthServer(*POOL, "--models", json.dumps(models), data_dir=tmp_path) as front:
            wait_state(front, "box", "ready")
            box.stop()  # before the next health check notices
            status, whole = chat(front, "background")
            assert status == 200 and whole["model"] == "local", whole
            req = urllib.request.Request(front.url + "/v1/chat/completions", data=json.dumps({
                "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4,
                "stream": True, "priority": "background"}).encode(),
                headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=60) as r:
                events = [x[5:].strip() for x in r.read().splitlines() if x.startswith(b"data:")]
            assert events[-1] == b"[DONE]"
            assert json.loads(events[0])["model"] == "local"
            assert worker(front, "box")["state"] == "unreachable"


def test_a_job_survives_its_remote_hearth_dying_and_routing_returns(tmp_path):
    port = free_port()
    remote = HearthServer(*POOL, data_dir=tmp_path / "remote", port=port).start()
    models = [{"name": "local", "classes": ["voice", "chat"], "pinned": True},
              {"name": "upstairs", "url": remote.url, "kind": "hearth",
               "classes": ["background"], "fallback": "local", "timeout_s": 120}]
    try:
        with HearthServer(*POOL, "--models", json.dumps(models),
                          data_dir=tmp_path / "front") as front:
            wait_state(front, "upstairs", "ready")
            status, job = front.post("/v1/jobs", {"class": "background", "request": {
                "messages": [{"role": "user", "content": "Write a long story."}],
                "max_tokens": 400, "ignore_eos": True, "temperature": 0}})
            assert status == 202
            deadline = time.monotonic() + 60
            while remote.get("/v1/queue")[1]["running"]["background"] < 1:
                assert time.monotonic() < deadline, "the job never reached the remote"
                time.sleep(0.1)
            assert remote.stop(signal.SIGKILL) is not None  # mid-run
            deadline = time.monotonic() + 180
            while True:
                got = front.get(f"/v1/jobs/{job['id']}")[1]
                if got["status"] in ("done", "failed", "cancelled"):
                    break
                assert time.monotonic() < deadline, got
                time.sleep(0.2)
            assert got["status"] == "done", got
            assert got["result"]["model"] == "local"  # retried on the fallback
            assert got["result"]["usage"]["completion_tokens"] == 400
            status, done = front.get("/v1/jobs?status=done")
            assert [j["id"] for j in done["data"]] == [job["id"]]  # landed once
            status, q = front.get("/v1/queue")
            assert q["classes"]["background"]["completed"] == 1
            assert q["models"]["upstairs"]["state"] == "unreachable"

            remote = HearthServer(*POOL, data_dir=tmp_path / "remote", port=port).start()
            wait_state(front, "upstairs", "ready")
            status, answer = chat(front, "background")
            assert status == 200 and answer["model"] == "upstairs"
            assert remote.get("/v1/queue")[1]["classes"]["background"]["completed"] == 1
    finally:
        remote.stop()


def test_a_remote_s_credentials_are_never_shown_or_logged(healthy):
    """The keyed box is used (its answer comes back) and shown everywhere without its user and
    password: /v1/models, /v1/queue, /health, /metrics and the log."""
    status, answer = healthy.post("/v1/chat/completions", {
        "model": "keyed-box", "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 4}, timeout=60)
    assert status == 200, answer
    wait_state(healthy, "keyed-box", "ready")
    shown = [json.dumps(healthy.get(p)[1]) for p in ("/v1/models", "/v1/queue", "/health")]
    with urllib.request.urlopen(healthy.url + "/metrics") as r:
        shown.append(r.read().decode())
    shown.append(healthy.log_path.read_text(errors="replace"))
    for text in shown:
        assert "pw-S3CRET" not in text
    assert "http://***@127.0.0.1" in shown[1]  # the URL is still shown, without its secret
