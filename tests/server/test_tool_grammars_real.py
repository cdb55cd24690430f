"""Tool-call grammars on the real llama.cpp sampler with SmolLM2-135M: the lazy grammar holds a
call once the model opens one (Hermes tag or fenced JSON) and nothing else. A grammar that
refuses a replayed token aborts inside llama.cpp, so each opening is also replayed whole."""

from __future__ import annotations

import json

import pytest
from llama_in_process import open_model
from real_model import greedy as _greedy

from hearth.chat.tool_grammars import (
    LAZY_CALL_TRIGGER,
    json_schema_grammar,
    lazy_call_grammar,
    lazy_call_trigger,
    tool_call_schema,
    with_argument_values,
    wrap_grammar,
)
from hearth.chat.tools import parse_tool_calls
from hearth.llama.llama_sampling import Sampler
from hearth.shared.requests import SamplingParams

# One intent tool whose name argument may be only an exposed light's.
TOOLS = with_argument_values([{"type": "function", "function": {
    "name": "HassTurnOn", "parameters": {"type": "object", "properties": {
        "name": {"type": "string"}}, "required": ["name"]}}}],
    {"HassTurnOn": {"name": ["Kitchen light", "Porch light"]}})
CALL_JSON = json_schema_grammar(tool_call_schema(TOOLS))

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def model():
    m = open_model()
    yield m
    m.close()


def samplers(model, grammar: str, trigger: str = LAZY_CALL_TRIGGER):
    """Greedy samplers without a grammar and with ``grammar`` held from the lazy ``trigger``."""
    def free(ctx):
        s = Sampler(model, SamplingParams(temperature=0))
        return lambda row: s.sample(ctx, row)

    def lazy(ctx):
        s = Sampler(model, SamplingParams(temperature=0, grammar=grammar,
                                          grammar_trigger=trigger))
        return lambda row: s.sample(ctx, row)

    return free, lazy


def test_a_lazy_call_grammar_holds_a_call_once_opened_and_nothing_else(model):
    """Under tool_choice "auto" the call grammar waits for ``<tool_call>``: an answer without a
    call comes out token for token as without a grammar, and a call the model opens names
    only an allowed entity, where the model left alone copies an unknown one."""
    grammar = wrap_grammar(CALL_JSON, "<tool_call>", "</tool_call>", repeat=True)
    free, lazy = samplers(model, grammar)

    question = "Question: What is the capital of France?\nAnswer:"
    answer = _greedy(model, question, free)
    assert "<tool_call>" not in answer
    assert _greedy(model, question, lazy) == answer

    example = ('<tool_call>{"name": "HassTurnOn", "arguments": {"name": "Garage heater"}}'
               "</tool_call>")
    command = f"Command: Turn on the garage heater.\nCall: {example}\n" \
              "Command: Turn on the garage heater.\nCall:"
    copied = _greedy(model, command, free)
    assert "Garage heater" in copied.split("\n")[0], copied  # the model names what it was told
    held = _greedy(model, command, lazy)
    _, calls = parse_tool_calls(held.split("\n")[0].strip())
    assert calls, held
    args = json.loads(calls[0]["function"]["arguments"])
    assert args["name"] in {"Kitchen light", "Porch light"}

    # The token that completes the trigger may carry a newline past it: the grammar takes it
    # (a grammar refusing a replayed token aborts the process inside llama.cpp).
    s = Sampler(model, SamplingParams(temperature=0, grammar=grammar,
                                      grammar_trigger=LAZY_CALL_TRIGGER))
    for t in model.tokenize('Sure. <tool_call>\n{"name": "HassTurnOn", "arguments": '
                            '{"name": "Porch light"}}\n</tool_call>', add_special=False):
        s.accept(t)
    s.close()


def _copied_free_and_held(model, free, lazy, opening: str, closing: str) -> str:
    """Shown a call of a heater that does not exist, opened with ``opening``: the model left
    alone copies it; held, it names an allowed light, and the answer parses as a call."""
    example = opening + '"name": "HassTurnOn", "arguments": {"name": "Garage heater"}}' + closing
    command = f"Command: Turn on the garage heater.\nCall: {example}\n" \
              "Command: Turn on the garage heater.\nCall:"
    copied = _greedy(model, command, free)
    assert copied.lstrip().startswith(opening) and "Garage heater" in copied, copied
    held = _greedy(model, command, lazy)
    _, calls = parse_tool_calls(held.strip(), {"HassTurnOn"})
    assert calls, held
    assert json.loads(calls[0]["function"]["arguments"])["name"] in {"Kitchen light",
                                                                      "Porch light"}
    return example


def test_a_fenced_call_is_held_too_and_other_fences_stay_free(model):
    """The lazy grammar's second opening: a ```json block whose object begins with "name" is
    held to the call's schema (an allowed name only), and the whole of it parses as a call; a
    fence holding other JSON, or code, comes out as without a grammar."""
    grammar = lazy_call_grammar(CALL_JSON)
    free, lazy = samplers(model, grammar)

    other = 'Data: ```json\n{"city": "Paris", "people": 3}\n```\nData: ```json\n{"city":'
    assert _greedy(model, other, lazy, n=20) == _greedy(model, other, free, n=20)

    _copied_free_and_held(model, free, lazy, "```json\n{", "\n```")

    # Replayed whole (a grammar refusing a token aborts inside llama.cpp): every opening.
    for text in ('Sure.\n```json\n{\n  "name": "HassTurnOn",\n  "arguments": {"name": '
                 '"Porch light"}\n}\n```',
                 'Sure. <tool_call>\n{"name": "HassTurnOn", "arguments": {"name": "Porch '
                 'light"}}\n</tool_call>',
                 '{{"name": "HassTurnOn", "arguments": {"name": "Porch light"}}}',
                 'To turn it on:\n<tools>\n{\n  "name": "HassTurnOn",\n  "arguments": '
                 '{"name": "Porch light"}\n}\n</tools>'):
        replay(model, grammar, LAZY_CALL_TRIGGER, text)


