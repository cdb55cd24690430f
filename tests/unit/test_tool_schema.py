"""The schema a tool call is held to: lists of enum values are bounded by the enum's size, and
nothing else of a tool's parameters changes."""

from __future__ import annotations

import copy

from hearth.chat.tool_grammars import BOUNDED_ENUM_VALUES, tool_call_schema


def _tool(params: dict) -> dict:
    return {"type": "function", "function": {"name": "f", "parameters": params}}


def _args(params: dict) -> dict:
    return tool_call_schema([_tool(params)])["properties"]["arguments"]


def test_a_list_of_enum_values_holds_at_most_each_value_once_in_count():
    domain = {"type": "array", "items": {"type": "string", "enum": ["light", "sensor", "light"]}}
    params = {"type": "object", "properties": {
        "domain": domain, "name": {"type": "string"},
        "either": {"anyOf": [{"type": "string"}, {"type": "array", "items": {"enum": [1, 2, 3]}}]}}}
    before = copy.deepcopy(params)
    props = _args(params)["properties"]
    assert props["domain"]["maxItems"] == 2  # two distinct values
    assert props["either"]["anyOf"][1]["maxItems"] == 3
    assert props["name"] == {"type": "string"}
    assert params == before  # the request's own tools are not changed


def test_a_list_keeps_its_own_bound_and_one_that_asks_for_more_items_is_left_alone():
    props = _args({"type": "object", "properties": {
        "a": {"type": "array", "items": {"enum": ["x", "y"]}, "maxItems": 5},
        "b": {"type": "array", "items": {"enum": ["x"]}, "minItems": 2},
        "c": {"type": "array", "items": {"type": "string"}},
        "d": {"type": "array", "items": {"enum": [str(i) for i in range(BOUNDED_ENUM_VALUES + 1)]}},
    }})["properties"]
    assert props["a"]["maxItems"] == 5
    assert not {"b", "c", "d"} & {k for k, v in props.items() if "maxItems" in v}  # d: too deep
