"""Queue-health sensors of a Hearth server."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from homeassistant.components.sensor import (
    SensorDeviceClass,
    SensorEntity,
    SensorEntityDescription,
    SensorStateClass,
)
from homeassistant.const import PERCENTAGE, EntityCategory, UnitOfTime
from homeassistant.core import HomeAssistant, callback
from homeassistant.helpers.entity_platform import AddConfigEntryEntitiesCallback
from homeassistant.helpers.typing import StateType

from .const import INTERACTIVE_CLASSES, REQUEST_CLASSES
from .entity import HearthServerEntity
from .models import HearthModelSensor, SteadyTime, served_models
from .worker import (
    WORKER_STATES,
    boundary_overhead,
    has_worker,
    worker_attributes,
    worker_state,
)

if TYPE_CHECKING:
    from . import HearthConfigEntry

# Sensor values come from the coordinator; no need to limit parallel updates.
PARALLEL_UPDATES = 0

UNIT_TOKENS_PER_SECOND = "tok/s"


def _number(value: Any) -> float | None:
    """Return a number, or None for missing data (a null percentile means no data yet)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return value


def _path(*keys: str) -> Callable[[dict[str, Any]], float | None]:
    def read(data: dict[str, Any]) -> float | None:
        value: Any = data
        for key in keys:
            if not isinstance(value, dict):
                return None
            value = value.get(key)
        return _number(value)

    return read


def _percent(*keys: str) -> Callable[[dict[str, Any]], float | None]:
    read = _path(*keys)

    def percent(data: dict[str, Any]) -> float | None:
        value = read(data)
        return None if value is None else round(value * 100.0, 2)

    return percent


def _voice_hit_rate(data: dict[str, Any]) -> float | None:
    """The share of voice turns that found part of their prompt cached, in percent; None
    until a voice turn has looked (the server reports 0 then)."""
    if not _path("prefix_cache", "by_class", "voice", "lookups")(data):
        return None
    return _percent("prefix_cache", "by_class", "voice", "hit_rate")(data)


@dataclass(frozen=True, kw_only=True)
class HearthSensorDescription(SensorEntityDescription):
    """Describes a Hearth queue sensor."""

    value_fn: Callable[[dict[str, Any]], StateType]
    attributes_fn: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    # Unavailable while this says no (the server does not report what the sensor reads).
    available_fn: Callable[[dict[str, Any]], bool] | None = None
    # value_fn reads an age in seconds; the sensor shows the time it started (steadily).
    age: bool = False


def _voice_cache_attributes(data: dict[str, Any]) -> dict[str, Any]:
    """The cells the cached voice prompts hold and how many are kept against lower classes
    (absent on servers without a per-class prefix cache)."""
    return {
        name: value
        for name in ("cells", "kept")
        if (value := _path("prefix_cache", "by_class", "voice", name)(data)) is not None
    }


def class_eta(data: dict[str, Any], cls: str) -> float | None:
    """The seconds a request of ``cls`` arriving now is expected to wait for its first token
    (``eta_s`` by class; None from servers without queue ETAs)."""
    return _path("eta_s", cls)(data)


