"""Ollama's requests as Hearth's OpenAI-shaped ones, and Hearth's answers in Ollama's shape.

Nothing here builds a prompt: a chat or generate body becomes the same ``ChatCompletionRequest``
(or, for ``raw`` prompts, ``CompletionRequest``) that the OpenAI routes hand to
:mod:`hearth.chat.completions`.
"""

from __future__ import annotations

import json
import logging
import re
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from ..chat.api_models import ChatCompletionRequest, CompletionRequest
from ..chat.completions import RESPONSE_SCHEMA, CompletionError
from .http import ApiError, validation_error
from .ollama_models import ChatBody, GenerateBody, Message, Options

log = logging.getLogger(__name__)

# Ollama option -> Hearth body field (sampling); their errors are reported under options.<name>.
SAMPLING = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p",
            "seed": "seed", "stop": "stop", "repeat_penalty": "repeat_penalty",
            "presence_penalty": "presence_penalty", "frequency_penalty": "frequency_penalty"}
_FIELD_NAMES = {**{v: f"options.{k}" for k, v in SAMPLING.items()},
                "max_tokens": "options.num_predict", "response_format": "format",
                "chat_template_kwargs": "think", "tool_choice": "options.tool_choice"}


def go_time(when: datetime) -> str:
    """A UTC time as Go writes a time.Time (RFC 3339 with fractional seconds)."""
    return when.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


_UNIT_S = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def keep_alive_seconds(value: float | int | str | None) -> float | None:
    """Ollama's keep_alive in seconds (a number is seconds, a string a Go duration); any
    negative value is -1, kept forever; None when unset."""
    if value is None or value == "":
        return None
    if isinstance(value, int | float):
        seconds = float(value)
    else:
        text = value.strip()
        sign = -1.0 if text.startswith("-") else 1.0
        parts = re.findall(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)?", text.lstrip("-"))
        seconds = sign * sum(float(n) * _UNIT_S[u or "s"] for n, u in parts)
    return -1.0 if seconds < 0 else seconds


def created_at() -> str:
    return go_time(datetime.now(UTC))


# Ollama takes any value; the sampler's useful range is this (beyond it, the same as its edge).
_CLAMPS = {"temperature": (0.0, 2.0), "min_p": (0.0, 1.0), "presence_penalty": (-2.0, 2.0),
           "frequency_penalty": (-2.0, 2.0)}
# Values that mean "off" in Ollama (and llama.cpp), where Hearth's fields want them left unset.
_OFF = {"top_p": lambda v: v <= 0 or v > 1, "top_k": lambda v: v < 0,
        "repeat_penalty": lambda v: v <= 0}


