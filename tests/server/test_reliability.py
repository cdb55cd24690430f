"""Reliability: fuzzing from the OpenAPI description, many clients dropping mid-stream, bounded
memory under overload, safe defaults."""

from __future__ import annotations

import asyncio
import json
import os
import time

import aiohttp
import pytest
import schemathesis
from hearth_server import HearthServer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytestmark = pytest.mark.model

# `make test` runs a bounded number of examples per operation; `make fuzz` sets more.
EXAMPLES = int(os.environ.get("HEARTH_FUZZ_EXAMPLES", "12"))


@pytest.fixture(scope="module")
def fuzz_server(tmp_path_factory):
    # A 2,048-token context bounds the work one request can ask for (~15 s of prefill on one
    # thread), so the 60 s read timeout below tells a hang from a long prompt: with 8,192 a
    # fuzzed request with a large tools array (rendered into the prompt) ran into it.
    with HearthServer("--max-tokens-default", "8", "--n-threads", "1", "--n-ctx", "2048",
                      data_dir=tmp_path_factory.mktemp("fuzz")) as s:
        yield s


@pytest.fixture(scope="module")
def api_schema(fuzz_server):
    return schemathesis.openapi.from_url(fuzz_server.url + "/openapi.json")


schema = schemathesis.pytest.from_fixture("api_schema").exclude(
    path=["/v1/events", "/v1/queue/events"])  # endless streams


def _bound(body: object) -> None:
    """Keep generated requests short: fuzzing looks for crashes, not for long generations."""
    if isinstance(body, dict):
        options = body.get("options")
        if isinstance(options, dict):  # Ollama's routes
            _bound(options)
            options["num_predict"] = 8
        for key in ("max_tokens", "max_completion_tokens", "num_predict"):
            value = body.get(key)
            # floats too: the API takes 14443.0 as an integer, and it ran past the timeout
            if isinstance(value, int | float) and not isinstance(value, bool) and value > 8:
                body[key] = 8
        if isinstance(body.get("request"), dict):
            _bound(body["request"])


@schema.parametrize()
@settings(max_examples=EXAMPLES, deadline=None,
          suppress_health_check=list(HealthCheck))
def test_fuzz_never_5xx_nor_hangs(case, fuzz_server):
    _bound(case.body)
    resp = case.call(base_url=fuzz_server.url, timeout=60)
    assert resp.status_code < 500, resp.text[:500]
    if resp.status_code >= 400:
        err = resp.json()["error"]
        if case.path.startswith("/api/"):  # Ollama's shape
            assert isinstance(err, str) and err
        else:
            assert err["message"] and err["type"]


# Valid bodies of every endpoint that takes text; the property below plants lone surrogates
# (JSON escapes such as "\ud800" that no UTF-8 text can hold) into their strings and keys.
VALID_BODIES = {
    "/v1/chat/completions": {"messages": [{"role": "system", "content": "Be brief."},
                                          {"role": "user", "content": [{"type": "text",
                                                                        "text": "Hi"}]}],
                             "max_tokens": 2, "stop": ["\n"], "user": "alice",
                             "tools": [{"type": "function", "function": {
                                 "name": "f", "description": "d",
                                 "parameters": {"type": "object", "properties": {}}}}]},
    "/v1/completions": {"prompt": "Once", "max_tokens": 2, "stop": ["."]},
    "/v1/embeddings": {"input": ["a text", "another"]},
    "/api/chat": {"model": "hearth:voice", "stream": False, "options": {"num_predict": 2},
                  "messages": [{"role": "user", "content": "Hi", "tool_name": "t"}],
                  "tools": [{"type": "function", "function": {
                      "name": "f", "parameters": {"type": "object", "properties": {}}}}]},
    "/api/generate": {"model": "hearth", "prompt": "Once", "system": "Be brief.",
                      "stream": False, "options": {"num_predict": 2, "stop": ["."]}},
    "/api/embed": {"model": "hearth", "input": ["a text", "another"]},
    "/v1/jobs": {"request": {"messages": [{"role": "user", "content": "Sum up."}],
                             "max_tokens": 2}, "tag": "t"},
}


def _strings(node: object, path: tuple = ()) -> list[tuple]:
    """Paths of every string value and key in ``node`` (a key's path ends with its name)."""
    if isinstance(node, str):
        return [path]
    if isinstance(node, dict):
        return [p for k, v in node.items() for p in [(*path, ("key", k)), *_strings(v, (*path, k))]]
    if isinstance(node, list):
        return [p for i, v in enumerate(node) for p in _strings(v, (*path, i))]
    return []


def _plant(body: dict, path: tuple, bad: str) -> dict:
    body = json.loads(json.dumps(body))
    *parents, last = path
    node = body
    for step in parents:
        node = node[step]
    if isinstance(last, tuple):  # a key: rename it
        node[last[1] + bad] = node.pop(last[1])
    else:
        node[last] = node[last] + bad
    return body


