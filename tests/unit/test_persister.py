"""Saving and restoring the prefix cache alone (no engine): given the backend and the KV part,
the persister saves the interactive entries when the engine is idle, stops for an arrival, and
another persister puts them back with their sharing."""

from __future__ import annotations

from sim_backend import SimBackend, computed

from hearth.engine.base import EngineConfig
from hearth.engine.kv import KVSpace
from hearth.engine.persistence import PERSIST_EVERY_S, Persister
from hearth.engine.prefix_store import PrefixStore
from hearth.policy.queue import WaitQueue

KEY = {"model": "/models/m.gguf", "size": 123, "n_ctx": 4000}
SYSTEM = [7000 + i for i in range(60)]


def space() -> tuple[KVSpace, SimBackend]:
    b = SimBackend(n_ctx=4000, n_seq_max=12)
    return KVSpace(b, EngineConfig(prefix_cache_entries=8), WaitQueue(), lambda: 0), b


def cache(kv: KVSpace, b: SimBackend, cls: str, n: int, seed: int, prefix=None) -> None:
    """A finished request's computed prompt kept as a cached prefix, as the engine would."""
    r = computed(kv, b, cls, n, seed, prefix)
    r.finished = True
    kv.keep(r)


def test_saves_the_interactive_entries_when_idle_and_another_restores_them(tmp_path):
    kv, b = space()
    for turn in range(2):  # two voice turns sharing a system prompt
        cache(kv, b, "voice", 30, turn, prefix=SYSTEM)
    cache(kv, b, "background", 200, 9)  # never saved: not worth a restart
    busy = [True]
    p = Persister(b, kv, lambda: busy[0], lambda: False)
    p.store = PrefixStore(tmp_path, dict(KEY), 10**9)
    assert not p.maybe_persist(), "not while the engine has work"
    busy[0] = False
    assert p.maybe_persist()
    future = p.persist(force=True)  # the store's writer saves in turn: waits for both
    assert future is not None
    future.result()
    assert len(list(tmp_path.glob("*.kvstate"))) == 2
    b.t += 2 * PERSIST_EVERY_S
    assert p.persist() is None, "nothing changed since"
    voice = {tuple(e.tokens) for e in kv.pool.entries.values() if e.rank == 0}

    kv2, b2 = space()
    q = Persister(b2, kv2, lambda: False, lambda: False)
    q.store = PrefixStore(tmp_path, dict(KEY), 10**9)
    assert q.restore(q.store.load()) == 2
    assert {tuple(e.tokens) for e in kv2.pool.entries.values()} == voice
    # The second turn shares the first one's system prompt cells again.
    assert kv2.pool.used_cells == b2.used == len(SYSTEM) + 2 * 30
    assert q.maybe_persist() is False, "what was restored is not saved again at once"


def test_an_arrival_stops_a_save_keeping_what_is_on_disk(tmp_path):
    kv, b = space()
    cache(kv, b, "voice", 30, 1)
    arrived = [True]
    p = Persister(b, kv, lambda: False, lambda: arrived[0])
    p.store = PrefixStore(tmp_path, dict(KEY), 10**9)
    p.persist().result()  # type: ignore[union-attr]
    assert not list(tmp_path.glob("*.kvstate")), "the request went first"
    arrived[0] = False
    p.persist().result()  # type: ignore[union-attr]
    assert len(list(tmp_path.glob("*.kvstate"))) == 1
