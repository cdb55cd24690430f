"""Reading a model's memory needs from its GGUF header, checked against llama.cpp's own reading
of the same file (the packaged SmolLM2), and refusing what is not a GGUF."""

from __future__ import annotations

import pytest
from llama_in_process import open_model

from hearth.fleet.gguf import GGUFError, read_metadata, shape_of
from hearth.fleet.models import packaged_model


def test_shape_matches_what_llama_cpp_reads():
    path = packaged_model()
    shape = shape_of(path)
    model = open_model(path)
    arch = model.meta("general.architecture")
    assert shape.architecture == arch
    assert shape.n_layer == int(model.meta(f"{arch}.block_count"))
    assert shape.n_embd == model.n_embd
    assert shape.n_ctx_train == model.n_ctx_train
    assert shape.n_head_kv == int(model.meta(f"{arch}.attention.head_count_kv"))
    # f16 K and V for every layer and KV head: SmolLM2-135M holds 23,040 bytes per cell.
    assert shape.kv_bytes(1) == 2 * shape.n_layer * shape.n_head_kv * 64 * 2 == 23_040
    assert shape.resident_bytes(4096) > shape.file_bytes + shape.kv_bytes(4096)
    meta = read_metadata(path, {"tokenizer.ggml.tokens"})
    assert len(meta["tokenizer.ggml.tokens"]) == model.n_vocab


def test_not_a_gguf_or_cut_short(tmp_path):
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a model at all")
    with pytest.raises(GGUFError, match="not a GGUF"):
        shape_of(junk)
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(packaged_model().read_bytes()[:4096])
    with pytest.raises(GGUFError, match="ends inside"):
        shape_of(cut)
