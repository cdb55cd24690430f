"""Bounds on the JSON schemas and tool argument values a request carries, checked in plain
Python before any of it reaches llama.cpp.

llama-cpp-python's converter writes a count such as ``maxLength: 20000`` as 20,000 nested
groups, and llama.cpp's grammar parser recurses once per group in native code: a 200-byte schema
overflows its stack and takes the whole server down (issue 26). Other inputs cost memory or time
out of proportion to their size (a pattern's ``a{100000000}``, ``allOf`` references that the
converter expands again at every use). Each limit here is far above what real schemas use and
far below what hurts; a request past one is a 400 that names the value (``SchemaTooLarge``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

KIB = 1024

# A count (minLength, maxLength, minItems, maxItems, minProperties, maxProperties, a pattern's
# {n} / {n,m}): the converter writes up to n nested groups; llama.cpp refuses a span past about
# 1,000 (its 2,000-rule repetition threshold) and overflows its stack near 15,000.
MAX_COUNT = 1_000
COUNT_KEYWORDS = ("minLength", "maxLength", "minItems", "maxItems", "minProperties",
                  "maxProperties")
# Nesting of a schema's JSON (an object level takes two: the schema and its "properties"): the
# converter recurses in Python once per level; real schemas nest under 20.
MAX_DEPTH = 64
# Properties of one object: the converter's work grows with the square of an object's optional
# properties (256 take 0.06 s, 900 over a second; 1,000 exhaust its recursion).
MAX_PROPERTIES = 256
# Values of one enum (and of one tool argument): one alternative each in the grammar.
MAX_ENUM_VALUES = 1_000
# One enum or const as JSON: the grammar holds it literally, escaped.
MAX_ENUM_BYTES = 32 * KIB
# One schema (response_format's, or one tool's parameters) as compact JSON.
MAX_SCHEMA_BYTES = 64 * KIB
# The grammar the converter would write, estimated before it runs: counts times the length of
# the rule they repeat, plus every schema it visits, again at each use of an allOf reference
# (2 KiB of such references expand to 18 MiB, doubling with each further level).
MAX_EXPANSION_BYTES = 2 * KIB * KIB
# The GBNF handed to llama.cpp, whole (llama.cpp parses 1.2 MiB in 20 ms).
MAX_GRAMMAR_BYTES = 2 * KIB * KIB
# Groups inside groups in the GBNF: llama.cpp's parser takes about 0.45 KiB of native stack per
# level (MAX_COUNT levels need 0.5 MiB of a thread's 8 MiB; 20,000 overflow it).
MAX_GRAMMAR_NESTING = 1_100
# Tools in one request (OpenAI's own bound); all their parameters together as JSON.
MAX_TOOLS = 128
MAX_TOOLS_BYTES = 256 * KIB
# tool_argument_values: arguments narrowed per tool, characters of one allowed value (an entity
# or area name), and all the values as JSON, also counted once per tool they narrow (15 tools
# narrowed to 1,000 entity names each come to 0.5 MiB).
MAX_ARGUMENTS = 64
MAX_VALUE_CHARS = 256
MAX_ARGUMENT_VALUES_BYTES = 1 * KIB * KIB

# Per schema the converter visits, and per repetition, beyond the length of its path.
_RULE_OVERHEAD = 16


class SchemaTooLarge(ValueError):
    """A schema or tool argument values past a limit; ``field`` is the dotted path of the value
    in the request (``response_format.json_schema.schema.properties.name.maxLength``)."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field


def json_size(value: Any) -> int:
    """Characters of ``value`` as compact JSON."""
    return len(json.dumps(value, separators=(",", ":"), ensure_ascii=False))


def _dotted(field: str, path: Sequence[str | int]) -> str:
    return ".".join([field, *(str(p) for p in path)])


