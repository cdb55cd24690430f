"""Issue 26 against the real server: a ~200-byte JSON schema with a count of 20,000 crashed
llama.cpp's grammar parser and the process with it. Sent every way a schema enters (OpenAI
response_format, tools under auto and required, tool_argument_values, Ollama's format and tools,
durable jobs), each is now a 400 naming the value, and the server answers afterwards."""

from __future__ import annotations

import pytest

from hearth.chat import schema_limits as sl

pytestmark = pytest.mark.model

KILLERS = {
    "maxLength": {"type": "string", "maxLength": 20000},
    "maxItems": {"type": "array", "items": {"type": "integer"}, "maxItems": 20000},
    "pattern": {"type": "string", "pattern": "^a{20000}$"},
}
MESSAGES = [{"role": "user", "content": "Turn on the kitchen light."}]


def tools_with(schema: dict) -> list[dict]:
    return [{"type": "function", "function": {"name": "HassTurnOn", "parameters": {
        "type": "object", "properties": {"name": schema}, "required": ["name"]}}}]


def response_format(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}


def refused(server, path: str, body: dict) -> dict:
    status, out = server.post(path, body, timeout=30)
    assert status == 400, out
    return out["error"]


@pytest.fixture(scope="module")
def ollama_model(server) -> str:
    status, tags = server.get("/api/tags")
    assert status == 200, tags
    return tags["models"][0]["model"]


@pytest.fixture(autouse=True)
def still_healthy(server):
    """After each refusal the process is alive and ready (a crash would end it)."""
    yield
    assert server.proc is not None and server.proc.poll() is None, server.log()
    status, health = server.get("/health")
    assert status == 200 and health["status"] == "ready", health


@pytest.mark.parametrize("keyword", sorted(KILLERS))
def test_response_format(server, keyword):
    err = refused(server, "/v1/chat/completions",
                  {"messages": MESSAGES, "response_format": response_format(KILLERS[keyword])})
    assert err["param"] == f"response_format.json_schema.schema.{keyword}"
    assert err["code"] == "invalid_response_format"
    assert err["message"].startswith(err["param"] + ": ")


@pytest.mark.parametrize("choice", ["auto", "required", None])
@pytest.mark.parametrize("keyword", sorted(KILLERS))
def test_tools(server, keyword, choice):
    body = {"messages": MESSAGES, "tools": tools_with(KILLERS[keyword])}
    if choice is not None:  # None: the default, auto
        body["tool_choice"] = choice
    err = refused(server, "/v1/chat/completions", body)
    assert err["param"] == f"tools.0.function.parameters.properties.name.{keyword}"
    assert err["code"] == "invalid_tools"


@pytest.mark.parametrize(("values", "param"), [
    ({"HassTurnOn": {"name": [f"Light {i}" for i in range(20000)]}}, "HassTurnOn.name"),
    ({"HassTurnOn": {"name": ["x" * 20000]}}, "HassTurnOn.name.0"),
])
def test_tool_argument_values(server, values, param):
    err = refused(server, "/v1/chat/completions", {
        "messages": MESSAGES, "tools": tools_with({"type": "string"}),
        "tool_argument_values": values})
    assert err["param"] == f"tool_argument_values.{param}"


@pytest.mark.parametrize("keyword", sorted(KILLERS))
def test_ollama_format_and_tools(server, ollama_model, keyword):
    base = {"model": ollama_model, "messages": MESSAGES, "stream": False}
    err = refused(server, "/api/chat", {**base, "format": KILLERS[keyword]})
    assert err.startswith(f"format.{keyword}: ")
    err = refused(server, "/api/generate", {"model": ollama_model, "prompt": "Hi",
                                            "stream": False, "format": KILLERS[keyword]})
    assert err.startswith(f"format.{keyword}: ")
    err = refused(server, "/api/chat", {**base, "tools": tools_with(KILLERS[keyword])})
    assert err.startswith(f"tools.0.function.parameters.properties.name.{keyword}: ")


@pytest.mark.parametrize("keyword", sorted(KILLERS))
def test_jobs_are_refused_when_posted(server, keyword):
    for request, param in [
        ({"messages": MESSAGES, "response_format": response_format(KILLERS[keyword])},
         f"request.response_format.json_schema.schema.{keyword}"),
        ({"messages": MESSAGES, "tools": tools_with(KILLERS[keyword])},
         f"request.tools.0.function.parameters.properties.name.{keyword}"),
    ]:
        err = refused(server, "/v1/jobs", {"request": request})
        assert err["param"] == param
    status, jobs = server.get("/v1/jobs?limit=1000")
    assert status == 200
    assert not any("20000" in str(job.get("request")) for job in jobs.get("data", []))


def test_counts_at_the_limit_still_work(server):
    """The limit is where llama.cpp still takes the grammar: a schema at it is served."""
    at_limit = {"type": "object", "properties": {
        "name": {"type": "string", "maxLength": sl.MAX_COUNT},
        "codes": {"type": "array", "items": {"type": "integer"}, "maxItems": sl.MAX_COUNT},
        "word": {"type": "string", "pattern": f"^[a-z]{{1,{sl.MAX_COUNT}}}$"}}}
    status, out = server.post("/v1/chat/completions", {
        "messages": MESSAGES, "response_format": response_format(at_limit), "max_tokens": 4,
        "temperature": 0}, timeout=120)
    assert status == 200, out
    status, out = server.post("/v1/chat/completions", {
        "messages": MESSAGES, "tools": tools_with(at_limit["properties"]["codes"]),
        "tool_choice": "required", "max_tokens": 4, "temperature": 0}, timeout=120)
    assert status == 200, out
