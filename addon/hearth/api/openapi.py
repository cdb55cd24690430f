"""The API described as OpenAPI 3.1, with request schemas generated from the pydantic models
the server validates with (so the description cannot drift from the validation)."""

from __future__ import annotations

from typing import Any

from pydantic.json_schema import models_json_schema

from .. import __version__
from ..chat.api_models import (
    ChatCompletionRequest,
    CompletionRequest,
    EmbeddingRequest,
    JobCreate,
    ReservationCreate,
)
from .ollama_models import ChatBody, EmbedBody, GenerateBody, LegacyEmbedBody, NamedModel

_ERROR = {"$ref": "#/components/schemas/Error"}


def _resp(desc: str, schema: dict[str, Any] | None = None,
          ctype: str = "application/json") -> dict[str, Any]:
    out: dict[str, Any] = {"description": desc}
    if schema is not None:
        out["content"] = {ctype: {"schema": schema}}
    return out


def _errors(*codes: int) -> dict[str, Any]:
    text = {400: "Invalid request", 401: "Missing or wrong API key", 404: "Not found",
            413: "Body too large", 429: "Queue full (see Retry-After)",
            503: "Model not loaded yet"}
    return {str(c): _resp(text[c], _ERROR) for c in codes}


def _body(name: str) -> dict[str, Any]:
    return {"required": True, "content": {"application/json": {
        "schema": {"$ref": f"#/components/schemas/{name}"}}}}


def _ollama(errors: dict[str, Any]) -> dict[str, Any]:
    """Ollama's routes: bodies validated like the others, errors as ``{"error": "..."}``."""
    obj = {"type": "object"}

    def post(summary: str, body: str) -> dict[str, Any]:
        return {"post": {"summary": summary, "tags": ["ollama"], "requestBody": _body(body),
                         "responses": {"200": _resp("Answer (NDJSON when streamed)", obj),
                                       **errors}}}

    def get(summary: str) -> dict[str, Any]:
        return {"get": {"summary": summary, "tags": ["ollama"],
                        "responses": {"200": _resp(summary, obj)}}}

    return {
        "/api/version": get("The Ollama release whose API Hearth follows"),
        "/api/tags": get("The model and its class aliases"),
        "/api/ps": get("The loaded model"),
        "/api/show": post("A model's details", "NamedModel"),
        "/api/pull": post("Ollama's answer for a model Hearth serves; 404 otherwise",
                          "NamedModel"),
        "/api/chat": post("Ollama chat; the class from a model alias such as <model>:voice",
                          "ChatBody"),
        "/api/generate": post("Ollama generate", "GenerateBody"),
        "/api/embed": post("Ollama embeddings (several inputs)", "EmbedBody"),
        "/api/embeddings": post("Ollama's older embeddings route (one prompt)",
                                "LegacyEmbedBody"),
    }


