"""Grammars that hold a tool call to its tool's schema: the JSON schema of one call, the
grammar around it (Hermes tags, a fenced block, doubled braces, bare JSON naming a tool) and
the lazy trigger that starts holding once the model opens a call (:mod:`.tools` parses what
comes out); any JSON schema as a grammar, by llama-cpp-python's converter."""

from __future__ import annotations

import copy
import json
import re
from typing import Any

# llama-cpp-python's schema-to-grammar converter (plain Python; importing it loads the library,
# as the server always has: at start, not on the first schema).
from llama_cpp.llama_grammar import json_schema_to_gbnf

from .tools import CLOSE, OPEN


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
# ``{{"name"`` (Qwen2.5's template shows its call so), which no JSON answer does, or such a
# line after prose (the 1.5B explained a follow-up's call, then wrote it so); and an
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
                     + r'|(?:^[ \t\n]*|\n)\{\{ ?"name"')
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


def json_schema_grammar(schema: dict) -> str:
    """A GBNF grammar (root rule ``root``) accepting JSON valid for ``schema``, from
    llama-cpp-python's converter. Raises ValueError for schemas it cannot convert."""
    try:
        gbnf = json_schema_to_gbnf(json.dumps(schema))
    except Exception as e:  # the converter raises assorted types on bad schemas
        raise ValueError(f"unsupported JSON schema: {e}") from e
    # Strict JSON forbids raw control characters inside strings; this converter allows them.
    return gbnf.replace('char ::= [^"\\\\]', 'char ::= [^"\\\\\\x7F\\x00-\\x1F]')
