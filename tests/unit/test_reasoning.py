"""Reasoning text split from the answer: whole outputs, every token split, and the engine's
stop strings seeing the answer only."""

from __future__ import annotations

from itertools import pairwise
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError
from sim_backend import Collector, Scripted, make_core, run_until

from hearth.chat.api_models import ChatCompletionRequest
from hearth.chat.completions import Completion
from hearth.chat.prompts import ChatFormatter
from hearth.chat.reasoning import (
    MARKERS,
    THINK,
    ReasoningSplitter,
    markers_for,
    prompt_opens,
    split_reasoning,
)
from hearth.policy.scheduler import CHAT_RANK, VOICE_RANK
from hearth.shared.requests import Event, Request, SamplingParams


def stream(pieces: list[str], started: bool = False, markers=THINK) -> tuple[str, str]:
    s = ReasoningSplitter(started, markers)
    r, a = [], []
    for p in pieces:
        x, y = s.feed(p)
        r.append(x)
        a.append(y)
    x, y = s.flush()
    return "".join([*r, x]), "".join([*a, y])


def cut(text: str, points: list[int]) -> list[str]:
    bounds = sorted({0, len(text), *(p % (len(text) + 1) for p in points)})
    return [text[i:j] for i, j in pairwise(bounds)]


def test_whole_text():
    text = "<think>\nThe user greets me.\n</think>\n\nHello there!"
    assert split_reasoning(text) == ("The user greets me.", "Hello there!")
    assert stream(list(text)) == ("The user greets me.", "Hello there!")
    assert split_reasoning("  <think>a</think>b") == ("a", "b")  # leading whitespace is fine


def test_no_reasoning_changes_nothing():
    for text in ["Hello!", "  \n Hi", "<b>bold</b>", "<thin", "answer </think> more", "", " "]:
        assert split_reasoning(text) == ("", text)
        assert stream(list(text)) == ("", text)
        assert stream([text]) == ("", text)


def test_close_only_when_the_prompt_opened_the_reasoning():
    text = "Let me see.\n</think>\n\nIt is 4."
    assert split_reasoning(text, started=True) == ("Let me see.", "It is 4.")
    assert stream(list(text), started=True) == ("Let me see.", "It is 4.")
    assert split_reasoning(text) == ("", text)  # prompt did not open it: unchanged
    assert prompt_opens("<|Assistant|><think>\n") and not prompt_opens("<think>\n\n</think>\n\n")


def test_unterminated_reasoning_is_all_reasoning():
    assert split_reasoning("<think>still thinking </thi") == ("still thinking </thi", "")
    assert stream(["<th", "ink>still", " thinking", " </thi"]) == ("still thinking </thi", "")
    assert stream(["abc "], started=True) == ("abc", "")
    assert stream(["<think>"]) == ("", "")


def test_marker_split_across_tokens_is_held_until_decided():
    s = ReasoningSplitter()
    assert s.feed("<") == ("", "")
    assert s.feed("think") == ("", "")
    assert s.feed(">plan") == ("plan", "")
    assert s.feed(" more </") == (" more", "")
    assert s.feed("think") == ("", "")
    assert s.feed(">\n") == ("", "")
    assert s.feed("Answer") == ("", "Answer")
    assert (s.reasoning_tokens, s.tokens) == (6, 7)
    s = ReasoningSplitter()
    assert s.feed("<") == ("", "")
    assert s.feed("b>") == ("", "<b>")  # not a marker after all: released verbatim
    assert s.reasoning_tokens == 0


def test_template_markers():
    assert markers_for("{{ '<|START_THINKING|>' }}...<|END_THINKING|>") == MARKERS[3]
    assert markers_for("{% if '</think>' in content %}") == THINK
    assert markers_for("no reasoning here") == THINK
    pair = ("[THINK]", "[/THINK]")
    assert stream(list("[THINK]x[/THINK] y"), markers=pair) == ("x", "y")


# Text from characters that can start or continue a marker, so random strings keep running
# into partial markers; markers themselves are then put in on purpose.
ALPHABET = st.sampled_from([*"<>/thinkTHINK[]ab \n\t", "</thi", "<thin", "</think", "é"])
TEXT = st.lists(ALPHABET, max_size=25).map("".join).filter(
    lambda s: "<think>" not in s and "</think>" not in s)


