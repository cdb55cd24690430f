"""One definition of the server's settings, read from CLI flags, the environment and the add-on's
options file.

Precedence: command-line flag > environment variable (``HEARTH_<NAME>``) > the add-on's
``/data/options.json`` (or ``--options-file``) > default. ``addon/config.yaml`` mirrors the fields
marked ``addon=True``; a test fails when the two drift apart.
"""

from __future__ import annotations

import argparse
import json
import os
import re
from pathlib import Path
from typing import Any, Literal, get_origin

from pydantic import BaseModel, Field, ValidationError, field_validator, model_validator

CLASS_NAMES = ("voice", "chat", "agent", "background", "embedding")
ENV_PREFIX = "HEARTH_"
ADDON_OPTIONS = Path("/data/options.json")


def _opt(default: Any, help: str, addon: bool = True, **kw: Any) -> Any:
    return Field(default, description=help, json_schema_extra={"addon": addon}, **kw)


ClassName = Literal["voice", "chat", "agent", "background", "embedding"]
NAME_PATTERN = r"^[a-z0-9][a-z0-9._-]{0,63}$"


class ModelSpec(BaseModel):
    """One model of several (the ``models`` setting). Unset sizes take the server-wide value."""

    model_config = {"extra": "forbid"}

    name: str = Field(pattern=NAME_PATTERN, description="what requests call it (lowercase)")
    file: str = Field("", description="GGUF: a path, a file under models_dir or an https:// "
                      "URL; empty = the embedded SmolLM2-135M-Instruct")
    classes: list[ClassName] = Field(
        default_factory=list, description="classes whose requests go here unless they name a "
        "model (a class no model claims goes to the first model)")
    aliases: list[str] = Field(default_factory=list, description="other names it answers to")
    n_ctx: int | None = Field(None, ge=256, description="its KV cache (default: n_ctx)")
    n_parallel: int | None = Field(None, ge=1, le=64, description="default: n_parallel")
    n_gpu_layers: int | None = Field(None, ge=-1, description="default: n_gpu_layers")
    keep_alive_s: float = Field(300.0, ge=-1, description="unloaded after this long idle "
                                "(-1 = never; 0 = as soon as it is idle)")
    pinned: bool = Field(False, description="loaded at start and never unloaded")
    # A remote worker: another server's model, reached over its OpenAI-compatible API.
    url: str = Field("", description="a remote OpenAI-compatible server (another Hearth, "
                     "llama-server, vLLM, Ollama) instead of a file: http://host:port")
    kind: Literal["hearth", "vllm", "llama-server", "openai"] = Field(
        "openai", description="what the remote server is: how its queue is read and the "
        "class passed (Hearth: priority by name; vLLM: priority by rank)")
    remote_model: str = Field("", description="the remote's name for the model (default: "
                              "name; for another Hearth none, so it picks its class's model)")
    api_key: str = Field("", description="the remote server's key")
    max_concurrency: int = Field(4, ge=1, le=256, description="most requests in flight there")
    timeout_s: float = Field(300.0, gt=0, description="a remote request's time limit")
    fallback: str = Field("", description="the model requests go to while this remote is "
                          "unreachable or saturated")

    @field_validator("classes", "aliases", mode="before")
    @classmethod
    def _comma_separated(cls, v: Any) -> Any:
        # The add-on's form has no list inside a list item: "voice, chat" there.
        return [x.strip() for x in v.split(",") if x.strip()] if isinstance(v, str) else v

    @field_validator("aliases")
    @classmethod
    def _lowercase_names(cls, v: list[str]) -> list[str]:
        for a in v:
            if not re.match(NAME_PATTERN, a):
                raise ValueError(f"alias {a!r}: lowercase letters, digits, '.', '_', '-'")
        return v


class KeySpec(BaseModel):
    """One member's API key (the ``api_keys`` setting): who it is and the classes it may use."""

    model_config = {"extra": "forbid"}

    name: str = Field(pattern=NAME_PATTERN, description="the member (its fairness name)")
    key: str = Field(min_length=8, description="the bearer token it sends")
    classes: list[ClassName] = Field(default_factory=list, description="classes it may use "
                                     "(empty = all)")

    @field_validator("classes", mode="before")
    @classmethod
    def _comma_separated(cls, v: Any) -> Any:
        return [x.strip() for x in v.split(",") if x.strip()] if isinstance(v, str) else v


