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
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError, field_validator, model_validator

CLASS_NAMES = ("voice", "chat", "agent", "background", "embedding")
ENV_PREFIX = "HEARTH_"
ADDON_OPTIONS = Path("/data/options.json")


def _opt(default: Any, help: str, addon: bool = True, **kw: Any) -> Any:
    return Field(default, description=help, json_schema_extra={"addon": addon}, **kw)


class Settings(BaseModel):
    """Every knob of the server. Field descriptions double as CLI help."""

    model_config = {"extra": "forbid", "validate_assignment": True}

    # Network
    host: str = _opt("127.0.0.1", "address to bind (the add-on binds its container interface)",
                     addon=False)
    port: int = _opt(8080, "TCP port", addon=False, ge=1, le=65535)
    api_key: str = _opt("", "require 'Authorization: Bearer <key>' on every endpoint but /health")

    # Model
    model: str = _opt("", "GGUF: a path, a file name under models_dir, or an https:// URL; "
                      "empty = the embedded SmolLM2-135M-Instruct")
    models_dir: str = _opt("models", "folder for model files (downloads land here)", addon=False)
    data_dir: str = _opt("data", "folder for the job store and other state", addon=False)
    embedding_model: str = _opt("", "GGUF for /v1/embeddings; empty = the chat model's weights")
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

    # Scheduling
    policy: Literal["hearth", "fifo", "serial"] = _opt(
        "hearth", "scheduling policy: hearth (classes, aging, fairness, preemption), fifo "
        "(arrival order, same batching) or serial (one sequence at a time)")
    latency_target_ms: float = _opt(
        60.0, "target duration of one engine iteration: bounds how long a newly arrived voice "
        "request waits behind running work", gt=0)
    relax_prefill_bound: bool = _opt(
        False, "let prefill use the whole batch while no interactive request runs or waits "
        "(more background throughput; a voice arrival then cuts the running decode)")
    prefix_cache: bool = _opt(True, "keep finished sequences' KV as reusable prefixes")
    prefix_cache_entries: int = _opt(8, "most cached prefixes kept", ge=0, le=64)
    prefix_cache_kept_share: float = _opt(
        0.5, "share of n_ctx in which the prompts voice and chat use stay cached against "
        "background and embedding work", ge=0, le=1)
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
    max_tokens_default: int = _opt(512, "max_tokens when a request names none", ge=1)
    constrain_tool_calls: bool = _opt(
        True, "under tool_choice auto, a tool call the model opens must match its tool's schema "
        "(never forces a call)")

    # Jobs
    job_retention_hours: float = _opt(24.0, "how long finished jobs are kept", gt=0)

    # Logging
    verbose: bool = _opt(False, "show llama.cpp's native log", addon=False)
    log_level: Literal["debug", "info", "warning", "error"] = _opt("info", "log level")

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
        if isinstance(v, str) and Settings.model_fields[k].annotation is bool:
            low = v.strip().lower()
            if low in ("1", "true", "yes", "on"):
                v = True
            elif low in ("0", "false", "no", "off", ""):
                v = False
        out[k] = v
    return out
