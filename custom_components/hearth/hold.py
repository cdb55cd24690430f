"""A spoken hold phrase for a voice turn that must wait.

A voice turn waiting behind other work (a model loading, a long prompt of another class) leaves
the speaker silent. Streaming text-to-speech starts on the first words of the reply, so when the
server reports that the wait will pass the agent's threshold (a ``: queued ... eta_s=X`` comment
with X above it), or no token has come once the threshold has passed, the reply starts with a
short phrase in the turn's language ("One moment.") and the real answer follows in the same
reply. Said at most once a turn, never after the turn has said something of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from .sse import QueueStatus

# By the language's primary subtag; English for the others.
HOLD_PHRASES: dict[str, str] = {
    "en": "One moment.",
    "de": "Einen Moment.",
    "fr": "Un instant.",
    "es": "Un momento.",
    "it": "Un momento.",
    "pt": "Um momento.",
    "nl": "Een moment.",
    "sv": "Ett ögonblick.",
    "da": "Et øjeblik.",
    "nb": "Et øyeblikk.",
    "no": "Et øyeblikk.",
    "fi": "Hetkinen.",
    "pl": "Chwileczkę.",
    "cs": "Moment.",
    "ru": "Минутку.",
    "uk": "Хвилинку.",
    "tr": "Bir saniye.",
    "ja": "少々お待ちください。",
    "zh": "请稍等。",
    "ko": "잠시만요.",
}


def hold_phrase(language: str | None) -> str:
    """The hold phrase in ``language`` (a tag such as ``de-CH``), English where none is known."""
    primary = (language or "").replace("_", "-").split("-")[0].lower()
    return HOLD_PHRASES.get(primary, HOLD_PHRASES["en"])


def has_token(chunk: dict[str, Any]) -> bool:
    """Whether a chat-completion chunk carries generated output (not just the role)."""
    for choice in chunk.get("choices") or ():
        delta = choice.get("delta") or {}
        if delta.get("content") or delta.get("tool_calls") or delta.get("reasoning_content"):
            return True
    return False


@dataclass(slots=True)
class _Failed:
    error: Exception


_HOLD = object()  # the phrase is due
_END = object()


class HoldPhrase:
    """One voice turn's hold phrase.

    Each request of the turn is streamed through :meth:`speak` (its deltas) with its chunks
    through :meth:`watch` and its queue status to :meth:`queued`. The deltas are produced in a
    task of their own, so that the phrase can go out while the request still waits for its
    first token.
    """

    def __init__(self, phrase: str, after_s: float) -> None:
        """``phrase`` is said when the wait passes ``after_s`` seconds."""
        self.phrase = phrase
        self.after_s = after_s
        self.said = False  # the phrase went out
        self.spoken = False  # the turn said something of its own
        self.last_status: QueueStatus | None = None
        self._queue: asyncio.Queue[Any] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._due_sent = False

    @property
    def _armed(self) -> bool:
        return not (self.said or self.spoken or self._due_sent) and self._queue is not None

    def _due(self) -> None:
        if self._armed and self._queue is not None:
            self._due_sent = True
            self._queue.put_nowait(_HOLD)

    def queued(self, status: QueueStatus) -> None:
        """The server reports the request waiting: the phrase is due if the wait it expects
        passes the threshold."""
        self.last_status = status
        if status.eta_s is not None and status.eta_s > self.after_s:
            self._due()

    async def watch(self, chunks: AsyncIterator[dict[str, Any]]) -> AsyncIterator[dict[str, Any]]:
        """Pass a request's chunks on; its first token disarms the phrase's timer."""
        async for chunk in chunks:
            if self._timer is not None and has_token(chunk):
                self._timer.cancel()
                self._timer = None
            yield chunk

    async def speak(self, deltas: AsyncIterator[Any]) -> AsyncIterator[Any]:
        """Pass a request's chat-log deltas on, the hold phrase first when it falls due
        (right after the assistant's role delta)."""
        if self.said or self.spoken:
            async for delta in deltas:
                yield delta
            return
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Any] = asyncio.Queue()
        self._queue, self._due_sent = queue, False
        self._timer = loop.call_later(self.after_s, self._due)
        producer = loop.create_task(self._produce(deltas, queue))
        began = pending = False
        try:
            while (item := await queue.get()) is not _END:
                if isinstance(item, _Failed):
                    raise item.error
                if item is _HOLD:
                    if self.spoken:
                        continue
                    if began:
                        self.said = True
                        yield {"content": self.phrase + " "}
                    else:
                        pending = True
                    continue
                yield item
                if item.get("role") == "assistant" and not began:
                    began = True
                    if pending:
                        self.said = True
                        yield {"content": self.phrase + " "}
                if item.get("content"):
                    self.spoken = True
        finally:
            if self._timer is not None:
                self._timer.cancel()
            self._timer = self._queue = None
            if not producer.done():
                producer.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await producer

    @staticmethod
    async def _produce(deltas: AsyncIterator[Any], queue: asyncio.Queue[Any]) -> None:
        try:
            async for delta in deltas:
                queue.put_nowait(delta)
        except Exception as err:  # handed to the consumer, which raises it
            queue.put_nowait(_Failed(err))
        else:
            queue.put_nowait(_END)
