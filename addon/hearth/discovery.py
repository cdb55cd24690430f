"""Announce the running add-on to Home Assistant through the Supervisor's discovery API.

Inside the add-on the Supervisor sets ``SUPERVISOR_TOKEN``; once the server listens, a
``POST http://supervisor/discovery`` with ``{"service": "hearth", "config": {...}}`` makes Home
Assistant offer the Hearth integration (its ``hassio`` config-flow step). ``host`` is the add-on
container's hostname, reachable from Home Assistant on the internal network whether or not the
port is published. Outside the add-on (no token) nothing is sent.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from typing import TYPE_CHECKING, Any

import aiohttp

if TYPE_CHECKING:
    from .settings import Settings

log = logging.getLogger(__name__)

SERVICE = "hearth"
SUPERVISOR_URL = "http://supervisor"
TOKEN_ENV = "SUPERVISOR_TOKEN"


def discovery_config(settings: Settings, hostname: str | None = None) -> dict[str, Any]:
    """The ``config`` part of the announcement: where and how Home Assistant reaches us."""
    config: dict[str, Any] = {"host": hostname or socket.gethostname(), "port": settings.port}
    if settings.api_key:
        config["api_key"] = settings.api_key
    return config


async def announce(
    settings: Settings,
    session: aiohttp.ClientSession,
    *,
    supervisor_url: str = SUPERVISOR_URL,
    token: str | None = None,
    hostname: str | None = None,
    attempts: int = 4,
    backoff: float = 1.0,
    request_timeout: float = 10.0,
) -> bool:
    """Send the discovery message. True when the Supervisor accepted it (2xx).

    Never raises on network or HTTP errors: they are logged and answered with False.
    Connection errors, timeouts, 429 and 5xx are retried up to ``attempts`` times with
    exponential backoff (``backoff``, 2×, 4× … seconds); other 4xx answers are final. The API key
    is never logged.
    """
    token = token or os.environ.get(TOKEN_ENV)
    if not token:
        log.debug("no %s: not running as a Home Assistant add-on, discovery skipped", TOKEN_ENV)
        return False

    config = discovery_config(settings, hostname)
    payload = {"service": SERVICE, "config": config}
    url = supervisor_url.rstrip("/") + "/discovery"
    headers = {"Authorization": f"Bearer {token}"}
    where = f"{config['host']}:{config['port']}"
    secrets = [s for s in (settings.api_key, token) if s]

    def redact(text: str) -> str:
        for s in secrets:
            text = text.replace(s, "***")
        return text

    attempts = max(1, attempts)
    for attempt in range(1, attempts + 1):
        try:
            async with session.post(url, json=payload, headers=headers,
                                    timeout=aiohttp.ClientTimeout(total=request_timeout)) as resp:
                if 200 <= resp.status < 300:
                    log.info("announced Hearth to Home Assistant (Supervisor discovery, %s%s)",
                             where, ", API key required" if settings.api_key else "")
                    return True
                body = redact((await resp.text(errors="replace"))[:300])
                retryable = resp.status >= 500 or resp.status == 429
                log.warning("Supervisor discovery answered %d (attempt %d/%d): %s",
                            resp.status, attempt, attempts, body)
                if not retryable:
                    return False
        except (aiohttp.ClientError, TimeoutError, OSError) as e:
            log.warning("Supervisor discovery failed (attempt %d/%d): %s",
                        attempt, attempts, redact(str(e) or type(e).__name__))
        if attempt < attempts:
            await asyncio.sleep(backoff * 2 ** (attempt - 1))
    log.error("could not announce Hearth to Home Assistant; add the integration by hand "
              "with the URL http://%s", where)
    return False
