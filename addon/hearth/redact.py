"""Secrets out of what is shown: a URL's user and password (``http://user:pw@host``) and
key-like query values are replaced wherever a URL is shown or logged (a remote worker's URL,
a model's download URL, an error that quotes either)."""

from __future__ import annotations

import logging
import re

_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/\s@?#]+@")
_QUERY_SECRET = re.compile(r"(?i)([?&](?:key|api_key|apikey|token|access_token|password|"
                           r"sig|signature)=)[^&#\s]+")


def redact(text: str) -> str:
    if "://" not in text and "=" not in text:
        return text
    return _QUERY_SECRET.sub(r"\1***", _USERINFO.sub(r"\1***@", text))


class RedactFilter(logging.Filter):
    """Redacts each record's message once it is formatted (handlers' filters run for every
    logger's records, the native log's included)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        clean = redact(message)
        if clean != message:
            record.msg, record.args = clean, None
        return True


def install() -> None:
    for handler in logging.getLogger().handlers:
        if not any(isinstance(f, RedactFilter) for f in handler.filters):
            handler.addFilter(RedactFilter())
