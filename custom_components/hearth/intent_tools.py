"""Assist's intent tools as a small model should see and call them: their arguments held to
the home's exposed names, domains, device classes and floors; a call naming a device in an
area it is not in, or naming no target while the request named one, repaired (the
guidance after the system prompt is in :mod:`.call_hint`). Measured with
``make bench-commands MODEL=qwen1.5b`` (README, issue 30)."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from homeassistant.core import HomeAssistant
from homeassistant.helpers import floor_registry as fr
from homeassistant.helpers import llm

from .compat import exposed_kinds, exposed_names, listed
from .const import LOGGER


def _intent(tool: llm.Tool) -> llm.IntentTool | None:
    """The intent tool ``tool`` is (a namespaced tool wraps the original), or None."""
    base = getattr(tool, "tool", tool)
    return base if isinstance(base, llm.IntentTool) else None


def tool_kind(tool: llm.Tool) -> str:
    """What ``tool`` is, casefolded: an intent tool's intent type (an intent tool of 2026.2
    keeps only that, slugified, as its name), another tool's own name (later releases prefix
    it with its API's: ``homeassistant__GetLiveContext``)."""
    base = getattr(tool, "tool", tool)
    return str(getattr(base, "intent_type", base.name)).casefold()


def offered_tool(llm_api: llm.APIInstance, base_name: str) -> str | None:
    """The name under which ``llm_api`` offers the tool named ``base_name`` (its intent, or
    its name with or without its API's prefix: :func:`tool_kind`)."""
    want = base_name.casefold()
    for tool in llm_api.tools:
        kind = tool_kind(tool)
        if kind == want or kind.endswith(f"__{want}"):
            return str(tool.name)
    return None


def _names_entities(tool: llm.Tool) -> bool:
    """Whether ``tool`` is an intent tool whose ``name`` argument names an entity (a timer
    intent's ``name`` is the timer's own)."""
    base = _intent(tool)
    return base is not None and "Timer" not in base.name


def intent_tools(llm_api: llm.APIInstance | None) -> set[str]:
    """The names under which ``llm_api`` offers Assist's intent tools (none without an API)."""
    if llm_api is None:
        return set()
    return {tool.name for tool in llm_api.tools if _intent(tool)}


def floor_names(hass: HomeAssistant) -> list[str]:
    """The home's floors by name and alias: what an intent's ``floor`` can match."""
    names: dict[str, None] = {}
    for floor in fr.async_get(hass).async_list_floors():
        names[floor.name] = None
        names.update(dict.fromkeys(floor.aliases))
    return list(names)


def intent_argument_values(
    llm_api: llm.APIInstance,
    formatted: list[dict[str, Any]],
    exposed: dict[str, dict[str, Any]],
) -> dict[str, dict[str, list[str]]]:
    """For each intent tool, the values its ``name`` and ``area`` arguments may take: the
    exposed entity and area names. The server holds a call the model opens to them, so a small
    model cannot name a light that does not exist (it may still answer without a call)."""
    names, areas = exposed_names(exposed)
    values: dict[str, dict[str, list[str]]] = {}
    for tool, described in zip(llm_api.tools, formatted, strict=True):
        if not _names_entities(tool):
            continue
        keys = described["function"]["parameters"].get("properties") or {}
        narrow = {arg: v for arg, v in (("name", names), ("area", areas)) if arg in keys and v}
        if narrow:
            values[tool.name] = narrow
    return values


def _only(prop: Any, allowed: list[str]) -> dict[str, Any] | None:
    """``prop`` (a string or an array of strings) taking only ``allowed`` values, of those it
    lists itself; None when none is left."""
    if not isinstance(prop, dict):
        return None
    items = prop.get("items") if prop.get("type") == "array" else None
    values = items if isinstance(items, dict) else prop
    listed = values.get("enum")
    keep = [v for v in (listed if isinstance(listed, list) else allowed) if v in allowed]
    if not keep:
        return None
    if values is prop:
        return {**prop, "enum": keep}
    return {**prop, "items": {**values, "enum": keep}}


# Colour modes beyond on/off and brightness; Home Assistant converts between a colour and a
# colour temperature for a light that has either, so one such light keeps both arguments.
_PLAIN_MODES = frozenset({"onoff", "brightness"})
_COLOUR_ARGS = ("color", "temperature")


def exposed_lights_colour(hass: HomeAssistant, exposed: dict[str, dict[str, Any]]) -> bool:
    """Whether an exposed light has a colour or a colour temperature to set."""
    for entity_id in exposed:
        if entity_id.startswith("light.") and (state := hass.states.get(entity_id)):
            modes = state.attributes.get("supported_color_modes") or ()
            if set(modes) - _PLAIN_MODES:
                return True
    return False


