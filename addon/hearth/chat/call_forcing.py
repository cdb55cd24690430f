"""Jump-forward in tool calls: once a call is open, the text its schemas leave no choice in is
written for the model instead of sampled, one token at a time, from it.

That text is the rest of a tool's or an argument's name once its start is unique, the
punctuation between keys and values, and the rest of an exposed name held by an ``enum`` once
its start is unique. The engine decodes it beside the next sampled token, as a short
prefill: on a CPU a token in a batch costs a fraction of one decoded alone (the 1.5B prefills
54 tokens/s and decodes 7.9 on 2 cores), and a third of the tokens of a Home Assistant intent
call are such text (``{"name": "intent__HassTurnOn", "arguments": {"name": "Kitchen light",
"domain": ["light"]}}``: 10 of 29). Forced text ends where the model's own next token would
start (a whole name, ``": "``, never a brace or quote it writes with what follows), so its
choices keep the odds they had. The worker checks each forced token against the call's
grammar before it takes it (:meth:`hearth.llama.llama_sampling.Sampler.force`), so a guess here can
shorten what is forced, never break a held call.

Pure text in, text out: no llama.cpp here."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

# A call's object opening, as the lazy grammar's trigger sees it
# (``tool_grammars.LAZY_CALL_TRIGGER``).
_OPEN = re.compile(r'\{[ \t\n]*"name"')
# The call object's own keys, in the order the grammar holds them, and their values' schemas.
_CALL = {"name": {"type": "string"}, "arguments": {"type": "object"}}
# Scanning restarts this far back, so an opening split across two feeds is still seen.
_OVERLAP = 24


@dataclass
class _Tool:
    props: dict[str, dict[str, Any]]
    required: bool  # some argument is required: the arguments object is never empty


def _tool(spec: dict[str, Any]) -> tuple[str, _Tool]:
    fn = spec.get("function", spec)
    params = fn.get("parameters") or {}
    props = params.get("properties") or {}
    return fn["name"], _Tool({k: v for k, v in props.items() if isinstance(v, dict)},
                             bool(params.get("required")))


def _opener(schema: dict[str, Any]) -> str:
    """What a value of ``schema`` starts with, where that is fixed and ends a token of the
    model's: a string's quote, an array's bracket (and its strings' quote); nothing for numbers
    and booleans, a schema that allows several kinds, or an object (its brace is one token with
    what follows, ``{"`` or ``{}``)."""
    kind = schema.get("type")
    if kind is None and isinstance(schema.get("enum"), list) and schema["enum"] and all(
            isinstance(v, str) for v in schema["enum"]):
        kind = "string"
    if kind == "string":
        return '"'
    if kind == "array":
        items = schema.get("items")
        return "[" + ('"' if isinstance(items, dict) and _opener(items) == '"' else "")
    return ""


def _enum(schema: dict[str, Any] | None) -> list[str] | None:
    """The strings a value may take (of a string, or of an array's items), if listed."""
    if not isinstance(schema, dict):
        return None
    values = schema.get("enum")
    if isinstance(values, list) and values and all(isinstance(v, str) for v in values):
        return values
    return None


@dataclass
class _Frame:
    kind: str  # "obj" | "arr"
    key: str | None = None  # the key whose value is being written (objects)
    used: list[str] = field(default_factory=list)
    after: str = "open"  # open | key | colon | value: what was last completed


@dataclass
class _State:
    """Where a scan of an open call ended."""
    frames: list[_Frame]
    tool: str | None  # the call's tool name, once complete
    string: str | None  # the string being written (without its opening quote), if any
    role: str = ""  # "key" | "value": what that string is
    spaced: bool = False  # whitespace since the last structural character


def _scan(text: str) -> _State | None:
    """The state at the end of ``text``, a call's JSON from its opening brace; None when the
    call has closed or the text is not JSON the scanner follows."""
    frames: list[_Frame] = []
    tool: str | None = None
    buf: list[str] | None = None
    role = ""
    esc = spaced = False
    for ch in text:
        if buf is not None:
            if esc:
                buf.append(ch)
                esc = False
            elif ch == "\\":
                esc = True
            elif ch == '"':
                s, buf = "".join(buf), None
                f = frames[-1]
                if role == "key":
                    f.key, f.after = s, "key"
                    f.used.append(s)
                else:
                    if len(frames) == 1 and f.key == "name":
                        tool = s
                    f.after = "value"
                spaced = False
            else:
                buf.append(ch)
            continue
        if ch in " \t\n\r":
            spaced = True
            continue
        spaced = False
        f = frames[-1] if frames else None
        if ch == '"':
            buf = []
            role = "key" if f is not None and f.kind == "obj" and f.after in ("open", "comma") \
                else "value"
        elif ch in "{[":
            frames.append(_Frame("obj" if ch == "{" else "arr"))
        elif ch in "}]":
            if not frames:
                return None
            frames.pop()
            if not frames:
                return None  # the call closed
            frames[-1].after = "value"
        elif ch == ":" and f is not None and f.after == "key":
            f.after = "colon"
        elif ch == "," and f is not None:
            f.after = "comma"
        elif f is not None and f.after in ("colon", "comma", "open"):
            f.after = "value"  # a number, true, false, null: its characters
        elif f is None:
            return None
    if not frames:
        return None
    return _State(frames, tool, None if buf is None else "".join(buf), role, spaced)


def _complete(prefix: str, candidates: list[str], close: str) -> str:
    """The rest of the one candidate that starts with ``prefix``, then ``close``; "" while
    several do (or none). Not the start they share: cut inside the model's own tokens
    (``intent__HassTurnO``, then "n" or "ff"), the 1.5B chose wrongly and even closed the name
    there, before the grammar of a bare call holds it (its trigger is a whole tool name). A
    value's closing quote is left to the model too: written apart from the comma it usually
    comes with, it made the 1.5B end calls early."""
    fits = [c for c in candidates if c.startswith(prefix)]
    return fits[0][len(prefix):] + close if len(fits) == 1 else ""


class CallForcer:
    """What must follow the output so far, for calls of ``tools`` (OpenAI tool specs, their
    ``name`` and ``area`` enums already narrowed to the home's names)."""

    def __init__(self, tools: list[dict[str, Any]]):
        self.tools = dict(_tool(t) for t in tools)
        self.text = ""
        self._from = 0  # where the open call (or the search for one) starts

    def quiet(self, text: str) -> bool:
        """Whether no call is open in the output so far, nor would open with ``text`` after
        it: nothing would be forced while it is written (drafted tokens may go unforced)."""
        return _OPEN.search(self.text + text, self._from) is None

    def note(self, text: str) -> None:
        """Add output that needs no answer (text just forced)."""
        self.text += text

    def feed(self, text: str) -> str:
        """Add the model's ``text``; the text its call's schemas now fix ("" for none)."""
        self.text += text
        while True:
            m = _OPEN.search(self.text, self._from)
            if m is None:
                self._from = max(self._from, len(self.text) - _OVERLAP)
                return ""
            state = _scan(self.text[m.start():])
            if state is None:  # closed, or not JSON: look for the next opening after it
                self._from = m.end()
                continue
            self._from = m.start()
            return self._forced(state)

    def _forced(self, s: _State) -> str:
        depth, f = len(s.frames), s.frames[-1]
        tool = self.tools.get(s.tool) if s.tool else None
        if depth == 1:  # the call object: {"name": …, "arguments": …}
            if s.string is not None:
                if s.role == "key":
                    return _key_rest(s.string, [k for k in _CALL if k not in f.used], _CALL)
                if f.key == "name":
                    rest = _complete(s.string, list(self.tools), '"')
                    if rest.endswith('"') and "arguments" not in f.used:
                        chosen = self.tools[s.string + rest[:-1]]
                        # ' {"' is one token, and '{}' another: the brace is the model's
                        # unless an argument is required
                        rest += ', "arguments":' + (' {"' if chosen.required else "")
                    return rest
                return ""
            return _after_key(f, s.spaced, _CALL.get(f.key or ""))
        if tool is None or s.frames[1].kind != "obj" or s.frames[0].key != "arguments":
            return ""
        args = s.frames[1]
        if depth == 2:
            if s.string is not None:
                if s.role == "key":
                    left = [k for k in tool.props if k not in args.used]
                    return _key_rest(s.string, left, tool.props)
                values = _enum(tool.props.get(args.key or ""))
                return _complete(s.string, values, "") if values else ""
            return _after_key(args, s.spaced, tool.props.get(args.key or ""))
        if depth == 3 and f.kind == "arr" and s.string is not None and s.role == "value":
            values = _enum((tool.props.get(args.key or "") or {}).get("items"))
            return _complete(s.string, values, "") if values else ""
        return ""


def _key_rest(prefix: str, keys: list[str], schemas: dict[str, dict[str, Any]]) -> str:
    """The rest of a key being written, and once it is whole, ``": "`` and its value's
    opener, or only the colon before a value with none (a number's space is the model's)."""
    rest = _complete(prefix, keys, '"')
    if rest.endswith('"'):
        opener = _opener(schemas.get(prefix + rest[:-1]) or {})
        rest += ": " + opener if opener else ":"
    return rest


def _after_key(f: _Frame, spaced: bool, schema: dict[str, Any] | None) -> str:
    """After a whole key: the colon, a space and the value's opener, as far as written."""
    opener = _opener(schema or {})
    if f.after == "key":
        return ": " + opener if opener else ":"
    if f.after == "colon" and opener:
        return opener if spaced else " " + opener
    return ""

