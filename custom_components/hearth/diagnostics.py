"""Diagnostics for Hearth."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from homeassistant.components.diagnostics import async_redact_data
from homeassistant.const import CONF_API_KEY, CONF_PROMPT
from homeassistant.core import HomeAssistant

from .worker import worker_of

if TYPE_CHECKING:
    from . import HearthConfigEntry

# The agents' prompts describe the household (names, rooms, habits): left out like the key.
TO_REDACT = {CONF_API_KEY, CONF_PROMPT, "authorization", "Authorization"}


async def async_get_config_entry_diagnostics(
    hass: HomeAssistant, entry: HearthConfigEntry
) -> dict[str, Any]:
    """Return diagnostics for a config entry (the API key and the prompts redacted)."""
    data = entry.runtime_data
    queue = data.coordinator.data
    models = (queue or {}).get("models")
    return {
        "entry": {
            "title": entry.title,
            "data": async_redact_data(dict(entry.data), TO_REDACT),
            "options": async_redact_data(dict(entry.options), TO_REDACT),
            "subentries": [
                {
                    "subentry_type": subentry.subentry_type,
                    "title": subentry.title,
                    "data": async_redact_data(dict(subentry.data), TO_REDACT),
                }
                for subentry in entry.subentries.values()
            ],
        },
        "server": data.health,
        "queue": queue,
        "queue_last_update_success": data.coordinator.last_update_success,
        # The models' worker processes (state, CPU rung, restarts, the last crash's cause):
        # also in the queue, gathered here for whoever reads why a model stopped answering.
        "worker": {
            "voice_model": worker_of(queue),
            "models": {
                name: info.get("worker")
                for name, info in (models if isinstance(models, dict) else {}).items()
                if isinstance(info, dict) and "worker" in info
            },
            "failed": sorted(data.coordinator.failed_workers),
        },
        "jobs": {
            "events_connected": data.jobs.connected,
            "events_supported": data.jobs.events_supported,
            "last_event_id": data.jobs.last_event_id,
            "pending": len(data.jobs.pending),
        },
    }
