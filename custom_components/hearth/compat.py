"""Bridges between the Home Assistant releases Hearth supports (2026.2 to the newest).

Each bridge prefers what the newest release offers and falls back to the older spelling, so the
rest of the integration is written once against one shape.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from homeassistant.components.conversation import DOMAIN as CONVERSATION_DOMAIN
from homeassistant.core import Context, HomeAssistant
from homeassistant.helpers import device_registry as dr
from homeassistant.helpers import entity_registry as er
from homeassistant.helpers import llm

from .const import DOMAIN

# Home Assistant >= 2026.9 validates with probatio (voluptuous's API, typed) and no longer ships
# voluptuous_openapi; the integration's schemas are built with whichever the release uses, as
# ``vol`` (``from .compat import vol``).
try:
    import probatio as vol
    from probatio import to_openapi as _to_openapi

    _OPENAPI_ARGS: dict[str, Any] = {"openapi_version": "3.1.0"}
except ImportError:  # pragma: no cover - exercised on the oldest release's test run
    import voluptuous as vol  # type: ignore[no-redef,unused-ignore]
    from voluptuous_openapi import (  # type: ignore[import-not-found,no-redef,unused-ignore]
        convert as _to_openapi,
    )

    _OPENAPI_ARGS = {}

__all__ = ["vol"]


def schema_to_openapi(
    schema: Any, custom_serializer: Callable[[Any], Any] | None = None
) -> dict[str, Any]:
    """Describe a Home Assistant schema (tool parameters, an AI Task structure) as OpenAPI.

    OpenAPI 3.1 where the converter offers it: optional values become ``"type": [..., "null"]``,
    which is also what JSON-schema grammars on the server understand.
    """
    return _to_openapi(schema, custom_serializer=custom_serializer, **_OPENAPI_ARGS)


def tool_result_data(content: Any) -> Any:
    """What a tool answered, as its tool made it (an intent's keeps ``.original``).

    Current releases hand an ``llm.ToolResult`` in ``ToolResultContent.result``; older ones a
    plain JSON object in ``tool_result`` (deprecated since).
    """
    result: Any = getattr(content, "result", None)
    return result.data if hasattr(result, "data") else content.tool_result


def tool_result_message(content: Any) -> dict[str, Any]:
    """What a tool answered, as the model should read it: ``{"data": ..., "error": ...}``."""
    result: Any = getattr(content, "result", None)
    return {"data": tool_result_data(content), "error": bool(getattr(result, "error", False))}


def tool_error_delta(call: llm.ToolInput, data: dict[str, Any]) -> Any:
    """A chat-log delta that answers an external ``call`` with the error ``data``: an
    ``llm.ToolResult`` in ``result`` where the release has one, else the plain ``tool_result``
    (a ``ToolResultContentDeltaDict`` of either kind, so typed loosely)."""
    delta: dict[str, Any] = {
        "role": "tool_result", "tool_call_id": call.id, "tool_name": call.tool_name}
    result_type: Any = getattr(llm, "ToolResult", None)
    if result_type is None:
        delta["tool_result"] = data
    else:
        delta["result"] = result_type(data=data, error=True)
    return delta


# A device's parent is named by its registry id (`via_device_id`) since 2026.10; before, by its
# identifier (`via_device`, deprecated since). Device info is a TypedDict, a dataclass in 2026.11.
# The checker sees one release's kind, so both are handled through Any.
_DEVICE_INFO: Any = dr.DeviceInfo


def _accepts_via_device_id() -> bool:
    if dataclasses.is_dataclass(_DEVICE_INFO):
        return any(field.name == "via_device_id" for field in dataclasses.fields(_DEVICE_INFO))
    return "via_device_id" in getattr(_DEVICE_INFO, "__annotations__", {})


_VIA_DEVICE_ID = _accepts_via_device_id()


def with_parent(
    info: dr.DeviceInfo, parent_id: str, parent_identifier: tuple[str, str]
) -> dr.DeviceInfo:
    """``info`` hung off its parent device, named as the release names a parent."""
    link: dict[str, Any] = (
        {"via_device_id": parent_id} if _VIA_DEVICE_ID else {"via_device": parent_identifier}
    )
    made: Any = info
    linked: dr.DeviceInfo = (
        dataclasses.replace(made, **link)
        if dataclasses.is_dataclass(_DEVICE_INFO)
        else _DEVICE_INFO(**made, **link)
    )
    return linked


def exposed_entities(hass: HomeAssistant, assistant: str) -> dict[str, dict[str, Any]]:
    """What the Assist API puts in the prompt for ``assistant``, by entity id (read once a
    turn: :func:`exposed_names` and :func:`exposed_kinds` take it)."""
    try:  # Home Assistant >= 2026.3: the Assist API lives in the homeassistant component
        from homeassistant.components.homeassistant.llm import async_get_exposed_entities

        return dict(async_get_exposed_entities(hass, assistant, include_state=False))
    except ImportError:  # pragma: no cover - exercised on the oldest release's test run
        from homeassistant.helpers.llm import (  # type: ignore[attr-defined,unused-ignore]
            _get_exposed_entities,
        )

        found = _get_exposed_entities(hass, assistant, include_state=False)
        return dict(found.get("entities", {}))


def listed(info: dict[str, Any], field: str) -> list[str]:
    """The names an exposed entity's ``field`` (``names``, ``areas``) holds: both releases
    join them with ", " for the prompt."""
    return [name for name in info.get(field, "").split(", ") if name]


def exposed_names(exposed: dict[str, dict[str, Any]]) -> tuple[list[str], list[str]]:
    """The entity names (with aliases) and area names (with aliases) of the ``exposed``
    entities, as the prompt lists them: what a tool call may name."""
    names: dict[str, None] = {}
    areas: dict[str, None] = {}
    for info in exposed.values():
        names.update(dict.fromkeys(listed(info, "names")))
        areas.update(dict.fromkeys(listed(info, "areas")))
    return list(names), list(areas)


def exposed_kinds(
    hass: HomeAssistant, exposed: dict[str, dict[str, Any]]
) -> tuple[list[str], list[str]]:
    """The domains and device classes of the ``exposed`` entities: an intent naming others
    matches nothing."""
    registry = er.async_get(hass)
    domains: dict[str, None] = {}
    classes: dict[str, None] = {}
    for entity_id in exposed:
        domains[entity_id.partition(".")[0]] = None
        entry = registry.async_get(entity_id)
        state = hass.states.get(entity_id)
        for device_class in (entry.device_class if entry else None,
                             state.attributes.get("device_class") if state else None):
            if isinstance(device_class, str):
                classes[device_class] = None
    return list(domains), list(classes)


# The agent handling a request is part of the LLM context since 2026.11.
_LLM_CONTEXT_FIELDS = frozenset(field.name for field in dataclasses.fields(llm.LLMContext))


def agent_llm_context(
    hass: HomeAssistant,
    agent_id: str | None,
    device_id: str | None = None,
    user_id: str | None = None,
) -> llm.LLMContext:
    """The LLM context of a turn for the agent ``agent_id`` from ``device_id`` (a satellite)
    or none, naming no user (a voice turn) or ``user_id``: what a warm-up renders the prompt
    with."""
    fields: dict[str, Any] = {
        "platform": DOMAIN,
        "context": Context(user_id=user_id),
        "language": hass.config.language,
        "assistant": CONVERSATION_DOMAIN,
        "device_id": device_id,
    }
    if "agent_id" in _LLM_CONTEXT_FIELDS:
        fields["agent_id"] = agent_id
    return llm.LLMContext(**fields)


def apis_require_admin(hass: HomeAssistant, api_ids: Any) -> bool:
    """Whether one of the LLM APIs ``api_ids`` serves administrators only (2026.11's Home
    Assistant API): its prompt cannot be built for nobody."""
    wanted = {api_ids} if isinstance(api_ids, str) else set(api_ids or ())
    return any(
        getattr(api, "requires_admin", False)
        for api in llm.async_get_apis(hass)
        if api.id in wanted
    )
