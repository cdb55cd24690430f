"""Actions for Hearth's durable background jobs."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from homeassistant.config_entries import ConfigEntryState
from homeassistant.core import (
    HomeAssistant,
    ServiceCall,
    ServiceResponse,
    SupportsResponse,
    callback,
)
from homeassistant.exceptions import HomeAssistantError, ServiceValidationError
from homeassistant.helpers import config_validation as cv

from .api import HearthError, InvalidAuth, NotFound
from .compat import vol
from .const import (
    ATTR_CLASS,
    ATTR_CONFIG_ENTRY,
    ATTR_INSTRUCTIONS,
    ATTR_JOB_ID,
    ATTR_MAX_TOKENS,
    ATTR_MESSAGES,
    ATTR_TAG,
    ATTR_TEXT,
    DEFAULT_JOB_INSTRUCTIONS,
    DOMAIN,
    GENERATION_CLASSES,
    SERVICE_CANCEL_JOB,
    SERVICE_GET_JOB,
    SERVICE_SUBMIT_JOB,
)
from .jobs import job_queue, job_result_text, job_timings

if TYPE_CHECKING:
    from . import HearthConfigEntry

MESSAGE_SCHEMA = vol.Schema(
    {
        vol.Required("role"): vol.In(["system", "user", "assistant"]),
        vol.Required("content"): cv.string,
    }
)

SUBMIT_JOB_SCHEMA = vol.All(
    vol.Schema(
        {
            vol.Optional(ATTR_CONFIG_ENTRY): cv.string,
            vol.Exclusive(ATTR_TEXT, "input"): cv.string,
            vol.Exclusive(ATTR_MESSAGES, "input"): vol.All(
                cv.ensure_list, vol.Length(min=1), [MESSAGE_SCHEMA]
            ),
            vol.Optional(ATTR_INSTRUCTIONS): cv.string,
            vol.Optional(ATTR_CLASS, default="background"): vol.In(GENERATION_CLASSES),
            vol.Optional(ATTR_MAX_TOKENS): vol.All(
                vol.Coerce(int), vol.Range(min=1, max=32768)
            ),
            vol.Optional(ATTR_TAG): cv.string,
        }
    ),
    cv.has_at_least_one_key(ATTR_TEXT, ATTR_MESSAGES),
)

JOB_SCHEMA = vol.Schema(
    {
        vol.Optional(ATTR_CONFIG_ENTRY): cv.string,
        vol.Required(ATTR_JOB_ID): cv.string,
    }
)


@callback
def _async_get_entry(hass: HomeAssistant, call: ServiceCall) -> HearthConfigEntry:
    """Return the loaded entry the call names, or the only loaded one."""
    if entry_id := call.data.get(ATTR_CONFIG_ENTRY):
        entry = hass.config_entries.async_get_entry(entry_id)
        if entry is None or entry.domain != DOMAIN:
            raise ServiceValidationError(
                translation_domain=DOMAIN,
                translation_key="invalid_config_entry",
                translation_placeholders={"config_entry": entry_id},
            )
        if entry.state is not ConfigEntryState.LOADED:
            raise ServiceValidationError(
                translation_domain=DOMAIN,
                translation_key="entry_not_loaded",
                translation_placeholders={"config_entry": entry.title},
            )
        return entry
    entries = hass.config_entries.async_loaded_entries(DOMAIN)
    if not entries:
        raise ServiceValidationError(
            translation_domain=DOMAIN, translation_key="no_loaded_entry"
        )
    if len(entries) > 1:
        raise ServiceValidationError(
            translation_domain=DOMAIN, translation_key="multiple_entries"
        )
    return entries[0]


def _raise_for(entry: HearthConfigEntry, hass: HomeAssistant, err: HearthError) -> None:
    if isinstance(err, InvalidAuth):
        entry.async_start_reauth(hass)
        raise HomeAssistantError(
            translation_domain=DOMAIN, translation_key="invalid_auth"
        ) from err
    raise HomeAssistantError(
        translation_domain=DOMAIN,
        translation_key="server_error",
        translation_placeholders={"error": str(err)},
    ) from err


def _job_response(job: dict[str, Any]) -> dict[str, Any]:
    """Return a job as action response data, with its result text and timings on top."""
    return {
        **job,
        "job_id": job.get("id"),
        # Where it stands while it waits (None once it runs).
        "queue": job_queue(job),
        "result_text": job_result_text(job),
        "timings": job_timings(job),
    }


async def _async_submit_job(call: ServiceCall) -> ServiceResponse:
    hass = call.hass
    entry = _async_get_entry(hass, call)
    data = entry.runtime_data
    messages: list[dict[str, str]] = []
    instructions = call.data.get(ATTR_INSTRUCTIONS)
    if ATTR_TEXT in call.data:
        messages.append(
            {"role": "system", "content": instructions or DEFAULT_JOB_INSTRUCTIONS}
        )
        messages.append({"role": "user", "content": call.data[ATTR_TEXT]})
    else:
        if instructions:
            messages.append({"role": "system", "content": instructions})
        messages.extend(dict(message) for message in call.data[ATTR_MESSAGES])
    request: dict[str, Any] = {"messages": messages}
    if ATTR_MAX_TOKENS in call.data:
        request["max_tokens"] = call.data[ATTR_MAX_TOKENS]
    if call.context.user_id:
        request["user"] = call.context.user_id
    try:
        job = await data.client.async_submit_job(
            request, request_class=call.data[ATTR_CLASS], tag=call.data.get(ATTR_TAG)
        )
    except HearthError as err:
        _raise_for(entry, hass, err)
    data.jobs.async_track(job)
    return {"job_id": job.get("id"), "status": job.get("status"), "queue": job_queue(job)}


async def _async_job_call(call: ServiceCall, *, cancel: bool) -> ServiceResponse:
    """Look a job up, or cancel it; an unknown id is the caller's mistake."""
    hass = call.hass
    entry = _async_get_entry(hass, call)
    client = entry.runtime_data.client
    request = client.async_cancel_job if cancel else client.async_get_job
    try:
        job = await request(call.data[ATTR_JOB_ID])
    except NotFound as err:
        raise ServiceValidationError(
            translation_domain=DOMAIN,
            translation_key="unknown_job",
            translation_placeholders={"job_id": call.data[ATTR_JOB_ID]},
        ) from err
    except HearthError as err:
        _raise_for(entry, hass, err)
    if cancel:
        # The cancelled job's final event is still worth announcing.
        entry.runtime_data.jobs.async_track(job)
    return _job_response(job)


async def _async_get_job(call: ServiceCall) -> ServiceResponse:
    return await _async_job_call(call, cancel=False)


async def _async_cancel_job(call: ServiceCall) -> ServiceResponse:
    return await _async_job_call(call, cancel=True)


@callback
def async_setup_services(hass: HomeAssistant) -> None:
    """Register the job actions (once, for all entries)."""
    hass.services.async_register(
        DOMAIN,
        SERVICE_SUBMIT_JOB,
        _async_submit_job,
        schema=SUBMIT_JOB_SCHEMA,
        supports_response=SupportsResponse.OPTIONAL,
    )
    hass.services.async_register(
        DOMAIN,
        SERVICE_GET_JOB,
        _async_get_job,
        schema=JOB_SCHEMA,
        supports_response=SupportsResponse.ONLY,
    )
    hass.services.async_register(
        DOMAIN,
        SERVICE_CANCEL_JOB,
        _async_cancel_job,
        schema=JOB_SCHEMA,
        supports_response=SupportsResponse.OPTIONAL,
    )
