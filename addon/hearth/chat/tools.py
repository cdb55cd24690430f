"""Tool calls: parsing them out of model output (the grammars that hold a call to its tool's
schema are in :mod:`.tool_grammars`).

Two output styles are understood:

- Hermes/Qwen: ``<tool_call>{"name": "f", "arguments": {...}}</tool_call>`` (any number, text
  before them is content). Hearth's tools-in-system-prompt fallback asks for this style.
- Llama 3.x JSON: the whole answer is ``{"name": "f", "parameters": {...}}`` (optionally after
  ``<|python_tag|>``; several separated by ``;`` or newlines).
- A fenced block (```` ```json ... ``` ````) holding such JSON, as small instruct models often
  write a call; only when every object in it names one of the request's tools.
- Such JSON between ``<tools>`` tags (the tag Qwen2.5's template lists the tools in, which
  the 1.5B copied around its calls), or right after a tool's name (``HassTurnOn{"name": …}``),
  or the pythonic style (``HassTurnOn(name="Porch light")``), only when it names one of the
  request's tools.
- Such JSON on a line of its own after some prose, when it names one of the request's tools
  (the 1.5B, asked to "turn it on then", explained which tool it would use, then called it),
  also in doubled braces (below).
- A tool may be named by its name's last part after ``__``, or with another prefix, where
  that fits one of the request's tools only (:func:`offered_name`).
- The same JSON in doubled braces, ``{{"name": "f", "arguments": {...}}}``: Qwen2.5's own chat
  template shows its call format so (a literal ``{{`` in a Jinja string), and small Qwen
  models copy it. The template is left as it is: shown with one brace, the 1.5B explained
  its calls in prose instead (5 of the first 9 commands failed so; as written, 28 of 40
  passed once these parse, ``make bench-commands MODEL=qwen1.5b``).

Parsing is linear in the output's length: model output is whatever a prompt made it write.
"""

from __future__ import annotations

import ast
import json
import re
import uuid
from typing import Any

OPEN, CLOSE = "<tool_call>", "</tool_call>"
PYTHON_TAG = "<|python_tag|>"
RESPONSE_OPEN = "<tool_response>"
FENCE = "```"
TOOLS_OPEN, TOOLS_CLOSE = "<tools>", "</tools>"
_FENCE_OPEN = re.compile(r"```[A-Za-z]*[ \t]*\n?")  # ```json, ```JSON, ``` …
LINE_CALL = "\n{"  # a call on a line of its own, after prose
_LINE_CALL_NAME = re.compile(r'\n\{\{?\s*"name"\s*:\s*"([^"\\\n]*)"')


def _call(name: str, args: Any) -> dict[str, Any]:
    if not isinstance(args, str):
        args = json.dumps(args if args is not None else {}, ensure_ascii=False)
    return {"id": "call_" + uuid.uuid4().hex[:24], "type": "function",
            "function": {"name": name, "arguments": args}}


def offered_name(name: str, names: set[str] | None) -> str | None:
    """``name`` as the request offers it: itself, or the one tool whose name ends with the
    same last part after ``__`` (Home Assistant prefixes tools with their API's name; the
    1.5B, shown ``intent__HassTurnOff``, wrote ``intent__HassLightSet`` for the offered
    ``light__HassLightSet``). None when no tool, or several, would fit."""
    if names is None or name in names:
        return name
    last = name.rsplit("__", 1)[-1]
    fits = [n for n in names if last and (n == last or n.endswith("__" + last))]
    return fits[0] if len(fits) == 1 else None


def _as_call(obj: Any, names: set[str] | None) -> dict[str, Any] | None:
    if not isinstance(obj, dict):
        return None
    name = obj.get("name")
    if name is None and names and obj.get("function") in names:
        name = obj["function"]  # {"function": "f", "arguments": …}: named by the tool itself
    if not isinstance(name, str) or (name := offered_name(name, names)) is None:
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except ValueError:
            return None
    if not isinstance(args, dict):
        return None
    return _call(name, args)


def _json_objects(text: str) -> list[Any] | None:
    """Consecutive JSON values in ``text`` separated by whitespace or ';', or None."""
    dec = json.JSONDecoder()
    out, i, n = [], 0, len(text)
    while True:
        while i < n and text[i] in " \t\r\n;":
            i += 1
        if i >= n:
            return out
        try:
            obj, i = dec.raw_decode(text, i)
        except ValueError:
            return None
        out.append(obj)