class Settings(BaseModel):
    """Every knob of the server. Field descriptions double as CLI help."""

    model_config = {"extra": "forbid", "validate_assignment": True}

    # Network
    host: str = _opt("127.0.0.1", "address to bind (the add-on binds its container interface)",
                     addon=False)
    port: int = _opt(8080, "TCP port", addon=False, ge=1, le=65535)
    api_key: str = _opt("", "require 'Authorization: Bearer <key>' on every endpoint but /health")
    api_keys: list[KeySpec] = _opt(
        [], "more keys, one per member: each with a name, a key and the classes it may use "
        "(JSON list on the command line); requests with one run as that member, in its classes")
    allowed_hosts: str = _opt(
        "", "more names the server answers to, comma-separated, beyond IP addresses, "
        "localhost, single-label names and .local/.lan/.internal/.home.arpa names ('*' = any; "
        "other names are refused against DNS rebinding)")
    allowed_origins: str = _opt(
        "", "web origins (https://host:port) whose pages may call the API, comma-separated "
        "('*' = any); other cross-site requests are refused")

    # Model
    model: str = _opt("", "GGUF: a path, a file name under models_dir, or an https:// URL; "
                      "empty = the embedded SmolLM2-135M-Instruct")
    models_dir: str = _opt("models", "folder for model files (downloads land here)", addon=False)
    data_dir: str = _opt("data", "folder for the job store and other state", addon=False)
    embedding_model: str = _opt("", "GGUF for /v1/embeddings; empty = the chat model's weights")
    draft_model: str = _opt(
        "", "GGUF of a small model with the chat model's vocabulary that drafts voice answers "
        "(speculative decoding), as many tokens as the measured costs say pay (on a small CPU, "
        "none); empty = no draft")
    draft_tokens: int = _opt(4, "most tokens the draft model guesses at a time", ge=1, le=16)
    draft_policy: Literal["measured", "always"] = _opt(
        "measured", "measured: guess as many tokens as the measured costs say pay (none where "
        "none can); always: draft_tokens every voice decode, to measure what drafting does",
        addon=False)
    n_ctx: int = _opt(16384, "KV cache size in tokens, shared by all sequences", ge=256)
    n_parallel: int = _opt(8, "most sequences decoding at once", ge=1, le=64)
    n_batch: int = _opt(512, "most tokens in one llama_decode call", ge=16)
    n_ubatch: int = _opt(128, "physical micro-batch size (the granularity a voice request can "
                         "cut a running prefill at)", ge=16)
    n_threads: int = _opt(0, "CPU threads (0 = all cores)", ge=0)
    n_gpu_layers: int = _opt(0, "layers to offload to a GPU (CUDA/Vulkan builds); -1 = all",
                             ge=-1)
    flash_attn: Literal["auto", "on", "off"] = _opt("auto", "flash attention")
    use_mmap: bool = _opt(True, "memory-map the model file", addon=False)
    models: list[ModelSpec] = _opt(
        [], "several models, each with the classes it serves (JSON list on the command line); "
        "empty = the one model above")
    memory_budget_mb: int = _opt(
        0, "most MB the resident models may take (weights + KV, read from their GGUF headers); "
        "past it the least recently used idle model is unloaded (0 = four fifths of RAM)", ge=0)
    interactive_grace_s: float = _opt(
        60.0, "a model that served voice or chat within this long is not unloaded to load "
        "another for a lower class", ge=0)
    arbitrate: bool = _opt(
        True, "while one model has voice or chat work, the other models' engines pause between "
        "iterations (they share one accelerator); off when each model has its own GPU")
    load_wait_s: float = _opt(120.0, "how long a request waits for its model to load before "
                              "503", gt=0)
    worker_watchdog_s: float = _opt(
        120.0, "a model's worker process that answers no call for this long (one decode or "
        "embedding batch) is killed and restarted", addon=False, gt=0)

    # Scheduling
    policy: Literal["hearth", "fifo", "serial"] = _opt(
        "hearth", "scheduling policy: hearth (classes, aging, fairness, preemption), fifo "
        "(arrival order, same batching) or serial (one sequence at a time)")
    latency_target_ms: float = _opt(
        60.0, "target duration of one engine iteration: bounds how long a newly arrived voice "
        "request waits behind running work (at least two single decodes of the model served, "
        "as measured: /v1/queue cost_model.latency_target_ms)", gt=0)
    relax_prefill_bound: bool = _opt(
        False, "let prefill use the whole batch while no interactive request runs or waits "
        "(more background throughput; a voice arrival then cuts the running decode)")
    prefix_cache: bool = _opt(True, "keep finished sequences' KV as reusable prefixes")
    prefix_cache_entries: int = _opt(8, "most cached prefixes kept", ge=0, le=64)
    prefix_cache_kept_share: float = _opt(
        0.5, "share of n_ctx in which the prompts voice and chat use stay cached against "
        "background and embedding work; it grows to hold the voice prompts, up "
        "to 0.75 (0: nothing kept)", ge=0, le=1)
    prefix_store_mb: int = _opt(
        512, "most MB of voice and chat prefixes saved to data_dir, restored at start "
        "(0 = none saved)", ge=0)
    aging_seconds_agent: float = _opt(30.0, "an agent request rises one class per this wait", gt=0)
    aging_seconds_background: float = _opt(20.0, "a background request rises one class per this "
                                           "wait (never above chat)", gt=0)
    aging_seconds_embedding: float = _opt(30.0, "an embedding request rises one class per this "
                                          "wait", gt=0)
    cap_background: float = _opt(0.5, "most share of running sequences background work may hold "
                                 "while higher classes wait", ge=0, le=1)
    cap_embedding: float = _opt(0.25, "most share of running sequences embedding work may hold "
                                "while higher classes wait", ge=0, le=1)
    fair_slots: bool = _opt(
        True, "while another household member waits, one member holds at most its fair share "
        "of the running sequences: its newest sequence of the same class makes room")
    max_queue: int = _opt(64, "most waiting requests per class before 429", ge=1)
    deadlines: str = _opt(
        "", "per class, the longest expected wait for a first token, in seconds, e.g. "
        "'voice=8, chat=60' (or a JSON object): a request expected to wait longer gets 429 at "
        "once, with Retry-After; jobs are never refused, they queue (empty = no deadlines)")
    reservation_s: float = _opt(
        5.0, "how long a wake word's reservation holds the voice model for the turn to come "
        "(at most 15 s): lower classes start no prompt chunk meanwhile", gt=0, le=15)
    voice_per_member: int = _opt(
        2, "most voice requests one member has waiting or running, jobs included; more of "
        "its voice requests run as chat", ge=1)
    max_tokens_default: int = _opt(512, "max_tokens when a request names none", ge=1)
    constrain_tool_calls: bool = _opt(
        True, "under tool_choice auto, a tool call the model opens must match its tool's schema "
        "(never forces a call)")
    jump_forward_calls: bool = _opt(
        True, "in a held tool call, text its schemas fix (the rest of a unique name, the "
        "punctuation) is written for the model, not sampled")

    # Jobs
    job_retention_hours: float = _opt(24.0, "how long finished jobs are kept", gt=0)
    job_queue_max: int = _opt(500, "most jobs queued or running; more are refused with 429",
                              ge=1)
    job_request_max_kb: int = _opt(1024, "most kB of one job's request; larger jobs are "
                                   "refused with 413", ge=1)
    job_store_max_mb: int = _opt(256, "most MB the job store keeps (requests, results, "
                                 "events); new jobs are refused with 429 until finished ones "
                                 "expire", ge=1)

    # Logging
    verbose: bool = _opt(False, "show llama.cpp's native log", addon=False)
    log_level: Literal["debug", "info", "warning", "error"] = _opt("info", "log level")

    @field_validator("deadlines", mode="before")
    @classmethod
    def _deadlines_text(cls, v: Any) -> Any:
        if isinstance(v, dict):  # a JSON object (the command line, a test): kept as text
            v = ", ".join(f"{k}={s}" for k, s in v.items())
        if isinstance(v, str):
            parse_deadlines(v)  # raises ValueError naming what is wrong
        return v

    def deadline_seconds(self) -> dict[str, float]:
        return parse_deadlines(self.deadlines)

    @field_validator("n_ubatch")
    @classmethod
    def _ubatch_le_batch(cls, v: int, info: Any) -> int:
        n_batch = info.data.get("n_batch")
        if n_batch is not None and v > n_batch:
            raise ValueError("n_ubatch must not exceed n_batch")
        return v

    @model_validator(mode="after")
    def _batch_holds_every_decode(self) -> Settings:
        # Every running sequence decodes one token per iteration: a batch smaller than the
        # sequences that may run cannot be built.
        if self.n_batch < self.n_parallel:
            raise ValueError(f"n_batch ({self.n_batch}) must be at least n_parallel "
                             f"({self.n_parallel}): each running sequence needs a batch slot")
        return self

    @model_validator(mode="after")
    def _models_are_distinct(self) -> Settings:
        if self.models and self.model:
            raise ValueError("set either model or models, not both (name the file of each "
                             "model in models)")
        seen: dict[str, str] = {}
        claimed: dict[str, str] = {}
        for m in self.models:
            for n in (m.name, *m.aliases):
                if n in seen or n in ("hearth", "default"):
                    raise ValueError(f"models: the name {n!r} is used twice")
                seen[n] = m.name
            if m.url and m.file:
                raise ValueError(f"models: {m.name!r} has both a file and a url")
            if m.url and not m.url.startswith(("http://", "https://")):
                raise ValueError(f"models: {m.name!r}: url must start with http:// or https://")
            if m.api_key and "@" in m.url.split("/")[2]:  # both would be the Authorization
                raise ValueError(f"models: {m.name!r}: give either a user and password in the "
                                 "url or an api_key, not both")
            for c in m.classes:
                if c in claimed:
                    raise ValueError(f"models: class {c!r} is claimed by both "
                                     f"{claimed[c]!r} and {m.name!r}")
                claimed[c] = m.name
        names = {m.name: m for m in self.models}
        for m in self.models:
            seen_chain = [m.name]
            nxt = m.fallback
            while nxt:
                if nxt not in names:
                    raise ValueError(f"models: {m.name!r} falls back to {nxt!r}, which is not "
                                     "a model here")
                if nxt in seen_chain:
                    raise ValueError(f"models: fallbacks go round: {' -> '.join(seen_chain)}")
                seen_chain.append(nxt)
                nxt = names[nxt].fallback
        return self

    def aging_seconds(self) -> dict[str, float]:
        return {
            "agent": self.aging_seconds_agent,
            "background": self.aging_seconds_background,
            "embedding": self.aging_seconds_embedding,
        }

    def caps(self) -> dict[str, float]:
        return {"background": self.cap_background, "embedding": self.cap_embedding}

    @classmethod
    def addon_fields(cls) -> dict[str, Any]:
        return {
            name: f for name, f in cls.model_fields.items()
            if (f.json_schema_extra or {}).get("addon")
        }