@pytest.mark.parametrize("endpoint", sorted(VALID_BODIES))
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_lone_surrogates_anywhere_are_a_400(fuzz_server, endpoint, data):
    """A lone surrogate in any string or key of a valid body: a 400 in the API's own shape,
    never a 500 (it once failed in the prompt builder)."""
    body = VALID_BODIES[endpoint]
    path = data.draw(st.sampled_from(_strings(body)))
    # One surrogate, high or low: never half of a pair (a pair is a valid character).
    bad = data.draw(st.characters(categories=["Cs"]))
    raw = json.dumps(_plant(body, path, bad)).encode()  # ensure_ascii: escapes, valid JSON
    status, out = fuzz_server.post(endpoint, raw, timeout=60)
    assert status == 400, out
    if endpoint.startswith("/api/"):  # Ollama's shape: the message only
        assert "surrogate" in out["error"]
    else:
        assert out["error"]["code"] == "invalid_unicode" and "surrogate" in out["error"]["message"]


def test_server_healthy_after_fuzzing(fuzz_server):
    assert fuzz_server.get("/health")[0] == 200
    status, body = fuzz_server.post("/v1/chat/completions", {
        "messages": [{"role": "user", "content": "still there?"}], "max_tokens": 4})
    assert status == 200 and body["choices"][0]["message"]["content"] is not None


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


# Per API: where a stream goes, its body, and how a line with content looks.
DROPPED_STREAMS = {
    "openai": ("/v1/chat/completions", {"stream": True, "max_tokens": 400, "ignore_eos": True},
               lambda line: line.startswith(b"data: ") and b'"content"' in line
               and b'""' not in line),
    "ollama": ("/api/chat", {"model": "hearth", "options": {"num_predict": 400,
                                                           "ignore_eos": True}},
               lambda line: b'"done": false' in line),
}


async def _drop_mid_stream(url: str, n: int, api: str) -> int:
    path, extra, has_content = DROPPED_STREAMS[api]
    body = {"messages": [{"role": "user", "content": "Tell me a long story."}], **extra}
    got_tokens = 0

    async def one(session: aiohttp.ClientSession) -> None:
        nonlocal got_tokens
        async with session.post(url + path, json=body) as r:
            assert r.status == 200
            async for line in r.content:
                if has_content(line):
                    got_tokens += 1
                    return  # leave with the stream still running

    async with aiohttp.ClientSession() as session:
        await asyncio.gather(*(one(session) for _ in range(n)))
    return got_tokens


def _settled(server) -> dict:
    """The queue once nothing runs or waits and the KV view shows no running cells, or as it
    stands after 60 s. The counts are read live, the KV view as of the engine's last
    iteration: a response can reach its client before the iteration that finished it is
    published, so a request just finished is not read as cells left behind."""
    deadline = time.monotonic() + 60
    while True:
        _, q = server.get("/v1/queue")
        settled = sum(q["running"].values()) == 0 and sum(q["waiting"].values()) == 0 \
            and q["kv"]["used_by_running"] == 0
        if settled or time.monotonic() > deadline:
            return q
        time.sleep(0.25)


@pytest.mark.parametrize("api", sorted(DROPPED_STREAMS))
def test_forty_clients_dropping_mid_stream_leave_nothing_behind(server, api):
    idle = _settled(server)  # the test before may have just finished a request
    got = asyncio.run(_drop_mid_stream(server.url, 40, api))
    assert got == 40  # each saw its stream start, then hung up
    q = _settled(server)
    assert sum(q["running"].values()) == 0 and sum(q["waiting"].values()) == 0
    assert q["kv"]["used_by_running"] == idle["kv"]["used_by_running"] == 0
    assert q["kv"]["used"] <= q["kv"]["cells"]
    status, _ = server.post("/v1/chat/completions", {
        "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3})
    assert status == 200


async def _flood(url: str, n: int) -> list[int]:
    body = {"messages": [{"role": "user", "content": "Summarise nothing."}], "max_tokens": 4,
            "priority": "background"}
    async with aiohttp.ClientSession() as session:
        async def one() -> int:
            async with session.post(url + "/v1/chat/completions", json=body) as r:
                await r.read()
                return r.status

        return await asyncio.gather(*(one() for _ in range(n)))


def test_overload_is_refused_not_buffered(tmp_path):
    with HearthServer("--max-queue", "4", "--n-parallel", "2", data_dir=tmp_path) as srv:
        pid = srv.proc.pid
        statuses = asyncio.run(_flood(srv.url, 20))  # warm-up: allocations that stay
        before = rss_kib(pid)
        for _ in range(5):
            statuses += asyncio.run(_flood(srv.url, 60))
        after = rss_kib(pid)
        assert 429 in statuses and 200 in statuses
        assert set(statuses) <= {200, 429}
        assert after < before * 1.10 + 8 * 1024, (before, after)
        _, q = srv.get("/v1/queue")
        assert q["classes"]["background"]["rejected"] == statuses.count(429)


def test_binds_loopback_unless_told_otherwise():
    from hearth.cli import build_parser
    from hearth.settings import load

    s = load(build_parser().parse_args(["serve"]), {})
    assert s.host == "127.0.0.1"


def test_diagnostics_free_endpoints_do_not_leak_the_key(tmp_path):
    key = "very-secret-key-123"
    with HearthServer(data_dir=tmp_path, env={"HEARTH_API_KEY": key}) as srv:
        ok = {"Authorization": f"Bearer {key}"}
        for path in ("/v1/queue", "/v1/models", "/openapi.json"):
            status, body = srv.get(path, ok)
            assert status == 200 and key not in json.dumps(body)
        srv.get("/v1/models", {"Authorization": "Bearer wrong-" + key})
        log = srv.log()
    assert key not in log
