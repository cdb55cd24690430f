"""Jump-forward in tool calls (hearth.chat.call_forcing): what the forcer writes is always what the
call would have held, and through the engine the output stays token for token the model's
while fewer steps sample."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st
from sim_backend import Collector, Scripted, make_core, run_until

from hearth.chat.call_forcing import CallForcer
from hearth.shared.requests import Request

PROPS = {"name": {"type": "string", "enum": ["Kitchen light", "Kitchen lamp", "Porch light"]},
         "area": {"type": "string", "enum": ["Kitchen", "Porch"]},
         "domain": {"type": "array", "items": {"type": "string", "enum": ["light", "switch"]}},
         "brightness": {"type": "integer"}}
TOOLS = [{"type": "function", "function": {"name": n, "parameters": {
    "type": "object", "properties": PROPS}}} for n in ("HassTurnOn", "HassTurnOff")] + [
    {"type": "function", "function": {"name": "GetLiveContext", "parameters": {
        "type": "object", "properties": {}}}}]


def forced_after(*chunks: str) -> str:
    f = CallForcer(TOOLS)
    out = ""
    for chunk in chunks:
        out = f.feed(chunk)
    return out


def test_what_a_call_leaves_no_choice_in_is_written():
    assert forced_after('{"name"') == ': "'
    assert forced_after('{"name":') == ' "'
    assert forced_after('{"na') == ""  # not yet a call's opening: any object starts so
    # not the start two names share: cut inside the model's tokens, it chose wrongly after
    assert forced_after('<tool_call>\n{"name": "HassTurn') == ""
    assert forced_after('{"name": "HassTurnOf') == 'f", "arguments":'  # the brace is its own
    assert forced_after('{"name": "G') == 'etLiveContext", "arguments":'
    assert forced_after('{"name": "HassTurnOff", "arguments": {"') == ""
    assert forced_after('{"name": "HassTurnOff", "arguments":') == ""  # ' {"' or ' {}': its own
    assert CallForcer([{"type": "function", "function": {"name": "T", "parameters": {
        "properties": {"x": {"type": "string"}}, "required": ["x"]}}}]).feed(
        '{"name": "') == 'T", "arguments": {"'  # an argument is required: it opens one
    args = '{"name": "HassTurnOn", "arguments": {"'
    assert forced_after(args + "do") == 'main": ["'
    assert forced_after(args + 'name": "Kitchen l') == "", "two names start so"
    assert forced_after(args + 'name": "Kitchen li') == "ght"  # its quote is the model's
    assert forced_after(args + 'domain": ["sw') == "itch"
    assert forced_after(args + "bri") == 'ghtness":'  # a number: its space is the model's
    assert forced_after(args + 'name": "Porch light", "') == ""  # area, domain, brightness


def test_nothing_is_written_outside_an_open_call():
    assert forced_after("Sure, the kitchen light is on.") == ""
    assert forced_after('{"name": "HassTurnOn", "arguments": {}}', ' and {"x') == ""
    assert forced_after('{"name": "Nope') == ""  # no tool starts so: the grammar decides
    # a second call after a closed one is followed again
    assert forced_after('{"name": "HassTurnOn", "arguments": {}}\n', '{"name": "HassTurnOf') \
        == 'f", "arguments":'
    # an argument called "name" is not a call's opening
    assert forced_after('{"name": "HassTurnOn", "arguments": {"name') == '": "'


NAMES = st.text("abcXY_", min_size=1, max_size=8)


@st.composite
def calls(draw):
    """Tools with made-up names and enums, and one call of them in the compact spacing small
    models write."""
    names = draw(st.lists(NAMES, min_size=1, max_size=5, unique=True))
    keys = draw(st.lists(NAMES, min_size=0, max_size=4, unique=True))
    words = st.text("ab c", min_size=1, max_size=6)
    props = {}
    for k in keys:
        kind = draw(st.sampled_from(["enum", "array", "int", "free"]))
        enum = draw(st.lists(words, min_size=1, max_size=4, unique=True))
        props[k] = {"enum": {"type": "string", "enum": enum},
                    "array": {"type": "array", "items": {"type": "string", "enum": enum}},
                    "int": {"type": "integer"}, "free": {"type": "string"}}[kind]
    required = bool(keys) and draw(st.booleans())
    tools = [{"type": "function", "function": {"name": n, "parameters": {
        "type": "object", "properties": props, **({"required": keys[:1]} if required else {})}}}
        for n in names]
    used = [k for k in keys if draw(st.booleans())] or (keys[:1] if required else [])
    args = {}
    for k in used:
        p = props[k]
        if "enum" in p:
            args[k] = draw(st.sampled_from(p["enum"]))
        elif p.get("type") == "array":
            args[k] = draw(st.lists(st.sampled_from(p["items"]["enum"]), min_size=1,
                                    max_size=2))
        elif p.get("type") == "integer":
            args[k] = draw(st.integers(0, 100))
        else:
            args[k] = draw(words)
    call = {"name": draw(st.sampled_from(names)), "arguments": args}
    return tools, json.dumps(call)


@settings(max_examples=300, deadline=None)
@given(calls(), st.data())
def test_the_forced_text_is_always_what_the_call_held(case, data):
    """Fed a call in random pieces, whatever the forcer writes is the call's own next text:
    the model loses no choice it had (the grammar then checks it again, token by token)."""
    tools, text = case
    f = CallForcer(tools)
    pos = 0
    while pos < len(text):
        n = data.draw(st.integers(1, 6))
        chunk = text[pos: pos + n]
        forced = f.feed(chunk)
        pos += len(chunk)
        assert text.startswith(forced, pos), (text, pos, forced)
        f.note(forced)
        pos += len(forced)


# Through the engine: a scripted model writes a call piece by piece; the forced pieces are
# taken from the script as the worker's sampler takes them from llama.cpp's tokenizer.
CALL = ['{"', "name", '":', ' "', "Hass", "Turn", "On", '",', ' "', "arguments", '":', ' {"',
        "name", '":', ' "', "Porch", " light", '"}}']


def run(pieces: list[str], forcer: CallForcer | None, max_tokens: int = 64):
    b = Scripted(pieces)
    core, _ = make_core(backend=b)
    sink = Collector(b)
    r = Request(prompt=[1, 2, 3], rank=1, sink=sink, max_tokens=max_tokens, forcer=forcer)
    core.submit(r)
    run_until(core, lambda: sink.done is not None)
    text = "".join(e.text for e in sink.events if e.kind == "token")
    return text, sink, core.stats, b


def test_a_forced_call_is_the_models_own_in_fewer_steps():
    plain_text, plain, plain_stats, _ = run(CALL, None)
    text, sink, stats, b = run(CALL, CallForcer(TOOLS))
    assert text == plain_text == "".join(CALL)
    assert sink.tokens == plain.tokens  # the same tokens, in the same order
    assert b.forced and len(b.forced) < len(CALL)
    # each forced span rides along with the step that samples the token after it
    assert stats.iterations <= plain_stats.iterations - len(b.forced) // 2
    assert sink.done.finish_reason == plain.done.finish_reason == "stop"
    assert sink.done.usage["completion_tokens"] == plain.done.usage["completion_tokens"]
    assert stats.forced_tokens == len(b.forced) and plain_stats.forced_tokens == 0


def test_forced_tokens_count_against_max_tokens():
    text, sink, _, b = run(CALL, CallForcer(TOOLS), max_tokens=6)
    assert sink.done.finish_reason == "length"
    assert len(sink.tokens) == 6 and text == "".join(CALL[:6])
    assert b.forced  # some of the six were forced
