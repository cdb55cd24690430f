"""Ollama's API, driven by the official ``ollama`` client (the version Home Assistant pins)
against the real server with SmolLM2: what Home Assistant's Ollama integration, Open WebUI and
scripts send. The same engine answers: classes come from model aliases and show on /v1/queue."""

from __future__ import annotations

import json
import math

import httpx
import ollama
import pytest

LIGHT_TOOL = {"type": "function", "function": {
    "name": "HassTurnOn", "description": "Turns on a device",
    "parameters": {"type": "object", "properties": {"name": {"type": "string"}},
                   "required": ["name"]}}}


@pytest.fixture(scope="module")
def client(server) -> ollama.Client:
    return ollama.Client(host=server.url)


@pytest.fixture(scope="module")
def model(client) -> str:
    return client.list().models[0].model


def test_version_list_show_ps(client, server, model):
    status, version = server.get("/api/version")
    assert status == 200 and version["version"].count(".") == 2
    names = [m.model for m in client.list().models]
    base = model.removesuffix(":latest")
    assert model.endswith(":latest")
    assert names == [model] + [f"{base}:{c}" for c in ("voice", "chat", "agent", "background")]
    listed = client.list().models[0]
    assert listed.size > 1_000_000 and len(listed.digest) == 64
    assert listed.details.format == "gguf" and listed.details.family
    shown = client.show(f"{base}:voice")
    assert "tools" in shown.capabilities and "embedding" not in shown.capabilities
    assert shown.modelinfo and listed.details.quantization_level == "Q4_1"
    assert "{%" in shown.template  # the model's own chat template
    # The file's name only: a client on the LAN learns nothing of the server's folders.
    (source,) = [line.removeprefix("FROM ") for line in shown.modelfile.splitlines()
                 if line.startswith("FROM ")]
    assert source.endswith(".gguf") and "/" not in shown.modelfile
    (loaded,) = client.ps().models
    assert loaded.model == model and loaded.size == listed.size
    # The OpenAI listing carries the same aliases, after the model.
    _, models = server.get("/v1/models")
    assert [m["id"] for m in models["data"]] == [base, *names[1:]]


def test_chat_streams_and_whole(client, model):
    messages = [{"role": "user", "content": "Say hello."}]
    whole = client.chat(model=model, messages=messages, options={"num_predict": 8, "seed": 1,
                                                                 "temperature": 0})
    assert whole.done and whole.done_reason in ("stop", "length")
    assert whole.message.role == "assistant" and whole.message.content
    assert whole.prompt_eval_count > 0 and 0 < whole.eval_count <= 8
    assert whole.total_duration >= whole.eval_duration > 0
    parts = list(client.chat(model=model, messages=messages, stream=True,
                             options={"num_predict": 8, "seed": 1, "temperature": 0}))
    assert [p.done for p in parts].count(True) == 1 and parts[-1].done
    assert len(parts) > 2  # token by token, not one chunk
    # Not compared with the whole answer: the second request finds the prompt cached, and a
    # different batch shape may tip a greedy choice.
    assert "".join(p.message.content for p in parts).strip()
    assert all(p.message.role == "assistant" for p in parts)
    assert 0 < parts[-1].eval_count <= 8 and parts[-1].done_reason in ("stop", "length")

def test_hearth_timings_beside_ollamas_counts(server, model):
    """The final chunk carries Hearth's timings too (clients ignore the field): the cached
    prompt, which Ollama has no field for, and the class."""
    body = {"model": model, "messages": [{"role": "user", "content": "Say hello again."}],
            "options": {"num_predict": 2}}
    lines = [json.loads(line) for line in httpx.post(
        server.url + "/api/chat", json=body, timeout=60).text.splitlines()]
    assert lines[-1]["done"] and lines[-1]["hearth"]["class"] == "chat"
    whole = httpx.post(server.url + "/api/chat", json={**body, "stream": False}, timeout=60)
    assert whole.json()["hearth"]["cached_tokens"] > 0  # the same prompt again


def test_generate_stream_and_raw(client, model):
    out = client.generate(model=model, prompt="The capital of France is",
                          options={"num_predict": 6, "temperature": 0})
    assert out.done and out.response and out.eval_count <= 6
    parts = list(client.generate(model=model, prompt="Count: one, two,", stream=True,
                                 options={"num_predict": 5, "temperature": 0}))
    assert parts[-1].done and "".join(p.response for p in parts)
    raw = client.generate(model=model, prompt="One, two, three,", raw=True,
                          options={"num_predict": 4, "temperature": 0, "stop": ["\n"]})
    assert raw.done and raw.eval_count <= 4
    loaded = client.generate(model=model, prompt="")  # Ollama's "load the model" request
    assert loaded.done and loaded.done_reason == "load"


def test_json_schema_format_parses(client, model):
    schema = {"type": "object", "properties": {"color": {"type": "string", "maxLength": 12},
                                               "count": {"type": "integer"}},
              "required": ["color", "count"]}
    out = client.chat(model=model, format=schema, options={"temperature": 0, "num_predict": 60},
                      messages=[{"role": "user", "content": "A colour and a number, as JSON."}])
    data = json.loads(out.message.content)
    assert isinstance(data["color"], str) and isinstance(data["count"], int)
    free = client.generate(model=model, prompt="A JSON object about a cat.", format="json",
                           options={"temperature": 0, "num_predict": 400})
    assert isinstance(json.loads(free.response), dict)


