"""Requests to a model as the routes and jobs make them: waiting while a local model's worker
restarts, building a completion off the event loop (templates, and tokenizing in the worker),
embeddings, and warming a prompt; a remote worker is asked the same way."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from ..chat.api_models import ChatCompletionRequest, CompletionRequest
from ..chat.completions import Completion, CompletionError, check_chars, check_limits
from ..engine import AsyncStream, RequestError
from ..engine.base import WorkerLost
from ..policy.scheduler import BACKGROUND_RANK, RANK_NAMES
from ..shared.requests import Request


async def completion(target: Any, body: ChatCompletionRequest | CompletionRequest, rank: int,
                     user: str | None = None, keep_rank: int | None = None) -> Any:
    """A completion on a local model, or on a remote worker (the same interface). A local
    one is built off the event loop (templates, tokenizing in the model's worker), once the
    worker serves: a request arriving while it restarts waits for it."""
    if getattr(target, "remote", False):
        if isinstance(body, ChatCompletionRequest):
            check_limits(body)  # a remote llama.cpp would parse what this one refuses
        return target.completion(body, rank, user)
    await serving(target)
    try:
        return await asyncio.to_thread(Completion, target, body, rank, user, keep_rank,
                                       asyncio.get_running_loop())
    except WorkerLost as e:
        raise worker_crashed(e) from None


async def serving(rt: Any) -> None:
    """Wait (within the settings' load_wait_s) while a local model's worker restarts."""
    deadline = time.monotonic() + rt.settings.load_wait_s
    while not getattr(rt, "serving", True):
        sup = getattr(rt, "supervisor", None)
        if sup is not None and sup.state == "failed":  # it keeps trying, every 30 s
            raise CompletionError(503, f"the model's worker cannot start: {rt.error}",
                                  "worker_failed", retry_after=30)
        if time.monotonic() > deadline:
            raise CompletionError(503, "the model's worker is restarting after a crash: "
                                  f"{rt.error or 'try again shortly'}", "worker_restarting",
                                  retry_after=5)
        await asyncio.sleep(0.05)


def worker_crashed(e: WorkerLost) -> CompletionError:
    return CompletionError(503, f"the model's worker crashed ({e.cause}); it is restarting, "
                           "try again", "worker_crashed", retry_after=5)


async def warm(rt: Any, body: ChatCompletionRequest, keep_rank: int) -> dict[str, Any]:
    """Compute and cache a chat prompt (as a request of class ``keep_rank`` would render it)
    without answering it: the next turn that starts the same way finds it cached. It runs as
    background work, so it never delays anyone, and is kept for ``keep_rank``."""
    if getattr(rt, "remote", False):
        check_limits(body)
        return await rt.warm(body, keep_rank)
    body = body.model_copy(update={"max_tokens": 1, "max_completion_tokens": None,
                                   "stream": False, "temperature": 0.0,
                                   "response_format": None})
    comp = await completion(rt, body, BACKGROUND_RANK, keep_rank=keep_rank)
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


MAX_INPUTS = 2048


def embedding_inputs(rt: Any, raw: Any) -> list[list[int]]:
    """OpenAI ``input``: a string, strings, a token list, or token lists."""
    if isinstance(raw, str):
        raw = [raw]
    if not raw:
        raise CompletionError(400, "input must not be empty", "invalid_value", "input")
    if all(isinstance(x, int) for x in raw):
        inputs = [list(raw)]
    elif len(raw) > MAX_INPUTS:  # counted before anything is tokenized
        raise CompletionError(400, f"at most {MAX_INPUTS} inputs per request", "invalid_value",
                              "input")
    elif all(isinstance(x, list) for x in raw):
        inputs = [list(x) for x in raw]
    else:
        for i, x in enumerate(raw):
            check_chars(len(x), rt.core.b.n_ctx_seq, f"input.{i}")
        inputs = [rt.model.tokenize(x, add_special=True, parse_special=False) for x in raw]
    if any(not x for x in inputs):
        raise CompletionError(400, "an input is empty", "invalid_value", "input")
    vocab = rt.model.n_vocab
    if any(not 0 <= t < vocab for x in inputs for t in x):
        raise CompletionError(400, "a token id is outside the vocabulary", "invalid_value",
                              "input")
    return inputs


async def embedding_inputs_async(rt: Any, raw: Any) -> list[list[int]]:
    """:func:`embedding_inputs` off the event loop, once the model's worker serves."""
    await serving(rt)
    try:
        return await asyncio.to_thread(embedding_inputs, rt, raw)
    except WorkerLost as e:
        raise worker_crashed(e) from None


async def embeddings(rt: Any, raw: Any, rank: int, user: str | None) -> dict[str, Any]:
    if getattr(rt, "remote", False):
        return await rt.embeddings(raw, rank, user)
    inputs = await embedding_inputs_async(rt, raw)
    stream = AsyncStream()
    r = Request(prompt=inputs, rank=rank, sink=stream, user=user or "anonymous", kind="embed")
    try:
        rt.engine.submit(r)
    except RequestError as e:
        raise CompletionError(e.status, str(e), e.code, "input", e.retry_after) from e
    async for ev in stream.events():
        if ev.kind == "error":
            raise CompletionError(ev.status, ev.message or "embedding failed",
                                  ev.code or "embedding_failed", retry_after=ev.retry_after)
        if ev.kind == "done":
            data = [{"object": "embedding", "index": i, "embedding": v}
                    for i, v in enumerate(ev.embedding or [])]
            n = sum(len(x) for x in inputs)
            return {"object": "list", "data": data, "model": rt.model_id,
                    "usage": {"prompt_tokens": n, "total_tokens": n}, "hearth": ev.timing}
    raise CompletionError(500, "embedding ended without a result", "embedding_failed")
