"""Request bodies of Ollama's API (its ``api/types.go``), validated so that a wrong type is a 400
naming the field. Unknown fields are ignored, as Ollama ignores them."""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator

# Go's time.ParseDuration, as Ollama reads keep_alive strings ("5m", "300s", "1h30m", "-1").
_DURATION = re.compile(r"^-?(\d+(\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)?((\d+(\.\d*)?|\.\d+)"
                       r"(ns|us|µs|ms|s|m|h))*$")


class _Body(BaseModel):
    model_config = ConfigDict(extra="allow")


def _integral(v: Any) -> Any:
    # Ollama converts JSON numbers to its integer options (truncating), so 8192.0 is 8192:
    # Home Assistant's number selectors store floats, and its Ollama integration sends num_ctx
    # as one.
    return int(v) if isinstance(v, float) and v == v and abs(v) < 2**63 else v


def _null_is_default(default: Any) -> BeforeValidator:
    # Go leaves a JSON null as the zero value: null content is "", null stream the default.
    return BeforeValidator(lambda v: default if v is None else v)


Int = Annotated[int | None, BeforeValidator(_integral)]


class Options(_Body):
    """``options``: what Hearth honours is typed and used; the runner's own knobs (num_ctx,
    num_gpu, num_thread, ...) are typed and ignored, since one engine serves every request."""

    model_config = ConfigDict(extra="allow", strict=True)
    num_predict: Int = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: Int = None
    min_p: float | None = None
    seed: Int = None
    stop: list[str] | None = None
    repeat_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    num_ctx: Int = None
    num_keep: Int = None
    num_batch: Int = None
    num_gpu: Int = None
    num_thread: Int = None
    typical_p: float | None = None
    repeat_last_n: Int = None
    # Hearth: Ollama has no tool_choice; "required", "none" or a tool's name.
    tool_choice: str | None = None
    # Hearth: generate num_predict tokens whatever the model says (benchmarks).
    ignore_eos: bool | None = None


class CallFunction(_Body):
    name: str = Field(..., min_length=1, max_length=128)
    arguments: dict[str, Any] = Field(default_factory=dict)


class ToolCall(_Body):
    id: str | None = None
    function: CallFunction


class Message(_Body):
    role: str
    content: Annotated[str, _null_is_default("")] = ""
    thinking: str | None = None
    images: list[str] | None = None
    tool_calls: list[ToolCall] | None = None
    tool_name: str | None = None
    tool_call_id: str | None = None

    @field_validator("role")
    @classmethod
    def _role(cls, v: str) -> str:
        v = v.lower()  # as Ollama reads it
        if v not in ("system", "user", "assistant", "tool"):
            raise ValueError("role must be system, user, assistant or tool")
        return v


class _Generation(_Body):
    model: str = Field(..., min_length=1)
    stream: Annotated[bool, _null_is_default(True)] = True
    format: str | dict[str, Any] | None = None
    keep_alive: float | int | str | None = None
    options: Options | None = None
    think: bool | str | None = None
    # Hearth: the class and the household member, where a client can send fields.
    priority: str | int | None = None
    user: str | None = Field(None, max_length=256)

    @field_validator("keep_alive")
    @classmethod
    def _duration(cls, v: float | int | str | None) -> float | int | str | None:
        if isinstance(v, str) and v and not _DURATION.match(v.strip()):
            raise ValueError(f"{v!r} is not a duration such as 5m, 300s or -1")
        return v

    @field_validator("think")
    @classmethod
    def _think(cls, v: bool | str | None) -> bool | str | None:
        if isinstance(v, str) and v not in ("low", "medium", "high", "max"):
            raise ValueError("think must be true, false, low, medium, high or max")
        return v

    @field_validator("format")
    @classmethod
    def _format(cls, v: str | dict[str, Any] | None) -> str | dict[str, Any] | None:
        if isinstance(v, str) and v not in ("", "json"):
            raise ValueError('format must be "json" or a JSON schema object')
        return v or None


class ChatBody(_Generation):
    messages: list[Message] = Field(default_factory=list)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | None = None  # Hearth, as in options


class GenerateBody(_Generation):
    prompt: str = ""
    suffix: str = ""
    system: str | None = None
    template: str | None = None
    raw: bool = False
    images: list[str] | None = None
    context: list[int] | None = None


class EmbedBody(_Body):
    model: str = Field(..., min_length=1)
    input: str | list[str] | None = None
    truncate: bool = True
    dimensions: int | None = None
    keep_alive: float | int | str | None = None
    options: Options | None = None
    priority: str | int | None = None
    user: str | None = Field(None, max_length=256)


class LegacyEmbedBody(_Body):
    """``/api/embeddings``: one prompt, one vector."""

    model: str = Field(..., min_length=1)
    prompt: str = ""
    keep_alive: float | int | str | None = None
    options: Options | None = None
    priority: str | int | None = None
    user: str | None = Field(None, max_length=256)


class NamedModel(_Body):
    """``/api/show`` and ``/api/pull`` name the model as ``model`` (or the older ``name``)."""

    model: str | None = None
    name: str | None = None
    stream: bool = True

    def model_name(self) -> str:
        if not (self.model or self.name):
            raise ValueError("model is required")
        return self.model or self.name or ""
