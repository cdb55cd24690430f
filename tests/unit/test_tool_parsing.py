"""Tool-call parsing on whatever a model writes: the same calls streamed as parsed whole, fenced
calls only when they name a tool, and time linear in the output (model output is whatever a
prompt made it write)."""

from __future__ import annotations

import json
import time

from hypothesis import given, settings
from hypothesis import strategies as st

from hearth.chat.tools import ToolStream, parse_tool_calls

NAMES = {"HassTurnOn", "HassTurnOff"}
CALL = {"name": "HassTurnOn", "arguments": {"name": "Kitchen light"}}


def _norm(text: str) -> str:
    return " ".join(text.split())


def _calls(calls: list[dict]) -> list[tuple[str, dict]]:
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls]


def test_a_fenced_call_naming_a_tool_is_a_call_and_text_before_it_stays():
    text = f"Sure, turning it on.\n```json\n{json.dumps(CALL)}\n```"
    content, calls = parse_tool_calls(text, NAMES)
    assert content == "Sure, turning it on."
    assert _calls(calls) == [("HassTurnOn", {"name": "Kitchen light"})]


def test_a_fence_that_names_no_tool_stays_the_answer():
    for body in ('{"name": "rm_rf", "arguments": {}}', '{"temperature": 21}', "print(1)"):
        text = f"Here:\n```json\n{body}\n```"
        assert parse_tool_calls(text, NAMES) == (text, [])
    # Without tool names to match, a fence is never a call.
    text = f"```json\n{json.dumps(CALL)}\n```"
    assert parse_tool_calls(text, None) == (text, [])


def test_a_call_in_doubled_braces_is_a_call_as_qwen_writes_it():
    """Qwen2.5's template shows ``{{"name": …}}`` and its small models copy it: closed with one
    brace too many, as written, or one short, where the lazy grammar ended the call; and the
    tool named under "function" instead of "name"."""
    inner = json.dumps(CALL)
    for text in ("{" + inner + "}", "{" + inner, " {" + inner + "}}\n"):
        assert _calls(parse_tool_calls(text, NAMES)[1]) == [("HassTurnOn",
                                                             {"name": "Kitchen light"})], text
    # A call then the tool's answer made up (Qwen2.5-Coder 0.5B and 1.5B): the call counts.
    text = json.dumps({"name": "HassTurnOn", "arguments": json.dumps({"name": "Porch"})}) \
        + '\n<tool_response>\n{"success": true}\n</tool_response>'
    assert _calls(parse_tool_calls(text, NAMES)[1]) == [("HassTurnOn", {"name": "Porch"})]
    aliased = {"function": "HassTurnOff", "arguments": {}}
    assert _calls(parse_tool_calls(json.dumps(aliased), NAMES)[1]) == [("HassTurnOff", {})]
    # Not calls: a doubled-brace object naming no tool, text after it, a "function" naming
    # something else, and JSON with a "function" key when no tools were sent.
    for text in ('{{"name": "rm_rf", "arguments": {}}}', "{" + inner + "} and more",
                 '{"function": "rm_rf", "arguments": {}}'):
        assert parse_tool_calls(text, NAMES) == (text, []), text
    text = json.dumps(aliased)
    assert parse_tool_calls(text, None) == (text, [])


def test_a_call_in_tools_tags_or_after_its_name_is_a_call():
    """The 1.5B wrapped calls in the ``<tools>`` tag its template lists the tools in (text
    before it stays), or wrote the tool's name and then its arguments (JSON, or keywords as
    a Python call, never evaluated); either counts only when it names one of the request's
    tools."""
    text = f"To turn it on:\n<tools>\n{json.dumps(CALL, indent=2)}\n</tools>"
    content, calls = parse_tool_calls(text, NAMES)
    assert content == "To turn it on:"
    assert _calls(calls) == [("HassTurnOn", {"name": "Kitchen light"})]
    assert _calls(parse_tool_calls("<tools>" + json.dumps(CALL), NAMES)[1])  # unclosed
    named = 'HassTurnOff{"name": "Porch light", "domain": ["light"]}'
    assert _calls(parse_tool_calls(named, NAMES)[1]) == [
        ("HassTurnOff", {"name": "Porch light", "domain": ["light"]})]
    for pythonic in ('HassTurnOff(name="Porch light", domain=["light"])',
                     'HassTurnOff{name="Porch light", domain=["light"]}'):
        assert _calls(parse_tool_calls(pythonic, NAMES)[1]) == [
            ("HassTurnOff", {"name": "Porch light", "domain": ["light"]})], pythonic
    for text in ('<tools>{"name": "rm_rf", "arguments": {}}</tools>',
                 'HassTurnOff(name=os.system("x"))', 'HassTurnOff("Porch light")',
                 'HassTurnOff(name="a") and more', 'HassTurnOff{name: "a"}',
                 f"<tools>{json.dumps(CALL)}</tools> and then more",
                 '<tools>{"type": "function"}</tools>', "HassTurnOff the light",
                 'HassTurnOff{"name": "a"} {"name": "b"}', 'rm_rf{"path": "/"}'):
        assert parse_tool_calls(text, NAMES) == (text, []), text
    assert parse_tool_calls(named, None) == (named, [])


