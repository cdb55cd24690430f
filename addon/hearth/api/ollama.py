"""Ollama's API on Hearth's engine: Home Assistant's Ollama integration, Open WebUI and the
official ``ollama`` clients work against Hearth unchanged, with the same classes (model aliases
such as ``<name>:voice``), fairness (the client's address when a request names no user),
queue and metrics as the OpenAI routes."""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import PurePosixPath
from typing import Any
from urllib.parse import urlsplit

from aiohttp import web

from ..chat.completions import CompletionError
from ..chat.prompts import template_capabilities
from ..engine.embeddings import l2_normalised
from ..fleet.gguf import FILE_TYPES
from ..service.serving import completion, embedding_inputs_async, embeddings
from . import ollama_convert as convert
from .http import FLEET, ApiError, read_body, ready, request_user, serve_completion
from .names import listed, resolve, use_model, with_model
from .ollama_models import ChatBody, EmbedBody, GenerateBody, LegacyEmbedBody, NamedModel

log = logging.getLogger(__name__)

# The Ollama release whose API shapes these routes follow (clients gate features on it).
OLLAMA_VERSION = "0.33.0"
NDJSON = "application/x-ndjson"
# Ollama writes a far-off expiry for a model kept alive forever (pinned, or keep_alive -1).
FOREVER = "2318-11-01T00:00:00Z"


def _quantization(description: str) -> str:
    """Ollama's spelling of llama.cpp's file type: "Q4_K - Medium" -> "Q4_K_M"."""
    words = description.split(maxsplit=2)
    name = words[2].removeprefix("(guessed) ") if len(words) > 2 else ""
    base, _, size = name.partition(" - ")
    if size in ("Small", "Medium", "Large"):
        return f"{base}_{size[0]}"
    return base  # e.g. "IQ4_XS - 4.25 bpw" -> "IQ4_XS"


def _details(w: Any) -> dict[str, Any]:
    """From the model's GGUF header, loaded or not (and its loaded description as a
    fallback for quantizations the table does not name)."""
    meta, rt = w.meta, w.rt
    words = rt.model.description.split() if rt.state == "ready" and not w.remote else []
    arch = meta.get("general.architecture") or (words[0] if words else "")
    quant = FILE_TYPES.get(meta.get("general.file_type", -1)) or \
        (_quantization(rt.model.description) if words else "")
    return {"parent_model": "", "format": "gguf", "family": arch, "families": [arch],
            "parameter_size": meta.get("general.size_label") or
            (words[1] if len(words) > 1 else ""),
            "quantization_level": quant}


def _file_facts(w: Any) -> tuple[int, str, str]:
    """Size, a digest and the modification time of the model file. The digest hashes the
    file's identity (path, size, mtime), not its gigabytes: it changes when the file does."""
    if w.path is None:  # not downloaded yet
        return 0, hashlib.sha256(w.name.encode()).hexdigest(), convert.go_time(
            datetime.fromtimestamp(0, UTC))
    st = w.path.stat()
    ident = f"{w.path}:{st.st_size}:{st.st_mtime_ns}".encode()
    when = convert.go_time(datetime.fromtimestamp(st.st_mtime, UTC))
    return st.st_size, hashlib.sha256(ident).hexdigest(), when


def _file_name(w: Any) -> str:
    """The model's file as ``/api/show`` names it: the file's name alone. A path would tell
    any client on the LAN how the server's disk is laid out, a download URL may carry a key;
    a model on another server is named as that server names it."""
    if w.remote:
        return w.entry.spec.remote_model or w.name
    if w.path is not None:
        return w.path.name
    source = w.rt.settings.model  # not on disk yet: a file name, a path or an https:// URL
    if "://" in source:
        source = urlsplit(source).path
    return PurePosixPath(source).name or w.name


def _listed(w: Any, names: list[str]) -> list[dict[str, Any]]:
    size, digest, modified = _file_facts(w)
    details = _details(w)
    # Ollama spells an untagged model "<name>:latest"; the aliases carry their class.
    names = [f"{names[0]}:latest", *names[1:]]
    return [{"name": n, "model": n, "modified_at": modified, "size": size, "digest": digest,
             "details": details} for n in names]


