"""Tool calls: parsing them out of model output, and grammars that force a valid one.

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
  (the 1.5B, asked to "turn it on then", explained which tool it would use, then called it).
- The same JSON in doubled braces, ``{{"name": "f", "arguments": {...}}}``: Qwen2.5's own chat
  template shows its call format so (a literal ``{{`` in a Jinja string), and small Qwen
  models copy it. The template is left as it is: shown with one brace, the 1.5B explained
  its calls in prose instead (5 of the first 9 commands failed so; as written, 28 of 40
  passed once these parse, ``make bench-commands MODEL=qwen1.5b``).

Parsing is linear in the output's length: model output is whatever a prompt made it write.
"""

from __future__ import annotations

import ast
import copy
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
_LINE_CALL_NAME = re.compile(r'\n\{\s*"name"\s*:\s*"([^"\\\n]*)"')


def _call(name: str, args: Any) -> dict[str, Any]:
    if not isinstance(args, str):
        args = json.dumps(args if args is not None else {}, ensure_ascii=False)
    return {"id": "call_" + uuid.uuid4().hex[:24], "type": "function",
            "function": {"name": name, "arguments": args}}


def _as_call(obj: Any, names: set[str] | None) -> dict[str, Any] | None:
    if not isinstance(obj, dict):
        return None
    name = obj.get("name")
    if name is None and names and obj.get("function") in names:
        name = obj["function"]  # {"function": "f", "arguments": …}: named by the tool itself
    if not isinstance(name, str) or (names is not None and name not in names):
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
    return next((m.start() for m in _LINE_CALL_NAME.finditer(body) if m[1] in names), -1)


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


# -- grammars -------------------------------------------------------------------------------
def with_argument_values(tools: list[dict[str, Any]],
                         values: dict[str, dict[str, list[str]]] | None) -> list[dict[str, Any]]:
    """The tools with each listed argument's schema narrowed to an enum of its values (a copy;
    arguments a tool does not have, and empty lists, are ignored)."""
    if not values:
        return tools
    out = []
    for t in tools:
        fn = t.get("function", t)
        narrow = values.get(fn.get("name"), {})
        props = (fn.get("parameters") or {}).get("properties") or {}
        if any(v and isinstance(props.get(a), dict) for a, v in narrow.items()):
            t = copy.deepcopy(t)
            props = t["function"]["parameters"]["properties"]
            for arg, allowed in narrow.items():
                if allowed and isinstance(props.get(arg), dict):
                    props[arg] = {"type": "string", "enum": list(dict.fromkeys(allowed))}
        out.append(t)
    return out


def tool_call_schema(tools: list[dict[str, Any]], only: str | None = None) -> dict[str, Any]:
    """JSON schema of one call: ``{"name": <one of the tools>, "arguments": <its params>}``."""
    variants = []
    for t in tools:
        fn = t.get("function", t)
        if only is not None and fn["name"] != only:
            continue
        params = _enum_lists_bounded(fn.get("parameters") or {"type": "object", "properties": {}})
        variants.append({"type": "object",
                         "properties": {"name": {"const": fn["name"]}, "arguments": params},
                         "required": ["name", "arguments"]})
    if not variants:
        raise ValueError(f"tool_choice names an unknown function {only!r}")
    return variants[0] if len(variants) == 1 else {"oneOf": variants}


# The most values an enum list is bounded by: the converter writes one nested group per item
# allowed, and a long enum (up to schema_limits.MAX_ENUM_VALUES) would nest too deep.
BOUNDED_ENUM_VALUES = 32


