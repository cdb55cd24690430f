"""GGUF files made where they are used: a machine that takes 64 MiB a call gets no model, so a
real model's tokenizer travels alone (a few MiB) and the weights are made there, random, in the
shapes of the architecture measured. Written with the gguf writer of the llama.cpp source that
builds the libraries (its gguf-py on PYTHONPATH; it needs numpy and PyYAML).

  make_model.py vocab SRC DST                  SRC's tokenizer (every tokenizer.* key: vocabulary,
                                               merges, special tokens, chat template), no tensors
  make_model.py model VOCAB DST [--shape NAME | --shape-from GGUF] [--layers N] [--set K=V ...]
                                               random weights (normal, std 0.02; norms 1) in F16,
                                               every tensor llama.cpp's loader asks for, and
                                               VOCAB's tokenizer; --layers keeps the first N
  make_model.py copy SRC DST --set K=V ...     SRC with string keys changed (tensors as they are),
                                               e.g. --set tokenizer.ggml.pre=llama3
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import gguf
import numpy as np


@dataclass(frozen=True)
class Shape:
    arch: str  # llama.cpp's name: llama, qwen2
    n_layer: int
    n_embd: int
    n_ff: int
    n_head: int
    n_head_kv: int
    rope_theta: float
    n_ctx_train: int
    rms_eps: float
    output: bool  # an output matrix of its own (else tied to the token embeddings)
    qkv_bias: bool


# The household model (Qwen2.5-Coder-1.5B-Instruct; its GGUF's header) and the packaged one.
SHAPES = {
    "qwen2.5-coder-1.5b": Shape("qwen2", 28, 1536, 8960, 12, 2, 1e6, 32768, 1e-6, True, True),
    "smollm2-135m": Shape("llama", 30, 576, 1536, 9, 3, 1e5, 8192, 1e-5, False, False),
}


def _field(r: gguf.GGUFReader, key: str) -> Any:
    return r.fields[key].contents() if key in r.fields else None


def shape_of(path: str | Path) -> Shape:
    """A GGUF's shape, read from its header."""
    r = gguf.GGUFReader(path)
    arch = _field(r, "general.architecture")
    names = {t.name for t in r.tensors}

    def get(key: str) -> Any:
        value = _field(r, f"{arch}.{key}")
        return float(f"{value:.6g}") if isinstance(value, float) else value  # float32's 1e-6
    return Shape(arch, int(get("block_count")), int(get("embedding_length")),
                 int(get("feed_forward_length")), int(get("attention.head_count")),
                 int(get("attention.head_count_kv")), float(get("rope.freq_base")),
                 int(get("context_length")), float(get("attention.layer_norm_rms_epsilon")),
                 "output.weight" in names, "blk.0.attn_q.bias" in names)


def _kv(w: gguf.GGUFWriter, r: gguf.GGUFReader, keep: Any, overrides: dict[str, str]) -> None:
    """Copy ``r``'s keys that ``keep`` accepts, with string ``overrides``."""
    for key, f in r.fields.items():
        if key.startswith("GGUF.") or not keep(key) or key == "general.architecture":
            continue
        main = f.types[0]
        sub = f.types[-1] if main == gguf.GGUFValueType.ARRAY else None
        value = overrides.pop(key) if key in overrides else f.contents()
        w.add_key_value(key, value, main, sub)
    for key, value in overrides.items():  # keys it did not have
        w.add_string(key, value)


def write_vocab(src: str, dst: str) -> None:
    r = gguf.GGUFReader(src)
    w = gguf.GGUFWriter(dst, _field(r, "general.architecture"))
    _kv(w, r, lambda k: k.startswith("tokenizer."), {})
    _finish(w)


