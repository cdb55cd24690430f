"""Answers that are not answers, as small models now and then write them, caught before they
are shown or spoken:

- a turn's first answer that describes a tool call instead of making it ("To turn on the
  kitchen light, use the `intent__HassTurnOn` function."): asked again with a call of the tool
  it named required (not any call: small models asked for just "a call" picked an action for a
  question whose answer had named the tool that reads the home);
- an answer that only repeats the user's words or a sentence of the agent's own guidance
  ("Is the kitchen light on?" after reading the home), is markup alone ("<tools></tools>"), or
  has no text at all: asked again as it was.

With tools offered, an answer's sentences are held back until each ends; a sentence that names
an offered tool (and all after it) or repeats such words is held. If the answer then made no
call and said nothing else, the agent asks once more, and the held text is said only if that
brings nothing better. The prompt is the same, so the server's prefix cache serves the second
ask: it costs its own tokens only.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Callable, Collection
from dataclasses import dataclass, field
from typing import Any

# Where a sentence ends: after . ! ? or : and a space, or at a line break (not inside "2.5").
_SENTENCE_END = re.compile(r"(?<=[.!?:])\s+|\n")
_PLAIN_WORD = re.compile(r"[a-z]+")
_CAMEL = r"(?<=[a-z])(?=[A-Z])"  # where a capitalised word starts inside another
# A sentence this long is let through up to its last word: a described call names its tool
# early ("To turn on the kitchen light, use the `intent__HassTurnOn` function"), and a long
# sentence must not keep a slow model's answer from the screen and the speaker.
LONGEST_HELD = 160
# Markup alone ("<tools></tools>", the chat template's own tags) says nothing either.
_ONLY_TAGS = re.compile(r"(?:\s*</?[A-Za-z_]+>)+\s*")
AGAIN = "auto"  # the tool_choice of an answer asked again as it was


def named_tool(text: str, offered: Collection[str]) -> str | None:
    """The offered tool that ``text`` names, as a word: by its whole name, or by the part after
    its prefix (``HassTurnOn`` for ``intent__HassTurnOn``, also when the text gives it another
    prefix, or one run into it: ``intent__HassGetLiveContext`` for ``GetLiveContext``). A name
    that is a plain word (``search``) does not count: prose uses it as a word."""
    for name in sorted(offered):
        for spelling in {name, name.rpartition("__")[2]}:
            if not _PLAIN_WORD.fullmatch(spelling) and re.search(
                    rf"(?:(?<!\w)|(?<=__)|{_CAMEL}){re.escape(spelling)}(?!\w)", text):
                return name
    return None


def _words(text: str) -> str:
    return " ".join(re.findall(r"[^\W_]+", text.lower()))


@dataclass(frozen=True)
class Rescue:
    """What one model answer may fall back on: the tools offered, the words an answer must not
    merely repeat, whether a described call is asked again (a turn's first answer only: later
    ones follow tool results), and the request again with a given ``tool_choice``."""

    offered: Collection[str]
    ask: Callable[[str | dict[str, Any]], AsyncIterator[dict[str, Any]]]
    echoes: Collection[str] = ()
    described: bool = True
    _echo_words: frozenset[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_echo_words", frozenset(
            w for w in map(_words, self.echoes) if w))

    def is_echo(self, sentence: str) -> bool:
        """Whether ``sentence`` only repeats words it must not, or is markup alone."""
        return _words(sentence) in self._echo_words or bool(_ONLY_TAGS.fullmatch(sentence))


class HeldSentences:
    """The text of one streamed answer, let through a sentence at a time; what it held back is
    :attr:`held`, and :attr:`retry` says how to ask again (None: do not)."""

    def __init__(self, rescue: Rescue) -> None:
        self.rescue = rescue
        self.named: str | None = None
        self.held = ""
        self.shown = False  # words let through: the answer said something
        self._pending = ""

    @property
    def retry(self) -> str | dict[str, Any] | None:
        """The ``tool_choice`` to ask again with (when the answer made no call): the named
        tool's, or as it was where the answer said nothing at all, an echo or no text (the
        1.5B, told "turn it on then" after a question, began a made-up tool result, which the
        server cuts, in 5 of 24 samples)."""
        if self.named is not None:
            return {"type": "function", "function": {"name": self.named}}
        return AGAIN if not self.shown else None

    def feed(self, text: str) -> str:
        """The text that can be shown now."""
        if self.named is not None:
            self.held += text
            return ""
        self._pending += text
        out = []
        while match := _SENTENCE_END.search(self._pending):
            sentence, rest = self._pending[: match.end()], self._pending[match.end():]
            if self._described(sentence, rest):
                break
            self._pending = rest
            if not self._echo(sentence):
                out.append(sentence)
        if (self.named is None and len(self._pending) > LONGEST_HELD
                and not self._described(self._pending, "")):
            cut = self._pending.rfind(" ") + 1
            out.append(self._pending[:cut])
            self._pending = self._pending[cut:]
        return self._let_through("".join(out))

    def finish(self) -> str:
        """At the stream's end: its last sentence, unless that is held."""
        rest, self._pending = self._pending, ""
        if self._described(rest, "") or self._echo(rest):
            return ""
        return self._let_through(rest)

    def _described(self, sentence: str, rest: str) -> bool:
        """Whether ``sentence`` names a tool: then it and all after it are held."""
        if self.rescue.described and (name := named_tool(sentence, self.rescue.offered)):
            self.named, self.held, self._pending = name, self.held + sentence + rest, ""
            return True
        return False

    def _echo(self, sentence: str) -> bool:
        """Whether ``sentence`` only repeats words the answer must not repeat: held."""
        if sentence.strip() and self.rescue.is_echo(sentence):
            self.held += sentence
            return True
        return False

    def _let_through(self, text: str) -> str:
        self.shown = self.shown or bool(text.strip())
        return text
