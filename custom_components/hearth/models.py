"""The server's models as sensors, and times the server reports as ages, held steady."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from homeassistant.components.sensor import SensorDeviceClass, SensorEntity
from homeassistant.const import EntityCategory
from homeassistant.util import dt as dt_util

from .entity import HearthServerEntity
from .worker import model_worker_attributes

if TYPE_CHECKING:
    from . import HearthConfigEntry

# A time computed from an age moves by the poll's latency and the server's rounding (0.1 s);
# a move this small is not a new time.
STEADY_WITHIN_S = 2.0


class SteadyTime:
    """A moment the server reports as seconds before (or after) now, kept the same from poll
    to poll while it only jitters, so a sensor showing it writes no new state."""

    def __init__(self) -> None:
        """Start with no moment."""
        self.value: datetime | None = None

    def ago(self, seconds: float | None) -> datetime | None:
        """The moment ``seconds`` before now (negative: after), or None."""
        if seconds is None:
            self.value = None
            return None
        moment = (dt_util.utcnow() - timedelta(seconds=seconds)).replace(microsecond=0)
        if self.value is None or abs((moment - self.value).total_seconds()) > STEADY_WITHIN_S:
            self.value = moment
        return self.value


def served_models(data: dict[str, Any] | None) -> dict[str, dict[str, Any]]:
    """The models ``/v1/queue`` lists, by name (none from an older server)."""
    models = (data or {}).get("models")
    return models if isinstance(models, dict) else {}


MODEL_STATES = ["ready", "loading", "unloading", "unloaded", "failed", "unreachable", "unknown"]
MODEL_ATTRIBUTES = ("classes", "aliases", "pinned", "in_use", "waiting", "running",
                    "memory_bytes", "keep_alive_s", "loads", "unloads",
                    "last_load_s", "paused_for_others_s", "url", "kind", "fallback",
                    "max_concurrency", "error", "eta_s")


class HearthModelSensor(HearthServerEntity, SensorEntity):
    """One model of the server, or a remote worker: loaded, loading, unloaded, unreachable;
    its classes and queue depth as attributes."""

    _attr_device_class = SensorDeviceClass.ENUM
    _attr_options = MODEL_STATES
    _attr_translation_key = "model"
    _attr_entity_category = EntityCategory.DIAGNOSTIC
    # The load of the moment: shown, not kept in history (the class sensors keep the queue's).
    _unrecorded_attributes = frozenset({"in_use", "waiting", "running", "eta_s"})

    def __init__(self, entry: HearthConfigEntry, model: str) -> None:
        """Initialize the sensor."""
        super().__init__(entry, f"model_{model}")  # names differ where slugs may not
        self.model = model
        self._attr_translation_placeholders = {"model": model}
        self._expires = SteadyTime()

    @property
    def _info(self) -> dict[str, Any] | None:
        return served_models(self.coordinator.data).get(self.model)

    @property
    def available(self) -> bool:
        """Unavailable once the server no longer lists the model."""
        return super().available and self._info is not None

    @property
    def native_value(self) -> str | None:
        """Return the model's state."""
        state = (self._info or {}).get("state")
        return state if state in MODEL_STATES else None

    @property
    def extra_state_attributes(self) -> dict[str, Any] | None:
        """Return what the server reports of the model (and of its worker process). The time
        left before an idle model unloads is given as the moment it unloads (``expires_at``):
        a countdown would write a new state on every poll."""
        info = self._info or {}
        attributes = {key: info[key] for key in MODEL_ATTRIBUTES if key in info}
        left = info.get("expires_in_s")
        expires = self._expires.ago(-left if isinstance(left, int | float) else None)
        if expires is not None:
            attributes["expires_at"] = expires.isoformat()
        return {**attributes, **model_worker_attributes(info)} or None
