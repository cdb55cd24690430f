"""Ollama's API on Hearth's engine: Home Assistant's Ollama integration, Open WebUI and the
official ``ollama`` clients work against Hearth unchanged, with the same classes (model aliases
such as ``<name>:voice``), fairness (the client's address when a request names no user),
queue and metrics as the OpenAI routes."""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

from aiohttp import web

from ..backend import l2_normalised
from ..completions import Completion, CompletionError, embedding_inputs, embeddings
from . import ollama_convert as convert
from .http import ApiError, read_body, ready, request_class, request_user, serve_completion
from .names import listed_names, resolve
from .ollama_models import ChatBody, EmbedBody, GenerateBody, LegacyEmbedBody, NamedModel

log = logging.getLogger(__name__)

# The Ollama release whose API shapes these routes follow (clients gate features on it).
OLLAMA_VERSION = "0.33.0"
NDJSON = "application/x-ndjson"
# Hearth keeps its model loaded: Ollama writes a far-off expiry for "kept alive forever".
FOREVER = "2318-11-01T00:00:00Z"


def _quantization(description: str) -> str:
    """Ollama's spelling of llama.cpp's file type: "Q4_K - Medium" -> "Q4_K_M"."""
    words = description.split(maxsplit=2)
    name = words[2].removeprefix("(guessed) ") if len(words) > 2 else ""
    base, _, size = name.partition(" - ")
    if size in ("Small", "Medium", "Large"):
        return f"{base}_{size[0]}"
    return base  # e.g. "IQ4_XS - 4.25 bpw" -> "IQ4_XS"


def _details(rt: Any) -> dict[str, Any]:
    words = rt.model.description.split()
    arch = rt.model.meta("general.architecture") or (words[0] if words else "")
    return {"parent_model": "", "format": "gguf", "family": arch, "families": [arch],
            "parameter_size": rt.model.meta("general.size_label") or
            (words[1] if len(words) > 1 else ""),
            "quantization_level": _quantization(rt.model.description)}


def _capabilities(rt: Any) -> list[str]:
    """As Ollama lists them for a chat model: tools (Hearth lists tools for any template) and
    thinking where the template has a chain of thought. Not "embedding": Ollama reserves it for
    embedding-only models, and clients hide those from chat pickers."""
    template = rt.model.chat_template() or ""
    caps = ["completion", "tools"]
    if any(mark in template for mark in ("<think>", "enable_thinking", "reasoning_content")):
        caps.append("thinking")
    return caps


def _file_facts(rt: Any) -> tuple[int, str, str]:
    """Size, a digest and the modification time of the model file. The digest hashes the
    file's identity (path, size, mtime), not its gigabytes: it changes when the file does."""
    st = rt.model_path.stat()
    ident = f"{rt.model_path}:{st.st_size}:{st.st_mtime_ns}".encode()
    when = convert.go_time(datetime.fromtimestamp(st.st_mtime, UTC))
    return st.st_size, hashlib.sha256(ident).hexdigest(), when


def _listed(rt: Any) -> list[dict[str, Any]]:
    size, digest, modified = _file_facts(rt)
    details = _details(rt)
    # Ollama spells an untagged model "<name>:latest"; the aliases carry their class.
    names = [f"{rt.model_id}:latest", *listed_names(rt)[1:]]
    return [{"name": n, "model": n, "modified_at": modified, "size": size, "digest": digest,
             "details": details} for n in names]


def _named(body: NamedModel) -> str:
    try:
        return body.model_name()
    except ValueError as e:
        raise ApiError(400, "model: model is required", "invalid_value", "model") from e


async def version(request: web.Request) -> web.Response:
    return web.json_response({"version": OLLAMA_VERSION})


async def tags(request: web.Request) -> web.Response:
    return web.json_response({"models": _listed(ready(request))})


async def ps(request: web.Request) -> web.Response:
    rt = ready(request)
    gpu = rt.settings.n_gpu_layers != 0 and any(b != "cpu" for b in rt.backends)
    models = [{**m, "expires_at": FOREVER, "size_vram": m["size"] if gpu else 0,
               "context_length": rt.backend.n_ctx_seq} for m in _listed(rt)[:1]]
    return web.json_response({"models": models})


async def show(request: web.Request) -> web.Response:
    rt = ready(request)
    body = await read_body(request, NamedModel)
    resolve(rt, _named(body), ollama=True)
    _, _, modified = _file_facts(rt)
    details = _details(rt)
    arch = details["family"]
    info = {"general.architecture": arch, "general.name": rt.model.name,
            f"{arch}.context_length": rt.model.n_ctx_train,
            f"{arch}.embedding_length": rt.model.n_embd}
    return web.json_response({
        "modelfile": f"# Served by Hearth from {rt.model_path.name}\nFROM {rt.model_path}\n",
        "parameters": "", "template": rt.model.chat_template() or "",
        "details": details, "model_info": info,
        "capabilities": _capabilities(rt), "modified_at": modified})


