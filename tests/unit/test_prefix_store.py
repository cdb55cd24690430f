"""The prefix cache on disk (hearth.engine.prefix_store, hearth.engine.persistence) on the simulated
backend: what one engine saves another restores, sharing and classes included; damaged,
foreign and oversized files never reach the KV cache."""

from __future__ import annotations

import logging

from sim_backend import SimBackend, make_core, request, run_until

from hearth.engine.persistence import HEADER_BYTES
from hearth.engine.prefix_store import PrefixStore, name_for

KEY = {"model": "/models/m.gguf", "size": 123, "n_ctx": 4000}


def _core(tmp_path, key=KEY, max_bytes=10**9):
    b = SimBackend(n_ctx=4000, n_seq_max=12)
    core, _ = make_core("hearth", n_parallel=4, backend=b, prefix_cache_entries=8)
    core.store = PrefixStore(tmp_path / "prefix-cache", dict(key), max_bytes)
    return core, b


def _serve(core, b, cls: str, n: int, seed: int, prefix: list[int]):
    r, s = request(b, cls, n, 3, seed=seed, prefix=prefix)
    core.submit(r)
    run_until(core, lambda: s.done is not None)
    return r


SYSTEM = [7000 + i for i in range(300)]


def _household(core, b) -> None:
    """Two voice turns sharing a system prompt, a chat turn, and a one-off summary."""
    _serve(core, b, "voice", 20, 1, SYSTEM)
    _serve(core, b, "voice", 25, 2, SYSTEM)
    _serve(core, b, "chat", 40, 3, [8000 + i for i in range(100)])
    _serve(core, b, "background", 200, 4, [])


def test_a_restart_brings_back_the_voice_and_chat_prefixes_and_their_sharing(tmp_path):
    core, b = _core(tmp_path)
    _household(core, b)
    before = {tuple(e.tokens): (e.rank, e.hits) for e in core.pool.entries.values()
              if e.rank <= 1}
    cells = sum(e.own for e in core.pool.entries.values() if e.rank <= 1)
    assert len(before) == 3
    core.persist(force=True).result()
    assert len(list((tmp_path / "prefix-cache").glob("*.kvstate"))) == 3  # no background one

    fresh, fb = _core(tmp_path)
    assert fresh.restore(fresh.store.load()) == 3
    after = {tuple(e.tokens): (e.rank, e.hits) for e in fresh.pool.entries.values()}
    assert after == before  # the same entries, classes and hits
    # The two voice turns share their system prompt's cells again: no cell is held twice.
    assert fresh.pool.used_cells == fb.used == cells
    assert sum(1 for e in fresh.pool.entries.values() if e.shared is not None) == 1
    # The next voice turn is served from the restored cells, as it would have been before.
    turn = _serve(fresh, fb, "voice", 30, 5, SYSTEM)
    assert turn.cached_tokens >= len(SYSTEM)
    assert fb.refusals == 0


def test_saving_twice_writes_only_what_changed_and_prunes_what_left(tmp_path):
    core, b = _core(tmp_path)
    _household(core, b)
    core.persist(force=True).result()
    folder = tmp_path / "prefix-cache"
    stamps = {p.name: p.stat().st_mtime_ns for p in folder.glob("*.kvstate")}
    assert core.persist() is None  # nothing changed
    chat = next(e for e in core.pool.entries.values() if e.rank == 1)
    core.kv.drop(core.pool.forget(chat))
    _serve(core, b, "chat", 40, 6, [8500 + i for i in range(100)])
    core.persist(force=True).result()
    now = {p.name: p.stat().st_mtime_ns for p in folder.glob("*.kvstate")}
    assert len(now) == 3 and name_for(chat.tokens) not in now
    kept = set(now) & set(stamps)
    assert len(kept) == 2 and all(now[n] == stamps[n] for n in kept)  # not rewritten


def test_the_store_keeps_to_its_byte_budget_voice_first(tmp_path):
    probe, pb = _core(tmp_path / "probe")
    _household(probe, pb)
    voice = sum(len(pb.state_bytes(pb.seq_state_get(e.seq_id))) + HEADER_BYTES
                + 8 * len(e.tokens) for e in probe.pool.entries.values() if e.rank == 0)
    core, b = _core(tmp_path, max_bytes=voice + 10)  # room for the two voice entries only
    _household(core, b)
    core.persist(force=True).result()
    fresh, _ = _core(tmp_path)
    fresh.restore(fresh.store.load())
    assert sorted(e.rank for e in fresh.pool.entries.values()) == [0, 0]
    assert core.store.stats()["bytes"] <= core.store.max_bytes


def test_damaged_and_foreign_files_are_skipped_with_a_log_line(tmp_path, caplog):
    core, b = _core(tmp_path)
    _household(core, b)
    core.persist(force=True).result()
    files = sorted((tmp_path / "prefix-cache").glob("*.kvstate"))
    files[0].write_bytes(files[0].read_bytes()[:-7])  # truncated
    raw = bytearray(files[1].read_bytes())
    raw[-3] ^= 0xFF  # one flipped byte in the cells
    files[1].write_bytes(bytes(raw))
    (tmp_path / "prefix-cache" / "junk.kvstate").write_bytes(b"not a prefix at all")
    with caplog.at_level(logging.WARNING, logger="hearth.engine.prefix_store"):
        fresh, fb = _core(tmp_path)
        assert fresh.restore(fresh.store.load()) == 1
    messages = " ".join(r.getMessage() for r in caplog.records)
    assert "truncated" in messages and "checksum" in messages and "junk" in messages
    assert fresh.store.skipped == 3 and fresh.pool.used_cells == fb.used

    other, _ = _core(tmp_path, key={**KEY, "size": 124})  # the model file changed
    with caplog.at_level(logging.WARNING, logger="hearth.engine.prefix_store"):
        assert other.restore(other.store.load()) == 0
    assert "size differ" in caplog.text


def test_a_store_that_cannot_be_written_costs_the_cache_only(tmp_path, caplog):
    (tmp_path / "prefix-cache").write_text("a file where the folder should be")
    core, b = _core(tmp_path)
    _household(core, b)
    with caplog.at_level(logging.WARNING, logger="hearth.engine.prefix_store"):
        core.persist(force=True).result()
    assert "cannot save the prefix cache" in caplog.text
    turn = _serve(core, b, "voice", 30, 5, SYSTEM)
    assert turn.cached_tokens >= len(SYSTEM)


def test_a_request_arriving_during_a_save_goes_first(tmp_path):
    """A save in the idle engine stops copying cells out when a request arrives; what is on
    disk stays, and the next save finishes the job."""
    core, b = _core(tmp_path)
    _serve(core, b, "voice", 20, 1, SYSTEM)
    core.persist(force=True).result()
    _serve(core, b, "chat", 40, 3, [8000 + i for i in range(100)])
    waiting, s = request(b, "voice", 10, 2, seed=9, prefix=SYSTEM)
    core.submit(waiting)  # in the inbox: the engine has work again
    core.persist().result()
    assert len(list((tmp_path / "prefix-cache").glob("*.kvstate"))) == 1
    run_until(core, lambda: s.done is not None)
    core.persist().result()
    names = {p.name for p in (tmp_path / "prefix-cache").glob("*.kvstate")}
    assert names == {name_for(e.tokens) for e in core.pool.entries.values() if e.rank <= 1}