def _named(body: NamedModel) -> str:
    try:
        return body.model_name()
    except ValueError as e:
        raise ApiError(400, "model: model is required", "invalid_value", "model") from e


def _worker(request: web.Request, name: str) -> Any:
    fleet = request.app[FLEET]
    model, _ = resolve(request, name, ollama=True)
    return fleet.workers[model or fleet.registry.for_class("chat")]


async def version(request: web.Request) -> web.Response:
    return web.json_response({"version": OLLAMA_VERSION})


async def tags(request: web.Request) -> web.Response:
    ready(request)
    return web.json_response({"models": [m for w, names in listed(request)
                                         for m in _listed(w, names)]})


async def ps(request: web.Request) -> web.Response:
    """The loaded models, with when each is unloaded if it stays idle."""
    fleet = ready(request)
    report = fleet.report()["models"]
    out = []
    for w, names in listed(request):
        if w.rt.state != "ready" or w.remote:  # a remote worker's memory is its own
            continue
        rt, left = w.rt, report[w.name]["expires_in_s"]
        gpu = rt.settings.n_gpu_layers != 0 and any(b != "cpu" for b in rt.backends)
        expires = FOREVER if left is None else convert.go_time(
            datetime.now(UTC) + timedelta(seconds=left))
        m = _listed(w, names)[0]
        out.append({**m, "expires_at": expires, "size_vram": m["size"] if gpu else 0,
                    "context_length": rt.backend.n_ctx_seq})
    return web.json_response({"models": out})


async def show(request: web.Request) -> web.Response:
    ready(request)
    body = await read_body(request, NamedModel)
    w = _worker(request, _named(body))
    _, _, modified = _file_facts(w)
    details = _details(w)
    arch = details["family"]
    info = {k: w.meta.get(k) for k in ("general.architecture", "general.name",
                                         f"{arch}.context_length", f"{arch}.embedding_length")}
    template = w.meta.get("tokenizer.chat_template") or ""
    name = _file_name(w)
    return web.json_response({
        "modelfile": f"# Served by Hearth\nFROM {name}\n",
        "parameters": "", "template": template,
        "details": details, "model_info": info,
        "capabilities": template_capabilities(template), "modified_at": modified})


async def pull(request: web.Request) -> web.StreamResponse:
    """Answers as Ollama does for a model it already has; Hearth downloads nothing this way."""
    fleet = ready(request)
    body = await read_body(request, NamedModel)
    name = _named(body)
    try:
        _worker(request, name)
    except ApiError as e:
        raise ApiError(404, f"pull model manifest: Hearth cannot pull {name!r}: it serves "
                       f"{', '.join(fleet.registry.names)}. Put a GGUF file in models_dir and "
                       "name it in the add-on options (`model`, or `models` for several) to "
                       "serve another model.", "model_not_found", "model") from e
    steps = ["pulling manifest", "verifying sha256 digest", "writing manifest", "success"]
    if not body.stream:
        return web.json_response({"status": "success"})
    resp = web.StreamResponse(headers={"Content-Type": NDJSON})
    await resp.prepare(request)
    for step in steps:
        await resp.write(json.dumps({"status": step}).encode() + b"\n")
    await resp.write_eof()
    return resp


def _loaded(name: str, chat: bool, keep_alive: Any) -> dict[str, Any]:
    """An empty request loads (or, with keep_alive 0, unloads) a model in Ollama."""
    unload = convert.keep_alive_seconds(keep_alive) == 0
    out: dict[str, Any] = {"model": name, "created_at": convert.created_at(), "done": True,
                           "done_reason": "unload" if unload else "load"}
    if chat:
        out["message"] = {"role": "assistant", "content": ""}
    else:
        out["response"] = ""
    return out


async def chat(request: web.Request) -> web.StreamResponse:
    ready(request)
    body = await read_body(request, ChatBody)
    if not body.messages:
        return await _load_only(request, body, chat=True)
    inner = convert.chat_request(body, request.app[FLEET].settings.max_tokens_default)
    return await _serve(request, body, inner, chat=True)