def narrow_intent_kinds(
    hass: HomeAssistant,
    llm_api: llm.APIInstance,
    formatted: list[dict[str, Any]],
    exposed: dict[str, dict[str, Any]],
) -> None:
    """Intent tools' ``domain`` and ``device_class`` arguments keep to the exposed entities'
    (in place): a call naming others matches nothing, and a small model offered every
    device class lists them all (the 1.5B wrote 30 into "turn on the kitchen light", which
    then matched nothing). ``floor`` keeps to the home's floors (the 1.5B wrote "Floor" into
    a home without any). An argument with no value left goes. ``color`` and ``temperature``
    go from ``HassLightSet`` where no exposed light has a colour: the 0.5B set both with the
    brightness, and Home Assistant refused the whole call (two colour descriptors)."""
    domains, classes = exposed_kinds(hass, exposed)
    floors = floor_names(hass)
    colour = exposed_lights_colour(hass, exposed)
    for tool, described in zip(llm_api.tools, formatted, strict=True):
        if _intent(tool) is None:
            continue
        params = described["function"]["parameters"]
        props = params.get("properties") or {}
        kind = tool_kind(tool)
        if kind == "hasslightset" and not colour:
            for arg in _COLOUR_ARGS:
                if arg not in params.get("required", ()):
                    props.pop(arg, None)
        for arg, allowed in (("domain", domains), ("device_class", classes), ("floor", floors)):
            if arg not in props:
                continue
            if (narrowed := _only(props[arg], allowed)) is not None:
                props[arg] = narrowed
            elif arg not in params.get("required", ()):
                del props[arg]


def shared_argument_sets(
    values: dict[str, dict[str, list[str]]],
) -> tuple[dict[str, dict[str, Any]], dict[str, list[str]]]:
    """The same values with each list many tools share sent once: ``"$names"`` in the tools'
    values and the list in ``tool_argument_sets`` (a server that lists the feature)."""
    sets: dict[str, list[str]] = {}
    shared: dict[str, dict[str, Any]] = {}
    for tool, args in values.items():
        shared[tool] = {}
        for arg, allowed in args.items():
            key = f"{arg}s"
            same = sets.setdefault(key, allowed) is allowed  # one exposed-names list per turn
            shared[tool][arg] = f"${key}" if same else allowed
    return shared, sets


def area_repair(
    llm_api: llm.APIInstance | None, exposed: dict[str, dict[str, Any]]
) -> Callable[[str, dict[str, Any]], dict[str, Any]]:
    """A repair for the model's intent calls: a call naming an exposed device together with an
    area that device is not in loses the area. Home Assistant would match nothing ("no
    entities in the area"); small models add a wrong area to a right name (the 1.5B turned
    "set the porch light to 80%" into the porch light in the Living Room). A name that
    exists in that area keeps it: two devices may share a name in different areas."""
    tools = intent_tools(llm_api)
    areas_of: dict[str, set[str]] = {}
    for info in exposed.values():
        areas = {area.casefold() for area in listed(info, "areas")}
        for name in listed(info, "names"):
            areas_of.setdefault(name.casefold(), set()).update(areas)

    def repair(tool_name: str, args: dict[str, Any]) -> dict[str, Any]:
        name, area = args.get("name"), args.get("area")
        if tool_name not in tools or not isinstance(name, str) or not isinstance(area, str):
            return args
        known = areas_of.get(name.casefold())
        if known is None or area.casefold() in known:
            return args
        LOGGER.debug("%s: %r is not in area %r; the area is dropped", tool_name, name, area)
        return {key: value for key, value in args.items() if key != "area"}

    return repair


_TARGETS = ("name", "area", "floor")


def named_target(text: str, exposed: dict[str, dict[str, Any]]) -> dict[str, str]:
    """The one exposed device, else the one area, that the request ``text`` names in so many
    words (any case): ``{"name": …}`` or ``{"area": …}``; nothing where it names none, or
    several (each wants its own call)."""
    names, areas = exposed_names(exposed)
    if len(devices := _said(text, names)) == 1:
        return {"name": next(iter(devices.values()))}
    if not devices and len(places := _said(text, areas)) == 1:
        return {"area": next(iter(places.values()))}
    return {}


def _said(text: str, words: list[str]) -> dict[str, str]:
    """Those of ``words`` that ``text`` says as words (any case), by their casefolded form."""
    folded = text.casefold()
    return {w.casefold(): w for w in words
            if re.search(rf"(?<!\w){re.escape(w.casefold())}(?!\w)", folded)}


def _accepted_arguments(tools: list[dict[str, Any]]) -> dict[str, set[str]]:
    """The arguments each formatted tool takes, by the tool's name."""
    return {t["function"]["name"]: set(t["function"]["parameters"].get("properties") or ())
            for t in tools}