def parse_deadlines(text: str) -> dict[str, float]:
    """``'voice=8, chat=60'`` or ``'{"voice": 8}'`` -> seconds by class (0 dropped)."""
    text = text.strip()
    if not text:
        return {}
    if text.startswith("{"):
        try:
            pairs = list(json.loads(text).items())
        except (ValueError, AttributeError) as e:
            raise ValueError(f"deadlines: not a JSON object: {e}") from e
    else:
        pairs = [tuple(p.split("=", 1)) if "=" in p else (p, "")
                 for p in (x.strip() for x in text.split(",")) if p]
    out: dict[str, float] = {}
    for name, value in pairs:
        name = str(name).strip().lower()
        if name not in CLASS_NAMES:
            raise ValueError(f"deadlines: unknown class {name!r}; one of {', '.join(CLASS_NAMES)}")
        try:
            seconds = float(value)
        except (TypeError, ValueError) as e:
            raise ValueError(f"deadlines: {name}: {value!r} is not a number of seconds") from e
        if not 0 <= seconds < 1e6:
            raise ValueError(f"deadlines: {name}: {seconds} is not 0 or more seconds")
        if seconds:
            out[name] = seconds
    return out


def _cli_name(field: str) -> str:
    return "--" + field.replace("_", "-")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add one flag per setting; defaults are None so unset flags do not override lower layers."""
    for name, f in Settings.model_fields.items():
        if f.annotation is bool:
            parser.add_argument(_cli_name(name), dest=name, default=None,
                                action=argparse.BooleanOptionalAction, help=f.description)
        else:
            parser.add_argument(_cli_name(name), dest=name, default=None, help=f.description)
    parser.add_argument("--options-file", default=None,
                        help="JSON options file (the add-on's /data/options.json)")


def _from_env(environ: dict[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in Settings.model_fields:
        key = ENV_PREFIX + name.upper()
        if key in environ:
            out[name] = environ[key]
    return out


def load(args: argparse.Namespace | None = None,
         environ: dict[str, str] | None = None) -> Settings:
    """Merge the layers. Raises SystemExit with a readable message on invalid values."""
    environ = dict(os.environ if environ is None else environ)
    layers: dict[str, Any] = {}
    options_file = getattr(args, "options_file", None) or environ.get(ENV_PREFIX + "OPTIONS_FILE")
    path = Path(options_file) if options_file else ADDON_OPTIONS
    if path.is_file():
        try:
            opts = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            raise SystemExit(f"hearth: cannot read options file {path}: {e}") from e
        layers.update({k: v for k, v in opts.items() if k in Settings.model_fields})
    layers.update(_from_env(environ))
    if args is not None:
        layers.update({
            k: v for k, v in vars(args).items() if k in Settings.model_fields and v is not None
        })
    try:
        return Settings.model_validate(_coerce(layers))
    except ValidationError as e:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in e.errors()
        )
        raise SystemExit(f"hearth: invalid settings: {problems}") from e


def _coerce(values: dict[str, Any]) -> dict[str, Any]:
    """Strings from flags and the environment become the field's type (pydantic is strict-ish
    about bool strings like 'yes')."""
    out = {}
    for k, v in values.items():
        if isinstance(v, str) and get_origin(Settings.model_fields[k].annotation) is list:
            try:
                v = json.loads(v) if v.strip() else []
            except ValueError as e:
                raise SystemExit(f"hearth: {k} must be a JSON list: {e}") from e
        if isinstance(v, str) and Settings.model_fields[k].annotation is bool:
            low = v.strip().lower()
            if low in ("1", "true", "yes", "on"):
                v = True
            elif low in ("0", "false", "no", "off", ""):
                v = False
        out[k] = v
    return out
