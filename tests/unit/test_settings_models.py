"""Settings layering and the model resolver."""

from __future__ import annotations

import json
from typing import ClassVar

import pytest

from hearth.cli import build_parser
from hearth.fleet import models
from hearth.settings import load


def parse(*argv: str):
    return build_parser().parse_args(["serve", *argv])


def test_flags_beat_environment_beat_options_file(tmp_path):
    opts = tmp_path / "options.json"
    opts.write_text(json.dumps({"n_parallel": 3, "policy": "fifo", "latency_target_ms": 80,
                                "unknown_option": 1}))
    env = {"HEARTH_POLICY": "serial", "HEARTH_PREFIX_CACHE": "no"}
    s = load(parse("--options-file", str(opts), "--latency-target-ms", "25"), env)
    assert s.n_parallel == 3 and s.policy == "serial" and s.latency_target_ms == 25
    assert s.prefix_cache is False


def test_invalid_settings_exit_with_a_readable_message():
    with pytest.raises(SystemExit, match="policy"):
        load(parse("--policy", "random"), {})
    with pytest.raises(SystemExit, match="n_ubatch"):
        load(parse("--n-batch", "64", "--n-ubatch", "128"), {})
    with pytest.raises(SystemExit, match=r"n_batch \(16\) must be at least n_parallel \(17\)"):
        load(parse("--n-batch", "16", "--n-ubatch", "16", "--n-parallel", "17"), {})


def test_packaged_model_is_found():
    p = models.packaged_model()
    assert p.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and p.stat().st_size > 50_000_000
    assert models.resolve("", "models") == p


def test_model_names_cannot_escape_the_models_folder(tmp_path):
    (tmp_path / "models").mkdir()
    (tmp_path / "secret.gguf").write_bytes(b"x")
    (tmp_path / "models" / "ok.gguf").write_bytes(b"x")
    assert models.resolve("ok.gguf", tmp_path / "models").name == "ok.gguf"
    with pytest.raises(models.ModelNotFound, match="escapes"):
        models.resolve("../secret.gguf", tmp_path / "models")
    with pytest.raises(models.ModelNotFound):
        models.resolve("missing.gguf", tmp_path / "models")


def test_a_download_reports_its_progress(tmp_path, monkeypatch):
    """What /v1/queue shows of a model being downloaded: bytes so far of the total."""
    import io

    data = b"GGUF" + b"x" * ((3 << 20) - 4)

    class Response(io.BytesIO):
        status = 200
        headers: ClassVar[dict[str, str]] = {"Content-Length": str(len(data))}

    monkeypatch.setattr(models.urllib.request, "urlopen", lambda req, timeout: Response(data))
    seen: list[tuple[int, int | None]] = []
    path = models.fetch("https://example.invalid/m.gguf", tmp_path, chunk=1 << 20,
                        progress=lambda got, total: seen.append((got, total)))
    assert path.read_bytes() == data
    assert seen == [(n << 20, 3 << 20) for n in (1, 2, 3)]