def tensors(s: Shape, n_vocab: int) -> list[tuple[str, tuple[int, ...]]]:
    """Every tensor of the shape, as (name, numpy shape: rows = outputs)."""
    head = s.n_embd // s.n_head
    q, kv = s.n_head * head, s.n_head_kv * head
    out: list[tuple[str, tuple[int, ...]]] = [("token_embd.weight", (n_vocab, s.n_embd))]
    for i in range(s.n_layer):
        b = f"blk.{i}."
        out += [(b + "attn_norm.weight", (s.n_embd,)), (b + "attn_q.weight", (q, s.n_embd)),
                (b + "attn_k.weight", (kv, s.n_embd)), (b + "attn_v.weight", (kv, s.n_embd)),
                (b + "attn_output.weight", (s.n_embd, q)), (b + "ffn_norm.weight", (s.n_embd,)),
                (b + "ffn_gate.weight", (s.n_ff, s.n_embd)),
                (b + "ffn_up.weight", (s.n_ff, s.n_embd)),
                (b + "ffn_down.weight", (s.n_embd, s.n_ff))]
        if s.qkv_bias:
            out += [(b + "attn_q.bias", (q,)), (b + "attn_k.bias", (kv,)),
                    (b + "attn_v.bias", (kv,))]
    out.append(("output_norm.weight", (s.n_embd,)))
    if s.output:
        out.append(("output.weight", (n_vocab, s.n_embd)))
    return out


def write_model(vocab: str, dst: str, s: Shape, overrides: dict[str, str], seed: int = 0) -> None:
    r = gguf.GGUFReader(vocab)
    n_vocab = len(r.fields["tokenizer.ggml.tokens"].data)
    w = gguf.GGUFWriter(dst, s.arch)
    w.add_name(f"random weights, {s.arch} {s.n_layer} layers x {s.n_embd}")
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    w.add_block_count(s.n_layer)
    w.add_context_length(s.n_ctx_train)
    w.add_embedding_length(s.n_embd)
    w.add_feed_forward_length(s.n_ff)
    w.add_head_count(s.n_head)
    w.add_head_count_kv(s.n_head_kv)
    w.add_rope_freq_base(s.rope_theta)
    w.add_rope_dimension_count(s.n_embd // s.n_head)
    w.add_layer_norm_rms_eps(s.rms_eps)
    w.add_vocab_size(n_vocab)
    _kv(w, r, lambda k: k.startswith("tokenizer."), dict(overrides))
    shapes = tensors(s, n_vocab)
    # One pool of random numbers that every matrix is a view of: the values only need to be
    # plausible (a decode costs the same), and 1.5B fresh ones would take most of a minute.
    most = max(int(np.prod(sh)) for _, sh in shapes if len(sh) == 2)
    pool = (np.random.default_rng(seed).standard_normal(most, dtype=np.float32) * 0.02
            ).astype(np.float16)
    ones = np.ones(max(sh[0] for _, sh in shapes if len(sh) == 1), dtype=np.float32)
    for name, sh in shapes:
        if len(sh) == 1:  # norms 1, biases 0: what a trained model's look like in scale
            w.add_tensor(name, ones[:sh[0]] if name.endswith("norm.weight")
                         else np.zeros(sh, dtype=np.float32))
        else:
            w.add_tensor(name, pool[:int(np.prod(sh))].reshape(sh))
    _finish(w)


def write_copy(src: str, dst: str, overrides: dict[str, str]) -> None:
    r = gguf.GGUFReader(src)
    w = gguf.GGUFWriter(dst, _field(r, "general.architecture"))
    _kv(w, r, lambda k: True, dict(overrides))
    for t in r.tensors:
        w.add_tensor(t.name, t.data, raw_shape=t.data.shape, raw_dtype=t.tensor_type)
    _finish(w)


def _finish(w: gguf.GGUFWriter) -> None:
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("what", choices=("vocab", "model", "copy"))
    ap.add_argument("src", help="vocab, copy: the GGUF read; model: the vocabulary GGUF")
    ap.add_argument("dst")
    ap.add_argument("--shape", default="qwen2.5-coder-1.5b", choices=sorted(SHAPES))
    ap.add_argument("--shape-from", default="", help="a GGUF whose header gives the shape")
    ap.add_argument("--layers", type=int, default=0, help="the first N layers only")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    a = ap.parse_args(argv)
    overrides = dict(kv.split("=", 1) for kv in a.set)
    if a.what == "vocab":
        write_vocab(a.src, a.dst)
    elif a.what == "copy":
        write_copy(a.src, a.dst, overrides)
    else:
        s = shape_of(a.shape_from) if a.shape_from else SHAPES[a.shape]
        if a.layers:
            s = replace(s, n_layer=a.layers)
        print("shape:", asdict(s), file=sys.stderr)
        write_model(a.src, a.dst, s, overrides)
    return 0


if __name__ == "__main__":
    sys.exit(main())
