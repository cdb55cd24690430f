"""Loaded before Home Assistant's test plugin: `pytest -p tests.ha.preload tests/ha`.

The newest test plugin (0.13.375) pins Home Assistant 2026.10.4 and, run against 2026.11.0,
trips over two changes of that release; both are the plugin's to fix, so they are bridged here
and never in the integration:
- Home Assistant 2026.11 aliases `httpx` to `httpx2` when it is first imported, and refuses once
  `httpx` is already imported; the plugin imports `respx` (and so `httpx`) before Home
  Assistant. Importing Home Assistant first puts the alias in place.
- `_clear_logger_overwrites` moved from `homeassistant.components.logger` to its `helpers`
  module; the plugin still imports it from the old place.
Harmless on the releases the plugin was made for.
"""

import homeassistant  # noqa: F401  (before the plugin imports httpx)
from homeassistant.components import logger

if not hasattr(logger, "_clear_logger_overwrites"):
    from homeassistant.components.logger import helpers as _logger_helpers

    logger._clear_logger_overwrites = _logger_helpers._clear_logger_overwrites