def _sampling(options: Options | None, default_max: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if options is None:
        return {"max_tokens": default_max}
    for name, field in SAMPLING.items():
        if (value := getattr(options, name)) is None:
            continue
        if name in _CLAMPS:
            low, high = _CLAMPS[name]
            value = min(max(value, low), high)
        if name in _OFF and _OFF[name](value):
            continue
        out[field] = value
    if options.ignore_eos:
        out["ignore_eos"] = True
    # num_predict -1 (until the end) and -2 (fill the context) take Hearth's bound.
    out["max_tokens"] = options.num_predict if (options.num_predict or 0) > 0 else default_max
    return out


def _thinking(think: bool | str | None) -> dict[str, Any]:
    if think is False:  # no chain of thought, and none shown if the model thinks anyway
        return {"chat_template_kwargs": {"enable_thinking": False}, "reasoning_format": "hide"}
    if think is None:
        return {}
    kwargs: dict[str, Any] = {"enable_thinking": True}
    if isinstance(think, str):  # the templates that take a level (gpt-oss) read it
        kwargs["reasoning_effort"] = "high" if think == "max" else think
    return {"chat_template_kwargs": kwargs}


def _format(fmt: str | dict[str, Any] | None) -> dict[str, Any] | None:
    if fmt is None:
        return None
    if fmt == "json":
        return {"type": "json_object"}
    return {"type": "json_schema", "json_schema": {"name": "format", "schema": fmt}}


def _tool_choice(choice: str | None) -> str | dict[str, Any] | None:
    if choice is None or choice in ("auto", "none", "required"):
        return choice
    return {"type": "function", "function": {"name": choice}}


def _message(m: Message, index: int) -> dict[str, Any]:
    out: dict[str, Any] = {"role": m.role, "content": m.content}
    if m.images:
        # Parts as the OpenAI routes take them: a model without vision answers a clear 400.
        out["content"] = [{"type": "text", "text": m.content}, *(
            {"type": "image_url", "image_url": {"url": f"data:image;base64,{image}"}}
            for image in m.images)]
    if m.tool_calls:
        out["tool_calls"] = [{"id": c.id or f"call_{index}_{i}", "type": "function",
                              "function": {"name": c.function.name,
                                           "arguments": c.function.arguments}}
                             for i, c in enumerate(m.tool_calls)]
    if m.role == "tool":
        if m.tool_name:
            out["name"] = m.tool_name
        if m.tool_call_id:
            out["tool_call_id"] = m.tool_call_id
    return out


def renamed(err: CompletionError) -> CompletionError:
    """The error naming the field as the Ollama client sent it (``format``, not
    ``response_format``; ``format.properties.name.maxLength``, not
    ``response_format.json_schema.schema.properties.name.maxLength``)."""
    param = err.param or ""
    field = param.split(".")[0]
    if param == RESPONSE_SCHEMA or param.startswith(RESPONSE_SCHEMA + "."):
        field, name = param, "format" + param[len(RESPONSE_SCHEMA):]
    elif field in _FIELD_NAMES:
        name = _FIELD_NAMES[field]
    else:
        return err
    if err.message.startswith(field):
        err.message = name + err.message[len(field):]
    else:
        err.message = f"{name}: {err.message}"
    err.param = name
    return err


def _validated(model: type[ChatCompletionRequest] | type[CompletionRequest],
               data: dict[str, Any]) -> Any:
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise renamed(validation_error(e)) from e


def _common(body: ChatBody | GenerateBody, default_max: int) -> dict[str, Any]:
    return {"stream": body.stream, "stream_options": {"include_usage": True},
            "user": body.user, "priority": body.priority,
            **_sampling(body.options, default_max)}


def chat_request(body: ChatBody, default_max: int) -> ChatCompletionRequest:
    choice = body.tool_choice or (body.options.tool_choice if body.options else None)
    data = {**_common(body, default_max), **_thinking(body.think),
            "messages": [_message(m, i) for i, m in enumerate(body.messages)],
            "tools": body.tools or None, "tool_choice": _tool_choice(choice),
            "response_format": _format(body.format)}
    return _validated(ChatCompletionRequest, data)


def generate_request(body: GenerateBody, default_max: int
                     ) -> ChatCompletionRequest | CompletionRequest:
    if body.suffix:
        raise ApiError(400, f"{body.model} does not support insert", "invalid_value", "suffix")
    if body.template and not body.raw:
        log.info("ollama generate: a custom template is not used; the model's own renders it")
    if body.raw:
        if body.system or body.context or body.format or body.template:
            raise ApiError(400, "raw mode does not support template, system, context or "
                           "format", "invalid_value", "raw")
        return _validated(CompletionRequest, {**_common(body, default_max),
                                              "prompt": body.prompt})
    messages = [Message(role="system", content=body.system)] if body.system else []
    messages.append(Message(role="user", content=body.prompt, images=body.images))
    data = {**_common(body, default_max), **_thinking(body.think),
            "messages": [_message(m, i) for i, m in enumerate(messages)],
            "response_format": _format(body.format)}
    return _validated(ChatCompletionRequest, data)


def metrics(usage: dict[str, Any] | None, timing: dict[str, Any] | None) -> dict[str, Any]:
    """The final chunk's counts and durations (nanoseconds, as Go's time.Duration)."""
    usage, timing = usage or {}, timing or {}

    def ns(ms: float | None) -> int:
        return max(0, round((ms or 0.0) * 1e6))

    queue, ttft, e2e = timing.get("queue_ms"), timing.get("ttft_ms"), timing.get("e2e_ms")
    return {"total_duration": ns(e2e), "load_duration": 0,
            "prompt_eval_count": usage.get("prompt_tokens", 0),
            "prompt_eval_duration": ns((ttft or 0) - (queue or 0)),
            "eval_count": usage.get("completion_tokens", 0),
            "eval_duration": ns((e2e or 0) - (ttft or 0))}


def done_reason(finish: str | None) -> str:
    return "length" if finish == "length" else "stop"


def tool_calls(calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """OpenAI tool calls (arguments as a JSON string) as Ollama's (arguments as an object)."""
    out = []
    for i, call in enumerate(calls):
        index = call.get("index", i)  # a streamed call's own index across the answer
        fn = call["function"]
        try:
            args = json.loads(fn.get("arguments") or "{}")
        except ValueError:
            args = None
        if not isinstance(args, dict):
            log.warning("tool call %s: arguments are not a JSON object: %r", fn["name"],
                        fn.get("arguments"))
            args = {}
        out.append({"id": call.get("id"), "function": {"index": index, "name": fn["name"],
                                                        "arguments": args}})
    return out