def parse_tool_calls(text: str, names: set[str] | None = None, opening: bool = True
                     ) -> tuple[str, list[dict[str, Any]]]:
    """Split model output into (content, tool_calls). Unparseable calls stay content.
    ``opening=False``: ``text`` is the rest of an answer from a sign of a call on (a stream's),
    where only what may follow prose counts."""
    if OPEN in text:
        return _hermes_calls(text, names)
    body = text.strip()
    if names and FENCE in body:
        fenced = _fenced_calls(body, names)
        if fenced is not None:
            return fenced
    if names and TOOLS_OPEN in body:
        tagged = _tagged_calls(body, names)
        if tagged is not None:
            return tagged
    if opening:
        if names and (named := _named_call(body, names)) is not None:
            return "", [named]
        if body.startswith(PYTHON_TAG):
            body = body[len(PYTHON_TAG):]
        if body.startswith("{") and (calls := _bare_calls(body, names)) is not None:
            return "", calls
    src = body if opening else text  # unstripped, a stream's rest may open with the line
    if (names and (at := _line_call(src, names)) >= opening
            and (calls := _bare_calls(src[at:], names)) is not None):
        return src[:at].rstrip(), calls
    return text, []


def _bare_calls(text: str, names: set[str] | None) -> list[dict[str, Any]] | None:
    """The calls bare JSON ``text`` makes, or None. Small models go on to make up the tool's
    answer after their call: it is not theirs."""
    text = text.split(RESPONSE_OPEN, 1)[0].strip()
    return _all_calls(_undoubled(text) if text.startswith("{{") else _json_objects(text), names)


def _line_call(body: str, names: set[str]) -> int:
    """Where a JSON call of one of ``names`` starts a line of ``body`` after prose, or -1."""
    return next((m.start() for m in _LINE_CALL_NAME.finditer(body)
                 if offered_name(m[1], names) is not None), -1)


def _all_calls(objs: list[Any] | None, names: set[str] | None) -> list[dict[str, Any]] | None:
    """Every one of ``objs`` as a call of the request's tools, or None (none, or one is
    not)."""
    calls = [_as_call(o, names) for o in objs or ()]
    if not calls or any(c is None for c in calls):
        return None
    return calls  # type: ignore[return-value]


def _undoubled(body: str) -> list[Any] | None:
    """The one object inside ``{{ … }}``; the closing braces may be one short (the grammar
    below ends the call with its object) or over."""
    try:
        obj, end = json.JSONDecoder().raw_decode(body, 1)
    except ValueError:
        return None
    return [obj] if not body[end:].strip().strip("}") else None


def _hermes_calls(text: str, names: set[str] | None) -> tuple[str, list[dict[str, Any]]]:
    """``<tool_call>…</tool_call>`` blocks (the last may lack its close), found with str.find:
    a regex with lazy groups between whitespace runs backtracks quadratically."""
    calls, content, pos = [], [], 0
    while (at := text.find(OPEN, pos)) >= 0:
        content.append(text[pos:at])
        start = at + len(OPEN)
        end = text.find(CLOSE, start)
        body = text[start:] if end < 0 else text[start:end]
        pos = len(text) if end < 0 else end + len(CLOSE)
        try:
            call = _as_call(json.loads(body), names)
        except ValueError:
            return text, []
        if call is None:
            return text, []
        calls.append(call)
    content.append(text[pos:])
    return "".join(content).strip(), calls


def _fenced_calls(body: str, names: set[str]) -> tuple[str, list[dict[str, Any]]] | None:
    """A fenced block that holds only calls of the request's tools, at the end of the answer
    (text before it stays content); None when the answer is anything else."""
    at = body.rfind(FENCE, 0, len(body) - len(FENCE)) if body.endswith(FENCE) else -1
    if at < 0:
        return None
    m = _FENCE_OPEN.match(body, at)
    if m is None:
        return None
    calls = _all_calls(_json_objects(body[m.end():len(body) - len(FENCE)]), names)
    return None if calls is None else (body[:at].strip(), calls)


def _tagged_calls(body: str, names: set[str]) -> tuple[str, list[dict[str, Any]]] | None:
    """Calls of the request's tools between ``<tools>`` tags at the end of the answer (the
    close may be missing; text before stays content); None when the answer is anything
    else."""
    at = body.rfind(TOOLS_OPEN)
    end = body.find(TOOLS_CLOSE, at)
    if end >= 0 and body[end + len(TOOLS_CLOSE):].strip():
        return None
    calls = _all_calls(
        _json_objects(body[at + len(TOOLS_OPEN):end if end >= 0 else len(body)]), names)
    return None if calls is None else (body[:at].strip(), calls)