def replay(model, grammar: str, trigger: str, text: str) -> None:
    """Feed ``text`` to a sampler holding ``grammar`` from ``trigger``: a grammar refusing a
    replayed token aborts inside llama.cpp, failing the run."""
    s = Sampler(model, SamplingParams(temperature=0, grammar=grammar, grammar_trigger=trigger))
    for t in model.tokenize(text, add_special=False):
        s.accept(t)
    s.close()


def test_a_call_in_doubled_braces_is_held_from_its_opening(model):
    """The third opening: an answer that begins ``{{"name"`` (as Qwen2.5's template shows a
    call) is held to the call's schema and parses as a call; the same braces later in an
    answer stay free."""
    grammar = lazy_call_grammar(CALL_JSON)
    free, lazy = samplers(model, grammar)
    example = _copied_free_and_held(model, free, lazy, "{{", "}")
    later = f"Example: {example}\nExample:"
    assert _greedy(model, later, lazy, n=20) == _greedy(model, later, free, n=20)


def test_a_bare_call_naming_a_tool_is_held_and_other_json_stays_free(model):
    """The fourth opening: an answer that begins as bare JSON naming one of the request's
    tools is held to the call's schema (it parsed as a call before, unheld); a JSON answer
    naming anything else comes out as without a grammar."""
    trigger = lazy_call_trigger({"HassTurnOn"})
    grammar = lazy_call_grammar(CALL_JSON)
    free, lazy = samplers(model, grammar, trigger)
    _copied_free_and_held(model, free, lazy, "{", "")
    other = 'Person: {"name": "Paris", "age": 3}\nPerson:'
    assert _greedy(model, other, lazy, n=20) == _greedy(model, other, free, n=20)
    for text in ('{"name": "HassTurnOn", "arguments": {"name": "Porch light"}}',
                 '\n{\n  "name": "HassTurnOn",\n  "arguments": {"name": "Porch light"}\n}',
                 'I will use HassTurnOn.\n\n{"name": "HassTurnOn", "arguments": {"name": '
                 '"Porch light"}}',
                 'I will use HassTurnOn.\n{{"name": "HassTurnOn", "arguments": {"name": '
                 '"Porch light"}}}'):
        replay(model, grammar, trigger, text)


def _sampler_after(model, grammar: str, text: str) -> Sampler:
    """A greedy sampler holding ``grammar`` (from the Hermes tag) that has taken ``text``."""
    s = Sampler(model, SamplingParams(temperature=0, grammar=grammar,
                                      grammar_trigger=LAZY_CALL_TRIGGER))
    for t in model.tokenize(text, add_special=False):
        s.accept(t)
    return s


def _text(model, tokens: list[int]) -> str:
    return b"".join(model.piece(t) for t in tokens).decode()


def _tokens(model, text: str) -> list[int]:
    return model.tokenize(text, add_special=False, parse_special=False)


def test_forced_text_is_taken_only_as_far_as_the_grammar_allows(model):
    """Text written for the model in a call (call_forcing) goes through the grammar token by
    token: an allowed name is taken whole, a name the grammar refuses stops where it leaves
    the allowed ones, and nothing refused reaches llama.cpp (which would abort)."""
    grammar = lazy_call_grammar(CALL_JSON)
    opened = '<tool_call>\n{"name": "HassTurnOn", "arguments": {"name": "'
    s = _sampler_after(model, grammar, opened)
    want = _tokens(model, "Porch light")
    assert s.force(want) == want
    s.close()
    s = _sampler_after(model, grammar, opened)
    taken = _text(model, s.force(_tokens(model, "Porch heater")))
    assert "Porch light".startswith(taken) and "heater" not in taken
    assert s.force(_tokens(model, " light"))
    s.close()
    # before the call opens the grammar holds nothing: prose is taken as it comes
    s = _sampler_after(model, grammar, "Sure, ")
    prose = _tokens(model, "the porch light is on.")
    assert s.force(prose) == prose
    s.close()


def test_a_list_of_enum_values_closes_once_it_could_hold_each_of_them(model):
    """A list argument whose items are an enum holds at most as many items as the enum has:
    the 1.5B once repeated ``"light", "sensor"`` in a call's domain list until the token
    limit. Past two items of two values only the list's end is taken."""
    tools = [{"type": "function", "function": {"name": "HassTurnOff", "parameters": {
        "type": "object", "properties": {"domain": {
            "type": "array", "items": {"type": "string", "enum": ["light", "sensor"]}}}}}}]
    grammar = lazy_call_grammar(json_schema_grammar(tool_call_schema(tools)))
    opened = '<tool_call>\n{"name": "HassTurnOff", "arguments": {"domain": ["light", "sensor"'
    s = _sampler_after(model, grammar, opened)
    taken = _text(model, s.force(_tokens(model, ', "light"]}}')))
    assert "light" not in taken, taken
    assert _text(model, s.force(_tokens(model, "]}}"))) == "]}}"
    s.close()
    s = _sampler_after(model, grammar, opened[:-len(', "sensor"')])  # one item: room for more
    assert _text(model, s.force(_tokens(model, ', "sensor"]'))) == ', "sensor"]'
    s.close()
