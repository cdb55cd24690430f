"""The embedding part alone (no engine): its budget is the policy's bound, a long input goes in
pieces whose weighed means are the whole input's vector, a failed decode answers only its
request, a dead worker hands back the request it was computing and restarts the rest."""

from __future__ import annotations

import math

import pytest
from sim_backend import Collector, SimBackend

from hearth.engine.base import BatchItem, EngineConfig
from hearth.engine.embeddings import Embedder
from hearth.engine.stats import Stats
from hearth.policy.scheduler import Policy, PolicyConfig
from hearth.shared.requests import Request

TARGET = 0.06


def part(b: SimBackend | None = None):
    b = b or SimBackend()
    events: list = []
    failed: list = []
    emb: Embedder

    def fail(r, message, now):
        failed.append((r, message))
        r.finished = True
        emb.remove(r)

    emb = Embedder(b, EngineConfig(latency_target_s=TARGET), Policy(PolicyConfig()), Stats(),
                   lambda r, ev: events.append((r, ev)), fail)
    emb.cost.seed(b.base, b.per_token)
    return emb, b, events, failed


def embed_request(b, inputs, seed=0):
    r = Request(prompt=inputs, rank=4, sink=Collector(b), kind="embed")
    r.arrival = b.now()
    return r


def test_the_budget_keeps_to_the_bound_only_when_the_policy_says_so():
    emb, b, _, _ = part()
    limit, _ = b.embed_limits()
    assert emb.budget(streaming=False, spent=0.0, bounded=False) == limit
    bounded = emb.budget(streaming=False, spent=0.0, bounded=True)
    assert bounded == emb.cost.tokens_within(TARGET) < limit
    beside = emb.budget(streaming=True, spent=TARGET / 2, bounded=True)
    assert 1 <= beside < bounded  # what the streams' decode left of the target
    assert emb.budget(streaming=True, spent=2 * TARGET, bounded=True) == 1


@pytest.mark.parametrize("pieces", [True, False])
def test_a_long_input_goes_in_pieces_and_its_vector_is_the_whole_inputs(pieces):
    b = SimBackend()
    b.pieces = pieces
    emb, _, events, _ = part(b)
    long, short = [100 + i % 37 for i in range(700)], [5, 6, 7]
    r = embed_request(b, [long, short])
    emb.add(r)
    calls = 0
    while not r.finished:
        assert emb.should_run([], 99, False, b.now())
        emb.run(b.now(), bounded=True)
        calls += 1
        if pieces and r.meta.get("_piece"):
            assert emb.head is r  # it stays the head until that input is done
    bound = emb.cost.tokens_within(TARGET)
    if pieces:
        assert all(-n <= bound for c in b.embed_calls for n in c if n < 0)
        assert calls >= math.ceil(700 / bound)
    else:
        assert b.embed_calls[0] == [700]  # a backend without pieces takes it whole
    (done_r, done), = events
    assert done_r is r and done.kind == "done" and not emb.waiting and emb.head is None
    whole = SimBackend().embed([long, short])
    for got, want in zip(done.embedding, whole, strict=True):
        assert got == pytest.approx(want)


def test_embeddings_wait_for_a_better_class_and_go_when_nothing_else_does():
    emb, b, _, _ = part()
    emb.add(embed_request(b, [[1, 2, 3]]))
    assert emb.should_run([], 99, False, b.now())
    assert not emb.should_run([], 0, True, b.now())  # a voice request waits for a slot
    chat = Request(prompt=[1] * 40, rank=1, sink=Collector(b))
    assert not emb.should_run([BatchItem(chat, 0, 40, True)], 99, False, b.now())


def test_a_failed_decode_answers_its_request_and_a_dead_worker_restarts_the_rest():
    class Failing(SimBackend):
        boom = True

        def embed(self, inputs):
            if self.boom:
                self.boom = False
                raise RuntimeError("no memory")
            return super().embed(inputs)

    emb, b, events, failed = part(Failing())
    first, second = embed_request(b, [[1, 2, 3]]), embed_request(b, [[4, 5, 6], [7, 8]])
    emb.add(first)
    emb.add(second)
    emb.run(b.now(), bounded=True)
    assert failed == [(first, "embedding failed: no memory")] and emb.computing is None
    second.meta["_embedded"] = [[1.0]]  # one input done when the worker died computing it
    emb.computing = second
    assert emb.lost() is second and emb.waiting == [] and emb.computing is None
    third = embed_request(b, [[9, 9]])
    third.meta["_embedded"] = [[0.5]]
    emb.add(third)
    emb.add(second)
    emb.computing = second
    assert emb.lost() is second and emb.waiting == [third]
    assert "_embedded" not in third.meta  # computed again from its first input
    assert events == []
