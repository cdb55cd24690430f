"""Prefix-cache bookkeeping."""

from __future__ import annotations

import random

from hearth.engine.kvcache import KVPool, common_prefix


def lookup(pool: KVPool, tokens: list[int]):
    """What admission does: find the longest cached prefix, then use it."""
    entry, hit = pool.find(tokens)
    pool.use(entry, hit, len(tokens))
    return entry, hit


def test_common_prefix_matches_a_plain_loop():
    rng = random.Random(1)
    for _ in range(300):
        n = rng.randint(0, 3000)
        a = [rng.randint(0, 3) for _ in range(n)]
        k = rng.randint(0, n)
        b = a[:k] + [rng.randint(0, 3) for _ in range(rng.randint(0, 50))]
        expect = 0
        for x, y in zip(a, b, strict=False):
            if x != y:
                break
            expect += 1
        assert common_prefix(a, b) == expect


def test_lookup_finds_longest_prefix_and_leaves_one_token_to_compute():
    pool = KVPool(n_ctx=1000, n_seq_max=4, max_entries=2)
    pool.insert(0, [1, 2, 3, 4], own=4, shared=None)
    pool.insert(1, [1, 2, 9], own=3, shared=None)
    e, n = lookup(pool, [1, 2, 3, 4, 5])
    assert e.seq_id == 0 and n == 4
    e, n = lookup(pool, [1, 2, 3, 4])
    assert n == 3  # the last prompt token is always computed (its logits are needed)
    assert lookup(pool, [7, 7])[1] == 0


def test_insert_supersedes_prefixes_and_evicts_lru():
    pool = KVPool(n_ctx=1000, n_seq_max=6, max_entries=2)
    assert pool.insert(0, [1, 2], own=2, shared=None) == []
    assert pool.insert(1, [1, 2, 3], own=3, shared=None) == [0]  # [1,2] is now redundant
    assert pool.insert(2, [5, 6], own=2, shared=None) == []
    lookup(pool, [1, 2, 3, 4])  # touch entry 1 (a hit)
    assert pool.insert(3, [8, 9], own=2, shared=None) == [2]  # never hit, least recent
    assert sorted(pool.entries) == [1, 3]
    assert pool.cached_cells == 5


def test_an_entry_running_sequences_share_is_kept():
    """Evicting it would free none of the cells they hold, and would count them twice (once
    per sharer): it stays until they are done."""
    pool = KVPool(n_ctx=1000, n_seq_max=4, max_entries=4)
    pool.insert(0, list(range(100)), own=100, shared=None)
    entry = pool.entries[0]

    class Seq:
        shared = entry
        shared_len = 100

    s = Seq()
    entry.sharers.add(s)
    pool.add_cells(20)
    assert pool.evict() is None
    assert pool.used_cells == 120 and 0 in pool.entries
    entry.sharers.discard(s)
    assert pool.evict() == 0 and pool.used_cells == 20


def test_evicting_the_middle_of_a_chain_counts_each_cell_once():
    """A <- B <- C share cells in a chain (B shares 80 of A's, C 110 of B's). B goes: C owns
    the 30 cells it shared with B alone and keeps sharing 80 with A, and the count is the real
    number of cells left (B's other 20 are freed)."""
    pool = KVPool(n_ctx=10_000, n_seq_max=8, max_entries=8)
    a = list(range(100))
    b = a[:80] + list(range(500, 550))
    c = b[:110] + list(range(900, 930))
    pool.insert(0, a, own=100, shared=None)
    pool.insert(1, b, own=50, shared=pool.entries[0])
    pool.insert(2, c, own=30, shared=pool.entries[1])
    assert pool.used_cells == 100 + 50 + 30
    entry_a, entry_c = pool.entries[0], pool.entries[2]
    assert pool.evict(avoid=entry_a) == 1
    assert pool.used_cells == 100 + 30 + 30
    assert entry_c.shared is entry_a and entry_c.own == 60 and entry_c in entry_a.sharers


def test_an_entry_two_entries_share_is_not_given_up_before_them():
    pool = KVPool(n_ctx=10_000, n_seq_max=8, max_entries=8)
    a = list(range(100))
    pool.insert(0, a, own=100, shared=None)
    pool.insert(1, [*a[:90], 1000, 1001], own=2, shared=pool.entries[0])
    pool.insert(2, [*a[:90], 2000, 2001], own=2, shared=pool.entries[0])
    assert not pool.evictable(pool.entries[0])
    assert pool.evict() == 1  # a sharer goes first
    assert pool.evictable(pool.entries[0])
    assert pool.used_cells == 100 + 2