def _enum_lists_bounded(schema: Any) -> Any:
    """A copy of ``schema`` where each list of enum values holds at most as many items as the
    enum has (up to BOUNDED_ENUM_VALUES): a longer one must repeat a value, and the 1.5B,
    once it repeated one, wrote ``"light", "sensor", "light", …`` until the token limit
    (issue 30). A list's own ``maxItems`` stays, and so does one whose ``minItems`` asks for
    more."""
    if isinstance(schema, list):
        return [_enum_lists_bounded(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _enum_lists_bounded(v) for k, v in schema.items()}
    items = schema.get("items")
    enum = items.get("enum") if isinstance(items, dict) else None
    if schema.get("type") == "array" and isinstance(enum, list) and "maxItems" not in schema:
        n = len({json.dumps(v, sort_keys=True) for v in enum})
        if 0 < n <= BOUNDED_ENUM_VALUES and not (isinstance(schema.get("minItems"), int)
                                                 and schema["minItems"] > n):
            out["maxItems"] = n
    return out


def wrap_grammar(gbnf: str, prefix: str, suffix: str, repeat: bool = False) -> str:
    """Rename a grammar's root to ``body`` and put literal text around it (``repeat``: one or
    more times, whitespace between)."""
    renamed = re.sub(r"^root\s*::=", "body ::=", gbnf, flags=re.M)
    one = f"{json.dumps(prefix)} body {json.dumps(suffix)}"
    if repeat:  # also whitespace inside the markers: the token that completes the trigger may
        # carry a newline past it ("<tool_call>\n{"), which a grammar must accept
        one = f"{json.dumps(prefix)} [ \\t\\n]* body [ \\t\\n]* {json.dumps(suffix)}"
        return f"root ::= hearth-call ([ \\t\\n]* hearth-call)*\nhearth-call ::= {one}\n{renamed}"
    return f"root ::= {one}\n{renamed}"


# Under tool_choice "auto" the model chooses freely whether to call; from the moment it opens
# a call the call's grammar holds, so the call parses and its arguments keep to the tool's
# schema (an enum of exposed names, say). Five openings: Hermes' tag; a fenced JSON block
# whose object begins with "name" (how small instruct models such as Qwen2.5-Coder often
# write a call), a fence holding other JSON staying free; the same object after ``<tools>``
# (the 1.5B wraps calls in the tag its template lists the tools in); an answer opening with
# ``{{"name"`` (Qwen2.5's template shows its call so), which no JSON answer does; and an
# answer opening with bare JSON that names one of the request's tools (``{"name":
# "HassTurnOn"``, :func:`lazy_call_trigger`), which the answer parsed as a call anyway, so
# unheld it could name a light that does not exist. Other JSON answers stay free.
# A plain pattern: llama.cpp then feeds the grammar from the match. A pattern with a leading
# [\s\S]*? group is searched over the whole output at every token (seconds per token after a
# few hundred tokens).
# The text a trigger matches is replayed into the grammar, and a grammar refusing it aborts
# inside llama.cpp: each pattern accepts only what its grammar does (no capturing group, which
# would move the start), so the JSON's whitespace here is the grammar's ``space`` below.
# An object opening with its "name" key, its whitespace as _PRETTY_SPACE allows.
_NAME_FIRST = r'\{(?: |\n[ \t]{0,20})?"name"'
LAZY_CALL_TRIGGER = (r'<tool_call>|(?:```json|<tools>)[ \t\n]*' + _NAME_FIRST
                     + r'|^[ \t\n]*\{\{ ?"name"')
# JSON as models write it in a fence: indented, one item a line.
_PRETTY_SPACE = 'space ::= | " " | "\\n" [ \\t]{0,20}'
# A grammar's literals and character classes, and its words (rule names among them).
_GBNF_TOKEN = re.compile(r'"(?:\\.|[^"\\])*"|\[(?:\\.|[^\]\\])*\]|[A-Za-z0-9_-]+')


_PLAIN_NAME = re.compile(r"[A-Za-z0-9_-]+")


def lazy_call_trigger(names: set[str]) -> str:
    """:data:`LAZY_CALL_TRIGGER` and an answer opening as a bare JSON call of one of
    ``names`` (written as the fenced grammar's JSON; a name needing escapes in a pattern is
    left to the other openings)."""
    plain = sorted(n for n in names if _PLAIN_NAME.fullmatch(n))
    if not plain:
        return LAZY_CALL_TRIGGER
    # An opening bare call, or one on a line of its own after prose (never inline: "Use
    # {"name": …}" may be an example).
    return (LAZY_CALL_TRIGGER + r'|(?:^[ \t\n]*|\n)' + _NAME_FIRST + r': ?"(?:'
            + "|".join(plain) + ')"')


def _prefixed(gbnf: str, prefix: str) -> str:
    """``gbnf`` with every rule renamed ``prefix`` + name (literals left alone), so a second
    copy of it can stand beside the first in one grammar."""
    names = set(re.findall(r"^([A-Za-z0-9_-]+)\s*::=", gbnf, flags=re.M))
    return _GBNF_TOKEN.sub(lambda m: prefix + m[0] if m[0] in names else m[0], gbnf)


def lazy_call_grammar(gbnf: str) -> str:
    """The grammar behind :func:`lazy_call_trigger`: one or more Hermes calls, as compact as
    the converter's JSON, one fenced or tagged (``<tools>``) call, which may be indented, one
    compact call in doubled braces, or one bare call, which may be indented (``gbnf`` is one
    call's JSON, root rule ``root``, from the schema converter)."""
    hermes = wrap_grammar(gbnf, OPEN, CLOSE, repeat=True).replace("root ::=", "hermes ::=", 1)
    pretty = re.sub(r"^space ::= .*$", lambda _: _PRETTY_SPACE, gbnf, flags=re.M)
    return ('root ::= hermes | fenced | tagged | doubled | bare\n'
            'fenced ::= "```json" [ \\t\\n]* fenced-root [ \\t\\n]* "```"\n'
            'tagged ::= "<tools>" [ \\t\\n]* fenced-root [ \\t\\n]* "</tools>"\n'
            'doubled ::= [ \\t\\n]* "{" body "}"?\n'
            'bare ::= [ \\t\\n]* fenced-root\n'
            + _prefixed(pretty, "fenced-") + "\n" + hermes)