@settings(max_examples=600, deadline=None)
@given(reasoning=TEXT, answer=TEXT, lead=st.sampled_from(["", " ", "\n"]),
       shape=st.sampled_from(["full", "started", "unterminated", "plain"]),
       points=st.lists(st.integers(0, 200), max_size=12))
def test_streamed_pieces_join_to_the_whole_split(reasoning, answer, lead, shape, points):
    started = shape == "started"
    if shape == "full":
        text = f"{lead}<think>{reasoning}</think>{answer}"
    elif shape == "started":
        text = f"{reasoning}</think>{answer}"
    elif shape == "unterminated":
        text = f"{lead}<think>{reasoning}"
    else:
        text = answer
    whole = split_reasoning(text, started)
    assert stream(cut(text, points), started) == whole
    assert stream(list(text), started) == whole
    r, a = whole
    for part in (r, a):
        assert "<think>" not in part and "</think>" not in part
    if shape in ("full", "started"):
        assert (r, a) == (reasoning.strip(), answer.lstrip())
    elif shape == "unterminated":
        assert (r, a) == (reasoning.strip(), "")
    elif not answer.lstrip().startswith("<think>"):
        assert whole == ("", answer)


# -- the engine: stops see the answer only -----------------------------------------------------
@pytest.mark.parametrize("split", [True, False])
def test_engine_matches_stops_on_the_answer_only(split):
    pieces = ["<", "think", ">", "I must not say STOP", " yet.", "</", "think", ">", " Done",
              " STOP", " never"]
    b = Scripted(pieces)
    core, _ = make_core(backend=b)
    sink = Collector(b)
    r = Request(prompt=[1, 2, 3], rank=1, sink=sink, max_tokens=50, stop=["STOP"],
                sampling=SamplingParams(), reasoning=ReasoningSplitter() if split else None)
    core.submit(r)
    run_until(core, lambda: sink.done is not None)
    tokens = [e for e in sink.events if e.kind == "token"]
    text = "".join(e.text for e in tokens)
    thought = "".join(e.reasoning for e in tokens)
    if split:
        assert (thought, text) == ("I must not say STOP yet.", "Done ")
        assert sink.done.usage["reasoning_tokens"] == 8
        assert sink.done.usage["completion_tokens"] == 10
    else:
        assert (thought, text) == ("", "<think>I must not say ")
        assert "reasoning_tokens" not in sink.done.usage
    assert sink.done.finish_reason == "stop"


def test_engine_flushes_unterminated_reasoning_at_the_length_limit():
    b = Scripted(["<think>", "a", " b", " c "])
    core, _ = make_core(backend=b)
    sink = Collector(b)
    r = Request(prompt=[1, 2], rank=1, sink=sink, max_tokens=4, reasoning=ReasoningSplitter())
    core.submit(r)
    run_until(core, lambda: sink.done is not None)
    tokens = [e for e in sink.events if e.kind == "token"]
    assert "".join(e.reasoning for e in tokens) == "a b c"
    assert "".join(e.text for e in tokens) == ""
    assert sink.done.finish_reason == "length"
    assert sink.done.usage["reasoning_tokens"] == sink.done.usage["completion_tokens"] == 4


# -- the completion: which requests split, and the response shapes ------------------------------
class FakeRuntime:
    """Just what Completion reads before the engine: a formatter and a tokenizer."""

    def __init__(self, generation_prompt: str, template: str = "{{ '</think>' }}"):
        text = "<|User|>hi" + generation_prompt
        self.formatter = SimpleNamespace(
            source=template, render_pieces=lambda msgs, tools=None, **kw: (text, [(text, True)]))
        self.settings = SimpleNamespace(max_tokens_default=64)
        self.core = SimpleNamespace(b=SimpleNamespace(n_ctx_seq=4096))
        self.model_id = "fake"

    def tokenize_prompt(self, text, pieces=None):
        return [1, 2, 3]