def _named_call(body: str, names: set[str]) -> dict[str, Any] | None:
    """The whole answer as a tool's name and its arguments: a JSON object, or keywords as a
    Python call writes them (``HassTurnOn(name="Porch light")``, the pythonic style Llama
    3.2 uses, also in braces); None when it is anything else."""
    name = max((n for n in names if body.startswith(n)), key=len, default=None)
    if name is None:
        return None
    rest = body[len(name):].strip()
    args = _json_objects(rest)
    if args and len(args) == 1 and isinstance(args[0], dict):
        return _call(name, args[0])
    if rest[:1] == "{" and rest[-1:] == "}":
        rest = f"({rest[1:-1]})"
    keywords = _keywords(rest) if rest[:1] == "(" and rest[-1:] == ")" else None
    return None if keywords is None else _call(name, keywords)


def _keywords(call: str) -> dict[str, Any] | None:
    """``(a="x", b=2)`` as ``{"a": "x", "b": 2}``: literal values only, read by Python's
    parser (never evaluated); None for anything else."""
    try:
        tree = ast.parse("f" + call, mode="eval").body
        if not isinstance(tree, ast.Call) or tree.args:
            return None
        return {k.arg: ast.literal_eval(k.value) for k in tree.keywords if k.arg}
    except (SyntaxError, ValueError, TypeError, RecursionError, MemoryError):
        return None


class ToolStream:
    """Streams content while watching for tool calls: text before a call streams at once;
    from the first sign of a call the rest is held and parsed when generation ends. With tool
    names to match, a code fence is such a sign too (a call the model fenced). Linear in the
    output: held text is kept as parts, joined once."""

    def __init__(self, names: set[str] | None):
        self.names = names
        self.markers = (OPEN, FENCE, TOOLS_OPEN, LINE_CALL) if names else (OPEN,)
        # an answer may open with a tool's name, its arguments after it
        self.openings = (PYTHON_TAG, *self.markers, *sorted(names or ()))
        self.blank: list[str] = []  # leading whitespace, held until the first visible text
        self.held = ""  # a tail that may still grow into a marker
        self.captured: list[str] = []  # from the first sign of a call on
        self.capturing = False
        self.seen_text = False

    def feed(self, text: str) -> str:
        if self.capturing:
            self.captured.append(text)
            return ""
        if not self.seen_text:
            lead = (self.held + text).lstrip()
            if not lead:
                self.blank.append(text)
                return ""
            buf = "".join(self.blank) + self.held + text
            self.blank, self.held = [], ""
            if lead.startswith(("{", *self.openings)):
                self.capturing = True  # the answer opens as a call (JSON style or Hermes)
                self.captured = [buf]
                return ""
            if any(m.startswith(lead) for m in self.openings):
                self.blank, self.held = [buf[:len(buf) - len(lead)]], lead  # may become one
                return ""
            self.seen_text = True
        else:
            buf, self.held = self.held + text, ""
        found = [at for m in self.markers if (at := buf.find(m)) >= 0]
        if found:
            self.capturing = True
            self.captured = [buf[min(found):]]
            return buf[:min(found)]
        keep = 0
        for m in self.markers:
            for k in range(min(len(m) - 1, len(buf)), keep, -1):
                if buf.endswith(m[:k]):
                    keep = k
                    break
        self.held = buf[len(buf) - keep:]
        return buf[: len(buf) - keep]

    def finish(self) -> tuple[str, list[dict[str, Any]]]:
        """(remaining content, tool calls) once generation has ended."""
        held = "".join(self.blank) + self.held + "".join(self.captured)
        self.blank, self.held, self.captured = [], "", []
        if not held:
            return "", []
        if not self.seen_text:
            return parse_tool_calls(held, self.names)
        # Held from a marker after text: it cannot open the answer (as ``{{`` may), and the
        # whitespace it starts with (the line call's newline) parts the text from the rest.
        content, calls = parse_tool_calls(held, self.names, opening=False)
        lead = held[:len(held) - len(held.lstrip())]
        return (lead + content.lstrip() if content.strip() else content), calls
