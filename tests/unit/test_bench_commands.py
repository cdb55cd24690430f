"""The command benchmark's scoring of the words, without Home Assistant or a server."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import yaml
from commands import CASES, GUIDANCE_END, _words, answered_right, no_answer, summary


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
    assert "Questions answered right" not in text  # none of these turns checks its answer


def test_summary_counts_the_questions_answered_right() -> None:
    results = [{**_turn("Is the porch light on?", said), "answer_ok": ok}
               for said, ok in (("It is on.", True), ("It is off.", False))]
    text = summary([*results, _turn("Turn on the kitchen light.", "Done.")], "m", 0)
    assert "Questions answered right: model 1 of 2" in text
    assert "- [model] q-1 'Is the porch light on?': said 'It is off.'" in text


def _answer(case_id: str) -> dict:
    return next(c["answer"] for c in yaml.safe_load(CASES.read_text())["cases"]
                if c["id"] == case_id)


@pytest.mark.parametrize(("case_id", "said", "right"), [
    ("q-1", "The porch light is on.", True),
    ("q-1", "Yes, it is.", True),
    ("q-1", "The porch light is off.", False),
    ("q-1", "No, the porch light is not on.", False),
    ("q-2", "The temperature in the living room is 21.5 °C.", True),
    ("q-2", "The living room temperature is 22 degrees.", False),
    ("q-6", "Yes, it is warm in the living room. The temperature is 21.5°C.", True),
    ("q-6", "The current temperature in the Living Room is 72 degrees Fahrenheit.", False),
    ("q-6", "It is 21.5 degrees Celsius in the living room.", True),
    ("q-6", "It is 23 degrees in the living room.", False),
    ("q-7", "Yes, the kitchen light is on.", False),
    ("q-7", "No, the kitchen light is off.", True),
    ("q-7", "Live Context: An overview of the areas and the devices in this smart home:\n"
            "- names: Kitchen light\n  domain: light\n  state: 'off'", False),
    ("q-7", "The kitchen light isn't on.", True),
    ("q-7", "No lights are on in the kitchen.", True),
    ("q-7", "The kitchen light is on.", False),
    ("q-3", "The kitchen light is on.", True),
    ("q-3", "The kitchen light and the porch light are on.", False),
    ("q-3", "The kitchen light, the porch light and the lamp are on.", False),
    ("q-3", "The porch light is on.", False),
    # the others said to be off: right (the rule first scored these wrong)
    ("q-3", "The kitchen light is on, and the porch light is off.", True),
    ("q-3", "The kitchen light is on, while the living room and porch lamps are off.", True),
    ("fu-3a", "The kitchen light is off.", True),
])
def test_answers_to_questions(case_id: str, said: str, right: bool) -> None:
    assert answered_right(_answer(case_id), said) is right
    assert answered_right(None, said) is None
