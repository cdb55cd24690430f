"""A voice turn that must wait says a hold phrase first (custom_components.hearth.hold), and a
turn a newer one of its satellite superseded ends quietly.

The fake server holds its answer back until the test releases it, after the queue-status
comments a waiting stream carries, so the test sees the phrase streamed while the turn waits.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from homeassistant.components import conversation
from homeassistant.core import Context, HomeAssistant
from pytest_homeassistant_custom_component.common import MockConfigEntry

from custom_components.hearth.const import CONF_HOLD_AFTER, CONF_HOLD_PHRASE
from custom_components.hearth.hold import hold_phrase
from custom_components.hearth.sse import QueueStatus, parse_queued

from .conftest import (
    CONVERSATION_OPTIONS,
    FakeHearth,
    async_setup_hearth,
    async_wait_for,
    entity_of,
    open_chat_session,
    text_chunks,
)

pytestmark = [pytest.mark.ha, pytest.mark.usefixtures("socket_enabled")]

ANSWER = "It is noon."
SATELLITE = "assist_satellite.kitchen"


def test_queued_comments_are_read() -> None:
    assert parse_queued(" queued position=2 eta_s=6.5") == QueueStatus(2, 6.5)
    assert parse_queued("queued eta_s=1") == QueueStatus(None, 1.0)
    assert parse_queued(" keepalive") is None
    assert parse_queued("queued position=x") == QueueStatus(None, None)


@pytest.mark.parametrize(("language", "phrase"), [
    ("en", "One moment."), ("de-CH", "Einen Moment."), ("fr_FR", "Un instant."),
    ("xx", "One moment."), (None, "One moment."),
])
def test_phrase_in_the_turns_language(language: str | None, phrase: str) -> None:
    assert hold_phrase(language) == phrase


async def _entry(hass: HomeAssistant, fake: FakeHearth, **options: Any) -> MockConfigEntry:
    fake.chat_handler = lambda body: text_chunks(ANSWER)
    return await async_setup_hearth(
        hass, fake.url, conversation={**CONVERSATION_OPTIONS, **options})


async def _voice_turn(
    hass: HomeAssistant, entry: MockConfigEntry, fake: FakeHearth, *,
    satellite: str | None = SATELLITE, language: str = "en",
    released_when: Any = None,
) -> tuple[str, list[dict[str, Any]]]:
    """Run a turn (voice: it names a satellite) whose chat log streams to a listener, as a
    pipeline's does; the server's answer is released once ``released_when(deltas)`` holds
    (at once without it). The speech and the deltas."""
    agent_id = entity_of(hass, entry, "conversation")
    deltas: list[dict[str, Any]] = []
    fake.voice.release = asyncio.Event()
    with (
        open_chat_session(hass) as session,
        conversation.async_get_chat_log(
            hass, session,
            conversation.ConversationInput(
                text="What time is it?", context=Context(),
                conversation_id=session.conversation_id, device_id=None,
                satellite_id=satellite, language=language, agent_id=agent_id,
            ),
            chat_log_delta_listener=lambda chat_log, delta: deltas.append(delta),
        ),
    ):
        turn = hass.async_create_task(conversation.async_converse(
            hass, "What time is it?", session.conversation_id, Context(),
            agent_id=agent_id, satellite_id=satellite, language=language,
        ))
        await async_wait_for(fake.voice.waiting.is_set)
        if released_when is not None:
            await async_wait_for(lambda: released_when(deltas))
        fake.voice.release.set()
        result = await turn
    return result.response.speech["plain"]["speech"], deltas


def _said(deltas: list[dict[str, Any]]) -> list[str]:
    return [d["content"] for d in deltas if d.get("content")]


async def test_high_eta_says_the_phrase_while_waiting(
    hass: HomeAssistant, fake_hearth: FakeHearth
) -> None:
    """The stream reports a wait past the threshold: the phrase is streamed while the server
    still holds the answer back, and the answer follows in the same reply."""
    entry = await _entry(hass, fake_hearth)
    fake_hearth.voice.comments = ["queued position=2 eta_s=6.5"]
    speech, deltas = await _voice_turn(
        hass, entry, fake_hearth, language="de-DE", released_when=_said)
    assert _said(deltas)[0] == "Einen Moment. "
    assert speech == f"Einen Moment. {ANSWER}"


async def test_no_token_by_the_threshold_says_the_phrase(
    hass: HomeAssistant, fake_hearth: FakeHearth
) -> None:
    """A short expected wait says nothing by itself; no token by the threshold does."""
    entry = await _entry(hass, fake_hearth, **{CONF_HOLD_AFTER: 0.5})
    fake_hearth.voice.comments = ["queued position=1 eta_s=0.2"]
    speech, deltas = await _voice_turn(hass, entry, fake_hearth, released_when=_said)
    assert speech == f"One moment. {ANSWER}"
    assert _said(deltas)[0] == "One moment. "


async def test_quick_answer_says_no_phrase(
    hass: HomeAssistant, fake_hearth: FakeHearth
) -> None:
    """An answer that comes before the threshold, after a short expected wait, has no
    phrase."""
    entry = await _entry(hass, fake_hearth, **{CONF_HOLD_AFTER: 30.0})
    fake_hearth.voice.comments = ["queued position=1 eta_s=0.4"]
    speech, _ = await _voice_turn(hass, entry, fake_hearth)
    assert speech == ANSWER


@pytest.mark.parametrize(("options", "satellite"), [
    ({CONF_HOLD_PHRASE: False}, SATELLITE),  # turned off
    ({}, None),  # a typed (chat) turn
])
async def test_no_phrase_when_off_or_typed(
    hass: HomeAssistant, fake_hearth: FakeHearth, options: dict[str, Any],
    satellite: str | None,
) -> None:
    entry = await _entry(hass, fake_hearth, **options)
    fake_hearth.voice.comments = ["queued position=3 eta_s=9.0"]
    speech, _ = await _voice_turn(hass, entry, fake_hearth, satellite=satellite)
    assert speech == ANSWER


@pytest.mark.parametrize("in_stream", [False, True])
async def test_superseded_turn_ends_quietly(
    hass: HomeAssistant, fake_hearth: FakeHearth, caplog: pytest.LogCaptureFixture,
    in_stream: bool,
) -> None:
    """A turn the server superseded (409, or an error event once the stream had begun)
    says nothing and logs no error: its satellite has moved on to the newer turn."""
    entry = await _entry(hass, fake_hearth, **{CONF_HOLD_PHRASE: False})
    fake_hearth.voice.refuse = not in_stream
    fake_hearth.voice.superseded_in_stream = in_stream
    result = await conversation.async_converse(
        hass, "What time is it?", None, Context(),
        agent_id=entity_of(hass, entry, "conversation"), satellite_id=SATELLITE,
    )
    assert result.response.response_type != "error"
    assert result.response.speech["plain"]["speech"] == ""
    assert fake_hearth.chat_requests[-1][0]["X-Hearth-Satellite"] == SATELLITE
    assert not [r for r in caplog.records if r.levelname == "ERROR"]
