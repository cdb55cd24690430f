"""The OpenAI-compatible API and the Hearth API, over HTTP against the real server."""

from __future__ import annotations

import json
import re
import urllib.request

import openai
import pytest

pytestmark = pytest.mark.model

TOOLS = [{"type": "function", "function": {
    "name": "HassTurnOn", "description": "Turns on a device or entity",
    "parameters": {"type": "object", "properties": {"name": {"type": "string"},
                                                     "area": {"type": "string"}},
                   "required": ["name"]}}}]


def sse(url: str, body: dict, headers: dict | None = None) -> list:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json", **(headers or {})})
    events = []
    with urllib.request.urlopen(req, timeout=120) as r:
        assert r.headers["Content-Type"].startswith("text/event-stream")
        for line in r:
            line = line.decode().strip()
            if line.startswith("data: "):
                events.append(line[6:])
    return events


def test_health_and_models(server):
    status, body = server.get("/health")
    assert status == 200 and body["status"] == "ready"
    assert body["model"] == "SmolLM2-135M-Instruct.Q4_1"
    assert body["backends"] and body["backends"][0].startswith("CPU")  # llama.cpp's, in use
    status, body = server.get("/v1/models")
    assert status == 200 and body["data"][0]["id"] == "SmolLM2-135M-Instruct.Q4_1"


def test_chat_completion_with_the_official_client(server):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused")
    out = client.chat.completions.create(
        model="SmolLM2-135M-Instruct.Q4_1", temperature=0, max_tokens=12,
        messages=[{"role": "user", "content": [{"type": "text", "text": "Hello!"}]}])
    assert out.choices[0].message.content
    assert out.usage.completion_tokens <= 12 and out.usage.prompt_tokens > 5
    chunks = list(client.chat.completions.create(
        model="SmolLM2-135M-Instruct.Q4_1", temperature=0, max_tokens=12, stream=True,
        stream_options={"include_usage": True},
        messages=[{"role": "user", "content": "Hello!"}]))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens > 0  # same prompt again
    # Greedy, streamed == whole: compared with a whole answer that found the prompt cached
    # as the stream did (the first may not have; another batch shape can tip a greedy choice).
    again = client.chat.completions.create(
        model="SmolLM2-135M-Instruct.Q4_1", temperature=0, max_tokens=12,
        messages=[{"role": "user", "content": "Hello!"}])
    assert again.usage.prompt_tokens_details.cached_tokens == \
        chunks[-1].usage.prompt_tokens_details.cached_tokens
    assert text == again.choices[0].message.content
    assert chunks[-1].usage.completion_tokens == again.usage.completion_tokens


def test_stream_ends_with_done_and_respects_stop_and_ignore_eos(server):
    events = sse(server.url + "/v1/chat/completions", {
        "messages": [{"role": "user", "content": "Count from 1 to 20, separated by commas."}],
        "temperature": 0, "max_tokens": 80, "stream": True, "stop": ["5"]})
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    assert "5" not in text and chunks[-1]["choices"][0]["finish_reason"] == "stop"
    status, body = server.post("/v1/chat/completions", {
        "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 40,
        "ignore_eos": True, "temperature": 0.7, "seed": 3})
    assert status == 200 and body["usage"]["completion_tokens"] == 40
    assert body["choices"][0]["finish_reason"] == "length"


def test_text_completion(server):
    status, body = server.post("/v1/completions", {"prompt": "The capital of France is",
                                                   "max_tokens": 5, "temperature": 0})
    assert status == 200 and body["object"] == "text_completion"
    assert body["choices"][0]["text"] and body["usage"]["completion_tokens"] <= 5


def test_embeddings(server):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused")
    out = client.embeddings.create(model="hearth", input=["kitchen light", "kitchen lamp",
                                                          "income tax"])
    v = [d.embedding for d in out.data]
    assert len(v) == 3 and len(v[0]) == 576

    def cos(a, b):
        return sum(x * y for x, y in zip(a, b, strict=True))

    assert cos(v[0], v[1]) > cos(v[0], v[2])


