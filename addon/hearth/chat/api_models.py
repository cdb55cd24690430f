"""Request bodies of the OpenAI-compatible API, validated with pydantic so a bad field is answered
with a 400 that names it."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator

from ..policy.scheduler import class_rank


class _Body(BaseModel):
    # Unknown OpenAI fields (logprobs, n=1, ...) are accepted and ignored, as other servers do.
    model_config = ConfigDict(extra="allow")


def _known_class(v: str | int | None) -> str | int | None:
    if v is not None:
        class_rank(v)  # raises ValueError: a 400 naming `priority`
    return v


# A class name or rank, checked when the body is validated.
Priority = Annotated[str | int | None, AfterValidator(_known_class)]


class CalledFunction(_Body):
    name: str = Field(..., min_length=1, max_length=128)
    arguments: str | dict[str, Any] = "{}"


class ToolCallIn(_Body):
    """A tool call in an assistant message of the history."""

    id: str | None = None
    type: Literal["function"] = "function"
    function: CalledFunction


class Message(_Body):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any] | str] | None = None
    name: str | None = None
    tool_calls: list[ToolCallIn] | None = None
    tool_call_id: str | None = None


class StreamOptions(_Body):
    include_usage: bool = False


class SamplingFields(_Body):
    model: str | None = None
    max_tokens: int | None = Field(None, ge=1, le=1_000_000)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=0)
    min_p: float | None = Field(None, ge=0.0, le=1.0)
    repeat_penalty: float | None = Field(None, gt=0.0, le=10.0)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = Field(None, max_length=256)
    priority: Priority = None
    ignore_eos: bool = False
    n: int = Field(1, ge=1, le=1)

    @field_validator("stop")
    @classmethod
    def _stops(cls, v: str | list[str] | None) -> str | list[str] | None:
        if isinstance(v, list) and len(v) > 8:
            raise ValueError("at most 8 stop strings")
        return v

    def stops(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)


class ToolFunction(_Body):
    name: str = Field(..., min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.\-]+$")
    description: str | None = None
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object",
                                                                "properties": {}})


class Tool(_Body):
    type: Literal["function"]
    function: ToolFunction


class ResponseFormat(_Body):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: dict[str, Any] | None = None


class ChatCompletionRequest(SamplingFields):
    messages: list[Message] = Field(..., min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1, le=1_000_000)
    tools: list[Tool] | None = None
    tool_choice: str | dict[str, Any] | None = None
    response_format: ResponseFormat | None = None
    parallel_tool_calls: bool | None = None
    tool_argument_values: dict[str, dict[str, list[str] | str]] | None = Field(
        None, description="Hearth: values a tool call's string arguments must take, by tool and "
        "argument, e.g. {\"HassTurnOn\": {\"name\": [\"Kitchen light\"]}}, or \"$set\" naming "
        "a list of tool_argument_sets. Held by the call's grammar only (the prompt shows the "
        "tools as sent); Home Assistant's Hearth agent sends the exposed entity and area names.")
    tool_argument_sets: dict[str, list[str]] | None = Field(
        None, description="Hearth: named lists of values that tool_argument_values refers to as "
        "\"$name\", so a list many tools share is sent once.")
    chat_template_kwargs: dict[str, Any] | None = Field(
        None, description="Extra variables for the model's chat template, as llama-server takes "
        "them (e.g. {\"enable_thinking\": false}); voice requests default enable_thinking to "
        "false so they never wait on a chain of thought.")
    reasoning_format: Literal["auto", "deepseek", "none", "hide"] = Field(
        "auto", description="Chain of thought between <think> and </think> (or the template's "
        "markers): auto/deepseek = in message.reasoning_content (streamed as "
        "delta.reasoning_content), none = left in content, hide = dropped.")

    @model_validator(mode="after")
    def _argument_sets(self) -> ChatCompletionRequest:
        """"$name" in tool_argument_values becomes that list of tool_argument_sets (the same
        list object for every tool: sent once, stored once)."""
        sets = self.tool_argument_sets or {}
        for tool, args in (self.tool_argument_values or {}).items():
            for arg, value in args.items():
                if isinstance(value, str):
                    name = value[1:] if value.startswith("$") else None
                    if name not in sets:
                        raise ValueError(f"tool_argument_values.{tool}.{arg}: {value!r} names "
                                         "no list of tool_argument_sets (write \"$name\")")
                    args[arg] = sets[name]
        return self


class CompletionRequest(SamplingFields):
    prompt: str | list[str]
    echo: bool = False


class EmbeddingRequest(_Body):
    model: str | None = None
    input: str | list[str] | list[int] | list[list[int]]
    encoding_format: Literal["float", "base64"] = "float"
    user: str | None = Field(None, max_length=256)
    priority: Priority = None
    dimensions: int | None = None


class JobCreate(_Body):
    request: dict[str, Any]
    kind: Literal["chat", "embeddings"] = "chat"
    cls: str = Field("background", alias="class")
    tag: str | None = Field(None, max_length=256)

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    @field_validator("cls")
    @classmethod
    def _known_class(cls, v: str) -> str:
        from ..policy.scheduler import RANK_NAMES

        return RANK_NAMES[class_rank(v)]


class ReservationCreate(BaseModel):
    """``POST /v1/reservations``: a satellite heard its wake word (hearth.api.reservations)."""

    model_config = ConfigDict(extra="forbid")

    model: str | None = Field(None, description="the voice agent's model (default: voice's)")
    satellite: str = Field(..., min_length=1, max_length=256, description="who heard it")
    ttl_s: float | None = Field(None, gt=0, le=15, description="default: reservation_s")
    warm: dict[str, Any] | None = Field(None, description="a /v1/cache/warm body: the voice "
                                        "prompt to have cached, computed as voice work")