def test_disabled_cache_hands_sequences_back():
    pool = KVPool(n_ctx=100, n_seq_max=2, max_entries=8, enabled=False)
    assert pool.insert(1, [1, 2], own=2, shared=None) == [1]


def test_a_prompt_that_serves_hits_outlives_one_off_prompts():
    pool = KVPool(n_ctx=100_000, n_seq_max=12, max_entries=3)
    system = list(range(1000))
    pool.insert(0, [*system, 1, 2], own=1002, shared=None)
    assert lookup(pool, [*system, 7])[1] == 1000  # a satellite's second turn hits it
    for i in range(1, 8):  # a stream of one-off documents
        pool.insert(i, [50_000 + i] * 300, own=300, shared=None)
    assert 0 in pool.entries
    # A conversation's next turn extends the entry, supersedes it and inherits its usefulness.
    assert pool.insert(9, [*system, 1, 2, 7, 8], own=2, shared=pool.entries[0]) == [0]
    for i in range(10, 12):
        pool.insert(i, [60_000 + i] * 300, own=300, shared=None)
    assert 9 in pool.entries


def test_an_entry_a_waiting_request_will_use_goes_last():
    pool = KVPool(n_ctx=100_000, n_seq_max=8, max_entries=8)
    for i in range(3):  # three one-off prompts, oldest first
        pool.insert(i, [1000 * (i + 1) + k for k in range(50)], own=50, shared=None)
    assert pool.evict(wanted=frozenset({0})) == 1  # the oldest is about to be used
    assert pool.evict(wanted=frozenset({0})) == 2
    assert pool.evict(wanted=frozenset({0})) == 0  # only when nothing else is left


def test_a_lower_class_may_not_evict_a_prefix_a_higher_class_hits():
    pool = KVPool(n_ctx=100_000, n_seq_max=8, max_entries=8, kept_cells=1000)
    system = list(range(100))
    pool.insert(0, [*system, 1], own=101, shared=None, rank=3)  # left by background work
    entry, hit = pool.find([*system, 2])
    pool.use(entry, hit, 101, rank=0)  # a voice turn hit it
    assert pool.evict(rank=3) is None  # background may not
    assert pool.evict(rank=0) == 0  # voice (or the engine itself) may


def test_past_the_kept_budget_a_prefix_goes_like_any_other():
    pool = KVPool(n_ctx=100_000, n_seq_max=8, max_entries=8, kept_cells=100)
    pool.insert(0, list(range(101)), own=101, shared=None, rank=1)  # one cell too many
    assert pool.kept() == set()
    assert pool.evict(rank=3) == 0


def test_the_budget_grows_to_a_voice_prompt_up_to_three_quarters_of_the_pool():
    pool = KVPool(n_ctx=400, n_seq_max=8, max_entries=8, kept_cells=100)
    pool.insert(0, list(range(300)), own=300, shared=None, rank=0)  # 3/4 of the pool
    assert pool.kept() == {0}
    assert pool.stats()["kept_budget"] == 300
    assert pool.evict(rank=3) is None
    over = KVPool(n_ctx=400, n_seq_max=8, max_entries=8, kept_cells=100)
    over.insert(0, list(range(301)), own=301, shared=None, rank=0)  # one cell past it
    assert over.kept() == set()
    assert over.evict(rank=3) == 0
    none = KVPool(n_ctx=400, n_seq_max=8, max_entries=8, kept_cells=0)  # nothing kept
    none.insert(0, list(range(200)), own=200, shared=None, rank=0)
    assert none.kept() == set()


def test_lookup_compares_only_entries_sharing_the_first_tokens():
    pool = KVPool(n_ctx=1_000_000, n_seq_max=300, max_entries=64)
    for i in range(60):
        pool.insert(i, [10_000 * (i + 1) + k for k in range(500)], own=500, shared=None)
    target = [*pool.entries[30].tokens[:400], 7]
    assert sum(1 for _ in pool._candidates(target)) == 1
    entry, hit = pool.find(target)
    assert entry is pool.entries[30] and hit == 400
