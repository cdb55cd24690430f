"""Reasoning ("thinking") text split from the answer, as llama-server and DeepSeek do: a model's
chain of thought between ``<think>`` and ``</think>`` (or a template's own markers) becomes
``reasoning_content``, the rest ``content``.

Pure Python. The engine feeds :class:`ReasoningSplitter` each token's text before stop strings
are matched, so stops and tool-call parsing only ever see the answer.
"""

from __future__ import annotations

THINK = ("<think>", "</think>")
# (open, close) pairs of chat templates known to reason; the first whose close marker the
# template mentions wins, else <think>.
MARKERS = (THINK, ("<thinking>", "</thinking>"), ("[THINK]", "[/THINK]"),
           ("<|START_THINKING|>", "<|END_THINKING|>"), ("<seed:think>", "</seed:think>"),
           ("◁think▷", "◁/think▷"))


def markers_for(template: str) -> tuple[str, str]:
    return next((m for m in MARKERS if m[1] in template), THINK)


def prompt_opens(prompt: str, markers: tuple[str, str] = THINK) -> bool:
    """Whether the rendered prompt itself opens the reasoning (DeepSeek-R1, QwQ templates):
    then the output starts mid-reasoning and only has the close marker."""
    return prompt.rstrip().endswith(markers[0])


def split_reasoning(text: str, started: bool = False,
                    markers: tuple[str, str] = THINK) -> tuple[str, str]:
    """(reasoning, answer) of a whole output. Reasoning only when the output opens with the
    marker (or ``started``); otherwise ("", text) unchanged. Unterminated: all reasoning."""
    open_, close = markers
    lead = text.lstrip()
    if lead.startswith(open_):
        body = lead[len(open_):]
    elif started:
        body = text
    else:
        return "", text
    reasoning, _, answer = body.partition(close)
    return reasoning.strip(), answer.lstrip()


def _partial(buf: str, marker: str) -> int:
    """Length of the longest tail of ``buf`` that could still grow into ``marker``."""
    for k in range(min(len(marker) - 1, len(buf)), 0, -1):
        if buf.endswith(marker[:k]):
            return k
    return 0


class ReasoningSplitter:
    """:func:`split_reasoning` on a stream: ``feed`` once per generated token, ``flush`` at the
    end; the pieces joined equal the whole-text split. What is not yet decided (a possible
    marker prefix, whitespace the split may strip) is held back, as partial UTF-8 is."""

    def __init__(self, started: bool = False, markers: tuple[str, str] = THINK):
        self.open, self.close = markers
        self.started = started
        self.state = "start"  # start -> think -> lead (whitespace after close) -> answer
        self.held = ""
        self.emitted = False  # any reasoning out yet (before it, whitespace is stripped)
        self.tokens = 0
        self.reasoning_tokens = 0  # tokens up to and including the one closing the reasoning

    def feed(self, text: str) -> tuple[str, str]:
        """(reasoning, answer) pieces now safe to emit."""
        self.tokens += 1
        return self._step(text, final=False)

    def flush(self, text: str = "") -> tuple[str, str]:
        """The last pieces, once generation has ended (``text``: a final, non-token tail)."""
        return self._step(text, final=True)

    def _step(self, text: str, final: bool) -> tuple[str, str]:
        buf, self.held = self.held + text, ""
        reasoning = answer = ""
        if self.state == "start":
            lead = buf.lstrip()
            if lead.startswith(self.open):
                self.state, buf = "think", lead[len(self.open):]
            elif not final and self.open.startswith(lead):
                self.held = buf  # may still become the open marker
                return "", ""
            else:
                self.state = "think" if self.started else "answer"
        if self.state == "think":
            at = buf.find(self.close)
            if at >= 0:
                reasoning, buf = buf[:at].rstrip(), buf[at + len(self.close):]
                self.state, self.reasoning_tokens = "lead", self.tokens
            elif final:
                reasoning, buf = buf.rstrip(), ""
                self.reasoning_tokens = self.tokens
            else:
                safe = buf[: len(buf) - _partial(buf, self.close)]
                reasoning = safe.rstrip()  # trailing whitespace waits: it may precede the close
                self.held, buf = buf[len(reasoning):], ""
            if not self.emitted:
                reasoning = reasoning.lstrip()
                self.emitted = bool(reasoning)
        if self.state == "lead":
            buf = buf.lstrip()
            if buf:
                self.state = "answer"
        if self.state == "answer":
            answer = buf
        return reasoning, answer