def test_a_call_on_its_own_line_after_prose_is_a_call():
    """The 1.5B, asked to "turn it on then", explained which tool it would use and then wrote
    the call on a line of its own (also in doubled braces): the call counts and the prose
    stays content. The same JSON inline, naming no tool, or without tools sent is not a
    call."""
    prose = "I'll use the `HassTurnOn` tool to turn the light on."
    text = f"{prose}\n\n\n{json.dumps(CALL)}"
    content, calls = parse_tool_calls(text, NAMES)
    assert content == prose
    assert _calls(calls) == [("HassTurnOn", {"name": "Kitchen light"})]
    made_up = text + '\n<tool_response>\n{"success": true}\n</tool_response>'
    assert _calls(parse_tool_calls(made_up, NAMES)[1]) == _calls(calls)
    for free in (f"{prose} {json.dumps(CALL)}", f'{prose}\n{{"name": "Paris", "age": 3}}',
                 f"{prose}\n{json.dumps(CALL)} and more"):
        assert parse_tool_calls(free, NAMES) == (free, []), free
    assert parse_tool_calls(text, None) == (text, [])
    # doubled, as Qwen2.5's template shows a call (the 1.5B's follow-up wrote it so)
    doubled = f"{prose}\n{{{json.dumps(CALL)}}}"
    content, again = parse_tool_calls(doubled, NAMES)
    assert content == prose and _calls(again) == _calls(calls)
    odd = f'{prose}\n{{{{"name": "Paris", "age": 3}}}}'
    assert parse_tool_calls(odd, NAMES) == (odd, [])
    stream = ToolStream(NAMES)
    shown = "".join(stream.feed(c) for c in (prose[:9], prose[9:], "\n\n", "\n{", '"name"',
                                             json.dumps(CALL)[7:]))
    rest, streamed = stream.finish()
    assert shown.strip() == prose and rest.strip() == ""
    assert _calls(streamed) == _calls(calls)


FRAGMENTS = st.sampled_from([
    "<tool_call>", "</tool_call>", "```", "```json\n", json.dumps(CALL),
    json.dumps({"name": "HassTurnOff", "arguments": {}}), "{", "}", " ", "\n", "  \t",
    "Okay.", "the light", "<tool", "``", "<|python_tag|>", ";", "{{", "}}", "<tools>",
    "</tools>", "HassTurn", "HassTurnOn", '{"name": "Porch"}', "Sure.\n", "\n{",
])


@settings(max_examples=300, deadline=None)
@given(st.lists(FRAGMENTS, max_size=12), st.data())
def test_streamed_in_any_chunks_the_calls_and_text_are_those_parsed_whole(parts, data):
    text = "".join(parts)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(text)), max_size=8)))
    chunks = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
    stream = ToolStream(NAMES)
    shown = "".join(stream.feed(c) for c in chunks)
    rest, calls = stream.finish()
    whole_content, whole_calls = parse_tool_calls(text, NAMES)
    assert _calls(calls) == _calls(whole_calls)
    assert _norm(shown + rest) == _norm(whole_content)


def _seconds(fn, n: int) -> float:
    best = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        fn(n)
        best = min(best, time.perf_counter() - t)
    return best


def _parse(n: int) -> None:
    parse_tool_calls("<tool_call>" + " " * n, NAMES)
    parse_tool_calls("<tool_call>" + " " * n + "x" * n, NAMES)
    parse_tool_calls("```json\n" + "{" * n, NAMES)


def _stream(n: int) -> None:
    s = ToolStream(NAMES)
    for _ in range(n):
        s.feed(" ")
    s.feed("<tool_call>")
    for _ in range(n):
        s.feed(" ")
    s.finish()