async def pull(request: web.Request) -> web.StreamResponse:
    """Answers as Ollama does for a model it already has; Hearth downloads nothing this way."""
    rt = ready(request)
    body = await read_body(request, NamedModel)
    name = _named(body)
    try:
        resolve(rt, name, ollama=True)
    except ApiError as e:
        raise ApiError(404, f"pull model manifest: Hearth cannot pull {name!r}: it serves "
                       f"{', '.join(listed_names(rt))}. Put a GGUF file in models_dir and set "
                       "`model` in the add-on options to serve another model.",
                       "model_not_found", "model") from e
    steps = ["pulling manifest", "verifying sha256 digest", "writing manifest", "success"]
    if not body.stream:
        return web.json_response({"status": "success"})
    resp = web.StreamResponse(headers={"Content-Type": NDJSON})
    await resp.prepare(request)
    for step in steps:
        await resp.write(json.dumps({"status": step}).encode() + b"\n")
    await resp.write_eof()
    return resp


def _zero(duration: Any) -> bool:
    if isinstance(duration, int | float):
        return duration == 0
    numbers = re.findall(r"\d+(?:\.\d*)?|\.\d+", duration or "")
    return bool(numbers) and all(float(n) == 0 for n in numbers)


def _loaded(name: str, chat: bool, keep_alive: Any) -> dict[str, Any]:
    """An empty request loads (or, with keep_alive 0, unloads) a model in Ollama."""
    unload = keep_alive is not None and _zero(keep_alive)
    out: dict[str, Any] = {"model": name, "created_at": convert.created_at(), "done": True,
                           "done_reason": "unload" if unload else "load"}
    if chat:
        out["message"] = {"role": "assistant", "content": ""}
    else:
        out["response"] = ""
    return out


async def chat(request: web.Request) -> web.StreamResponse:
    rt = ready(request)
    body = await read_body(request, ChatBody)
    alias = resolve(rt, body.model, ollama=True)
    if not body.messages:
        return web.json_response(_loaded(body.model, True, body.keep_alive))
    inner = convert.chat_request(body, rt.settings.max_tokens_default)
    return await _serve(request, rt, body, inner, alias, chat=True)


async def generate(request: web.Request) -> web.StreamResponse:
    rt = ready(request)
    body = await read_body(request, GenerateBody)
    alias = resolve(rt, body.model, ollama=True)
    if not body.prompt and not body.images:
        return web.json_response(_loaded(body.model, False, body.keep_alive))
    inner = convert.generate_request(body, rt.settings.max_tokens_default)
    return await _serve(request, rt, body, inner, alias, chat=False)


async def _serve(request: web.Request, rt: Any, body: ChatBody | GenerateBody, inner: Any,
                 alias: str | None, chat: bool) -> web.StreamResponse:
    rank = request_class(request, body.priority, "chat", alias)
    try:
        comp = Completion(rt, inner, rank, request_user(request, body.user, by_address=True))
    except CompletionError as e:
        raise convert.renamed(e) from e
    out = _Shaper(body.model, chat, raw=not comp.chat)

    async def ndjson(chunks: AsyncIterator[dict[str, Any]]) -> AsyncIterator[bytes]:
        async for chunk in chunks:
            for line in out.lines(chunk):
                yield json.dumps(line).encode() + b"\n"

    return await serve_completion(request, comp, body.stream, NDJSON, ndjson, out.whole)


