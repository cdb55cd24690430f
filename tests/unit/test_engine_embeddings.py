"""Embeddings beside streams (simulated backend): they never take a stream's iteration, and
their timings never move the generation's cost model."""

from __future__ import annotations

from itertools import pairwise

from sim_backend import Collector, SimBackend, make_core, request, run_until

from hearth.shared.requests import Request


def embedding_request(n_inputs: int, tokens_each: int = 20) -> tuple[Request, list]:
    events: list = []
    inputs = [[100 + (i + j) % 500 for j in range(tokens_each)] for i in range(n_inputs)]
    return Request(prompt=inputs, rank=4, sink=events.extend, kind="embed"), events


def test_a_stream_keeps_its_cadence_while_a_large_embedding_request_runs():
    """A streaming reply keeps getting a token every iteration while 400 inputs are embedded
    (once, the decode batch was dropped for the embedding and the stream froze for the whole
    request); the iteration stays within about twice the latency target."""
    core, b = make_core("hearth", latency_target=0.06)
    chat, stream = request(b, "voice", 30, 400, seed=1)
    core.submit(chat)
    run_until(core, lambda: chat.first_token_at is not None)
    emb, emb_events = embedding_request(400)
    started = b.now()
    core.submit(emb)
    run_until(core, lambda: any(e.kind == "done" for e in emb_events))
    ended = b.now()

    during = [t for t in stream.times if started <= t <= ended]
    gaps = [later - earlier for earlier, later in pairwise(during)]
    assert len(during) > 20, "the stream got no tokens while the embeddings ran"
    assert max(gaps) <= 2.5 * 0.06, max(gaps)
    done = next(e for e in emb_events if e.kind == "done")
    assert len(done.embedding) == 400


class CostlyEmbeddings(SimBackend):
    """The embedding context is ten times slower per token than generation."""

    def embed(self, inputs):
        self.t += self.base + 10 * self.per_token * sum(len(x) for x in inputs)
        return [[float(len(x)), 1.0] for x in inputs]


def test_embedding_timings_do_not_move_the_generation_cost_model():
    """The prefill budget comes from generation timings only: an embedding job on a slower
    context leaves it where it was (it once jumped tenfold) and has its own model."""
    b = CostlyEmbeddings()
    core, _ = make_core("hearth", backend=b)
    before = (core.cost.view(), core.batcher.prefill_budget(4))
    emb, emb_events = embedding_request(100)
    core.submit(emb)
    run_until(core, lambda: any(e.kind == "done" for e in emb_events))
    assert (core.cost.view(), core.batcher.prefill_budget(4)) == before
    assert core.embed_cost.predict(20) > 5 * core.cost.predict(20)  # the size it went in


def test_idle_embeddings_still_go_in_large_batches():
    """With no stream to keep, an embedding request goes as many inputs per decode as the
    embedding context takes."""
    core, b = make_core("hearth")
    sink = Collector(b)
    core.submit(Request(prompt=[[1, 2, 3]] * 64, rank=4, sink=sink, kind="embed"))
    run_until(core, lambda: sink.done is not None)
    assert len(sink.done.embedding) == 64
    assert core.stats.iterations == 0  # no generation decode was needed
