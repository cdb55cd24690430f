"""Recovery alone (no engine): the suspects of a failed decode decode alone in turn and only
one that fails alone is failed; a dead worker's requests are taken out of the queue, the running
list and the outbox it is given, and the right ones are suspected."""

from __future__ import annotations

from sim_backend import SimBackend, request

from hearth.engine.base import BatchItem, EngineConfig, WorkerLost
from hearth.engine.embeddings import Embedder
from hearth.engine.kv import KVSpace
from hearth.engine.outbox import Outbox
from hearth.engine.recovery import SOLO_TRIES, Recovery
from hearth.engine.stats import Stats
from hearth.policy.queue import WaitQueue
from hearth.policy.scheduler import Policy, PolicyConfig
from hearth.shared.requests import Request


def recovery():
    b = SimBackend()
    policy, stats, outbox = Policy(PolicyConfig()), Stats(), Outbox()
    failed: list[Request] = []
    changes = [0]

    def fail(r: Request, message: str, now: float) -> None:  # as the engine's: retires it
        r.finished = True
        running.remove(r)
        failed.append(r)

    running: list[Request] = []
    embedder = Embedder(b, EngineConfig(), policy, stats, outbox.emit, fail)
    waiting = WaitQueue()
    rec = Recovery(b, policy, stats, outbox, KVSpace(b, EngineConfig(), waiting, lambda: 0),
                   waiting, running, embedder, fail,
                   lambda: changes.__setitem__(0, changes[0] + 1), lambda *charged: None)
    return rec, b, failed, changes


def new(rec: Recovery, b: SimBackend, cls: str, seed: int, seq: int | None = None) -> Request:
    r, _ = request(b, cls, 20, 5, seed=seed)
    r.tokens, r.arrival, r.seq_id, r.sampler = list(r.prompt), float(seed), seq, object()
    rec.outbox.track(r)
    return r


def test_a_failed_batch_decodes_alone_in_turn_and_only_who_fails_alone_is_failed():
    rec, b, failed, changes = recovery()
    chat, voice = new(rec, b, "chat", 1, seq=0), new(rec, b, "voice", 2, seq=1)
    rec.running += [chat, voice]
    batch = [BatchItem(chat, 0, 20, True), BatchItem(voice, 0, 20, True)]
    assert rec.next_alone() is None
    rec.decode_failed(batch, -3, 1.0)
    assert changes[0] == 1
    assert rec.next_alone() is voice  # best class first
    rec.decoded(voice)  # it decoded alone: not the culprit
    assert rec.next_alone() is chat
    for i in range(SOLO_TRIES):
        assert not failed
        rec.decode_failed([BatchItem(chat, 0, 20, True)], -3, 2.0 + i)
    assert failed == [chat] and rec.next_alone() is None
    assert rec.running == [voice]


def test_a_suspect_that_stopped_running_is_not_waited_for():
    rec, b, _, _ = recovery()
    a, c = new(rec, b, "chat", 1, seq=0), new(rec, b, "chat", 2, seq=1)
    rec.running += [a, c]
    rec.decode_failed([BatchItem(a, 0, 20, True), BatchItem(c, 0, 20, True)], -3, 1.0)
    rec.running.remove(a)  # e.g. cancelled
    assert rec.next_alone() is c


def test_a_death_while_making_a_sampler_takes_out_the_begun_and_suspects_the_admitted():
    rec, b, _, _ = recovery()
    running = rec.running
    streaming = new(rec, b, "chat", 1, seq=0)
    running.append(streaming)
    preempted = new(rec, b, "chat", 2)  # waits again after it began answering
    preempted.first_admitted_at = 0.5
    fresh, admitting = new(rec, b, "agent", 3), new(rec, b, "voice", 4)
    for r in (preempted, fresh, admitting):
        rec.waiting.append(r)
    rec.decode_failed([BatchItem(streaming, 0, 20, True)], -3, 1.0)
    lost, suspects = rec.worker_lost(WorkerLost("SIGSEGV", signal=11, during="new_sampler"),
                                     admitting)
    assert suspects == [admitting]
    assert {r.id for r in lost} == {streaming.id, preempted.id, admitting.id}
    assert all(r.finished and r.finish_reason == "error" and r.seq_id is None for r in lost)
    assert rec.running is running and running == []  # the engine's own list, emptied
    assert list(rec.waiting) == [fresh] and fresh.sampler is None and not fresh.finished
    assert rec.suspects == [] and set(rec.outbox.by_id) == {fresh.id}
    assert rec.stats.failed["chat"] + rec.stats.failed["voice"] == 3


def test_a_decode_cut_short_keeps_the_finished_micro_batches_but_not_a_last_output():
    rec, b, _, _ = recovery()
    charged: list[tuple[int, int, int]] = []
    rec._charge = lambda r, start, n, now: charged.append((r.id, start, n))
    long, short = new(rec, b, "background", 1), new(rec, b, "chat", 2)
    long.tokens = long.tokens * 15  # 300 tokens; the short one has 20
    for r in (long, short):
        r.seq_id = rec.kv.pool.take_id()
        rec.kv.seat(r, r.seq_id, None, 0, len(r.tokens) + 1)
    # llama.cpp finished the first micro-batch of 128 of the long prompt and all of the short.
    b.decode(long.tokens[:128], list(range(128)), [long.seq_id] * 128, [False] * 128)
    b.decode(short.tokens, list(range(20)), [short.seq_id] * 20, [False] * 19 + [True])
    rec.after_abort([BatchItem(long, 0, 300, True), BatchItem(short, 0, 20, True)])
    assert (long.n_past, long.prefilled_tokens) == (128, 128)
    # The short prompt's last token is computed again: its logits were not kept.
    assert short.n_past == 19 and b.seq_pos_max(short.seq_id) == 18
    assert rec.kv.pool.used_cells == b.used == 128 + 19
    assert charged == [(long.id, 0, 128), (short.id, 0, 19)]
