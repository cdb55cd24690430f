"""Chat prompt rendering and its fallbacks."""

from __future__ import annotations

import pytest

from hearth.chat.prompts import CHATML, ChatFormatter, PromptError, content_text

TOOLS = [{"type": "function", "function": {
    "name": "HassTurnOn", "description": "Turn on a device",
    "parameters": {"type": "object", "properties": {"name": {"type": "string"}}}}}]


def test_missing_template_falls_back_to_chatml():
    f = ChatFormatter(None)
    assert f.is_fallback and f.source == CHATML
    out = f.render([{"role": "user", "content": "hi"}])
    assert out == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_a_gemma_without_template_gets_gemma_turns_with_the_system_text_in_the_first():
    """Gemma 3 270M's GGUF has no template; ChatML's markers mean nothing to it (its answers
    were noise). Gemma has no system role: the system text opens the first user turn."""
    f = ChatFormatter(None, architecture="gemma3")
    assert f.is_fallback
    out = f.render([{"role": "system", "content": "Be brief."},
                    {"role": "user", "content": "hi"},
                    {"role": "assistant", "content": "Hello."},
                    {"role": "user", "content": "light on"}], tools=TOOLS)
    turns = out.split("<end_of_turn>\n")
    assert turns[0].startswith("<start_of_turn>user\nYou can call functions.")
    assert "</tool_call>\n\nBe brief." in turns[0] and turns[0].endswith("hi")
    assert turns[1] == "<start_of_turn>model\nHello."
    assert turns[2] == "<start_of_turn>user\nlight on"
    assert turns[3] == "<start_of_turn>model\n"
    assert "<|im_start|>" not in out and "system" not in out.split("\n")[0]
    # A system message with no user turn after it is its own user turn, never dropped or
    # spoken by the model.
    alone = f.render([{"role": "system", "content": "Be brief."}])
    assert alone == "<start_of_turn>user\nBe brief.<end_of_turn>\n<start_of_turn>model\n"
    before_model = f.render([{"role": "system", "content": "Be brief."},
                             {"role": "assistant", "content": "Hello."}])
    assert before_model.startswith("<start_of_turn>user\nBe brief.<end_of_turn>\n"
                                   "<start_of_turn>model\nHello.")


def test_template_without_tools_gets_tools_in_the_system_prompt():
    f = ChatFormatter(CHATML)
    assert not f.native_tools
    out = f.render([{"role": "system", "content": "Be brief."},
                    {"role": "user", "content": "light on"}], tools=TOOLS)
    assert "Be brief." in out and "<tools>" in out and '"HassTurnOn"' in out
    assert "<tool_call>" in out


def test_tools_come_before_a_system_prompt_that_ends_with_the_time():
    """Home Assistant's system prompt ends with the current time: two turns a minute apart
    share everything up to it, the tools included, so the prefix cache serves them."""
    f = ChatFormatter(CHATML)
    a, b = (f.render([{"role": "system", "content": f"Be brief.\nCurrent time is {t}."},
                      {"role": "user", "content": "light on"}], tools=TOOLS)
            for t in ("10:00:01", "10:01:07"))
    shared = next(i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y)
    assert a.index('"HassTurnOn"') < a.index("Be brief.") < shared


def test_tool_history_is_rendered_for_templates_without_tools():
    f = ChatFormatter(CHATML)
    out = f.render([
        {"role": "user", "content": "light on"},
        {"role": "assistant", "content": None, "tool_calls": [{
            "id": "c1", "type": "function",
            "function": {"name": "HassTurnOn", "arguments": '{"name": "kitchen"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": '{"success": true}'},
    ])
    assert '<tool_call>{"name": "HassTurnOn", "arguments": {"name": "kitchen"}}</tool_call>' in out
    assert "<tool_response>" in out


def test_native_tool_template_receives_tools():
    tmpl = "{% for t in tools %}[{{ t.function.name }}]{% endfor %}" \
           "{% for m in messages %}{{ m.content }}{% endfor %}"
    f = ChatFormatter(tmpl)
    assert f.native_tools
    assert f.render([{"role": "user", "content": "x"}], tools=TOOLS) == "[HassTurnOn]x"


def test_a_native_template_gets_a_calls_arguments_as_an_object():
    """OpenAI messages carry a call's arguments as a JSON string; a template writes them with
    ``tojson`` (Qwen2.5's does), so they go in as an object, as transformers and llama.cpp's
    server pass them. A string that is not JSON stays as it is."""
    tmpl = ("{% if tools %}{% endif %}{% for m in messages %}{% for c in m.tool_calls or [] %}"
            "{{ c.function.name }}:{{ c.function.arguments | tojson }};"
            "{% endfor %}{% endfor %}")
    f = ChatFormatter(tmpl)
    assert f.native_tools
    call = {"id": "a", "type": "function",
            "function": {"name": "HassTurnOn", "arguments": '{"name": "Kitchen light"}'}}
    odd = {**call, "function": {"name": "HassTurnOff", "arguments": "not json"}}
    message = {"role": "assistant", "content": "", "tool_calls": [call, odd]}
    out = f.render([{"role": "user", "content": "x"}, message], tools=TOOLS)
    assert out == 'HassTurnOn:{"name": "Kitchen light"};HassTurnOff:"not json";', out
    assert message["tool_calls"][0]["function"]["arguments"] == '{"name": "Kitchen light"}'


def test_tools_are_listed_as_transformers_lists_them():
    """``tojson`` keeps the keys' order and the text as written (Jinja's own sorts keys and
    escapes ' < > & and non-ASCII)."""
    tools = [{"type": "function", "function": {
        "name": "HassTurnOn", "description": "Turns on a light in the kid's room (Küche)",
        "parameters": {"type": "object", "properties": {}}}}]
    out = ChatFormatter("{% for t in tools %}{{ t | tojson }}{% endfor %}").render(
        [{"role": "user", "content": "x"}], tools=tools)
    assert out == ('{"type": "function", "function": {"name": "HassTurnOn", "description": '
                   '"Turns on a light in the kid\'s room (Küche)", "parameters": {"type": '
                   '"object", "properties": {}}}}'), out


def test_content_parts_and_errors():
    assert content_text([{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]) == "ab"
    with pytest.raises(PromptError):
        content_text([{"type": "image_url", "image_url": {"url": "x"}}])
    f = ChatFormatter("{{ raise_exception('no system role') }}")
    with pytest.raises(PromptError):
        f.render([{"role": "user", "content": "x"}])


def test_sandbox_blocks_unsafe_templates():
    f = ChatFormatter("{{ ''.__class__.__mro__ }}")
    with pytest.raises(PromptError):
        f.render([{"role": "user", "content": "x"}])
