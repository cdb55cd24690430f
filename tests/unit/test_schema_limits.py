"""The bounds on schemas and tool argument values (issue 26: a 200-byte schema with a count of
20,000 crashed llama.cpp's grammar parser): whatever is within them converts; whatever has a
count past them anywhere is refused, naming the value."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schema_strategies import schemas

from hearth.api.ollama_convert import renamed
from hearth.chat import schema_limits as sl
from hearth.chat.api_models import ChatCompletionRequest
from hearth.chat.completions import CompletionError, check_limits
from hearth.chat.schema_limits import SchemaTooLarge, check_grammar_size, check_schema
from hearth.chat.tool_grammars import json_schema_grammar
from hearth.jobs.runner import validate_job_request

FIELD = "response_format.json_schema.schema"
KILLERS = {  # ~50 bytes each; each took the server down
    "maxLength": {"type": "string", "maxLength": 20000},
    "maxItems": {"type": "array", "items": {"type": "integer"}, "maxItems": 20000},
    "pattern": {"type": "string", "pattern": "^a{20000}$"},
}
PROBE = settings(max_examples=60, deadline=None,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])



def dict_paths(node, path=()):
    """Every dict in ``node`` with its path."""
    if isinstance(node, dict):
        yield path, node
        for key, value in node.items():
            yield from dict_paths(value, (*path, key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from dict_paths(value, (*path, i))


def dotted(path):
    return ".".join([FIELD, *map(str, path)])


@PROBE
@given(schemas)
def test_within_the_limits_passes_and_converts(schema):
    check_schema(schema, FIELD)
    check_grammar_size(json_schema_grammar(schema), FIELD)


@PROBE
@given(schemas, st.data())
def test_a_count_past_the_limit_anywhere_is_refused_there(schema, data):
    check_schema(schema, FIELD)
    schema = json.loads(json.dumps(schema))  # as a request has it: no dict shared
    path, node = data.draw(st.sampled_from(list(dict_paths(schema))))
    keyword = data.draw(st.sampled_from([*sl.COUNT_KEYWORDS, "pattern"]))
    big = data.draw(st.integers(sl.MAX_COUNT + 1, 10**12))
    node[keyword] = f"^x{{1,{big}}}$" if keyword == "pattern" else big
    with pytest.raises(SchemaTooLarge) as e:
        check_schema(schema, FIELD)
    assert e.value.field == dotted((*path, keyword))
    assert str(e.value).startswith(e.value.field + ": ")


@PROBE
@given(schemas, st.integers(sl.MAX_ENUM_VALUES + 1, 3000), st.data())
def test_a_long_enum_anywhere_is_refused_there(schema, n, data):
    schema = json.loads(json.dumps(schema))
    path, node = data.draw(st.sampled_from(list(dict_paths(schema))))
    node["enum"] = list(range(n))
    with pytest.raises(SchemaTooLarge) as e:
        check_schema(schema, FIELD)
    assert e.value.field == dotted((*path, "enum"))


@PROBE
@given(schemas)
def test_nesting_past_the_limit_is_refused(schema):
    for _ in range(sl.MAX_DEPTH // 2):
        schema = {"type": "object", "properties": {"a": schema}}
    with pytest.raises(SchemaTooLarge, match="levels deep"):
        check_schema(schema, FIELD)


# -- the killers and other hand cases ------------------------------------------------------
@pytest.mark.parametrize("keyword", sorted(KILLERS))
def test_the_200_byte_killers_are_refused_by_name(keyword):
    schema = {"type": "object", "properties": {"name": KILLERS[keyword]}}
    assert len(json.dumps(schema)) < 200
    with pytest.raises(SchemaTooLarge) as e:
        check_schema(schema, FIELD)
    assert e.value.field == f"{FIELD}.properties.name.{keyword}"
    assert "1,000" in str(e.value)


@pytest.mark.parametrize("schema", [
    {"type": "string", "maxLength": sl.MAX_COUNT},
    {"type": "array", "items": {"type": "integer"}, "maxItems": sl.MAX_COUNT},
    {"type": "string", "pattern": f"^a{{0,{sl.MAX_COUNT}}}$"},
])
def test_a_count_at_the_limit_converts(schema):
    check_schema(schema, FIELD)
    gbnf = json_schema_grammar(schema)
    check_grammar_size(gbnf, FIELD)
    assert sl.grammar_nesting(gbnf) >= sl.MAX_COUNT - 1  # what the limit is about


@pytest.mark.parametrize("value", [math.inf, math.nan, 1e300, 2**80, 1000.5])
def test_odd_numbers_past_the_limit_are_refused(value):
    with pytest.raises(SchemaTooLarge):
        check_schema({"type": "string", "maxLength": value}, FIELD)


@pytest.mark.parametrize(("pattern", "counts", "nesting"), [
    ("^a{20000}$", [20000], 0),
    (r"^\{20000}[{20000}]x{1,2}$", [1, 2], 0),  # escaped, and inside a class: literal text
    ("^((a|b){3,})$", [3], 2),
    ("^x{ 1_000 , ２０ }$", [1000, 20], 0),  # as int() reads them, which the converter uses
])
def test_pattern_counts_are_read_as_the_converter_reads_them(pattern, counts, nesting):
    assert sl.scan_pattern(pattern) == (counts, nesting)


def test_counts_under_any_key_are_checked_since_a_ref_can_point_anywhere():
    schema = {"type": "object", "properties": {
        "a": {"$ref": "#/properties/b/default"},
        "b": {"type": "object", "default": KILLERS["maxLength"]}}}
    with pytest.raises(SchemaTooLarge) as e:
        check_schema(schema, FIELD)
    assert e.value.field == f"{FIELD}.properties.b.default.maxLength"
    # A property that happens to be called maxLength is a schema, not a count.
    check_schema({"type": "object", "properties": {"maxLength": {"type": "integer"}}}, FIELD)


def test_allof_references_that_expand_exponentially_are_refused():
    """The converter expands an allOf's $ref again at every use: 16 levels of two uses each
    are 2 KiB of schema and 18 MiB of grammar."""
    defs = {f"D{i}": {"type": "object", "properties": {
        key: {"allOf": [{"$ref": f"#/$defs/D{i + 1}"}]} for key in "ab"}} for i in range(16)}
    defs["D16"] = {"type": "integer"}
    schema = {"$defs": defs, "allOf": [{"$ref": "#/$defs/D0"}]}
    assert len(json.dumps(schema)) < 3000
    with pytest.raises(SchemaTooLarge, match="KiB") as e:
        check_schema(schema, FIELD)
    assert e.value.field == FIELD


def test_size_and_properties_are_bounded():
    many = {f"p{i}": {"type": "integer"} for i in range(sl.MAX_PROPERTIES + 1)}
    with pytest.raises(SchemaTooLarge) as e:
        check_schema({"type": "object", "properties": many}, FIELD)
    assert e.value.field == f"{FIELD}.properties"
    with pytest.raises(SchemaTooLarge, match="characters as JSON"):
        check_schema({"description": "x" * sl.MAX_SCHEMA_BYTES}, FIELD)


def test_grammar_size_and_nesting():
    assert sl.grammar_nesting('root ::= ("(" [()] (a)?)* # ((((\nb ::= "\\"("') == 2
    deep = "root ::= " + "(" * 2000 + '"a"' + ")" * 2000
    with pytest.raises(SchemaTooLarge, match="nests 2,000") as e:
        check_grammar_size(deep, "tools")
    assert e.value.field == "tools"
    with pytest.raises(SchemaTooLarge, match="characters"):
        check_grammar_size('root ::= "' + "a" * sl.MAX_GRAMMAR_BYTES + '"', FIELD)


# -- tools and tool_argument_values, as a request carries them -----------------------------
def chat(**fields):
    return {"messages": [{"role": "user", "content": "hi"}], **fields}


def tool(name="HassTurnOn", props=None):
    return {"type": "function", "function": {"name": name, "parameters": {
        "type": "object", "properties": props or {"name": {"type": "string"}}}}}


def refused(body) -> CompletionError:
    with pytest.raises(CompletionError) as e:
        check_limits(ChatCompletionRequest.model_validate(body))
    assert e.value.status == 400 and e.value.message.startswith(e.value.param + ": ")
    return e.value


@pytest.mark.parametrize("choice", ["auto", "required", "none"])
def test_every_tools_parameters_are_checked_whatever_the_choice(choice):
    body = chat(tools=[tool("ok"), tool("bad", {"x": KILLERS["pattern"]})], tool_choice=choice)
    e = refused(body)
    assert (e.param, e.code) == ("tools.1.function.parameters.properties.x.pattern",
                                 "invalid_tools")


@pytest.mark.parametrize(("values", "param"), [
    ({"HassTurnOn": {"name": ["x"] * (sl.MAX_ENUM_VALUES + 1)}}, "HassTurnOn.name"),
    ({"HassTurnOn": {"name": ["ok", "x" * (sl.MAX_VALUE_CHARS + 1)]}}, "HassTurnOn.name.1"),
    ({"HassTurnOn": {f"a{i}": ["x"] for i in range(sl.MAX_ARGUMENTS + 1)}}, "HassTurnOn"),
    ({f"T{i}": {"name": ["x"]} for i in range(sl.MAX_TOOLS + 1)}, ""),
])
def test_tool_argument_values_are_bounded(values, param):
    e = refused(chat(tools=[tool()], tool_argument_values=values))
    assert e.param == ".".join(filter(None, ["tool_argument_values", param]))
    assert e.code == "invalid_value"


def test_argument_values_count_once_per_tool_they_narrow():
    """Values for a name that many tools share are copied into each of them."""
    names = [f"Light number {i:04}" for i in range(sl.MAX_ENUM_VALUES)]
    values = {"HassTurnOn": {"name": names}}
    check_limits(ChatCompletionRequest.model_validate(
        chat(tools=[tool()], tool_argument_values=values)))
    e = refused(chat(tools=[tool()] * 60, tool_argument_values=values))
    assert e.param == "tool_argument_values"


def test_tools_are_bounded_together():
    e = refused(chat(tools=[tool(f"t{i}") for i in range(sl.MAX_TOOLS + 1)]))
    assert e.param == "tools"
    big = {f"p{i}": {"type": "string", "description": "d" * 200} for i in range(200)}
    e = refused(chat(tools=[tool(f"t{i}", big) for i in range(8)]))
    assert e.param == "tools" and "characters as JSON" in e.message


def test_ollama_and_jobs_name_the_field_as_their_clients_sent_it():
    body = chat(response_format={"type": "json_schema",
                                 "json_schema": {"name": "x", "schema": KILLERS["maxItems"]}})
    e = refused(body)
    assert e.param == f"{FIELD}.maxItems" and e.code == "invalid_response_format"
    assert renamed(e).param == "format.maxItems" and e.message.startswith("format.maxItems: ")
    with pytest.raises(CompletionError) as job:
        validate_job_request("chat", body)
    assert job.value.status == 400 and job.value.param == f"request.{FIELD}.maxItems"
    assert job.value.message.startswith(job.value.param + ": ")


def test_argument_sets_are_sent_once_and_shared_by_reference():
    """tool_argument_values may name a list of tool_argument_sets ("$names"); every tool that
    names it gets that list, and a name that is no set is refused."""
    import pytest
    from pydantic import ValidationError

    from hearth.chat.api_models import ChatCompletionRequest

    names = [f"Light {i}" for i in range(300)]
    body = ChatCompletionRequest.model_validate({
        "messages": [{"role": "user", "content": "hi"}],
        "tool_argument_sets": {"names": names},
        "tool_argument_values": {t: {"name": "$names", "area": ["Kitchen"]}
                                 for t in ("HassTurnOn", "HassTurnOff")}})
    values = body.tool_argument_values
    assert values["HassTurnOn"]["name"] == names and values["HassTurnOn"]["area"] == ["Kitchen"]
    assert values["HassTurnOn"]["name"] is values["HassTurnOff"]["name"]
    with pytest.raises(ValidationError, match="names no list"):
        ChatCompletionRequest.model_validate({
            "messages": [{"role": "user", "content": "hi"}],
            "tool_argument_values": {"HassTurnOn": {"name": "$missing"}}})