def forced_tokens(server) -> float:
    """hearth_forced_tokens_total from /metrics: call text written without sampling."""
    with urllib.request.urlopen(server.url + "/metrics") as r:
        text = r.read().decode()
    return float(re.search(r"^hearth_forced_tokens_total (\S+)$", text, re.M).group(1))


def test_grammar_forced_tool_call(server):
    before = forced_tokens(server)
    status, body = server.post("/v1/chat/completions", {
        "messages": [{"role": "user", "content": "Turn on the kitchen light"}],
        "tools": TOOLS, "tool_choice": "required", "temperature": 0, "max_tokens": 80})
    assert status == 200, body
    choice = body["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    call = choice["message"]["tool_calls"][0]
    assert call["type"] == "function" and call["function"]["name"] == "HassTurnOn"
    assert isinstance(json.loads(call["function"]["arguments"])["name"], str)
    # the call's fixed text (the tool's name, '", "arguments": {"name": "') was not sampled,
    # and counts as output all the same
    forced = forced_tokens(server) - before
    assert 0 < forced < body["usage"]["completion_tokens"]


def test_a_tool_call_the_model_opens_keeps_to_the_values_sent(server):
    """Under tool_choice "auto", a call the model opens is held to the tool's schema, narrowed
    by ``tool_argument_values``: it names an exposed entity and area, also for a device that is
    not there. A forced call keeps to them too, and a question gets no call. (That the model
    left alone names what is not there is shown deterministically at the sampler level in
    test_engine_real: over HTTP, chunking varies with the machine's load, and with it the
    free model's near-ties.)"""
    values = {"HassTurnOn": {"name": ["Kitchen light", "Porch light"],
                             "area": ["Kitchen", "Porch"]}}

    def ask(text, choice="auto"):
        status, out = server.post("/v1/chat/completions", {
            "messages": [{"role": "system", "content": "You control a home. Devices: "
                                                       "Kitchen light, Porch light."},
                         {"role": "user", "content": text}],
            "tools": TOOLS, "tool_choice": choice, "temperature": 0, "max_tokens": 60,
            "tool_argument_values": values})
        assert status == 200, out
        return out["choices"][0]["message"]

    def args(message):
        return [json.loads(c["function"]["arguments"]) for c in message.get("tool_calls") or []]

    # Whether greedy SmolLM2 opens a call at all under "auto" is a near-tie that the prompt's
    # chunking (the machine's load, the calibrated cost) tips either way, for all four commands
    # at once in about one run in four on an idle machine: the calls it opens are checked here,
    # and test_tool_grammars_real shows deterministically that an opened call is held.
    held = [a for text in ("Turn on the garage heater.", "Turn on the kitchen light.",
                           "Switch the porch light on.", "Please turn on the garage heater.")
            for a in args(ask(text))]
    forced = args(ask("Turn on the garage heater.", "required"))
    assert forced
    for a in held + forced:
        assert a["name"] in values["HassTurnOn"]["name"]
        assert a.get("area", "Kitchen") in values["HassTurnOn"]["area"]
    question = ask("What is the capital of France?")
    assert not question.get("tool_calls") and "Paris" in question["content"]


def test_named_tool_call_streams_as_deltas(server):
    events = sse(server.url + "/v1/chat/completions", {
        "messages": [{"role": "user", "content": "Switch on the hall lamp"}],
        "tools": TOOLS, "stream": True, "max_tokens": 80, "temperature": 0,
        "tool_choice": {"type": "function", "function": {"name": "HassTurnOn"}}})
    chunks = [json.loads(e) for e in events[:-1]]
    calls = [tc for c in chunks for tc in c["choices"][0]["delta"].get("tool_calls", [])]
    assert calls and calls[0]["function"]["name"] == "HassTurnOn"
    json.loads(calls[0]["function"]["arguments"])
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_json_schema_answer(server):
    schema = {"type": "object", "properties": {"name": {"type": "string"},
                                                "age": {"type": "integer"}},
              "required": ["name", "age"], "additionalProperties": False}
    status, body = server.post("/v1/chat/completions", {
        "messages": [{"role": "user", "content": "Invent a person."}], "temperature": 0,
        "max_tokens": 60, "response_format": {"type": "json_schema",
                                              "json_schema": {"name": "p", "schema": schema}}})
    assert status == 200
    data = json.loads(body["choices"][0]["message"]["content"])
    assert set(data) == {"name", "age"} and isinstance(data["age"], int)
    status, body = server.post("/v1/chat/completions", {
        "messages": [{"role": "user", "content": "Say anything as JSON."}], "temperature": 0,
        "max_tokens": 120, "response_format": {"type": "json_object"}})
    assert status == 200 and isinstance(json.loads(body["choices"][0]["message"]["content"]),
                                        dict)


@pytest.mark.parametrize(("body", "param"), [
    (b"{not json", None),
    pytest.param(b"[" * 100_000, None, id="nested-too-deep"),  # the decoder gives up: was a 500
    ({"messages": "hello"}, "messages"),
    ({}, "messages"),
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "wizard", "content": "x"}]}, "messages.0.role"),
    ({"messages": [{"role": "user", "content": "x"}], "priority": "urgent"}, "priority"),
    ({"messages": [{"role": "user", "content": "x"}], "max_tokens": -1}, "max_tokens"),
    ({"messages": [{"role": "user", "content": "x"}], "temperature": 9}, "temperature"),
    ({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function",
                                                                "function": {"name": ""}}]},
     "tools.0.function.name"),
    ({"messages": [{"role": "user", "content": "x"}],
      "response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "nope"}}}},
     "response_format"),
    # past llama.cpp's repetition limit: once crashed the server; now past Hearth's own limit
    # (schema_limits), refused naming the value
    ({"messages": [{"role": "user", "content": "x"}],
      "response_format": {"type": "json_schema",
                          "json_schema": {"schema": {"type": "string", "maxLength": 10000}}}},
     "response_format.json_schema.schema.maxLength"),
    ({"messages": [{"role": "user", "content": "x"}], "tool_choice": "required",
      "tools": [{"type": "function", "function": {"name": "f", "parameters": {
          "type": "object", "properties": {"s": {"type": "string", "maxLength": 10000}}}}}]},
     "tools.0.function.parameters.properties.s.maxLength"),
])
def test_bad_requests_are_400_in_the_openai_shape(server, body, param):
    status, out = server.post("/v1/chat/completions", body)
    assert status == 400
    err = out["error"]
    assert err["type"] == "invalid_request_error" and err["message"]
    if param:
        assert err["param"] == param
    status, _ = server.post("/v1/chat/completions", {
        "messages": [{"role": "user", "content": "ok?"}], "max_tokens": 2})
    assert status == 200  # the next valid request still succeeds


