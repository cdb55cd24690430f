"""OpenAI chat and text completions on the engine, without HTTP: building the prompt, grammar
and engine request from a validated body, and turning engine events into OpenAI responses or
stream chunks. Used by the HTTP handlers and by durable jobs."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from .api_models import ChatCompletionRequest, CompletionRequest, SamplingFields
from .engine import AsyncStream, RequestError
from .llama_sampling import check_grammar, json_schema_grammar
from .prompts import PromptError
from .reasoning import ReasoningSplitter, markers_for, prompt_opens
from .requests import Event, Request, SamplingParams
from .scheduler import BACKGROUND_RANK, RANK_NAMES, VOICE_RANK
from .tools import (
    LAZY_CALL_TRIGGER,
    ToolStream,
    tool_call_schema,
    with_argument_values,
    wrap_grammar,
)

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
                 user: str | None = None, keep_rank: int | None = None):
        self.rt = rt
        self.body = body
        self.rank = rank
        # The class the prompt is rendered and cached for (a warm-up's, not the one it runs as).
        self.prompt_rank = rank if keep_rank is None else keep_rank
        self.chat = isinstance(body, ChatCompletionRequest)
        self.id = ("chatcmpl-" if self.chat else "cmpl-") + uuid.uuid4().hex[:24]
        self.created = int(time.time())
        self.tools: ToolStream | None = None
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
        self.stream = AsyncStream()
        self.request = Request(
            prompt=tokens, rank=rank, sink=self.stream,
            user=user or body.user or "anonymous", max_tokens=max_tokens, stop=body.stops(),
            ignore_eos=body.ignore_eos, sampling=sampling_of(body, grammar, self.trigger),
            reasoning=self.reasoning, keep_rank=keep_rank)

    # -- building --------------------------------------------------------------------------
    def _chat_prompt(self, body: ChatCompletionRequest) -> tuple[list[int], str | None]:
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
                grammar = self._schema_grammar(schema)
            except ValueError as e:
                raise CompletionError(400, str(e), "invalid_response_format",
                                      "response_format") from e
        return self._render(body, tools, reasoning=grammar is None or bool(self.trigger)), grammar

    def _lazy_call_grammar(self, tools: list[dict]) -> str | None:
        """Calls of these tools, held only once the model opens one. A schema llama.cpp
        cannot take leaves the calls free: under "auto" the grammar is a help, not a
        promise."""
        try:
            body = self._schema_grammar(tool_call_schema(tools))
        except ValueError as e:
            log.info("tool calls left unconstrained: %s", e)
            return None
        self.trigger = LAZY_CALL_TRIGGER
        return wrap_grammar(body, "<tool_call>", "</tool_call>", repeat=True)

    def _schema_grammar(self, schema: dict) -> str:
        """GBNF for ``schema``, tried on llama.cpp now: one it refuses is this request's 400,
        not a failure inside the engine loop."""
        gbnf = json_schema_grammar(schema)
        check_grammar(self.rt.model, gbnf)
        return gbnf

    def _render(self, body: ChatCompletionRequest, tools: list[dict] | None,
                reasoning: bool) -> list[int]:
        template_kwargs = dict(body.chat_template_kwargs or {})
        if self.prompt_rank == VOICE_RANK:  # a voice reply never waits on a chain of thought
            template_kwargs.setdefault("enable_thinking", False)
        try:
            text = self.rt.formatter.render(
                [m.model_dump(exclude_none=True) for m in body.messages], tools=tools,
                template_kwargs=template_kwargs)
        except PromptError as e:
            raise CompletionError(400, str(e), "invalid_messages", "messages") from e
        # A grammar shapes the whole output: nothing of it is reasoning.
        if reasoning and body.reasoning_format != "none":
            markers = markers_for(getattr(self.rt.formatter, "source", ""))
            self.reasoning = ReasoningSplitter(prompt_opens(text, markers), markers)
        return self.rt.tokenize_prompt(text)

    def _text_prompt(self, body: CompletionRequest) -> list[int]:
        prompt = body.prompt
        if isinstance(prompt, list):
            if len(prompt) != 1:
                raise CompletionError(400, "exactly one prompt per request", "invalid_value",
                                      "prompt")
            prompt = prompt[0]
        if not prompt:
            raise CompletionError(400, "prompt must not be empty", "invalid_value", "prompt")
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
                                      "generation_failed")
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
                yield {"error": {"message": ev.message, "type": "server_error",
                                 "code": "generation_failed"}}
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


def completion(target: Any, body: ChatCompletionRequest | CompletionRequest, rank: int,
               user: str | None = None) -> Any:
    """A completion on a local model, or on a remote worker (the same interface)."""
    if getattr(target, "remote", False):
        return target.completion(body, rank, user)
    return Completion(target, body, rank, user)


async def warm(rt: Any, body: ChatCompletionRequest, keep_rank: int) -> dict[str, Any]:
    """Compute and cache a chat prompt (as a request of class ``keep_rank`` would render it)
    without answering it: the next turn that starts the same way finds it cached. It runs as
    background work, so it never delays anyone, and is kept for ``keep_rank``."""
    if getattr(rt, "remote", False):
        return await rt.warm(body, keep_rank)
    body = body.model_copy(update={"max_tokens": 1, "max_completion_tokens": None,
                                   "stream": False, "temperature": 0.0,
                                   "response_format": None})
    comp = Completion(rt, body, BACKGROUND_RANK, keep_rank=keep_rank)
    comp.request.warm_up = True
    t0 = time.monotonic()
    comp.submit()
    try:
        usage = (await comp.result())["usage"]
    finally:
        comp.cancel()
    cached = usage["prompt_tokens_details"]["cached_tokens"]
    return {"object": "cache.warm", "model": rt.model_id, "class": RANK_NAMES[keep_rank],
            "prompt_tokens": usage["prompt_tokens"], "cached_tokens": cached,
            "computed_tokens": usage["prompt_tokens"] - cached,
            "seconds": round(time.monotonic() - t0, 3)}


def embedding_inputs(rt: Any, raw: Any) -> list[list[int]]:
    """OpenAI ``input``: a string, strings, a token list, or token lists."""
    if isinstance(raw, str):
        raw = [raw]
    if not raw:
        raise CompletionError(400, "input must not be empty", "invalid_value", "input")
    if all(isinstance(x, int) for x in raw):
        inputs = [list(raw)]
    elif all(isinstance(x, list) for x in raw):
        inputs = [list(x) for x in raw]
    else:
        inputs = [rt.model.tokenize(x, add_special=True, parse_special=False) for x in raw]
    if len(inputs) > 2048:
        raise CompletionError(400, "at most 2048 inputs per request", "invalid_value", "input")
    if any(not x for x in inputs):
        raise CompletionError(400, "an input is empty", "invalid_value", "input")
    vocab = rt.model.n_vocab
    if any(not 0 <= t < vocab for x in inputs for t in x):
        raise CompletionError(400, "a token id is outside the vocabulary", "invalid_value",
                              "input")
    return inputs


async def embeddings(rt: Any, raw: Any, rank: int, user: str | None) -> dict[str, Any]:
    if getattr(rt, "remote", False):
        return await rt.embeddings(raw, rank, user)
    inputs = embedding_inputs(rt, raw)
    stream = AsyncStream()
    r = Request(prompt=inputs, rank=rank, sink=stream, user=user or "anonymous", kind="embed")
    try:
        rt.engine.submit(r)
    except RequestError as e:
        raise CompletionError(e.status, str(e), e.code, "input", e.retry_after) from e
    async for ev in stream.events():
        if ev.kind == "error":
            raise CompletionError(ev.status, ev.message or "embedding failed",
                                  "embedding_failed")
        if ev.kind == "done":
            data = [{"object": "embedding", "index": i, "embedding": v}
                    for i, v in enumerate(ev.embedding or [])]
            n = sum(len(x) for x in inputs)
            return {"object": "list", "data": data, "model": rt.model_id,
                    "usage": {"prompt_tokens": n, "total_tokens": n}, "hearth": ev.timing}
    raise CompletionError(500, "embedding ended without a result", "embedding_failed")
