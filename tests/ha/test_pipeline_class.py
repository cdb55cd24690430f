"""The class of a turn that reaches the agent through an Assist pipeline run, counted by the
real Hearth server (SmolLM2-135M) on /v1/queue.

Every pipeline run listens to its chat log's deltas (to stream text to speech), the typed
Assist dialog's too: typed runs must be ``chat``, runs that began with speech ``voice``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from hearth_server import HearthServer
from homeassistant.components import assist_pipeline, stt
from homeassistant.components.assist_pipeline import PipelineEvent, PipelineStage
from homeassistant.core import Context, HomeAssistant
from homeassistant.setup import async_setup_component
from pytest_homeassistant_custom_component.common import (
    MockPlatform,
    mock_platform,
)
from pytest_homeassistant_custom_component.typing import WebSocketGenerator

from .conftest import async_queue, async_setup_hearth, async_wait_for, entity_of
from .satellite import async_create_pipeline

pytestmark = [pytest.mark.ha, pytest.mark.model, pytest.mark.usefixtures("socket_enabled")]

HEARD = "What is the capital of France?"


class HeardProvider(stt.Provider):
    """A speech-to-text engine that hears one sentence, whatever the audio."""

    @property
    def supported_languages(self) -> list[str]:
        return ["en"]

    @property
    def supported_formats(self) -> list[stt.AudioFormats]:
        return [stt.AudioFormats.WAV]

    @property
    def supported_codecs(self) -> list[stt.AudioCodecs]:
        return [stt.AudioCodecs.PCM]

    @property
    def supported_bit_rates(self) -> list[stt.AudioBitRates]:
        return [stt.AudioBitRates.BITRATE_16]

    @property
    def supported_sample_rates(self) -> list[stt.AudioSampleRates]:
        return [stt.AudioSampleRates.SAMPLERATE_16000]

    @property
    def supported_channels(self) -> list[stt.AudioChannels]:
        return [stt.AudioChannels.CHANNEL_MONO]

    async def async_process_audio_stream(
        self, metadata: stt.SpeechMetadata, stream: AsyncIterator[bytes]
    ) -> stt.SpeechResult:
        async for _chunk in stream:
            pass
        return stt.SpeechResult(HEARD, stt.SpeechResultState.SUCCESS)


async def _get_engine(hass: HomeAssistant, config: Any, discovery_info: Any) -> HeardProvider:
    return HeardProvider()


@pytest.fixture
async def pipeline_id(
    hass: HomeAssistant, hearth_server: HearthServer, hass_ws_client: WebSocketGenerator
) -> str:
    """A pipeline whose conversation agent is a Hearth agent on the real server and whose
    speech-to-text engine hears ``HEARD``."""
    entry = await async_setup_hearth(hass, hearth_server.url)
    platform = MockPlatform()
    platform.async_get_engine = _get_engine
    mock_platform(hass, "heard.stt", platform)
    assert await async_setup_component(hass, "stt", {"stt": {"platform": "heard"}})
    return await async_create_pipeline(
        hass, hass_ws_client, entity_of(hass, entry, "conversation"), "Hearth", stt_engine="heard"
    )


async def _completed(hass: HomeAssistant, server: HearthServer) -> dict[str, int]:
    queue = await async_queue(hass, server)
    return {name: data["completed"] for name, data in queue["classes"].items()}


async def _one_more(
    hass: HomeAssistant, server: HearthServer, before: dict[str, int], request_class: str
) -> None:
    """The server counts one more request of ``request_class`` and none of the other
    interactive class."""

    async def counted() -> dict[str, int] | None:
        now = await _completed(hass, server)
        served = now["voice"] + now["chat"] > before["voice"] + before["chat"]
        return now if served else None

    now = await async_wait_for(counted, within=30)
    other = "chat" if request_class == "voice" else "voice"
    assert (now[request_class], now[other]) == (before[request_class] + 1, before[other])


async def test_typed_dialog_run_is_chat(
    hass: HomeAssistant,
    pipeline_id: str,
    hearth_server: HearthServer,
    hass_ws_client: WebSocketGenerator,
) -> None:
    """The Assist dialog's typed turn: a pipeline run of the intent stage only, from a
    browser (no device), over the websocket API as the frontend sends it, is chat."""
    client = await hass_ws_client(hass)
    before = await _completed(hass, hearth_server)
    await client.send_json_auto_id(
        {
            "type": "assist_pipeline/run",
            "start_stage": "intent",
            "end_stage": "intent",
            "input": {"text": "Hello, who are you?"},
            "pipeline": pipeline_id,
            "conversation_id": None,
        }
    )
    assert (await client.receive_json())["success"]
    kinds: list[str] = []
    while not kinds or kinds[-1] != "run-end":
        message = await client.receive_json()
        kinds.append(message["event"]["type"])
    assert "intent-progress" in kinds  # the run listened to the chat log's deltas
    assert "intent-end" in kinds and "error" not in kinds, kinds
    await _one_more(hass, hearth_server, before, "chat")


async def test_run_from_speech_without_device_is_voice(
    hass: HomeAssistant, pipeline_id: str, hearth_server: HearthServer
) -> None:
    """A run that began with speech to text (a browser's or phone's microphone: no device,
    no satellite) is voice."""

    async def audio() -> AsyncIterator[bytes]:
        yield b"\0" * 3200

    events: list[PipelineEvent] = []
    before = await _completed(hass, hearth_server)
    await assist_pipeline.async_pipeline_from_audio_stream(
        hass,
        context=Context(),
        event_callback=events.append,
        stt_metadata=stt.SpeechMetadata(
            language="en",
            format=stt.AudioFormats.WAV,
            codec=stt.AudioCodecs.PCM,
            bit_rate=stt.AudioBitRates.BITRATE_16,
            sample_rate=stt.AudioSampleRates.SAMPLERATE_16000,
            channel=stt.AudioChannels.CHANNEL_MONO,
        ),
        stt_stream=audio(),
        pipeline_id=pipeline_id,
        end_stage=PipelineStage.INTENT,
    )
    kinds = [str(event.type) for event in events]
    assert "stt-end" in kinds and "intent-end" in kinds and "error" not in kinds, kinds
    intent_start = next(e for e in events if str(e.type) == "intent-start")
    assert intent_start.data["intent_input"] == HEARD
    assert intent_start.data["device_id"] is None
    await _one_more(hass, hearth_server, before, "voice")
