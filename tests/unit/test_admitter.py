"""Admission and preemption alone (no engine): the admitter moves requests between the wait
queue and the running list it is given, passes only when something changed, and preempts
through the KV part it is given."""

from __future__ import annotations

from sim_backend import SimBackend, request

from hearth.engine.admission import Admitter
from hearth.engine.base import ADMIT_RECHECK_S, BatchItem, EngineConfig
from hearth.engine.kv import KVSpace
from hearth.engine.stats import Stats
from hearth.policy.queue import WaitQueue
from hearth.policy.scheduler import Policy, PolicyConfig
from hearth.shared.requests import Request


def admitter(n_parallel: int = 2, **policy):
    b = SimBackend(n_ctx=10_000, n_seq_max=n_parallel + 4)
    cfg = EngineConfig()
    waiting: WaitQueue = WaitQueue()
    running: list[Request] = []
    ended: list[tuple[Request, str]] = []

    def end(r: Request, why: str, *_: object, **__: object) -> None:  # as the engine's _finish
        r.finished = True
        ended.append((r, why))

    a = Admitter(b, cfg, Policy(PolicyConfig(n_parallel=n_parallel, **policy)), Stats(),
                 KVSpace(b, cfg, waiting, lambda: 0), waiting, running, finish=end, fail=end)
    return a, b, ended


def arrive(a: Admitter, b: SimBackend, cls: str, seed: int, t: float) -> Request:
    """What the engine does with an arrival before admission sees it."""
    r, _ = request(b, cls, 50, 10, user=f"m{seed}", seed=seed)
    r.tokens, r.arrival = list(r.prompt), t
    a.policy.user_arrived(r.user, t)
    a.waiting.append(r)
    return r


def test_a_pass_runs_when_something_changed_or_the_recheck_is_due():
    a, b, _ = admitter(n_parallel=2)
    reqs = [arrive(a, b, "chat", i, 0.0) for i in range(3)]
    a.admit(0.0)
    assert a.running == reqs[:2] and list(a.waiting) == reqs[2:]
    assert all(r.sampler is not None and r.seq_id is not None for r in a.running)
    done = a.running.pop(0)  # a slot comes free behind the admitter's back
    a.kv.release(done)
    a.admit(0.01)
    assert list(a.waiting) == reqs[2:], "nothing it was told about changed: no pass"
    a.changed()
    a.admit(0.02)
    assert a.running == [reqs[1], reqs[2]] and not a.waiting
    # Without a change a pass still comes once the recheck time is due (aging moves classes).
    a.running.pop(0)
    a.kv.release(reqs[1])
    late = arrive(a, b, "chat", 9, 0.03)
    a.admit(0.03)
    assert late in a.waiting
    a.admit(0.02 + ADMIT_RECHECK_S)
    assert late in a.running


def test_voice_preempts_the_newest_stream_which_waits_again_with_its_cells_kept():
    a, b, ended = admitter(n_parallel=2, voice_spare_slots=0)
    chats = [arrive(a, b, "chat", i, float(i)) for i in range(2)]
    a.admit(2.0)
    for r in chats:  # their prompts were computed
        a.kv.computed(r, len(r.tokens))
        r.n_past = len(r.tokens)
    voice = arrive(a, b, "voice", 7, 3.0)
    a.changed()
    a.admit(3.0)
    assert a.running == [chats[0], voice]
    victim = chats[1]
    assert list(a.waiting) == [victim] and victim.preemptions == 1 and victim.seq_id is None
    assert a.stats.preemptions == 1 and not ended
    # Its cells stay as a cached prefix it resumes from (all but the last: its logits).
    entry, hit = a.kv.find(victim.tokens)
    assert entry is not None and hit == len(victim.tokens) - 1
    assert a.kv.pool.used_cells == 2 * len(victim.tokens)


def test_a_batch_the_pool_cannot_grow_ends_a_lone_voice_turn_with_length():
    a, b, ended = admitter(n_parallel=1)
    r = arrive(a, b, "voice", 1, 0.0)
    a.admit(0.0)
    assert a.running == [r]
    free = a.kv.pool.free_cells
    items = [BatchItem(r, 0, r.reserved + free + 1, True)]  # one cell more than there is
    assert a.fit(items, 1.0) == []
    assert ended == [(r, "length")]
