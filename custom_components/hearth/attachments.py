"""Attachments (a camera snapshot for an AI Task) as OpenAI content parts.

Images travel as `image_url` parts with a base64 `data:` URL, the shape every OpenAI-compatible
server reads; whether the model can see them is the server's to say (a model without vision
support answers a clear 400). Other kinds of file are refused here, by name.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable
from typing import Any

from homeassistant.components import conversation
from homeassistant.core import HomeAssistant
from homeassistant.exceptions import HomeAssistantError

from .const import DOMAIN


def _parts(text: str, attachments: Iterable[conversation.Attachment]) -> list[dict[str, Any]]:
    """The message's text, then one part per attachment (reads the files: run in an executor)."""
    parts: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
    for attachment in attachments:
        mime_type = attachment.mime_type or ""
        if not mime_type.startswith("image/"):
            raise HomeAssistantError(
                translation_domain=DOMAIN,
                translation_key="unsupported_attachments",
                translation_placeholders={"mime_type": mime_type or "unknown"},
            )
        try:
            data = attachment.path.read_bytes()
        except OSError as err:
            raise HomeAssistantError(
                translation_domain=DOMAIN,
                translation_key="attachment_unreadable",
                translation_placeholders={"path": str(attachment.path), "error": str(err)},
            ) from err
        encoded = base64.b64encode(data).decode("ascii")
        parts.append(
            {"type": "image_url", "image_url": {"url": f"data:{mime_type};base64,{encoded}"}}
        )
    return parts


async def async_add_attachments(
    hass: HomeAssistant,
    contents: Iterable[conversation.Content],
    messages: list[dict[str, Any]],
) -> None:
    """Turn the user messages whose chat-log entry has attachments into content parts, in place.

    ``messages`` are the converted ``contents``, one for one.
    """
    for content, message in zip(contents, messages, strict=True):
        attachments = getattr(content, "attachments", None)
        if isinstance(content, conversation.UserContent) and attachments:
            message["content"] = await hass.async_add_executor_job(
                _parts, message["content"], list(attachments)
            )
