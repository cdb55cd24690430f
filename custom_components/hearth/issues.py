"""Repair issues: a sub-entry set to a model the server no longer lists; a model whose worker
serves one CPU rung down (llama.cpp crashed on the best one), with what that costs."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from homeassistant.core import HomeAssistant, callback
from homeassistant.helpers import issue_registry as ir

from .const import CONF_MODEL, DOMAIN, LOGGER, MODEL_CLASS_DEFAULT

if TYPE_CHECKING:
    from . import HearthConfigEntry


def _prefix(entry_id: str) -> str:
    return f"model_missing_{entry_id}_"


def _step_prefix(entry_id: str) -> str:
    return f"cpu_step_down_{entry_id}_"


def served_names(queue: dict[str, Any]) -> set[str] | None:
    """The names a request may give as its model: each model the server lists and its
    aliases. None when the server does not list its models (nothing can be said then)."""
    models = queue.get("models")
    if not isinstance(models, dict):
        return None
    names = set(models)
    for info in models.values():
        if isinstance(info, dict):
            names.update(info.get("aliases") or ())
    return names


@callback
def async_check_models(
    hass: HomeAssistant, entry: HearthConfigEntry, url: str, queue: dict[str, Any]
) -> None:
    """Raise a repair issue for each sub-entry whose model the server no longer lists (every
    turn of that agent or task fails until another model is picked); withdraw it once the
    model is back or the sub-entry changed."""
    served = served_names(queue)
    if served is None:
        return
    registry = ir.async_get(hass)
    missing: dict[str, tuple[str, str]] = {}
    for subentry in entry.subentries.values():
        model = subentry.data.get(CONF_MODEL)
        if model and model != MODEL_CLASS_DEFAULT and model not in served:
            missing[_prefix(entry.entry_id) + subentry.subentry_id] = (model, subentry.title)
    for issue_id, (model, title) in missing.items():
        if registry.async_get_issue(DOMAIN, issue_id) is None:
            LOGGER.warning(
                "%s is set to model %s, which the Hearth server at %s no longer serves",
                title, model, url,
            )
        ir.async_create_issue(
            hass,
            DOMAIN,
            issue_id,
            is_fixable=False,
            severity=ir.IssueSeverity.ERROR,
            translation_key="model_missing",
            translation_placeholders={"model": model, "name": title, "server": entry.title},
        )
    async_clear_issues(hass, entry.entry_id, keep=missing.keys(), prefix=_prefix)


def step_downs(queue: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each local model whose worker serves below the top of its CPU ladder: its step-down
    (rung left, rung served, why, cost), as the server reports it."""
    models = queue.get("models")
    if not isinstance(models, dict):
        return {}
    found = {}
    for name, info in models.items():
        worker = info.get("worker") if isinstance(info, dict) else None
        step = worker.get("step_down") if isinstance(worker, dict) else None
        if isinstance(step, dict) and step.get("to"):
            found[name] = step
    return found


@callback
def async_check_step_downs(
    hass: HomeAssistant, entry: HearthConfigEntry, queue: dict[str, Any]
) -> None:
    """A warning for each model served one CPU rung down: the model works, slower or not,
    and the household should know why and what it costs; withdrawn once it serves on the
    top rung again (a new llama.cpp build, another machine)."""
    steps = step_downs(queue)
    ids = {_step_prefix(entry.entry_id) + name: step for name, step in steps.items()}
    for issue_id, step in ids.items():
        model = issue_id.removeprefix(_step_prefix(entry.entry_id))
        ir.async_create_issue(
            hass,
            DOMAIN,
            issue_id,
            is_fixable=False,
            severity=ir.IssueSeverity.WARNING,
            translation_key="cpu_step_down",
            translation_placeholders={
                "model": model, "server": entry.title,
                "best": str(step.get("from", "")), "rung": str(step["to"]),
                "why": str(step.get("why", "")), "cost": str(step.get("cost", "")),
            },
        )
    async_clear_issues(hass, entry.entry_id, keep=ids.keys(), prefix=_step_prefix)


@callback
def async_clear_issues(
    hass: HomeAssistant, entry_id: str, keep: Any = frozenset(), prefix: Any = None
) -> None:
    """Withdraw the entry's issues (of one kind, when ``prefix`` names it) but those in
    ``keep``."""
    prefixes = tuple(p(entry_id) for p in ([prefix] if prefix else [_prefix, _step_prefix]))
    stale = [
        issue_id
        for domain, issue_id in list(ir.async_get(hass).issues)
        if domain == DOMAIN and issue_id.startswith(prefixes) and issue_id not in keep
    ]
    for issue_id in stale:
        ir.async_delete_issue(hass, DOMAIN, issue_id)
