"""Model names and class aliases.

Clients that cannot add a field to a request (Home Assistant's Ollama and OpenAI integrations,
Open WebUI) can still pick a model, so the class travels in the model's name: every model is
also listed as ``<name>:voice``, ``:chat``, ``:agent`` and ``:background``, and a request to an
alias runs in that class. A plain name (or ``<name>:latest``, as Ollama spells it) leaves the
class to the request's field, header or the endpoint's default.
"""

from __future__ import annotations

from typing import Any

from .http import ApiError

ALIAS_CLASSES = ("voice", "chat", "agent", "background")
# Names every Hearth server answers to, whatever its model file is called.
GENERIC = ("hearth", "default")


def base_names(rt: Any) -> tuple[str, ...]:
    return (rt.model_id.lower(), *GENERIC)


def resolve(rt: Any, name: str | None, *, ollama: bool = False) -> str | None:
    """The class an alias names (None for a plain name); 404 for a model not served here."""
    if not name:
        return None
    base, _, tag = name.strip().lower().partition(":")
    if base in base_names(rt) and (tag in ("", "latest") or tag in ALIAS_CLASSES):
        return tag if tag in ALIAS_CLASSES else None
    if ollama:  # Ollama's own words, which its clients and users know
        raise ApiError(404, f"model '{name}' not found", "model_not_found", "model")
    listed = ", ".join(listed_names(rt))
    raise ApiError(404, f"model {name!r} does not exist; this server serves {listed}",
                   "model_not_found", "model")


def listed_names(rt: Any) -> list[str]:
    """The model, then one alias per class."""
    return [rt.model_id, *(f"{rt.model_id}:{c}" for c in ALIAS_CLASSES)]
