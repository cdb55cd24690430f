"""OpenAI chat and text completions on the engine, without HTTP: building the prompt, grammar
and engine request from a validated body, and turning engine events into OpenAI responses or
stream chunks. Used by the HTTP handlers and by durable jobs."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from ..engine import AsyncStream, RequestError
from ..policy.scheduler import VOICE_RANK
from ..shared.requests import Event, Request, SamplingParams
from .api_models import ChatCompletionRequest, CompletionRequest, SamplingFields
from .call_forcing import CallForcer
from .prompts import PromptError
from .reasoning import ReasoningSplitter, markers_for, prompt_opens
from .schema_limits import (
    SchemaTooLarge,
    check_argument_values,
    check_grammar_size,
    check_schema,
    check_tools,
)
from .tool_grammars import (
    json_schema_grammar,
    lazy_call_grammar,
    lazy_call_trigger,
    tool_call_schema,
    with_argument_values,
    wrap_grammar,
)
from .tools import RESPONSE_OPEN, ToolStream

log = logging.getLogger(__name__)

# ``response_format: json_object``: a flat object of at most six short keys and values. Any JSON
# object grammar lets a small model nest or repeat keys until max_tokens cuts it mid-document;
# this one always closes in time. Richer shapes: use json_schema.
JSON_OBJECT_GRAMMAR = r"""root ::= "{" ws (pair ("," ws pair){0,5})? ws "}"
pair ::= key ws ":" ws value
key ::= "\"" [a-zA-Z_] [a-zA-Z0-9_]{0,31} "\""
value ::= str | num | "true" | "false" | "null"
str ::= "\"" [^"\\\x7F\x00-\x1F]{0,80} "\""
num ::= "-"? [0-9]{1,12} ("." [0-9]{1,6})?
ws ::= " "?
"""


class CompletionError(Exception):
    """A request that cannot be served; ``status``/``code``/``param`` map onto the OpenAI error
    shape."""

    def __init__(self, status: int, message: str, code: str, param: str | None = None,
                 retry_after: float | None = None):
        super().__init__(message)
        self.status, self.message, self.code, self.param = status, message, code, param
        self.retry_after = retry_after


RESPONSE_SCHEMA = "response_format.json_schema.schema"
_LIMIT_CODES = {"response_format": "invalid_response_format", "tools": "invalid_tools"}
# No token of a real vocabulary is this long: text of more characters than this many per token
# of the context cannot fit, and is refused before it is tokenized (a 4 MB prompt is refused in
# the time it takes to count it).
MAX_CHARS_PER_TOKEN = 64


def check_chars(n_chars: int, n_ctx_seq: int, param: str) -> None:
    if n_chars > n_ctx_seq * MAX_CHARS_PER_TOKEN:
        raise CompletionError(400, f"{param}: {n_chars:,} characters cannot fit the model's "
                              f"context of {n_ctx_seq:,} tokens", "context_length_exceeded",
                              param)


def too_large(e: SchemaTooLarge) -> CompletionError:
    """The 400 for a value past one of :mod:`.schema_limits`' bounds, naming it."""
    return CompletionError(400, str(e), _LIMIT_CODES.get(e.field.split(".")[0], "invalid_value"),
                           e.field)


def check_limits(body: ChatCompletionRequest) -> None:
    """Refuse (400, naming the value) a response_format schema, tools' parameters (whatever
    the tool_choice) or tool_argument_values past :mod:`.schema_limits`' bounds, before any of
    it is converted to a grammar or reaches llama.cpp."""
    try:
        if body.tools:
            check_tools([t.function.parameters for t in body.tools])
        check_argument_values(body.tool_argument_values,
                              [t.function.name for t in body.tools or []])
        fmt = body.response_format
        if fmt is not None and fmt.type == "json_schema":
            schema = (fmt.json_schema or {}).get("schema")
            if isinstance(schema, dict):
                check_schema(schema, RESPONSE_SCHEMA)
    except SchemaTooLarge as e:
        raise too_large(e) from e


def sampling_of(body: SamplingFields, grammar: str | None = None,
                trigger: str | None = None) -> SamplingParams:
    p = SamplingParams(grammar=grammar, grammar_trigger=trigger)
    for name in ("temperature", "top_p", "top_k", "min_p", "repeat_penalty"):
        v = getattr(body, name)
        if v is not None:
            setattr(p, name, v)
    if body.repeat_penalty is None and body.frequency_penalty:
        p.repeat_penalty = 1.0 + max(0.0, body.frequency_penalty) / 2
    p.seed = body.seed
    return p


def usage_of(u: dict[str, int] | None) -> dict[str, Any]:
    u = u or {}
    out: dict[str, Any] = {"prompt_tokens": u.get("prompt_tokens", 0),
                           "completion_tokens": u.get("completion_tokens", 0),
                           "total_tokens": u.get("total_tokens", 0),
                           "prompt_tokens_details": {"cached_tokens": u.get("cached_tokens", 0)}}
    if "reasoning_tokens" in u:  # completion_tokens includes them, as OpenAI counts
        out["completion_tokens_details"] = {"reasoning_tokens": u["reasoning_tokens"]}
    return out


class Completion:
    """One chat or text completion in flight."""

    def __init__(self, rt: Any, body: ChatCompletionRequest | CompletionRequest, rank: int,
                 user: str | None = None, keep_rank: int | None = None,
                 loop: asyncio.AbstractEventLoop | None = None):
        self.rt = rt
        self.body = body
        self.rank = rank
        # The class the prompt is rendered and cached for (a warm-up's, not the one it runs as).
        self.prompt_rank = rank if keep_rank is None else keep_rank
        self.chat = isinstance(body, ChatCompletionRequest)
        self.id = ("chatcmpl-" if self.chat else "cmpl-") + uuid.uuid4().hex[:24]
        self.created = int(time.time())
        self.tools: ToolStream | None = None
        self.forcer: CallForcer | None = None
        self.forced_call = False
        self.reasoning: ReasoningSplitter | None = None
        self.show_reasoning = getattr(body, "reasoning_format", "none") != "hide"
        grammar = None
        self.trigger: str | None = None  # set with a grammar that holds only once a call opens
        if self.chat:
            tokens, grammar = self._chat_prompt(body)  # type: ignore[arg-type]
            default_max = rt.settings.max_tokens_default
            max_tokens = body.max_completion_tokens or body.max_tokens or default_max
        else:
            tokens = self._text_prompt(body)  # type: ignore[arg-type]
            max_tokens = body.max_tokens or 16
        self.stream = AsyncStream(loop)
        stops = body.stops()
        if self.tools is not None:
            # A tool's answer is the tool's, never the model's: a small model that writes
            # one has made it up (the 1.5B, asked "and the porch light too", wrote the
            # light's "Turned on" result instead of the call). Its answer ends there.
            stops.append(RESPONSE_OPEN)
        self.request = Request(
            prompt=tokens, rank=rank, sink=self.stream,
            user=user or body.user or "anonymous", max_tokens=max_tokens, stop=stops,
            ignore_eos=body.ignore_eos, sampling=sampling_of(body, grammar, self.trigger),
            reasoning=self.reasoning, keep_rank=keep_rank, forcer=self.forcer)

    # -- building --------------------------------------------------------------------------
    def _chat_prompt(self, body: ChatCompletionRequest) -> tuple[list[int], str | None]:
        check_limits(body)
        tools = [t.model_dump(exclude_none=True) for t in body.tools] if body.tools else None
        choice = body.tool_choice
        if choice == "none":
            tools = None
        grammar = None
        if tools:
            names = {t["function"]["name"] for t in tools}
            only = None
            if isinstance(choice, dict):
                only = (choice.get("function") or {}).get("name")
                if only not in names:
                    raise CompletionError(400, f"tool_choice names an unknown function "
                                               f"{only!r}", "invalid_tool_choice", "tool_choice")
            elif choice not in (None, "auto", "required"):
                raise CompletionError(400, "tool_choice must be none, auto, required or "
                                           "{type: function, function: {name}}",
                                      "invalid_tool_choice", "tool_choice")
            # The grammar holds the narrowed schemas; the prompt shows the tools as sent.
            call_tools = with_argument_values(tools, body.tool_argument_values)
            if choice == "required" or only:
                self.forced_call = True
                try:
                    schema_grammar = self._schema_grammar(tool_call_schema(call_tools, only))
                except ValueError as e:
                    raise CompletionError(400, f"invalid tool parameters schema: {e}",
                                          "invalid_tools", "tools") from e
                grammar = wrap_grammar(schema_grammar, "<tool_call>", "</tool_call>")
            elif self.rt.settings.constrain_tool_calls and body.response_format is None:
                grammar = self._lazy_call_grammar(call_tools)
            if grammar is not None and self.rt.settings.jump_forward_calls:
                self.forcer = CallForcer(call_tools)  # the grammar checks what it writes
            self.tools = ToolStream(names)
        elif choice not in (None, "none", "auto"):
            raise CompletionError(400, "tool_choice given without tools", "invalid_tool_choice",
                                  "tool_choice")
        fmt = body.response_format
        if fmt is not None and fmt.type == "json_object" and grammar is None:
            grammar = JSON_OBJECT_GRAMMAR
        elif fmt is not None and fmt.type == "json_schema" and grammar is None:
            schema = (fmt.json_schema or {}).get("schema")
            if not isinstance(schema, dict):
                raise CompletionError(400, "response_format.json_schema.schema must be a JSON "
                                           "schema object", "invalid_response_format",
                                      "response_format")
            try:
                grammar = self._schema_grammar(schema, RESPONSE_SCHEMA)
            except ValueError as e:
                raise CompletionError(400, str(e), "invalid_response_format",
                                      "response_format") from e
        return self._render(body, tools, reasoning=grammar is None or bool(self.trigger)), grammar

    def _lazy_call_grammar(self, tools: list[dict]) -> str | None:
        """Calls of these tools, held only once the model opens one. A schema llama.cpp
        cannot take leaves the calls free: under "auto" the grammar is a help, not a
        promise. One past Hearth's limits is a 400 all the same."""
        try:
            body = self._schema_grammar(tool_call_schema(tools))
        except ValueError as e:
            log.info("tool calls left unconstrained: %s", e)
            return None
        self.trigger = lazy_call_trigger({t.get("function", t)["name"] for t in tools})
        return lazy_call_grammar(body)

    def _schema_grammar(self, schema: dict, field: str = "tools") -> str:
        """GBNF for ``schema`` (its source checked by :func:`check_limits` with the request),
        tried on llama.cpp now: one it refuses is a ValueError for the caller to judge, not a
        failure inside the engine loop. A grammar too large or nested too deep for llama.cpp's
        parser is a 400 here, naming ``field``."""
        gbnf = json_schema_grammar(schema)
        try:
            check_grammar_size(gbnf, field)
        except SchemaTooLarge as e:
            raise too_large(e) from e
        self.rt.model.check_grammar(gbnf)  # in the worker: a crash there is its own
        return gbnf

    def _render(self, body: ChatCompletionRequest, tools: list[dict] | None,
                reasoning: bool) -> list[int]:
        template_kwargs = dict(body.chat_template_kwargs or {})
        if self.prompt_rank == VOICE_RANK:  # a voice reply never waits on a chain of thought
            template_kwargs.setdefault("enable_thinking", False)
        try:
            text, pieces = self.rt.formatter.render_pieces(
                [m.model_dump(exclude_none=True) for m in body.messages], tools=tools,
                template_kwargs=template_kwargs)
        except PromptError as e:
            raise CompletionError(400, str(e), "invalid_messages", "messages") from e
        check_chars(len(text), self.rt.core.b.n_ctx_seq, "messages")
        # A grammar shapes the whole output: nothing of it is reasoning.
        if reasoning and body.reasoning_format != "none":
            markers = markers_for(getattr(self.rt.formatter, "source", ""))
            self.reasoning = ReasoningSplitter(prompt_opens(text, markers), markers)
        return self.rt.tokenize_prompt(text, pieces)

    def _text_prompt(self, body: CompletionRequest) -> list[int]:
        prompt = body.prompt
        if isinstance(prompt, list):
            if len(prompt) != 1:
                raise CompletionError(400, "exactly one prompt per request", "invalid_value",
                                      "prompt")
            prompt = prompt[0]
        if not prompt:
            raise CompletionError(400, "prompt must not be empty", "invalid_value", "prompt")
        check_chars(len(prompt), self.rt.core.b.n_ctx_seq, "prompt")
        return self.rt.model.tokenize(prompt, add_special=True, parse_special=False)

    # -- running ---------------------------------------------------------------------------
    def submit(self) -> None:
        try:
            self.rt.engine.submit(self.request)
        except RequestError as e:
            raise CompletionError(e.status, str(e), e.code, None, e.retry_after) from e

    def cancel(self) -> None:
        if not self.request.finished:
            self.rt.engine.cancel(self.request.id)

    def _content(self, ev: Event) -> str:
        return self.tools.feed(ev.text) if self.tools else ev.text

    async def result(self) -> dict[str, Any]:
        """The whole (non-streamed) response object."""
        parts: list[str] = []
        thoughts: list[str] = []
        done: Event | None = None
        async for ev in self.stream.events():
            if ev.kind == "token":
                thoughts.append(ev.reasoning)
                parts.append(self._content(ev))
            elif ev.kind == "error":
                raise CompletionError(ev.status, ev.message or "generation failed",
                                      ev.code or "generation_failed", retry_after=ev.retry_after)
            else:
                done = ev
        assert done is not None
        calls: list[dict[str, Any]] = []
        if self.tools:
            rest, calls = self.tools.finish()
            parts.append(rest)
        content = "".join(parts)
        finish = "tool_calls" if calls else done.finish_reason
        choice: dict[str, Any] = {"index": 0, "finish_reason": finish, "logprobs": None}
        if self.chat:
            msg: dict[str, Any] = {"role": "assistant", "content": content or None}
            if calls:
                msg["tool_calls"] = calls
            else:
                msg["content"] = content
            reasoning = "".join(thoughts)
            if reasoning and self.show_reasoning:
                msg["reasoning_content"] = reasoning
            choice["message"] = msg
        else:
            choice["text"] = content
        return {"id": self.id, "object": "chat.completion" if self.chat else "text_completion",
                "created": self.created, "model": self.rt.model_id, "choices": [choice],
                "usage": usage_of(done.usage), "hearth": done.timing}

    def _chunk(self, delta: dict[str, Any] | str, finish: str | None) -> dict[str, Any]:
        c: dict[str, Any] = {"index": 0, "finish_reason": finish, "logprobs": None}
        if self.chat:
            c["delta"] = delta
        else:
            c["text"] = delta
        return {"id": self.id, "created": self.created, "model": self.rt.model_id,
                "object": "chat.completion.chunk" if self.chat else "text_completion",
                "choices": [c]}

    async def chunks(self) -> AsyncIterator[dict[str, Any]]:
        """Stream chunks in OpenAI's shape (the caller adds ``data: [DONE]``)."""
        if self.chat:
            yield self._chunk({"role": "assistant", "content": ""}, None)
        async for ev in self.stream.events():
            if ev.kind == "token":
                if ev.reasoning and self.show_reasoning:
                    yield self._chunk({"reasoning_content": ev.reasoning}, None)
                text = self._content(ev)
                if text:
                    yield self._chunk({"content": text} if self.chat else text, None)
            elif ev.kind == "error":
                kind = "superseded" if ev.code == "superseded" else "server_error"
                yield {"error": {"message": ev.message, "type": kind,
                                 "code": ev.code or "generation_failed"}}
            else:
                finish = ev.finish_reason
                if self.tools:
                    rest, calls = self.tools.finish()
                    if rest:
                        yield self._chunk({"content": rest}, None)
                    for i, call in enumerate(calls):
                        yield self._chunk({"tool_calls": [{"index": i, **call}]}, None)
                    if calls:
                        finish = "tool_calls"
                yield self._chunk({} if self.chat else "", finish)
                opts = getattr(self.body, "stream_options", None)
                if opts is not None and opts.include_usage:
                    usage = self._chunk({}, None)
                    usage["choices"] = []
                    usage["usage"] = usage_of(ev.usage)
                    usage["hearth"] = ev.timing
                    yield usage