def test_image_parts_are_a_clear_400(server):
    """An image part (an AI Task's camera snapshot) to a model without vision support: a 400
    that says so, not a generic one."""
    status, out = server.post("/v1/chat/completions", {"messages": [{"role": "user", "content": [
        {"type": "text", "text": "What is on the camera?"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
    ]}], "max_tokens": 4})
    assert status == 400
    assert out["error"]["param"] == "messages"
    assert "no vision support" in out["error"]["message"]


def test_other_error_statuses(server):
    status, out = server.post("/v1/chat/completions", {
        "model": "gpt-9", "messages": [{"role": "user", "content": "x"}]})
    assert status == 404 and out["error"]["code"] == "model_not_found"
    status, out = server.post("/v1/chat/completions", {
        "messages": [{"role": "user", "content": "word " * 9000}]})
    assert status == 400 and out["error"]["code"] == "context_length_exceeded"
    status, out = server.post("/v1/chat/completions", b"\xff\xfe{}")
    assert status == 400 and out["error"]["code"] == "invalid_utf8"
    status, out = server.post("/v1/chat/completions", b"x" * (9 * 1024 * 1024))
    assert status == 413 and out["error"]["code"] == "body_too_large"
    assert server.get("/v1/jobs/job_nope")[0] == 404


def test_class_header_and_priority_reach_the_per_class_counts(server):
    _, before = server.get("/v1/queue")
    server.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "a"}],
                                         "max_tokens": 2}, headers={"X-Hearth-Class": "agent"})
    server.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "b"}],
                                         "max_tokens": 2, "priority": 0})
    _, after = server.get("/v1/queue")
    assert after["classes"]["agent"]["completed"] == before["classes"]["agent"]["completed"] + 1
    assert after["classes"]["voice"]["completed"] == before["classes"]["voice"]["completed"] + 1


