"""The command benchmark's scoring of the words, without Home Assistant or a server."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from commands import GUIDANCE_END, _words, no_answer, summary


def _turn(text: str, said: str, mode: str = "model", local: bool = False) -> dict:
    return {"mode": mode, "id": "q-1", "kind": "question", "text": text, "speech": said,
            "local": local, "passed": True, "seconds": 1.0, "calls": [], "error": None}


@pytest.mark.parametrize(("said", "nothing"), [
    ("Is the kitchen light on?", True),
    ("is the KITCHEN light on", True),
    ("To act, answer with the tool call alone, not with an explanation of it.", True),
    ("To turn it on, use the `intent__HassTurnOn` function.", True),
    ("<tools></tools>", True),
    ("The model used its tools but gave no answer.", True),
    ("The model gave no answer.", True),
    ("The kitchen light is off.", False),
    ("", False),
])
def test_no_answer(said: str, nothing: bool) -> None:
    assert no_answer(_turn("Is the kitchen light on?", said)) is nothing


def test_the_guidance_sentence_is_the_agents_own() -> None:
    """The benchmark scores without importing Home Assistant; its copy of the agent's last
    guidance sentence must not drift from the integration's."""
    from custom_components.hearth.call_hint import ACT_ALONE

    assert _words(ACT_ALONE) == GUIDANCE_END


def test_summary_counts_the_answers_that_said_nothing() -> None:
    results = [_turn("Is the kitchen light on?", "Is the kitchen light on?"),
               _turn("Is the porch light on?", "The porch light is on."),
               _turn("Turn on the kitchen light.", "Turned on the light", "local", local=True),
               _turn("Is the kitchen light on?", "The kitchen light is off.", "local")]
    text = summary(results, "m", 0)
    assert "Model answers that said nothing: model 1 of 2, local 0 of 1" in text
    assert "- [model] q-1 'Is the kitchen light on?': said 'Is the kitchen light on?'" in text