def build() -> dict[str, Any]:
    _, defs = models_json_schema(
        [(m, "validation") for m in (ChatCompletionRequest, CompletionRequest, EmbeddingRequest,
                                     JobCreate, ChatBody, GenerateBody, EmbedBody,
                                     LegacyEmbedBody, NamedModel, ReservationCreate)],
        ref_template="#/components/schemas/{model}")
    schemas = defs.get("$defs", {})
    schemas["OllamaError"] = {"type": "object", "required": ["error"],
                              "properties": {"error": {"type": "string"}}}
    schemas["Error"] = {"type": "object", "required": ["error"], "properties": {"error": {
        "type": "object", "properties": {
            "message": {"type": "string"}, "type": {"type": "string"},
            "param": {"type": ["string", "null"]}, "code": {"type": ["string", "null"]}}}}}
    obj = {"type": "object"}
    job_id = {"name": "job_id", "in": "path", "required": True, "schema": {"type": "string"}}
    gen_errors = _errors(400, 401, 404, 413, 429, 503)
    paths = {
        "/health": {"get": {"summary": "200 when the model is loaded, 503 while loading",
                            "security": [], "responses": {"200": _resp("Ready", obj),
                                                          "503": _resp("Loading", obj)}}},
        "/v1/models": {"get": {"summary": "The served model",
                               "responses": {"200": _resp("Models", obj), **_errors(401, 503)}}},
        "/v1/chat/completions": {"post": {
            "summary": "OpenAI chat completion (stream with SSE when stream=true)",
            "parameters": [{"name": "X-Hearth-Class", "in": "header", "required": False,
                            "schema": {"type": "string",
                                       "enum": ["voice", "chat", "agent", "background",
                                                "embedding"]}}],
            "requestBody": _body("ChatCompletionRequest"),
            "responses": {"200": _resp("Completion", obj), **gen_errors}}},
        "/v1/completions": {"post": {"summary": "OpenAI text completion",
                                     "requestBody": _body("CompletionRequest"),
                                     "responses": {"200": _resp("Completion", obj),
                                                   **gen_errors}}},
        "/v1/embeddings": {"post": {"summary": "OpenAI embeddings",
                                    "requestBody": _body("EmbeddingRequest"),
                                    "responses": {"200": _resp("Embeddings", obj),
                                                  **gen_errors}}},
        "/v1/cache/warm": {"post": {
            "summary": "Compute and cache a chat prompt without answering it, for the class "
                       "named in priority (default voice); runs as background work",
            "requestBody": _body("ChatCompletionRequest"),
            "responses": {"200": _resp("What was cached: prompt_tokens, cached_tokens, "
                                       "computed_tokens, seconds", obj), **gen_errors}}},
        "/v1/queue": {"get": {"summary": "Queue health", "responses": {
            "200": _resp("Queue health document", obj), **_errors(401, 503)}}},
        "/v1/queue/events": {"get": {
            "summary": "Server-sent events: queue health as it changes. Each event is "
                       "'event: queue' with the /v1/queue document: one on connecting, then "
                       "one per change (at most one a second), keepalive comments between; "
                       "nothing is replayed. /health's features name it queue_events",
            "responses": {"200": _resp("Event stream", {"type": "string"},
                                       "text/event-stream"), **_errors(401, 503)}}},
        "/v1/reservations": {"post": {
            "summary": "A satellite heard its wake word: for ttl_s (default reservation_s, at "
                       "most 15 s) the model's lower classes start no prompt chunk, and warm "
                       "is computed as voice work; ends at expiry, on DELETE or when the "
                       "satellite's voice request (X-Hearth-Satellite) arrives",
            "requestBody": _body("ReservationCreate"),
            "responses": {"200": _resp("id, model, expires_in_s", obj),
                          **_errors(400, 401, 404, 503)}}},
        "/v1/reservations/{rid}": {"delete": {
            "summary": "End a reservation",
            "parameters": [{"name": "rid", "in": "path", "required": True,
                            "schema": {"type": "string"}}],
            "responses": {"200": _resp("id, ended", obj), **_errors(401, 404)}}},
        "/v1/jobs": {
            "post": {"summary": "Submit a durable background job", "requestBody":
                     _body("JobCreate"), "responses": {"202": _resp("Job accepted", obj),
                                                       **_errors(400, 401, 413)}},
            "get": {"summary": "List jobs", "parameters": [
                {"name": "status", "in": "query", "required": False,
                 "schema": {"type": "string", "enum": ["queued", "running", "done", "failed",
                                                       "cancelled"]}},
                {"name": "limit", "in": "query", "required": False,
                 "schema": {"type": "integer", "minimum": 1, "maximum": 1000}}],
                    "responses": {"200": _resp("Jobs", obj), **_errors(400, 401)}}},
        "/v1/jobs/{job_id}": {
            "get": {"summary": "One job", "parameters": [job_id],
                    "responses": {"200": _resp("Job", obj), **_errors(401, 404)}},
            "delete": {"summary": "Cancel a job", "parameters": [job_id],
                       "responses": {"200": _resp("Job", obj), **_errors(401, 404)}}},
        "/v1/events": {"get": {
            "summary": "Server-sent events: job state changes; resume with Last-Event-ID",
            "parameters": [{"name": "Last-Event-ID", "in": "header", "required": False,
                            "schema": {"type": "integer"}}],
            "responses": {"200": _resp("Event stream", {"type": "string"},
                                       "text/event-stream"), **_errors(400, 401)}}},
        "/metrics": {"get": {"summary": "Prometheus metrics", "responses": {
            "200": _resp("Exposition", {"type": "string"}, "text/plain"), **_errors(401)}}},
        **_ollama({k: {**v, "content": {"application/json": {"schema": {
            "$ref": "#/components/schemas/OllamaError"}}}} for k, v in gen_errors.items()}),
    }
    return {
        "openapi": "3.1.0",
        "info": {"title": "Hearth", "version": __version__,
                 "description": "Local LLM service for Home Assistant households"},
        "paths": paths,
        "components": {"schemas": schemas, "securitySchemes": {
            "bearer": {"type": "http", "scheme": "bearer"}}},
        "security": [{"bearer": []}],
    }