async def generate(request: web.Request) -> web.StreamResponse:
    ready(request)
    body = await read_body(request, GenerateBody)
    if not body.prompt and not body.images:
        return await _load_only(request, body, chat=False)
    inner = convert.generate_request(body, request.app[FLEET].settings.max_tokens_default)
    return await _serve(request, body, inner, chat=False)


async def _load_only(request: web.Request, body: ChatBody | GenerateBody, chat: bool
                     ) -> web.Response:
    """An empty request loads the model (or, with keep_alive 0, lets it go once idle,
    without loading it first), as in Ollama."""
    keep_alive = convert.keep_alive_seconds(body.keep_alive)
    if keep_alive == 0:
        request.app[FLEET].expire(_worker(request, body.model).name)
    else:
        async with use_model(request, body.model, body.priority, "chat", ollama=True,
                             keep_alive_s=keep_alive):
            pass
    return web.json_response(_loaded(body.model, chat, body.keep_alive))


async def _serve(request: web.Request, body: ChatBody | GenerateBody, inner: Any, chat: bool
                 ) -> web.StreamResponse:
    user = request_user(request, body.user, by_address=True)

    async def run(rt: Any, rank: int) -> web.StreamResponse:
        try:
            comp = await completion(rt, inner, rank, user)
        except CompletionError as e:
            raise convert.renamed(e) from e
        out = _Shaper(body.model, chat, raw=not comp.chat)

        async def ndjson(chunks: AsyncIterator[dict[str, Any]]) -> AsyncIterator[bytes]:
            async for chunk in chunks:
                for line in out.lines(chunk):
                    yield json.dumps(line).encode() + b"\n"

        return await serve_completion(request, comp, body.stream, NDJSON, ndjson, out.whole)

    return await with_model(request, body.model, body.priority, "chat", run, ollama=True,
                            keep_alive_s=convert.keep_alive_seconds(body.keep_alive), user=user)


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
    ready(request)
    body = await read_body(request, EmbedBody)
    resolve(request, body.model, ollama=True)
    texts = [body.input] if isinstance(body.input, str) else body.input or []
    if not any(texts):  # as Ollama answers no input
        return web.json_response({"model": body.model, "embeddings": []})
    result = await _embed(request, body, texts, body.truncate)
    vectors = [d["embedding"] for d in result["data"]]
    if body.dimensions and body.dimensions > 0:  # Ollama takes <= 0 as unset
        vectors = [_shortened(v, body.dimensions) for v in vectors]
    timing = result.get("hearth") or {}
    return web.json_response({
        "model": body.model, "embeddings": vectors,
        "total_duration": round((timing.get("e2e_ms") or 0) * 1e6), "load_duration": 0,
        "prompt_eval_count": result["usage"]["prompt_tokens"]})


async def legacy_embeddings(request: web.Request) -> web.Response:
    ready(request)
    body = await read_body(request, LegacyEmbedBody)
    resolve(request, body.model, ollama=True)
    if not body.prompt:  # as Ollama answers an empty prompt
        return web.json_response({"embedding": []})
    result = await _embed(request, body, [body.prompt], True)
    return web.json_response({"embedding": result["data"][0]["embedding"]})


async def _embed(request: web.Request, body: EmbedBody | LegacyEmbedBody, texts: list[str],
                 truncate: bool) -> dict[str, Any]:
    if any(not t for t in texts):
        raise ApiError(400, "an input is empty", "invalid_value", "input")
    user = request_user(request, body.user, by_address=True)

    async def run(rt: Any, rank: int) -> dict[str, Any]:
        inputs: list[Any] = list(texts)  # a remote worker tokenizes for itself
        if not getattr(rt, "remote", False):
            inputs = await embedding_inputs_async(rt, texts)
            if truncate:  # Ollama's default: cut an input to what the model can take
                limit, _ = rt.backend.embed_limits()
                inputs = [x[:limit] for x in inputs]
        try:
            return await embeddings(rt, inputs, rank, user)
        except CompletionError as e:
            if e.code == "context_length_exceeded":
                e.message = f"the input length exceeds the context length: {e.message}"
            raise

    return await with_model(request, body.model, body.priority, "embedding", run, ollama=True,
                            keep_alive_s=convert.keep_alive_seconds(body.keep_alive), user=user)


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
