"""What other threads read of the engine, alone (a stand-in for the engine, no iteration): the
counts by class, arrivals still in the inbox included, and a published view that is replaced
whole, never changed under a reader."""

from __future__ import annotations

from collections import deque
from types import SimpleNamespace

from sim_backend import SimBackend, request

from hearth.engine.base import EngineConfig
from hearth.engine.batching import BatchComposer
from hearth.engine.kv import KVSpace
from hearth.engine.view import View
from hearth.policy.queue import WaitQueue
from hearth.policy.scheduler import Policy, PolicyConfig


def test_counts_by_class_and_a_view_replaced_whole():
    b = SimBackend(n_ctx=1000)
    cfg, policy = EngineConfig(), Policy(PolicyConfig())
    batcher = BatchComposer(b, cfg, policy)
    kv = KVSpace(b, cfg, WaitQueue(), lambda: 0)
    core = SimpleNamespace(b=b, pool=kv.pool, cost=batcher.cost, policy=policy, batcher=batcher,
                           store=None, waiting=WaitQueue(), embed_waiting=[], running=[],
                           _inbox=deque(),
                           queue_eta=SimpleNamespace(publish=lambda now: {}))
    core.waiting.append(request(b, "chat", 10, 1, seed=1)[0])
    core.running.append(request(b, "voice", 10, 1, seed=2)[0])
    core._inbox.append(("add", request(b, "chat", 10, 1, seed=3)[0]))
    core._inbox.append(("cancel", 7))
    view = View(core)  # type: ignore[arg-type]
    view.publish()
    first = view.snapshot
    state = view.queue_state()
    assert state["waiting"]["chat"] == 2 and state["running"]["voice"] == 1
    assert state["kv"] == {"cells": 1000, "used": 0, "used_by_running": 0,
                           "used_by_prefix_cache": 0, "reserved": 0, "use": 0.0}
    kv.pool.reserve(250)
    assert view.queue_state()["kv"]["reserved"] == 0, "only what was published"
    view.publish()
    assert view.queue_state()["kv"]["reserved"] == 250
    assert first["kv"]["reserved"] == 0, "a reader's copy never changes"
