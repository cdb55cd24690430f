"""Reasoning text (``<think>…</think>``) split from the answer, over HTTP against the real server.

SmolLM2 does not reason on its own. At temperature 0 it copies a few-shot pattern exactly: the
history holds three assistant turns that answered with reasoning markers, so the next answer
repeats them, as real tokens of the model ("<", "think", ">" — split across tokens). Each test
first checks (with ``reasoning_format: none``) that the raw output really has the markers.
"""

from __future__ import annotations

import json
import urllib.request

import pytest

pytestmark = pytest.mark.model

TARGET = "<think>The user greets me.</think>Hello there!"
FEW_SHOT = [m for q in ("Hi", "Hello", "Hey") for m in (
    {"role": "user", "content": q}, {"role": "assistant", "content": TARGET})]
MESSAGES = [*FEW_SHOT, {"role": "user", "content": "Hi"}]
TOOLS = [{"type": "function", "function": {
    "name": "HassTurnOn", "description": "Turns on a device or entity",
    "parameters": {"type": "object", "properties": {"name": {"type": "string"}},
                   "required": ["name"]}}}]
CALL = ('<think>Turn on the lamp.</think><tool_call>{"name": "HassTurnOn", '
        '"arguments": {"name": "lamp"}}</tool_call>')


def chat(server, **body):
    status, out = server.post("/v1/chat/completions", {
        "messages": MESSAGES, "temperature": 0, "max_tokens": 30, **body})
    assert status == 200, out
    return out


def stream(server, **body) -> list[dict]:
    data = {"messages": MESSAGES, "temperature": 0, "max_tokens": 30, "stream": True,
            "stream_options": {"include_usage": True}, **body}
    req = urllib.request.Request(server.url + "/v1/chat/completions",
                                 data=json.dumps(data).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        events = [line.decode().strip()[6:] for line in r if line.startswith(b"data: ")]
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


def deltas(chunks: list[dict], key: str) -> list[str]:
    return [c["choices"][0]["delta"][key] for c in chunks
            if c["choices"] and key in c["choices"][0]["delta"]]


def test_raw_output_really_has_the_markers(server):
    out = chat(server, reasoning_format="none")
    msg = out["choices"][0]["message"]
    assert msg["content"] == TARGET and "reasoning_content" not in msg
    assert "completion_tokens_details" not in out["usage"]


def test_reasoning_is_split_from_the_answer(server):
    for fmt in ({}, {"reasoning_format": "auto"}, {"reasoning_format": "deepseek"}):
        out = chat(server, **fmt)
        msg = out["choices"][0]["message"]
        assert msg["reasoning_content"] == "The user greets me."
        assert msg["content"] == "Hello there!"
        u = out["usage"]
        assert 0 < u["completion_tokens_details"]["reasoning_tokens"] < u["completion_tokens"]
    hidden = chat(server, reasoning_format="hide")
    assert hidden["choices"][0]["message"] == {"role": "assistant", "content": "Hello there!"}
    assert hidden["usage"] == out["usage"] | {"prompt_tokens_details":
                                              hidden["usage"]["prompt_tokens_details"]}


def test_streamed_reasoning_joins_to_the_whole_response(server):
    whole = chat(server)
    chunks = stream(server)
    reasoning = deltas(chunks, "reasoning_content")
    content = deltas(chunks, "content")
    assert len(reasoning) > 1  # streamed as it was generated, not at the end
    assert "".join(reasoning) == whole["choices"][0]["message"]["reasoning_content"]
    assert "".join(content) == whole["choices"][0]["message"]["content"]
    assert not any("<" in p or ">" in p for p in reasoning + content)  # no marker leaks
    assert chunks[-1]["usage"] == whole["usage"] | {
        "prompt_tokens_details": chunks[-1]["usage"]["prompt_tokens_details"]}
    hidden = stream(server, reasoning_format="hide")
    assert not deltas(hidden, "reasoning_content")
    assert "".join(deltas(hidden, "content")) == "Hello there!"
    raw = stream(server, reasoning_format="none")
    assert "".join(deltas(raw, "content")) == TARGET and not deltas(raw, "reasoning_content")


def test_stop_strings_match_the_answer_only(server):
    # "greets" is in the reasoning and must not stop it; "there" is in the answer.
    for chunks in (None, stream(server, stop=["greets", "there"])):
        if chunks is None:
            out = chat(server, stop=["greets", "there"])
            msg, finish = out["choices"][0]["message"], out["choices"][0]["finish_reason"]
            reasoning, content = msg["reasoning_content"], msg["content"]
        else:
            finish = chunks[-2]["choices"][0]["finish_reason"]
            reasoning = "".join(deltas(chunks, "reasoning_content"))
            content = "".join(deltas(chunks, "content"))
        assert (reasoning, content, finish) == ("The user greets me.", "Hello ", "stop")


def test_output_cut_inside_the_reasoning_is_all_reasoning(server):
    out = chat(server, max_tokens=5)
    msg = out["choices"][0]["message"]
    assert out["choices"][0]["finish_reason"] == "length"
    assert msg["content"] == "" and msg["reasoning_content"]
    assert "The user greets me.".startswith(msg["reasoning_content"])
    u = out["usage"]
    assert u["completion_tokens_details"]["reasoning_tokens"] == u["completion_tokens"] == 5


def test_tool_calls_are_parsed_from_the_answer_after_the_reasoning(server):
    msgs = [m for _ in range(2) for m in ({"role": "user", "content": "Turn on the lamp"},
                                          {"role": "assistant", "content": CALL})]
    msgs.append({"role": "user", "content": "Turn on the lamp"})
    raw = chat(server, messages=msgs, tools=TOOLS, max_tokens=60, reasoning_format="none")
    assert raw["choices"][0]["message"]["content"].startswith("<think>")
    out = chat(server, messages=msgs, tools=TOOLS, max_tokens=60)
    choice = out["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] is None
    assert choice["message"]["reasoning_content"] == "Turn on the lamp."
    call = choice["message"]["tool_calls"][0]["function"]
    assert call["name"] == "HassTurnOn" and json.loads(call["arguments"]) == {"name": "lamp"}


def test_a_grammar_turns_the_split_off(server):
    out = chat(server, response_format={"type": "json_object"}, max_tokens=60)
    assert "reasoning_content" not in out["choices"][0]["message"]
    assert "completion_tokens_details" not in out["usage"]


def test_bad_reasoning_format_is_a_400_and_documented(server):
    status, out = server.post("/v1/chat/completions", {
        "messages": [{"role": "user", "content": "x"}], "reasoning_format": "loud"})
    assert status == 400 and out["error"]["param"] == "reasoning_format"
    assert "'auto'" in out["error"]["message"] and "'hide'" in out["error"]["message"]
    status, spec = server.get("/openapi.json")
    field = spec["components"]["schemas"]["ChatCompletionRequest"]["properties"][
        "reasoning_format"]
    assert field["enum"] == ["auto", "deepseek", "none", "hide"] and field["default"] == "auto"
