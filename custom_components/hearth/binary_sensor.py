"""Whether the Hearth server answers."""

from __future__ import annotations

from typing import TYPE_CHECKING

from homeassistant.components.binary_sensor import (
    BinarySensorDeviceClass,
    BinarySensorEntity,
)
from homeassistant.const import EntityCategory
from homeassistant.core import HomeAssistant
from homeassistant.helpers.entity_platform import AddConfigEntryEntitiesCallback

from .entity import HearthServerEntity

if TYPE_CHECKING:
    from . import HearthConfigEntry

PARALLEL_UPDATES = 0


async def async_setup_entry(
    hass: HomeAssistant,
    config_entry: HearthConfigEntry,
    async_add_entities: AddConfigEntryEntitiesCallback,
) -> None:
    """Set up the reachability sensor."""
    async_add_entities([HearthReachableSensor(config_entry)])


class HearthReachableSensor(HearthServerEntity, BinarySensorEntity):
    """On while the server answers its queue stream or poll; never unavailable itself."""

    _attr_device_class = BinarySensorDeviceClass.CONNECTIVITY
    _attr_entity_category = EntityCategory.DIAGNOSTIC
    _attr_translation_key = "reachable"

    def __init__(self, entry: HearthConfigEntry) -> None:
        """Initialize the sensor."""
        super().__init__(entry, "reachable")

    @property
    def available(self) -> bool:
        """Stay available so that an unreachable server reads as off."""
        return True

    @property
    def is_on(self) -> bool:
        """Return whether the server answered the last queue update."""
        return self.coordinator.last_update_success