def test_parsing_time_grows_linearly_with_adversarial_output():
    """8x the input takes about 8x the time (quadratic: 64x); the bound leaves a wide margin.
    The old regex took 1.5 s on 8,000 spaces and 34 s on 32,000."""
    for fn in (_parse, _stream):
        small, big = _seconds(fn, 32_000), _seconds(fn, 256_000)
        assert big < max(small, 1e-3) * 24, (fn.__name__, small, big)


def test_the_lazy_trigger_matches_only_openings_its_grammar_accepts():
    """Matched text is replayed into the grammar (a refusal aborts inside llama.cpp): the
    fence's JSON whitespace must be the grammar's ``space`` (one space, or a newline and up to
    20 spaces or tabs); anything else stays free rather than triggering."""
    import re

    from hearth.chat.tool_grammars import LAZY_CALL_TRIGGER, lazy_call_grammar, lazy_call_trigger

    trigger = re.compile(LAZY_CALL_TRIGGER)
    assert trigger.groups == 0  # a group would move where the replay starts
    for held in ('```json\n{"name"', '```json\n{\n  "name"', '```json\n\n{ "name"',
                 '<tools>\n{\n  "name"', 'Use: <tools>{"name"',
                 "<tool_call>", 'Sure. ```json\n{\n\t"name"', '{{"name"', '\n {{ "name"',
                 'Sure.\n{{"name"', 'I will.\n\n{{ "name"'):
        assert trigger.search(held), held
    for free in ('```json\n{  "name"', '```json\n{\n\n"name"', '```JSON\n{"name"',
                 '```json\n{"city"', '```\n{"name"', '{"name"',
                 '```json\n{\n' + ' ' * 21 + '"name"', 'Sure: {{"name"', '{{\n"name"'):
        assert not trigger.search(free), free
    # bare JSON is held only when it opens naming one of the request's tools
    named = re.compile(lazy_call_trigger({"HassTurnOn", "light__HassLightSet", "odd.name"}))
    assert named.groups == 0
    for held in ('{"name": "HassTurnOn"', ' \n{"name":"light__HassLightSet"',
                 '{\n  "name": "HassTurnOn"', "<tool_call>", 'Sure.\n{"name": "HassTurnOn"',
                 'I will.\n\n{\n  "name": "HassTurnOn"'):
        assert named.search(held), held
    for free in ('{"name": "Paris"', '{"name": "HassTurnOnX"', 'Sure: {"name": "HassTurnOn"',
                 '{"name": "odd.name"', '{"city": "HassTurnOn"', 'Sure.\n  {"name": "HassTurnOn"',
                 'Sure.\n{"name": "Paris"'):
        assert not named.search(free), free
    assert lazy_call_trigger(set()) == LAZY_CALL_TRIGGER
    grammar = lazy_call_grammar('root ::= "{" space "\\"name\\"" space\nspace ::= " "?')
    assert "bare ::= [ \\t\\n]* fenced-root" in grammar
    assert 'tagged ::= "<tools>" [ \\t\\n]* fenced-root [ \\t\\n]* "</tools>"' in grammar
    assert 'space ::= | " " | "\\n" [ \\t]{0,20}' in grammar
    assert 'fenced ::= "```json" [ \\t\\n]* fenced-root [ \\t\\n]* "```"' in grammar
    assert 'doubled ::= [ \\t\\n]* "{" body "}"?' in grammar and "\nbody ::=" in grammar
    # Hermes calls keep the converter's compact JSON (indenting spends a short reply's tokens)
    assert '\nspace ::= " "?' in grammar and "\nfenced-space ::= " in grammar


def test_a_tool_named_with_another_prefix_is_the_one_offered_that_fits():
    """Home Assistant prefixes tools with their API's name; the 1.5B, shown
    ``intent__HassTurnOff``, wrote ``intent__HassLightSet`` for ``light__HassLightSet``. A name
    whose last part fits one offered tool is that tool; one fitting none or several is not a
    call."""
    names = {"intent__HassTurnOn", "light__HassLightSet", "a__Same", "b__Same"}
    args = {"name": "Porch light", "brightness": 50}
    for written in ("intent__HassLightSet", "HassLightSet", "light__HassLightSet"):
        text = json.dumps({"name": written, "arguments": args})
        assert _calls(parse_tool_calls(text, names)[1]) == [("light__HassLightSet", args)]
        line = f"To dim it:\n{text}"
        assert _calls(parse_tool_calls(line, names)[1]) == [("light__HassLightSet", args)]
    for written in ("c__Same", "Same", "HassLightSetX", "intent__", "Paris"):
        text = json.dumps({"name": written, "arguments": args})
        assert parse_tool_calls(text, names) == (text, []), written
