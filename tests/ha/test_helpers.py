"""The integration's pure helpers: class choice, history trimming, stream parsing."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import pytest
from homeassistant.core import Context, State

from custom_components.hearth.api import normalize_url
from custom_components.hearth.confirm import _response_key
from custom_components.hearth.conversation import fairness_key_for, request_class_for
from custom_components.hearth.jobs import job_event_data, job_result_text
from custom_components.hearth.messages import transform_stream, trim_history
from custom_components.hearth.sse import iter_sse

from .conftest import deprecation_reports

pytestmark = pytest.mark.ha


def _input(**kw: Any) -> SimpleNamespace:
    return SimpleNamespace(
        context=Context(user_id=kw.pop("user_id", None)),
        device_id=kw.pop("device_id", None),
        **kw,
    )


def test_request_class_and_fairness_key() -> None:
    """auto: voice for satellites, devices and pipeline runs that began with audio; else
    chat (a typed turn, whatever listens to its chat log)."""
    typed = _input(satellite_id=None, user_id="user-1")
    assert request_class_for("auto", typed, False) == "chat"
    assert fairness_key_for(typed) == "user-1"
    assert request_class_for("auto", typed, True) == "voice"
    satellite = _input(satellite_id="assist_satellite.hall", user_id="user-1")
    assert request_class_for("auto", satellite, False) == "voice"
    assert fairness_key_for(satellite) == "assist_satellite.hall"
    # Home Assistant versions without satellite_id on the input.
    device = _input(device_id="dev-1")
    assert request_class_for("auto", device, False) == "voice"
    assert fairness_key_for(device) == "dev-1"
    assert request_class_for("background", satellite, True) == "background"
    assert request_class_for("chat", satellite, True) == "chat"


def test_trim_history_keeps_whole_rounds() -> None:
    """The system prompt stays; rounds start at user messages; tool results stay with
    their calls."""
    messages = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "1"},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "a"}]},
        {"role": "tool", "tool_call_id": "a", "content": "{}"},
        {"role": "assistant", "content": "a1"},
        {"role": "user", "content": "2"},
        {"role": "assistant", "content": "a2"},
        {"role": "user", "content": "3"},
    ]
    assert trim_history(messages, 0) == messages
    assert trim_history(messages, 5) == messages
    assert [m["content"] for m in trim_history(messages, 1)] == ["s", "2", "a2", "3"]
    assert trim_history(messages, 2) == messages


async def _chunks(items: list[dict[str, Any]]) -> AsyncIterator[dict[str, Any]]:
    for item in items:
        yield item


async def test_transform_stream_assembles_parallel_tool_calls() -> None:
    """Text passes through at once; tool-call fragments are joined per index."""
    chunks = [
        {"choices": [{"delta": {"content": "Sure"}}]},
        {"choices": [{"delta": {"tool_calls": [
            {"index": 0, "id": "c0", "function": {"name": "HassTurnOn", "arguments": '{"na'}},
            {"index": 1, "id": "c1", "function": {"name": "HassTurnOff", "arguments": ""}},
        ]}}]},
        {"choices": [{"delta": {"tool_calls": [
            {"index": 0, "function": {"arguments": 'me": "Lamp", "area": ""}'}},
            {"index": 1, "function": {"arguments": "not json"}},
        ]}}]},
        {"choices": [], "usage": {"completion_tokens": 3}},
    ]
    deltas = [delta async for delta in transform_stream(_chunks(chunks))]
    assert deltas[0] == {"role": "assistant"}
    assert deltas[1] == {"content": "Sure"}
    calls = deltas[2]["tool_calls"]
    assert [(c.id, c.tool_name, c.tool_args) for c in calls] == [
        ("c0", "HassTurnOn", {"name": "Lamp"}),
        ("c1", "HassTurnOff", {}),
    ]


class _Body:
    def __init__(self, parts: list[bytes]) -> None:
        self._parts = parts

    async def iter_any(self) -> AsyncIterator[bytes]:
        for part in self._parts:
            yield part


async def test_sse_parsing() -> None:
    """Events split across reads, CRLF lines, comments and multi-line data."""
    response = SimpleNamespace(content=_Body([
        b": hearth events\n\nid: 7\r\nevent: job\r\ndata: {\"a\":",
        b" 1}\r\n\r\n: keepalive\n\ndata: line1\ndata: line2\n\n",
        b"data: [DONE]",
    ]))
    events = [event async for event in iter_sse(response)]  # type: ignore[arg-type]
    assert [(e.id, e.event, e.data) for e in events] == [
        ("7", "job", '{"a": 1}'),
        ("7", "message", "line1\nline2"),
        ("7", "message", "[DONE]"),
    ]
    assert events[0].json() == {"a": 1}


def test_normalize_url_and_job_text() -> None:
    """Base URLs lose a trailing slash and /v1; a job's text is its first choice."""
    assert normalize_url(" http://h:8080/v1/ ") == "http://h:8080"
    job = {
        "id": "job_1", "status": "failed", "tag": None, "created_at": 1.0,
        "started_at": None, "finished_at": 2.0, "result": None, "error": "boom",
    }
    assert job_result_text(job) is None
    data = job_event_data("entry", job)
    assert data["error"] == "boom"
    assert data["timings"]["total_ms"] == 1000.0
    assert data["timings"]["queue_ms"] is None
    job["result"] = {"choices": [{"message": {"content": [{"type": "text", "text": "hi"}]}}]}
    assert job_result_text(job) == "hi"