class _Shaper:
    """OpenAI chunks and responses of one request, in Ollama's shape."""

    def __init__(self, model: str, chat: bool, raw: bool):
        self.model, self.chat, self.raw = model, chat, raw
        self.finish: str | None = None

    def _piece(self, content: str, thinking: str = "",
               calls: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        # chat answers in a message; generate in the object itself ("response")
        part: dict[str, Any] = ({"role": "assistant", "content": content} if self.chat
                                else {"response": content})
        if thinking:
            part["thinking"] = thinking
        if calls:
            part["tool_calls"] = convert.tool_calls(calls)
        out: dict[str, Any] = {"model": self.model, "created_at": convert.created_at()}
        if self.chat:
            out["message"] = part
        else:
            out.update(part)
        return out

    @staticmethod
    def _done(finish: str | None, usage: dict[str, Any], timing: dict[str, Any] | None
              ) -> dict[str, Any]:
        return {"done": True, "done_reason": convert.done_reason(finish),
                **convert.metrics(usage, timing), "hearth": timing}

    def whole(self, result: dict[str, Any]) -> dict[str, Any]:
        choice = result["choices"][0]
        if self.raw:
            out = self._piece(choice["text"])
        else:
            msg = choice["message"]
            out = self._piece(msg.get("content") or "", msg.get("reasoning_content") or "",
                              msg.get("tool_calls"))
        return {**out, **self._done(choice["finish_reason"], result["usage"],
                                    result.get("hearth"))}

    def lines(self, chunk: dict[str, Any]) -> list[dict[str, Any]]:
        if "error" in chunk:
            return [{"error": chunk["error"].get("message") or "generation failed"}]
        if "usage" in chunk and not chunk.get("choices"):  # the last chunk: counts and times
            return [{**self._piece(""), **self._done(self.finish, chunk["usage"],
                                                     chunk.get("hearth"))}]
        choice = chunk["choices"][0]
        if choice.get("finish_reason"):
            self.finish = choice["finish_reason"]
        if self.raw:
            return [{**self._piece(choice["text"]), "done": False}] if choice["text"] else []
        delta = choice["delta"]
        content, thinking = delta.get("content") or "", delta.get("reasoning_content") or ""
        calls = delta.get("tool_calls") or []  # each keeps its index across the answer
        if not (content or thinking or calls):
            return []
        return [{**self._piece(content, thinking, calls), "done": False}]


async def embed(request: web.Request) -> web.Response:
    rt = ready(request)
    body = await read_body(request, EmbedBody)
    alias = resolve(rt, body.model, ollama=True)
    texts = [body.input] if isinstance(body.input, str) else body.input or []
    if not any(texts):  # as Ollama answers no input
        return web.json_response({"model": body.model, "embeddings": []})
    inputs = _tokens(rt, texts, body.truncate)
    result = await _embed(request, rt, inputs, body.priority, alias, body.user)
    vectors = [d["embedding"] for d in result["data"]]
    if body.dimensions and body.dimensions > 0:  # Ollama takes <= 0 as unset
        vectors = [_shortened(v, body.dimensions) for v in vectors]
    timing = result.get("hearth") or {}
    return web.json_response({
        "model": body.model, "embeddings": vectors,
        "total_duration": round((timing.get("e2e_ms") or 0) * 1e6), "load_duration": 0,
        "prompt_eval_count": result["usage"]["prompt_tokens"]})


async def legacy_embeddings(request: web.Request) -> web.Response:
    rt = ready(request)
    body = await read_body(request, LegacyEmbedBody)
    alias = resolve(rt, body.model, ollama=True)
    if not body.prompt:  # as Ollama answers an empty prompt
        return web.json_response({"embedding": []})
    result = await _embed(request, rt, _tokens(rt, [body.prompt], True), body.priority, alias,
                          body.user)
    return web.json_response({"embedding": result["data"][0]["embedding"]})


def _tokens(rt: Any, texts: list[str], truncate: bool) -> list[list[int]]:
    if any(not t for t in texts):
        raise ApiError(400, "an input is empty", "invalid_value", "input")
    inputs = embedding_inputs(rt, texts)
    if truncate:  # Ollama's default: cut an input to what the model can take
        limit, _ = rt.backend.embed_limits()
        inputs = [x[:limit] for x in inputs]
    return inputs


async def _embed(request: web.Request, rt: Any, inputs: list[list[int]],
                 priority: str | int | None, alias: str | None, user: str | None
                 ) -> dict[str, Any]:
    rank = request_class(request, priority, "embedding", alias)
    try:
        return await embeddings(rt, inputs, rank, request_user(request, user, by_address=True))
    except CompletionError as e:
        if e.code == "context_length_exceeded":
            e.message = f"the input length exceeds the context length: {e.message}"
        raise


def _shortened(vector: list[float], n: int) -> list[float]:
    """The first ``n`` dimensions, normalised again (as Ollama's ``dimensions`` does)."""
    return l2_normalised(vector[:n])


async def root(request: web.Request) -> web.Response:
    """Ollama's liveness check (its CLI's heartbeat, some clients' connection tests)."""
    return web.Response(text="Hearth is running (Ollama's API on /api, OpenAI's on /v1)")


def add_routes(r: web.UrlDispatcher) -> None:
    r.add_get("/", root)  # add_get answers HEAD too
    r.add_get("/api/version", version)
    r.add_get("/api/tags", tags)
    r.add_get("/api/ps", ps)
    r.add_post("/api/show", show)
    r.add_post("/api/pull", pull)
    r.add_post("/api/chat", chat)
    r.add_post("/api/generate", generate)
    r.add_post("/api/embed", embed)
    r.add_post("/api/embeddings", legacy_embeddings)