def test_forced_tool_call(client, model):
    """Ollama has no tool_choice; Hearth takes one in options (an ignored option elsewhere)."""
    out = client.chat(model=model, tools=[LIGHT_TOOL], options={"tool_choice": "required"},
                      messages=[{"role": "user", "content": "Turn on the kitchen light."}])
    (call,) = out.message.tool_calls
    assert call.function.name == "HassTurnOn"
    assert isinstance(call.function.arguments, dict) and call.function.arguments["name"]
    # The call and its result go back as Ollama's clients send a history.
    again = client.chat(model=model, tools=[LIGHT_TOOL], options={"num_predict": 12}, messages=[
        {"role": "user", "content": "Turn on the kitchen light."},
        {"role": "assistant", "content": "", "tool_calls": [call.model_dump()]},
        {"role": "tool", "content": '{"success": true}', "tool_name": "HassTurnOn"}])
    assert again.done


def test_embed_both_endpoints(client, model):
    out = client.embed(model=model, input=["kitchen light", "porch light"])
    first, second = out.embeddings
    assert len(first) == len(second) > 100
    assert math.isclose(sum(x * x for x in first), 1.0, rel_tol=1e-3)
    assert out.prompt_eval_count > 0
    short = client.embed(model=model, input="kitchen light", dimensions=16).embeddings[0]
    assert len(short) == 16 and math.isclose(sum(x * x for x in short), 1.0, rel_tol=1e-3)
    legacy = client.embeddings(model=model, prompt="kitchen light").embedding
    assert legacy == pytest.approx(first, abs=1e-4)
    # No input, as Ollama answers it: nothing to embed, no error.
    assert client.embed(model=model, input=[]).embeddings == []
    assert client.embeddings(model=model, prompt="").embedding == []


def test_aliases_run_in_their_class(client, server, model):
    base = model.removesuffix(":latest")
    before = server.get("/v1/queue")[1]["classes"]
    client.chat(model=f"{base}:voice", messages=[{"role": "user", "content": "Hi"}],
                options={"num_predict": 2})
    client.chat(model=f"{base}:background", messages=[{"role": "user", "content": "Hi"}],
                options={"num_predict": 2})
    after = server.get("/v1/queue")[1]["classes"]
    for cls in ("voice", "background"):
        assert after[cls]["completed"] == before[cls]["completed"] + 1
    # The aliases work on the OpenAI routes too.
    status, out = server.post("/v1/chat/completions", {
        "model": f"{base}:voice", "max_tokens": 2,
        "messages": [{"role": "user", "content": "Hi"}]})
    assert status == 200 and out["hearth"]["class"] == "voice"
    # With no user field, the client's address is the household member.
    assert any(u.startswith("127.0.0.1") for u in server.get("/v1/queue")[1]["users"])


def test_pull(client, model, server):
    assert client.pull(model).status == "success"
    statuses = [p.status for p in client.pull(model, stream=True)]
    assert statuses[0] == "pulling manifest" and statuses[-1] == "success"
    with pytest.raises(ollama.ResponseError) as err:
        client.pull("qwen3:4b-instruct")
    assert err.value.status_code == 404 and "models_dir" in err.value.error


def test_errors_in_ollama_shape(client, server, model):
    with pytest.raises(ollama.ResponseError) as err:
        client.chat(model="llama3:8b", messages=[{"role": "user", "content": "Hi"}])
    assert err.value.status_code == 404 and "not found" in err.value.error
    with pytest.raises(ollama.ResponseError) as err:
        client.chat(model=model, messages=[{"role": "user", "content": "Hi"}],
                    options={"temperature": "hot"})
    assert err.value.status_code == 400 and "options.temperature" in err.value.error
    # Ollama takes any temperature: past the sampler's range it is the edge (2.0).
    hot = client.chat(model=model, messages=[{"role": "user", "content": "Hi"}],
                      options={"temperature": 5.0, "num_predict": 2})
    assert hot.done
    for body, field in (({"model": model, "messages": [{"role": "user", "content": 3}]},
                         "messages.0.content"),
                        ({"model": model, "messages": [], "keep_alive": "soon"}, "keep_alive"),
                        ({"model": model, "format": "yaml",
                          "messages": [{"role": "user", "content": "Hi"}]}, "format"),
                        ({"messages": []}, "model")):
        r = httpx.post(server.url + "/api/chat", json=body, timeout=30)
        assert r.status_code == 400, body
        assert set(r.json()) == {"error"} and r.json()["error"].startswith(field)
    for path in ("/api/show", "/api/pull"):
        r = httpx.post(server.url + path, json={}, timeout=30)
        assert r.status_code == 400 and r.json() == {"error": "model: model is required"}
    # Unknown fields are ignored, as Ollama ignores them; an integral float is an integer
    # (Home Assistant's Ollama integration sends its form's num_ctx as 8192.0).
    r = httpx.post(server.url + "/api/chat", timeout=60, json={
        "model": model, "stream": False, "messages": [{"role": "user", "content": "Hi"}],
        "options": {"num_predict": 2.0, "num_ctx": 8192.0, "mirostat": 0}, "truncate": True,
        "shift": True})
    assert r.status_code == 200 and r.json()["done"] and r.json()["eval_count"] <= 2
    r = httpx.post(server.url + "/api/chat", timeout=30, json={
        "model": model, "messages": [{"role": "user", "content": "Hi"}],
        "options": {"num_ctx": "8192"}})
    assert r.status_code == 400 and r.json()["error"].startswith("options.num_ctx")
    # Ollama's liveness check, open without a key as Ollama's is.
    r = httpx.get(server.url + "/", timeout=10)
    assert r.status_code == 200 and "running" in r.text
    assert httpx.head(server.url + "/", timeout=10).status_code == 200
    r = httpx.post(server.url + "/api/chat", timeout=30, json={
        "model": model, "messages": [{"role": "user", "content": "Hi", "images": ["aGk="]}]})
    assert r.status_code == 400 and "vision" in r.json()["error"]
