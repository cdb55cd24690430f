"""The household's calls over Ollama's API, as Home Assistant's Ollama integration sends them:
``/api/chat`` streamed as NDJSON, the class as a model alias (``<model>:voice``; embeddings,
which have no alias, on the plain name), the member in the ``X-Hearth-User`` header. Sampling
is the OpenAI path's, so the two paths replay the same tokens and differ only in their wire."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import aiohttp

if TYPE_CHECKING:
    from .driver import CallResult, Replay
    from .workload import Call, Session

ALIASED = ("voice", "chat", "agent", "background")


def model_for(rp: Replay, cls: str) -> str:
    return f"{rp.target.model}:{cls}" if cls in ALIASED else rp.target.model


def chat_body(rp: Replay, s: Session, index: int, call: Call) -> dict[str, Any]:
    from .driver import call_seed

    return {"model": model_for(rp, s.cls), "messages": call.messages, "stream": True,
            "options": {"num_predict": call.max_tokens, "temperature": 0.7,
                        "seed": call_seed(s.id, index), "ignore_eos": True}}


def embed_body(rp: Replay, s: Session, call: Call) -> dict[str, Any]:
    return {"model": model_for(rp, s.cls), "input": call.inputs}


async def read_stream(rp: Replay, r: CallResult, resp: aiohttp.ClientResponse) -> None:
    async for raw in resp.content:
        line = raw.strip()
        if not line:
            continue
        chunk = json.loads(line)
        if "error" in chunk:
            r.status, r.error = "error", str(chunk["error"])[:300]
            return
        msg = chunk.get("message") or {}
        if msg.get("content") or msg.get("tool_calls"):
            r.content_at(rp.now())
        if chunk.get("done"):
            r.prompt_tokens = int(chunk.get("prompt_eval_count") or 0)
            r.completion_tokens = int(chunk.get("eval_count") or 0)
            # Ollama has no field for it; Hearth's timings beside it count the cached prompt.
            r.cached_tokens = int((chunk.get("hearth") or {}).get("cached_tokens") or 0)
    r.stream_ended()


async def read_embedded(rp: Replay, r: CallResult, resp: aiohttp.ClientResponse) -> None:
    out = await resp.json()
    r.first_s = round(rp.now(), 4)
    r.prompt_tokens = int(out.get("prompt_eval_count") or 0)
    r.status = "ok"
