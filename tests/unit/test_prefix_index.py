"""The prefix index alone: a lookup sees every entry that shares a useful prefix with the
prompt, through additions, removals and cuts."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from hearth.engine.prefix_index import INDEX_LEN, PrefixEntry, PrefixIndex, common_prefix

tokens = st.lists(st.integers(0, 2), min_size=0, max_size=3 * INDEX_LEN)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["add", "remove", "cut"]), tokens,
                          st.integers(0, 3 * INDEX_LEN)), max_size=30), tokens)
def test_candidates_hold_every_useful_sharer(ops, prompt):
    index, live = PrefixIndex(), {}
    for i, (op, toks, keep) in enumerate(ops):
        if op == "add" or not live:
            e = PrefixEntry(seq_id=i, tokens=toks, own=len(toks))
            index.add(e)
            live[i] = e
        elif op == "remove":
            index.remove(live.pop(min(live)))
        else:
            e = live[max(live)]
            old, e.tokens = e.tokens, e.tokens[:keep]
            index.moved(e, old)
    found = {e.seq_id for e in index.candidates(prompt)}
    useful = {i for i, e in live.items()
              if common_prefix(e.tokens, prompt) >= INDEX_LEN or len(e.tokens) < INDEX_LEN}
    assert useful <= found <= set(live)
    for i in list(live):  # and everything can be taken out again: nothing filed twice
        index.remove(live.pop(i))
    assert list(index.candidates(prompt)) == []
