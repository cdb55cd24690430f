"""What a GGUF file says about the memory a model needs, read from its header without loading it.

Deciding which models can be resident at once needs their cost before one is loaded: the
weights (about the file's size, mapped or read) plus the KV cache for the context the model
will run with (2 tensors × layers × context × KV heads × head size × bytes per element), plus
a compute buffer. llama.cpp's own estimate needs the model loaded; the header is enough here.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

MAGIC = b"GGUF"
# Scalar value types of GGUF metadata (gguf.h's gguf_type), as struct formats.
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q",
            12: "d"}
_STRING, _ARRAY = 8, 9
# Room llama.cpp's compute graph takes beside weights and KV (measured: 30-70 MB for the
# small models here; larger ones scale it with n_batch and the vocabulary).
COMPUTE_OVERHEAD_BYTES = 96 * 1024 * 1024


class GGUFError(ValueError):
    pass


def _read(f: BinaryIO, fmt: str) -> Any:
    size = struct.calcsize("<" + fmt)
    data = f.read(size)
    if len(data) != size:
        raise GGUFError("the file ends inside its header")
    return struct.unpack("<" + fmt, data)[0]


def _string(f: BinaryIO) -> str:
    n = _read(f, "Q")
    if n > 1 << 24:
        raise GGUFError(f"a metadata string of {n} bytes")
    data = f.read(n)
    if len(data) != n:
        raise GGUFError("the file ends inside its header")
    return data.decode("utf-8", "replace")


def _value(f: BinaryIO, kind: int, keep: bool) -> Any:
    if kind in _SCALARS:
        return _read(f, _SCALARS[kind])
    if kind == _STRING:
        return _string(f)
    if kind == _ARRAY:
        item, n = _read(f, "I"), _read(f, "Q")
        if item in _SCALARS and not keep:  # e.g. token types: skip without decoding
            f.seek(n * struct.calcsize("<" + _SCALARS[item]), 1)
            return None
        values = [_value(f, item, keep) for _ in range(n)]
        return values if keep else None
    raise GGUFError(f"unknown metadata type {kind}")


def read_metadata(path: Path, wanted: set[str] | None = None) -> dict[str, Any]:
    """The header's key/value metadata. Arrays (the vocabulary) are skipped unless named in
    ``wanted``; with ``wanted``, only those keys are returned."""
    with open(path, "rb") as f:
        if f.read(4) != MAGIC:
            raise GGUFError(f"{path.name} is not a GGUF file")
        version = _read(f, "I")
        if version < 2:
            raise GGUFError(f"GGUF version {version} is too old")
        _read(f, "Q")  # tensor count
        n_kv = _read(f, "Q")
        out: dict[str, Any] = {}
        for _ in range(n_kv):
            key = _string(f)
            keep = wanted is None or key in wanted
            value = _value(f, _read(f, "I"), keep=wanted is not None and key in wanted)
            if keep:
                out[key] = value
        return out


@dataclass(frozen=True)
class ModelShape:
    architecture: str
    n_layer: int
    n_ctx_train: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim_k: int
    head_dim_v: int
    file_bytes: int

    def kv_bytes(self, n_ctx: int, bytes_per_element: float = 2.0) -> int:
        """The KV cache for ``n_ctx`` cells (f16 by default)."""
        per_cell = self.n_layer * self.n_head_kv * (self.head_dim_k + self.head_dim_v)
        return int(per_cell * n_ctx * bytes_per_element)

    def resident_bytes(self, n_ctx: int, bytes_per_element: float = 2.0) -> int:
        """Weights + KV + compute: what loading the model with this context takes."""
        return self.file_bytes + self.kv_bytes(n_ctx, bytes_per_element) + \
            COMPUTE_OVERHEAD_BYTES


def shape_of(path: Path, meta: dict[str, Any] | None = None) -> ModelShape:
    """The model's shape, from its header (or from ``meta``, the header already read)."""
    meta = read_metadata(path) if meta is None else meta
    arch = meta.get("general.architecture")
    if not isinstance(arch, str):
        raise GGUFError(f"{path.name} names no architecture")

    def num(key: str, default: int | None = None) -> int:
        value = meta.get(f"{arch}.{key}", default)
        if isinstance(value, list):  # per-layer head counts: the largest bounds the cost
            value = max(value)
        if not isinstance(value, int):
            raise GGUFError(f"{path.name} has no {arch}.{key}")
        return value

    n_embd, n_head = num("embedding_length"), num("attention.head_count")
    head_dim = n_embd // n_head
    return ModelShape(
        architecture=arch, n_layer=num("block_count"), n_ctx_train=num("context_length"),
        n_embd=n_embd, n_head=n_head, n_head_kv=num("attention.head_count_kv", n_head),
        head_dim_k=num("attention.key_length", head_dim),
        head_dim_v=num("attention.value_length", head_dim), file_bytes=path.stat().st_size)


# llama.cpp's file types (llama_ftype) as Ollama names them, for the common quantizations.
FILE_TYPES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1",
              10: "Q2_K", 11: "Q3_K_S", 12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M",
              16: "Q5_K_S", 17: "Q5_K_M", 18: "Q6_K", 32: "BF16"}
