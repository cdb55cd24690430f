"""An Assist satellite for the tests: a real ``assist_satellite`` entity (Home Assistant's own
base class) whose state a test moves, and the pipeline that sends its turns to a Hearth agent."""

from __future__ import annotations

from typing import Any

from homeassistant.components.assist_pipeline import PipelineEvent
from homeassistant.components.assist_satellite import (
    AssistSatelliteConfiguration,
    AssistSatelliteEntity,
)
from homeassistant.components.assist_satellite.entity import AssistSatelliteState
from homeassistant.core import HomeAssistant
from homeassistant.setup import async_setup_component
from pytest_homeassistant_custom_component.common import MockPlatform, mock_platform
from pytest_homeassistant_custom_component.typing import WebSocketGenerator

PIPELINE_SELECT = "select.kitchen_satellite_pipeline"


class Satellite(AssistSatelliteEntity):
    """A satellite that only changes state when told."""

    _attr_name = "Kitchen satellite"

    def __init__(self, pipeline_entity_id: str | None) -> None:
        self._attr_pipeline_entity_id = pipeline_entity_id

    def async_get_configuration(self) -> AssistSatelliteConfiguration:
        return AssistSatelliteConfiguration(
            available_wake_words=[], active_wake_words=[], max_active_wake_words=1
        )

    async def async_set_configuration(self, config: AssistSatelliteConfiguration) -> None:
        return None

    def on_pipeline_event(self, event: PipelineEvent) -> None:
        return None

    def go(self, state: str) -> None:
        """Move to ``state`` (listening: its wake word was heard)."""
        self._set_state(AssistSatelliteState(state))


async def async_add_satellite(
    hass: HomeAssistant, pipeline_entity_id: str | None = PIPELINE_SELECT
) -> Satellite:
    """Set up Home Assistant's satellite component with one satellite (before a websocket
    client: the component registers an HTTP view, which a started server refuses)."""
    satellite = Satellite(pipeline_entity_id)

    async def setup_platform(
        hass: HomeAssistant, config: Any, add_entities: Any, discovery_info: Any = None
    ) -> None:
        add_entities([satellite])

    mock_platform(hass, "test_satellite.assist_satellite",
                  MockPlatform(async_setup_platform=setup_platform))
    assert await async_setup_component(
        hass, "assist_satellite", {"assist_satellite": [{"platform": "test_satellite"}]}
    )
    await hass.async_block_till_done()
    assert satellite.entity_id
    return satellite


async def async_create_pipeline(
    hass: HomeAssistant,
    hass_ws_client: WebSocketGenerator,
    agent_id: str,
    name: str,
    stt_engine: str | None = None,
) -> str:
    """A pipeline named ``name`` whose conversation agent is ``agent_id`` (and speech-to-text
    engine ``stt_engine``, in English); its id."""
    assert await async_setup_component(hass, "assist_pipeline", {})
    client = await hass_ws_client(hass)
    await client.send_json_auto_id(
        {
            "type": "assist_pipeline/pipeline/create",
            "conversation_engine": agent_id,
            "conversation_language": "en",
            "language": "en",
            "name": name,
            "stt_engine": stt_engine,
            "stt_language": "en" if stt_engine else None,
            "tts_engine": None,
            "tts_language": None,
            "tts_voice": None,
            "wake_word_entity": None,
            "wake_word_id": None,
        }
    )
    created = await client.receive_json()
    assert created["success"], created
    return str(created["result"]["id"])