def test_queue_document(server):
    server.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                                         "max_tokens": 4, "user": "alice"})
    status, q = server.get("/v1/queue")
    assert status == 200
    for cls in ("voice", "chat", "agent", "background", "embedding"):
        c = q["classes"][cls]
        assert {"completed", "rejected", "queue_ms", "ttft_ms", "itl_ms", "e2e_ms"} <= set(c)
        assert q["waiting"][cls] >= 0 and q["running"][cls] >= 0
    assert q["classes"]["chat"]["ttft_ms"]["p95"] > 0
    assert 0 <= q["kv"]["use"] <= 1 and "hit_rate" in q["prefix_cache"]
    assert "alice" in q["users"] and 0 < q["users"]["alice"]["share"] <= 1
    assert set(q["jobs"]) == {"queued", "running", "done", "failed", "cancelled"}


def test_metrics_and_openapi(server):
    server.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                                         "max_tokens": 3})
    with urllib.request.urlopen(server.url + "/metrics") as r:
        text = r.read().decode()
    assert 'hearth_time_to_first_token_seconds_bucket{class="chat"' in text
    assert "hearth_requests_running" in text and "hearth_kv_cache_usage_ratio" in text
    status, spec = server.get("/openapi.json")
    assert status == 200 and spec["openapi"].startswith("3.")
    assert "/v1/chat/completions" in spec["paths"] and "ChatCompletionRequest" in \
        spec["components"]["schemas"]


def test_client_disconnect_cancels_and_frees_the_sequence(server):
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    conn.request("POST", "/v1/chat/completions", json.dumps({
        "messages": [{"role": "user", "content": "Write a long story."}], "stream": True,
        "max_tokens": 2000, "ignore_eos": True}), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    resp.readline()
    resp.readline()
    conn.sock.shutdown(2)
    conn.close()
    import time

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        _, q = server.get("/v1/queue")
        if sum(q["running"].values()) == 0 and q["kv"]["used_by_running"] == 0:
            break
        time.sleep(0.2)
    assert sum(q["running"].values()) == 0 and q["kv"]["used_by_running"] == 0
    assert q["classes"]["chat"]["completed"] >= 1


def test_non_streaming_client_that_hangs_up_is_cancelled(server):
    import socket
    import time

    body = json.dumps({"messages": [{"role": "user", "content": "Write a long story."}],
                       "max_tokens": 3000, "ignore_eos": True}).encode()
    s = socket.create_connection(("127.0.0.1", server.port))
    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
              b"application/json\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n"
              + body)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # wait until it is really generating
        _, q = server.get("/v1/queue")
        if q["running"]["chat"] >= 1:
            break
        time.sleep(0.1)
    assert q["running"]["chat"] >= 1
    s.close()
    t0 = time.monotonic()
    while time.monotonic() - t0 < 20:
        _, q = server.get("/v1/queue")
        if sum(q["running"].values()) == 0:
            break
        time.sleep(0.1)
    # 3,000 tokens would take far longer than this at this machine's decode speed.
    assert sum(q["running"].values()) == 0
    assert time.monotonic() - t0 < 10