def _scope_repair(
    llm_api: llm.APIInstance | None,
    accepts: dict[str, set[str]],
    exposed: dict[str, dict[str, Any]],
    text: str,
) -> Callable[[str, dict[str, Any]], dict[str, Any]]:
    """A repair for the model's intent calls: a call with no target at all (only a domain, or
    nothing) while the request named one exposed device or one area is held to it. Told to
    pass only the domain for "all the lights", the 1.5B passed only the domain for "light up
    the porch" and "turn on the lights in the kitchen" too, and every light went on. A
    request naming no device or area ("turn everything off") keeps the call as it is."""
    target = named_target(text, exposed)
    intents = {t.name for t in llm_api.tools if _names_entities(t)} if llm_api else set()

    def repair(tool_name: str, args: dict[str, Any]) -> dict[str, Any]:
        if (not target or tool_name not in intents or any(args.get(k) for k in _TARGETS)
                or not set(target) <= accepts.get(tool_name, set())):
            return args
        LOGGER.debug("%s names no target; the request named %s", tool_name, target)
        return {**args, **target}

    return repair


# A brightness a request states in digits: "20%", "20 percent", "20 per cent".
_PERCENT = re.compile(r"(?<![\w.,])(\d{1,3})\s*(?:%|per\s?cent\b)", re.IGNORECASE)

Call = tuple[str, dict[str, Any]]  # a tool's name and its arguments


def stated_percent(text: str) -> int | None:
    """The one percentage (0-100) the request ``text`` states in digits; None where it states
    none, several, or one past 100."""
    found = {int(value) for value in _PERCENT.findall(text)}
    if len(found) != 1:
        return None
    value = found.pop()
    return value if value <= 100 else None


def _brightness_repair(
    llm_api: llm.APIInstance | None,
    accepts: dict[str, set[str]],
    exposed: dict[str, dict[str, Any]],
    text: str,
) -> Callable[[list[Call]], list[Call]]:
    """A repair for a round of the model's calls: the request states one percentage and the
    round is a single on/off call of lights, which can set no brightness: it becomes
    ``HassLightSet`` on the same target with that brightness. Shown a brightness call among
    its examples, the 1.5B still turned "dim the living room lamp to 20 percent" off or on
    (20 of its 24 failed brightness cases in 27 benchmark runs; README). Left as they
    are: two calls, a target that may not be a light, a request naming a device that is not
    one (the percentage may be its), and a call turning off what the request said "off" to
    ("turn off the lamp, it is at 20%")."""
    level = stated_percent(text)
    if llm_api is None or level is None or not (
            light_set := offered_tool(llm_api, "HassLightSet")):
        return lambda calls: calls
    switches = {tool.name: tool_kind(tool) for tool in llm_api.tools
                if tool_kind(tool) in ("hassturnon", "hassturnoff")}
    takes = accepts.get(light_set, set())
    lights = {name.casefold() for entity_id, info in exposed.items()
              if entity_id.startswith("light.") for name in listed(info, "names")}
    others = set(_said(text, exposed_names(exposed)[0])) - lights
    said_off = re.search(r"\boff\b", text, re.IGNORECASE) is not None

    def of_lights(args: dict[str, Any]) -> bool:
        domain, name = args.get("domain"), args.get("name")
        domains = [domain] if isinstance(domain, str) else domain
        if name:
            return isinstance(name, str) and name.casefold() in lights
        return domains == ["light"]

    def repair(calls: list[Call]) -> list[Call]:
        if len(calls) != 1 or calls[0][0] not in switches or others:
            return calls
        tool_name, args = calls[0]
        if not of_lights(args) or (said_off and switches[tool_name] == "hassturnoff"):
            return calls
        kept = {key: value for key, value in args.items() if key in takes and key != "domain"}
        LOGGER.info("The model called %s for a request stating %s%%: %s with that brightness"
                    " instead", tool_name, level, light_set)
        return [(light_set, {**kept, "brightness": level})]

    return repair


def call_repair(
    llm_api: llm.APIInstance | None,
    tools: list[dict[str, Any]],
    exposed: dict[str, dict[str, Any]],
    text: str,
) -> Callable[[list[Call]], list[Call]]:
    """The repairs of a round of the model's intent calls, for a turn asking ``text``: in
    each call a wrong area dropped (:func:`area_repair`) and a missing target added
    (:func:`_scope_repair`); then an on/off call for a stated brightness made a brightness
    call (:func:`_brightness_repair`)."""
    accepts = _accepted_arguments(tools)
    area = area_repair(llm_api, exposed)
    scope = _scope_repair(llm_api, accepts, exposed, text)
    level = _brightness_repair(llm_api, accepts, exposed, text)
    return lambda calls: level([(name, scope(name, area(name, args))) for name, args in calls])
