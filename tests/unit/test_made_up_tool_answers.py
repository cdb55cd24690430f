"""A tool's answer written by the model ends the model's answer: with tools offered, the
Hermes/Qwen ``<tool_response>`` tag is a stop, so a made-up result is neither spoken nor
keeps a call before it from counting. Through the engine's stop matching, token by token."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from sim_backend import Scripted, make_core, run_until

from hearth.chat.api_models import ChatCompletionRequest
from hearth.chat.completions import Completion
from hearth.chat.tools import RESPONSE_OPEN

TOOLS = [{"type": "function", "function": {
    "name": "HassTurnOn", "parameters": {"type": "object", "properties": {
        "name": {"type": "string"}}}}}]
MADE_UP = ["<", "tool", "_response", ">\n", '{"speech": ', '"Turned on the porch light"}',
           "\n</", "tool_response", ">"]


class Runtime:
    """What Completion reads before the engine; tool calls parsed, not held by a grammar."""

    def __init__(self):
        text = "<|user|>hi<|assistant|>"
        self.formatter = SimpleNamespace(
            source="", render_pieces=lambda msgs, tools=None, **kw: (text, [(text, True)]))
        self.settings = SimpleNamespace(max_tokens_default=64, constrain_tool_calls=False)
        self.core = SimpleNamespace(b=SimpleNamespace(n_ctx_seq=4096))
        self.model_id = "fake"

    def tokenize_prompt(self, text, pieces=None):
        return [1, 2, 3]


async def answer(pieces: list[str], **body) -> dict:
    req = ChatCompletionRequest.model_validate(
        {"messages": [{"role": "user", "content": "And the porch light too."}], **body})
    comp = Completion(Runtime(), req, rank=1)
    core, _ = make_core(backend=Scripted(pieces))
    core.submit(comp.request)
    run_until(core, lambda: comp.request.finished_at is not None)
    return (await comp.result())["choices"][0]


@pytest.mark.parametrize(("before", "content", "calls"), [
    ([], "", []),  # the made-up answer alone: nothing to speak
    (["Sure", "."], "Sure.", []),
    (['{"name": "HassTurnOn", ', '"arguments": {"name": "Porch light"}}', "\n"], None,
     [("HassTurnOn", '{"name": "Porch light"}')]),
])
async def test_a_made_up_tool_answer_ends_the_answer(before, content, calls):
    choice = await answer([*before, *MADE_UP, " It is on now."], tools=TOOLS)
    message = choice["message"]
    assert RESPONSE_OPEN not in (message.get("content") or "")
    assert (message.get("content") or None) == (content or None)
    got = [(c["function"]["name"], c["function"]["arguments"])
           for c in message.get("tool_calls") or ()]
    assert got == calls
    assert choice["finish_reason"] == ("tool_calls" if calls else "stop")


async def test_without_tools_the_tag_is_only_text():
    choice = await answer(["Sure", ".", *MADE_UP])
    assert choice["message"]["content"] == "Sure." + "".join(MADE_UP)