def completion(prompt_end: str = "<|Assistant|>", **body):
    req = ChatCompletionRequest.model_validate(
        {"messages": [{"role": "user", "content": "hi"}], **body})
    return Completion(FakeRuntime(prompt_end), req, rank=1)


def feed(comp, pieces, finish="stop"):
    """Engine events for ``pieces`` as the engine makes them (split, then emitted)."""
    r = comp.request
    events = []
    for p in [*pieces, None]:
        thought, text = r.split(p) if p is not None else r.split("", final=True)
        events.append(Event("token", text=text, reasoning=thought))
    r.n_generated = len(pieces)
    events.append(Event("done", finish_reason=finish, usage=r.usage()))
    comp.stream(events)


async def test_completion_splits_and_reports_reasoning():
    comp = completion()
    assert comp.request.reasoning is comp.reasoning and not comp.reasoning.started
    feed(comp, ["<think>", "plan", "</think>", "\n\nHi"])
    out = await comp.result()
    assert out["choices"][0]["message"] == {"role": "assistant", "content": "Hi",
                                            "reasoning_content": "plan"}
    assert out["usage"]["completion_tokens"] == 4
    assert out["usage"]["completion_tokens_details"] == {"reasoning_tokens": 3}

    comp = completion(stream=True)
    feed(comp, ["<think>", "plan", "</think>", "\n\nHi"])
    deltas = [c["choices"][0]["delta"] async for c in comp.chunks() if c["choices"]]
    assert deltas == [{"role": "assistant", "content": ""}, {"reasoning_content": "plan"},
                      {"content": "Hi"}, {}]


async def test_prompt_that_opens_the_reasoning():
    comp = completion("<|Assistant|><think>\n")
    assert comp.reasoning.started
    feed(comp, ["plan", "</think>", "Hi"])
    msg = (await comp.result())["choices"][0]["message"]
    assert (msg["reasoning_content"], msg["content"]) == ("plan", "Hi")


async def test_formats_and_grammars_that_do_not_split():
    assert completion(reasoning_format="none").request.reasoning is None
    assert completion(response_format={"type": "json_object"}).request.reasoning is None
    comp = completion(reasoning_format="hide")
    feed(comp, ["<think>", "plan", "</think>", "Hi"])
    out = await comp.result()
    assert out["choices"][0]["message"] == {"role": "assistant", "content": "Hi"}
    assert out["usage"]["completion_tokens_details"] == {"reasoning_tokens": 3}


def test_bad_reasoning_format_is_rejected_by_the_model():
    with pytest.raises(ValidationError, match="reasoning_format"):
        completion(reasoning_format="loud")


# -- voice never waits on a chain of thought ---------------------------------------------------
# The end of a Qwen3-style template: with enable_thinking false it closes an empty reasoning in
# the prompt, so the model answers at once.
THINKING_TEMPLATE = (
    "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n"
    "{% endif %}{% endif %}"
)


class TemplateRuntime(FakeRuntime):
    """A real ChatFormatter on a template that honours enable_thinking; keeps the prompt text."""

    def __init__(self):
        super().__init__("")
        self.formatter = ChatFormatter(THINKING_TEMPLATE)
        self.prompts: list[str] = []

    def tokenize_prompt(self, text, pieces=None):
        self.prompts.append(text)
        return [1, 2, 3]


def prompt_of(rank: int, **body) -> str:
    rt = TemplateRuntime()
    req = ChatCompletionRequest.model_validate(
        {"messages": [{"role": "user", "content": "hi"}], **body})
    Completion(rt, req, rank=rank)
    return rt.prompts[-1]


async def test_voice_turns_thinking_off_in_the_template():
    assert prompt_of(VOICE_RANK).endswith("<|assistant|><think>\n\n</think>\n\n")
    assert prompt_of(CHAT_RANK).endswith("<|assistant|>")
    # The request's own choice wins, for voice too; reserved variables cannot be overridden.
    kwargs = {"enable_thinking": True, "add_generation_prompt": False}
    assert prompt_of(VOICE_RANK, chat_template_kwargs=kwargs).endswith("<|assistant|>")
    assert prompt_of(CHAT_RANK, chat_template_kwargs={"enable_thinking": False}).endswith(
        "</think>\n\n")