def _is_count(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _int_or_none(text: str) -> int | None:
    try:
        return int(text.strip())
    except ValueError:
        return None


def scan_pattern(pattern: str) -> tuple[list[int], int]:
    """The numbers in a regex's ``{n}``, ``{n,}`` and ``{n,m}`` quantifiers, read as the
    converter reads them (escapes and ``[...]`` classes skipped, ``int()`` on each part), and
    the deepest nesting of its groups."""
    counts: list[int] = []
    deepest = depth = 0
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "\\":
            i += 1
        elif c == "[":
            i += 1
            while i < n and pattern[i] != "]":
                i += 2 if pattern[i] == "\\" else 1
        elif c == "(":
            depth += 1
            deepest = max(deepest, depth)
        elif c == ")":
            depth -= 1
        elif c == "{":
            end = pattern.find("}", i)
            if end < 0:
                break
            # A part that is no number: the converter refuses the pattern itself.
            counts.extend(v for v in map(_int_or_none, pattern[i + 1:end].split(","))
                          if v is not None)
            i = end
        i += 1
    return counts, deepest


def _local_target(root: Any, ref: Any) -> tuple[Any, tuple[str, ...]] | None:
    """The node a local ``$ref`` ("#/$defs/X") points to, split as the converter splits it."""
    if not isinstance(ref, str) or not ref.startswith("#/"):
        return None
    node, path = root, tuple(ref[2:].split("/"))
    for key in path:
        if not isinstance(node, dict) or key not in node:
            return None
        node = node[key]
    return node, path


def _expanded_refs(all_of: Any) -> Iterator[Any]:
    """The ``$ref`` values whose targets' properties the converter expands again where an
    ``allOf`` uses them (its entries, and the entries of an ``anyOf`` inside one)."""
    if not isinstance(all_of, list):
        return
    for entry in all_of:
        if not isinstance(entry, dict):
            continue
        if "anyOf" in entry and isinstance(entry["anyOf"], list):
            yield from (e["$ref"] for e in entry["anyOf"] if isinstance(e, dict) and "$ref" in e)
        elif "$ref" in entry:
            yield entry["$ref"]


def _check_keyword(key: str, value: Any, where: str) -> tuple[int, int]:
    """Check one keyword's value. What it adds to the grammar beyond its schema's own rule:
    (repetitions of a rule named after the schema's path, other characters)."""
    if key in COUNT_KEYWORDS and _is_count(value):
        if not value <= MAX_COUNT:  # also NaN
            raise SchemaTooLarge(where, f"must be at most {MAX_COUNT:,} (a grammar holds no "
                                 f"larger count), not {value}")
        n = max(int(value), 0)
        if key in ("minItems", "maxItems"):
            return n, 0  # the item's rule, n times
        if key in ("minLength", "maxLength"):
            return 0, 8 * n  # "char", n times
        return 0, 0  # min/maxProperties: the converter leaves them out
    if key == "pattern" and isinstance(value, str):
        counts, nesting = scan_pattern(value)
        if nesting > MAX_DEPTH:
            raise SchemaTooLarge(where, f"groups nested more than {MAX_DEPTH} deep")
        for count in counts:
            if count > MAX_COUNT:
                raise SchemaTooLarge(where, f"a repetition count must be at most {MAX_COUNT:,} "
                                     f"(a grammar holds no larger count), not {count}")
        return sum(max(c, 0) for c in counts), 2 * len(value)
    if key == "enum" and isinstance(value, list) and len(value) > MAX_ENUM_VALUES:
        raise SchemaTooLarge(where, f"{len(value):,} values, more than {MAX_ENUM_VALUES:,}")
    if key in ("enum", "const"):
        size = json_size(value)
        if size > MAX_ENUM_BYTES:
            raise SchemaTooLarge(where, f"{size:,} characters as JSON, more than "
                                 f"{MAX_ENUM_BYTES:,}")
        return 0, 2 * size
    if key == "properties" and isinstance(value, dict) and len(value) > MAX_PROPERTIES:
        raise SchemaTooLarge(where, f"{len(value):,} properties, more than {MAX_PROPERTIES:,}")
    return 0, 0


def check_schema(schema: Any, field: str) -> int:
    """Raise :class:`SchemaTooLarge` if ``schema`` (sent as ``field``) is past a limit; return
    the estimated size of the grammar the converter would write for it.

    Count keywords and patterns are checked wherever they appear, not only where a schema is
    expected: a ``$ref`` may point the converter anywhere in the document."""
    try:
        size = json_size(schema)
    except (RecursionError, TypeError, ValueError) as e:
        raise SchemaTooLarge(field, f"not a JSON schema the server can read ({e})") from e
    if size > MAX_SCHEMA_BYTES:
        raise SchemaTooLarge(field, f"{size:,} characters as JSON, more than "
                             f"{MAX_SCHEMA_BYTES:,}")
    expansion = 0
    # (node, its path, its depth, the path its grammar rules are named after)
    stack: list[tuple[Any, tuple[str | int, ...], int, int]] = [(schema, (), 1, 0)]
    while stack:
        node, path, depth, name_len = stack.pop()
        if depth > MAX_DEPTH:
            raise SchemaTooLarge(_dotted(field, path), f"nested more than {MAX_DEPTH} levels "
                                 "deep")
        if isinstance(node, list):
            stack.extend((item, (*path, i), depth + 1, name_len + 4)
                         for i, item in enumerate(node) if isinstance(item, dict | list))
            continue
        if not isinstance(node, dict):
            continue
        rule = name_len + _RULE_OVERHEAD
        expansion += 2 * rule
        # The converter names a schema's rules after the property names on its way there.
        named = bool(path) and path[-1] == "properties"
        for key, value in node.items():
            where = (*path, key)
            repeated, other = _check_keyword(key, value, _dotted(field, where))
            expansion += repeated * rule + other
            if isinstance(value, dict | list):
                step = len(key) + 1 if named else 5
                stack.append((value, where, depth + 1, name_len + step))
            if key == "allOf":  # the target's properties, again, named after this schema
                for ref in _expanded_refs(value):
                    target = _local_target(schema, ref)
                    if target is not None and isinstance(target[0], dict) \
                            and isinstance(props := target[0].get("properties"), dict):
                        stack.append((props, (*target[1], "properties"), depth + 1, name_len))
        if expansion > MAX_EXPANSION_BYTES:
            raise SchemaTooLarge(field, "the grammar made from this schema would be over "
                                 f"{MAX_EXPANSION_BYTES // KIB:,} KiB")
    return expansion


def check_tools(parameters: Sequence[Any], field: str = "tools") -> int:
    """Check each tool's ``parameters`` schema (``tools.<i>.function.parameters``) and their
    sizes together; return the estimated size of their grammar."""
    if len(parameters) > MAX_TOOLS:
        raise SchemaTooLarge(field, f"{len(parameters):,} tools, more than {MAX_TOOLS}")
    total = expansion = 0
    for i, schema in enumerate(parameters):
        expansion += check_schema(schema, f"{field}.{i}.function.parameters")
        total += json_size(schema)
    if total > MAX_TOOLS_BYTES:
        raise SchemaTooLarge(field, f"the tools' parameters come to {total:,} characters as "
                             f"JSON, more than {MAX_TOOLS_BYTES:,}")
    if expansion > MAX_EXPANSION_BYTES:
        raise SchemaTooLarge(field, "the grammar made from the tools' parameters would be over "
                             f"{MAX_EXPANSION_BYTES // KIB:,} KiB")
    return expansion


def check_argument_values(values: Mapping[str, Mapping[str, Sequence[str]]] | None,
                          tool_names: Sequence[str] = (),
                          field: str = "tool_argument_values") -> None:
    """Check ``tool_argument_values`` (allowed values by tool and argument, which become
    enums): how many, how long, and their size once applied to every tool of ``tool_names``
    that they narrow."""
    if not values:
        return
    if len(values) > MAX_TOOLS:
        raise SchemaTooLarge(field, f"{len(values):,} tools, more than {MAX_TOOLS}")
    sizes: dict[str, int] = {}
    for tool, args in values.items():
        if len(args) > MAX_ARGUMENTS:
            raise SchemaTooLarge(f"{field}.{tool}", f"{len(args):,} arguments, more than "
                                 f"{MAX_ARGUMENTS}")
        for arg, allowed in args.items():
            where = f"{field}.{tool}.{arg}"
            if len(allowed) > MAX_ENUM_VALUES:
                raise SchemaTooLarge(where, f"{len(allowed):,} values, more than "
                                     f"{MAX_ENUM_VALUES:,}")
            for i, value in enumerate(allowed):
                if len(value) > MAX_VALUE_CHARS:
                    raise SchemaTooLarge(f"{where}.{i}", f"{len(value):,} characters, more "
                                         f"than {MAX_VALUE_CHARS}")
        sizes[tool] = json_size(args)
    whole = json_size(values)
    applied = sum(sizes.get(name, 0) for name in tool_names)
    if max(whole, applied) > MAX_ARGUMENT_VALUES_BYTES:
        raise SchemaTooLarge(field, f"the values come to {max(whole, applied):,} characters as "
                             f"JSON across the tools they narrow, more than "
                             f"{MAX_ARGUMENT_VALUES_BYTES:,}")


def grammar_nesting(gbnf: str) -> int:
    """The deepest nesting of parenthesised groups in a GBNF grammar (quoted literals,
    character classes and comments skipped)."""
    deepest = depth = 0
    i, n = 0, len(gbnf)
    while i < n:
        c = gbnf[i]
        if c in "\"[":
            close = '"' if c == '"' else "]"
            i += 1
            while i < n and gbnf[i] != close:
                i += 2 if gbnf[i] == "\\" else 1
        elif c == "#":
            end = gbnf.find("\n", i)
            i = n if end < 0 else end
        elif c == "(":
            depth += 1
            deepest = max(deepest, depth)
        elif c == ")":
            depth -= 1
        i += 1
    return deepest


def check_grammar_size(gbnf: str, field: str) -> None:
    """Raise :class:`SchemaTooLarge` if the GBNF made from ``field`` is too big, or nests
    groups too deeply, for llama.cpp's parser."""
    if len(gbnf) > MAX_GRAMMAR_BYTES:
        raise SchemaTooLarge(field, f"the grammar made from it is {len(gbnf):,} characters, "
                             f"more than {MAX_GRAMMAR_BYTES:,}")
    if (nesting := grammar_nesting(gbnf)) > MAX_GRAMMAR_NESTING:
        raise SchemaTooLarge(field, f"the grammar made from it nests {nesting:,} groups deep, "
                             f"more than {MAX_GRAMMAR_NESTING:,}")
