"""The Hearth demo: the server and a local Home Assistant with the integration, a dashboard and
demo entities (``make run``), a household load generator (``make demo-load``), used by the
end-to-end browser test (``make e2e``)."""

from .haclient import HAError, HomeAssistantClient
from .load import VOICE_LINES, LoadResult, run_load
from .stack import AGENT_ID, DemoSettings, DemoStack

__all__ = ["AGENT_ID", "VOICE_LINES", "DemoSettings", "DemoStack", "HAError",
           "HomeAssistantClient", "LoadResult", "run_load"]
