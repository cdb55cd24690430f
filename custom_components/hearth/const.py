"""Constants for the Hearth integration."""

from __future__ import annotations

import logging
from typing import Final

from homeassistant.const import CONF_LLM_HASS_API
from homeassistant.helpers import llm

DOMAIN: Final = "hearth"
LOGGER = logging.getLogger(__package__)

DEFAULT_NAME: Final = "Hearth"
DEFAULT_CONVERSATION_NAME: Final = "Hearth conversation"
DEFAULT_AI_TASK_NAME: Final = "Hearth AI Task"

# Request classes of the Hearth server, highest priority first.
REQUEST_CLASSES: Final = ("voice", "chat", "agent", "background", "embedding")
INTERACTIVE_CLASSES: Final = ("voice", "chat")
# Classes an agent or AI task may be pinned to (embedding is for /v1/embeddings only).
GENERATION_CLASSES: Final = ("voice", "chat", "agent", "background")
CLASS_POLICY_AUTO: Final = "auto"

# Subentry options
CONF_PROMPT: Final = "prompt"
CONF_MAX_TOKENS: Final = "max_tokens"
CONF_TEMPERATURE: Final = "temperature"
CONF_MAX_HISTORY: Final = "max_history"
CONF_CLASS_POLICY: Final = "class_policy"
CONF_REQUEST_CLASS: Final = "request_class"
CONF_MODEL: Final = "model"
CONF_CONFIRM_ACTIONS: Final = "confirm_actions"
# A voice turn that waits says a short hold phrase first (:mod:`.hold`).
CONF_HOLD_PHRASE: Final = "hold_phrase"
CONF_HOLD_AFTER: Final = "hold_after_s"
# The subentry's model option when it leaves the model to the server: each class's own.
MODEL_CLASS_DEFAULT: Final = "class_default"

DEFAULT_MAX_TOKENS: Final = 512
DEFAULT_TEMPERATURE: Final = 0.7
DEFAULT_MAX_HISTORY: Final = 20
DEFAULT_HOLD_PHRASE: Final = True
DEFAULT_HOLD_AFTER: Final = 2.0
DEFAULT_AI_TASK_CLASS: Final = "background"
DEFAULT_AI_TASK_MAX_TOKENS: Final = 1024

RECOMMENDED_CONVERSATION_OPTIONS: Final = {
    CONF_PROMPT: llm.DEFAULT_INSTRUCTIONS_PROMPT,
    CONF_LLM_HASS_API: [llm.LLM_API_ASSIST],
    CONF_MAX_TOKENS: DEFAULT_MAX_TOKENS,
    CONF_TEMPERATURE: DEFAULT_TEMPERATURE,
    CONF_MAX_HISTORY: DEFAULT_MAX_HISTORY,
    CONF_CLASS_POLICY: CLASS_POLICY_AUTO,
    CONF_MODEL: MODEL_CLASS_DEFAULT,
    CONF_CONFIRM_ACTIONS: True,
    CONF_HOLD_PHRASE: DEFAULT_HOLD_PHRASE,
    CONF_HOLD_AFTER: DEFAULT_HOLD_AFTER,
}
RECOMMENDED_AI_TASK_OPTIONS: Final = {
    CONF_REQUEST_CLASS: DEFAULT_AI_TASK_CLASS,
    CONF_MAX_TOKENS: DEFAULT_AI_TASK_MAX_TOKENS,
    CONF_MODEL: MODEL_CLASS_DEFAULT,
}

# Header the server also accepts the class in.
CLASS_HEADER: Final = "X-Hearth-Class"
# Header naming a voice turn's satellite: a newer turn of it supersedes one still waiting.
SATELLITE_HEADER: Final = "X-Hearth-Satellite"
# What /health's features name when the server takes reservations on a wake word.
RESERVATION_FEATURE: Final = "reservation"

# Limits of the conversation tool loop.
MAX_TOOL_ITERATIONS: Final = 10

# Polling and timeouts (seconds).
# Queue health is pushed over QUEUE_EVENTS_PATH by servers whose /health features name
# QUEUE_EVENTS_FEATURE; older servers are polled (GET /v1/queue) this often.
QUEUE_EVENTS_PATH: Final = "/v1/queue/events"
QUEUE_EVENTS_FEATURE: Final = "queue_events"
QUEUE_POLL_INTERVAL: Final = 60
REQUEST_TIMEOUT: Final = 10
STREAM_READ_TIMEOUT: Final = 300
# A warm-up is answered once its prompt is computed as background work: it may wait its turn.
WARM_UP_TIMEOUT: Final = 300
EVENTS_READ_TIMEOUT: Final = 60  # the server sends a keepalive comment every 15 s
EVENTS_BACKOFF_MIN: Final = 1.0
EVENTS_BACKOFF_MAX: Final = 60.0
JOB_POLL_INTERVAL: Final = 5.0
EVENTS_RETRY_UNSUPPORTED: Final = 300.0

# Background-job actions and event
SERVICE_SUBMIT_JOB: Final = "submit_job"
SERVICE_GET_JOB: Final = "get_job"
SERVICE_CANCEL_JOB: Final = "cancel_job"
EVENT_JOB_FINISHED: Final = "hearth_job_finished"
JOB_TERMINAL_STATES: Final = frozenset({"done", "failed", "cancelled"})
DEFAULT_JOB_INSTRUCTIONS: Final = (
    "Summarize the following for a household member in a few short sentences."
)

ATTR_CONFIG_ENTRY: Final = "config_entry_id"
ATTR_TEXT: Final = "text"
ATTR_MESSAGES: Final = "messages"
ATTR_INSTRUCTIONS: Final = "instructions"
ATTR_CLASS: Final = "class"
ATTR_MAX_TOKENS: Final = "max_tokens"
ATTR_TAG: Final = "tag"
ATTR_JOB_ID: Final = "job_id"