def _waiting_attributes(cls: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """A class's expected wait (``eta_s``) and where its waiting requests stand (``requests``:
    id, member, position and ETA of each)."""

    def read(data: dict[str, Any]) -> dict[str, Any]:
        attributes: dict[str, Any] = {}
        if (eta := class_eta(data, cls)) is not None:
            attributes["eta_s"] = eta
        listed = data.get("waiting_requests")
        if isinstance(listed, list):
            attributes["requests"] = [
                {key: item.get(key) for key in ("id", "member", "position", "eta_s")}
                for item in listed
                if isinstance(item, dict) and item.get("class") == cls
            ]
        return attributes

    return read


def _descriptions() -> list[HearthSensorDescription]:
    descriptions: list[HearthSensorDescription] = []
    for cls in REQUEST_CLASSES:
        less_used = cls in ("agent", "embedding")
        descriptions += [
            HearthSensorDescription(
                key=f"waiting_{cls}",
                translation_key=f"waiting_{cls}",
                state_class=SensorStateClass.MEASUREMENT,
                entity_registry_enabled_default=not less_used,
                value_fn=_path("waiting", cls),
                attributes_fn=_waiting_attributes(cls),
            ),
            HearthSensorDescription(
                key=f"running_{cls}",
                translation_key=f"running_{cls}",
                state_class=SensorStateClass.MEASUREMENT,
                entity_registry_enabled_default=not less_used,
                value_fn=_path("running", cls),
            ),
            HearthSensorDescription(
                key=f"completed_{cls}",
                translation_key=f"completed_{cls}",
                state_class=SensorStateClass.TOTAL_INCREASING,
                entity_category=EntityCategory.DIAGNOSTIC,
                entity_registry_enabled_default=False,
                value_fn=_path("classes", cls, "completed"),
            ),
        ]
    for cls in INTERACTIVE_CLASSES:
        for metric, source in (("ttft", "ttft_ms"), ("itl", "itl_ms"), ("queue_wait", "queue_ms")):
            descriptions.append(
                HearthSensorDescription(
                    key=f"{metric}_p95_{cls}",
                    translation_key=f"{metric}_p95_{cls}",
                    device_class=SensorDeviceClass.DURATION,
                    native_unit_of_measurement=UnitOfTime.MILLISECONDS,
                    state_class=SensorStateClass.MEASUREMENT,
                    suggested_display_precision=0,
                    value_fn=_path("classes", cls, source, "p95"),
                )
            )
    descriptions += [
        HearthSensorDescription(
            key="tokens_per_second",
            translation_key="tokens_per_second",
            native_unit_of_measurement=UNIT_TOKENS_PER_SECOND,
            state_class=SensorStateClass.MEASUREMENT,
            suggested_display_precision=1,
            value_fn=_path("tokens_per_s"),
        ),
        HearthSensorDescription(
            key="kv_cache_use",
            translation_key="kv_cache_use",
            native_unit_of_measurement=PERCENTAGE,
            state_class=SensorStateClass.MEASUREMENT,
            suggested_display_precision=1,
            value_fn=_percent("kv", "use"),
        ),
        HearthSensorDescription(
            key="prefix_cache_hit_rate",
            translation_key="prefix_cache_hit_rate",
            native_unit_of_measurement=PERCENTAGE,
            state_class=SensorStateClass.MEASUREMENT,
            suggested_display_precision=0,
            entity_category=EntityCategory.DIAGNOSTIC,
            value_fn=_percent("prefix_cache", "hit_rate"),
        ),
        HearthSensorDescription(
            key="prefix_cache_voice_hit_rate",
            translation_key="prefix_cache_voice_hit_rate",
            native_unit_of_measurement=PERCENTAGE,
            state_class=SensorStateClass.MEASUREMENT,
            suggested_display_precision=0,
            entity_category=EntityCategory.DIAGNOSTIC,
            value_fn=_voice_hit_rate,
        ),
        HearthSensorDescription(
            key="prefix_cache_voice_entries",
            translation_key="prefix_cache_voice_entries",
            state_class=SensorStateClass.MEASUREMENT,
            entity_category=EntityCategory.DIAGNOSTIC,
            value_fn=_path("prefix_cache", "by_class", "voice", "entries"),
            attributes_fn=_voice_cache_attributes,
        ),
        HearthSensorDescription(
            key="prefix_cache_voice_oldest",
            translation_key="prefix_cache_voice_oldest",
            # When the oldest was cached, not its age: an age grows, and would write a new
            # state on every poll.
            device_class=SensorDeviceClass.TIMESTAMP,
            entity_category=EntityCategory.DIAGNOSTIC,
            value_fn=_path("prefix_cache", "by_class", "voice", "oldest_s"),
            age=True,
        ),
        HearthSensorDescription(
            key="prefix_cache_warm_ups",
            translation_key="prefix_cache_warm_ups",
            state_class=SensorStateClass.TOTAL_INCREASING,
            entity_category=EntityCategory.DIAGNOSTIC,
            value_fn=_path("prefix_cache", "warm_ups"),
        ),
        HearthSensorDescription(
            key="preemptions",
            translation_key="preemptions",
            state_class=SensorStateClass.TOTAL_INCREASING,
            entity_category=EntityCategory.DIAGNOSTIC,
            value_fn=_path("preemptions"),
        ),
        HearthSensorDescription(
            key="generated_tokens",
            translation_key="generated_tokens",
            state_class=SensorStateClass.TOTAL_INCREASING,
            entity_category=EntityCategory.DIAGNOSTIC,
            entity_registry_enabled_default=False,
            value_fn=_path("generated_tokens_total"),
        ),
        HearthSensorDescription(
            key="jobs_queued",
            translation_key="jobs_queued",
            state_class=SensorStateClass.MEASUREMENT,
            value_fn=_path("jobs", "queued"),
        ),
        HearthSensorDescription(
            key="jobs_failed",
            translation_key="jobs_failed",
            # The failed jobs the server still keeps: old ones are purged, so it can shrink.
            state_class=SensorStateClass.MEASUREMENT,
            value_fn=_path("jobs", "failed"),
        ),
    ]
    return descriptions


SENSORS: tuple[HearthSensorDescription, ...] = tuple(_descriptions())

# The voice model's worker process: created once the server reports it (not by older servers,
# nor for a remote voice model).
WORKER_SENSORS: tuple[HearthSensorDescription, ...] = (
    HearthSensorDescription(
        key="worker",
        translation_key="worker",
        device_class=SensorDeviceClass.ENUM,
        options=WORKER_STATES,
        value_fn=worker_state,
        attributes_fn=worker_attributes,
        available_fn=has_worker,
    ),
    # Restarts after a crash over the server's lifetime (not "crashes": that counts only the
    # last few crashes the server remembers); a server restart starts again at 0, which
    # total_increasing reads as a new meter.
    HearthSensorDescription(
        key="worker_crashes",
        translation_key="worker_crashes",
        state_class=SensorStateClass.TOTAL_INCREASING,
        entity_category=EntityCategory.DIAGNOSTIC,
        value_fn=_path("worker", "restarts"),
        available_fn=has_worker,
    ),
    # What running llama.cpp in another process costs per engine iteration.
    HearthSensorDescription(
        key="worker_boundary_overhead",
        translation_key="worker_boundary_overhead",
        device_class=SensorDeviceClass.DURATION,
        native_unit_of_measurement=UnitOfTime.MICROSECONDS,
        state_class=SensorStateClass.MEASUREMENT,
        suggested_display_precision=0,
        entity_category=EntityCategory.DIAGNOSTIC,
        entity_registry_enabled_default=False,
        value_fn=boundary_overhead,
        available_fn=has_worker,
    ),
)


async def async_setup_entry(
    hass: HomeAssistant,
    config_entry: HearthConfigEntry,
    async_add_entities: AddConfigEntryEntitiesCallback,
) -> None:
    """Set up the queue sensors on the server's device, one sensor per model or remote
    worker the server reports (more appear as the server reports more), and the voice model's
    worker sensors once the server reports its worker."""
    async_add_entities(
        (HearthJobsQueuedSensor if description.key == "jobs_queued" else HearthQueueSensor)(
            config_entry, description
        )
        for description in SENSORS
    )
    coordinator = config_entry.runtime_data.coordinator
    known: set[str] = set()
    worker_added = False

    @callback
    def add_new() -> None:
        nonlocal worker_added
        new = [m for m in served_models(coordinator.data) if m not in known]
        known.update(new)
        if new:
            async_add_entities(HearthModelSensor(config_entry, model) for model in new)
        if not worker_added and has_worker(coordinator.data or {}):
            worker_added = True
            async_add_entities(
                HearthQueueSensor(config_entry, description) for description in WORKER_SENSORS
            )

    add_new()
    config_entry.async_on_unload(coordinator.async_add_listener(add_new))


class HearthQueueSensor(HearthServerEntity, SensorEntity):
    """One number from ``/v1/queue``."""

    entity_description: HearthSensorDescription
    # The queue of the moment: shown, not kept in history (the sensors' values keep it).
    _unrecorded_attributes = frozenset({"eta_s", "requests", "jobs"})

    def __init__(
        self, entry: HearthConfigEntry, description: HearthSensorDescription
    ) -> None:
        """Initialize the sensor."""
        super().__init__(entry, description.key)
        self.entity_description = description
        self._since = SteadyTime()

    @property
    def available(self) -> bool:
        """Unavailable while the server does not report what the sensor reads."""
        available_fn = self.entity_description.available_fn
        return super().available and (
            available_fn is None or available_fn(self.coordinator.data or {})
        )

    @property
    def native_value(self) -> StateType | datetime:
        """Return the value, or None when the server has no data for it."""
        value = self.entity_description.value_fn(self.coordinator.data or {})
        if self.entity_description.age:
            return self._since.ago(value if isinstance(value, int | float) else None)
        return value

    @property
    def extra_state_attributes(self) -> dict[str, Any] | None:
        """Return the details some sensors carry beside their value."""
        if self.entity_description.attributes_fn is None:
            return None
        return self.entity_description.attributes_fn(self.coordinator.data or {}) or None


class HearthJobsQueuedSensor(HearthQueueSensor):
    """The server's queued jobs; the jobs submitted here that wait, with their place in the
    queue and expected start (``jobs``), as attributes."""

    async def async_added_to_hass(self) -> None:
        """Follow the submitted jobs' places in the queue too."""
        await super().async_added_to_hass()
        watcher = self.coordinator.config_entry.runtime_data.jobs
        self.async_on_remove(watcher.async_add_listener(self.async_write_ha_state))

    @property
    def extra_state_attributes(self) -> dict[str, Any] | None:
        """Each waiting job submitted here: id, tag, position and ETA."""
        queued = self.coordinator.config_entry.runtime_data.jobs.queued
        if not queued:
            return None
        return {"jobs": [{"job_id": job_id, **where} for job_id, where in queued.items()]}
