"""Random JSON schemas within Hearth's limits (hearth.chat.schema_limits), for the property tests
of the limits and the fuzzing of llama.cpp's grammar path in a worker."""

from __future__ import annotations

from hypothesis import strategies as st

from hearth.chat import schema_limits as sl

names = st.text("abcdefgh_", min_size=1, max_size=8)
counts = st.integers(0, sl.MAX_COUNT)


@st.composite
def spans(draw):
    low, high = sorted((draw(counts), draw(counts)))
    return low, high


@st.composite
def strings(draw):
    schema: dict = {"type": "string"}
    low, high = draw(spans())
    kind = draw(st.sampled_from(["plain", "length", "pattern", "enum"]))
    if kind == "length":
        schema |= {"minLength": low, "maxLength": high}
    elif kind == "pattern":
        schema["pattern"] = f"^[a-z]{{{low},{high}}}-x{{{low}}}$"
    elif kind == "enum":
        schema["enum"] = draw(st.lists(names, min_size=1, max_size=20, unique=True))
    return schema


leaves = st.one_of(strings(), st.sampled_from([{"type": "integer"}, {"type": "number"},
                                               {"type": "boolean"}, {"const": "on"}]))


def containers(children):
    objects = st.dictionaries(names, children, min_size=1, max_size=5).flatmap(
        lambda props: st.builds(lambda req: {"type": "object", "properties": props,
                                             "required": req},
                                st.lists(st.sampled_from(sorted(props)), unique=True)))
    arrays = st.builds(lambda items, span: {"type": "array", "items": items,
                                            "minItems": span[0], "maxItems": span[1]},
                       children, spans())
    unions = st.lists(children, min_size=2, max_size=3).map(lambda alts: {"anyOf": alts})
    return st.one_of(objects, arrays, unions)


schemas = st.recursive(leaves, containers, max_leaves=8)