def test_deprecation_reports_are_recognised() -> None:
    """The check that fails a test on Home Assistant's deprecation reports finds them, and
    only those about this integration."""
    def record(name: str, message: str) -> logging.LogRecord:
        return logging.LogRecord(name, logging.WARNING, __file__, 1, message, None, None)

    ours = record(
        "homeassistant.helpers.frame",
        "Detected that custom integration 'hearth' calls `x` with a deprecated `y` parameter",
    )
    entity = record(
        "homeassistant.helpers.entity",
        "Entity sensor.x (<class 'custom_components.hearth.sensor.S'>) uses deprecated things",
    )
    other = record(
        "homeassistant.helpers.frame", "Detected that custom integration 'other' calls `x`"
    )
    unrelated = record("custom_components.hearth", "Hearth at http://x serves a model")
    assert deprecation_reports([ours, entity, other, unrelated]) == [
        ours.getMessage(), entity.getMessage()
    ]


@pytest.mark.parametrize(
    ("kind", "slots", "entities", "key"),
    [
        ("HassTurnOn", {"name": "Kitchen light"}, ["light.kitchen"], "default"),
        ("HassTurnOn", {"domain": ["light"]}, ["light.kitchen", "light.porch"], "light_all"),
        ("HassTurnOff", {"area": "Kitchen"}, ["light.a", "light.b"], "lights_area"),
        ("HassTurnOff", {"floor": "Ground"}, ["fan.a", "fan.b"], "fans_floor"),
        ("HassTurnOn", {"name": "Garage door"}, ["cover.garage"], "cover"),
        ("HassTurnOn", {"name": "Evening"}, ["scene.evening"], "scene"),
        ("HassTurnOff", {"domain": ["light", "switch"]}, ["light.a", "switch.b"], "default"),
        ("HassLightSet", {"name": "Lamp", "brightness": 20}, ["light.lamp"], "brightness"),
        ("HassLightSet", {"name": "Lamp", "color": "red"}, ["light.lamp"], "color"),
    ],
)
def test_confirmation_key_follows_what_was_acted_on(
    kind: str, slots: dict[str, Any], entities: list[str], key: str
) -> None:
    """The response a confirmation uses is the one Home Assistant's agent would pick for the
    sentence that did the same: all lights, the lights of an area, a cover opening, ..."""
    states = [State(entity_id, "on") for entity_id in entities]
    assert _response_key(kind, slots, states) == key
