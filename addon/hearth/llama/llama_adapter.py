"""The one thin adapter over llama-cpp-python's low-level ctypes bindings: the model, its
contexts and the backends (``llama_sampling`` holds the samplers and grammars).

Outside this folder only :mod:`hearth.chat.tool_grammars` imports ``llama_cpp`` (its
JSON-schema converter). Everything here is owned by the engine thread, except
:meth:`Context.request_abort`, which any thread may call.
"""

from __future__ import annotations

import ctypes
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import llama_cpp as L
import numpy as np

from ..shared.protocol import ContextParams
from .llama_backends import LlamaError, backend_names, init_backend

log = logging.getLogger(__name__)
__all__ = ["Context", "ContextParams", "LlamaError", "Model", "backend_names", "init_backend"]

def _gguf_meta(model: ctypes.c_void_p, key: str) -> str | None:
    buf = ctypes.create_string_buffer(1 << 16)
    n = L.llama_model_meta_val_str(model, key.encode(), buf, ctypes.sizeof(buf))
    if n < 0:
        return None
    if n >= ctypes.sizeof(buf):  # long chat templates
        buf = ctypes.create_string_buffer(n + 1)
        L.llama_model_meta_val_str(model, key.encode(), buf, ctypes.sizeof(buf))
    return buf.value.decode("utf-8", "replace")


class Model:
    """A loaded GGUF: weights, vocabulary, metadata."""

    def __init__(self, path: str | Path, n_gpu_layers: int = 0, use_mmap: bool = True,
                 extra_buffers: bool = True):
        self.path = Path(path)
        if not self.path.is_file():
            raise LlamaError(f"model file not found: {self.path}")
        params = L.llama_model_default_params()
        params.n_gpu_layers = 2**31 - 1 if n_gpu_layers < 0 else n_gpu_layers
        params.load_mode = L.LLAMA_LOAD_MODE_MMAP if use_mmap else L.LLAMA_LOAD_MODE_NONE
        params.use_extra_bufts = extra_buffers  # off: no AMX kernel, no repacked weights
        self.ptr = L.llama_model_load_from_file(str(self.path).encode(), params)
        if not self.ptr:
            raise LlamaError(f"llama.cpp could not load {self.path}")
        self.vocab = L.llama_model_get_vocab(self.ptr)
        self.n_vocab = L.llama_vocab_n_tokens(self.vocab)
        self.n_ctx_train = L.llama_model_n_ctx_train(self.ptr)
        self.n_embd = L.llama_model_n_embd(self.ptr)
        self.add_bos = bool(L.llama_vocab_get_add_bos(self.vocab))
        # Memory kinds the engine's sequence sharing depends on (see runner.boot.unservable).
        self.is_recurrent = bool(L.llama_model_is_recurrent(self.ptr))
        self.is_hybrid = bool(L.llama_model_is_hybrid(self.ptr))
        self.n_swa = int(L.llama_model_n_swa(self.ptr))
        self._pieces: dict[int, bytes] = {}
        self._candidates: Candidates | None = None
        desc = ctypes.create_string_buffer(256)
        L.llama_model_desc(self.ptr, desc, ctypes.sizeof(desc))
        self.description = desc.value.decode("utf-8", "replace")

    @property
    def name(self) -> str:
        return _gguf_meta(self.ptr, "general.name") or self.path.stem

    def candidates(self, logits: Any) -> Candidates:
        """The model's reusable candidate array, filled from one logits row."""
        if self._candidates is None:
            self._candidates = Candidates(self.n_vocab)
        return self._candidates.fill(logits)

    def chat_template(self) -> str | None:
        tmpl = L.llama_model_chat_template(self.ptr, None)
        return tmpl.decode("utf-8", "replace") if tmpl else None

    def meta(self, key: str) -> str | None:
        return _gguf_meta(self.ptr, key)

    def token_text(self, token: int) -> str:
        return (L.llama_vocab_get_text(self.vocab, token) or b"").decode("utf-8", "replace")

    def special_tokens(self) -> dict[str, str]:
        out = {}
        for name, fn in (("bos_token", L.llama_vocab_bos), ("eos_token", L.llama_vocab_eos)):
            tok = fn(self.vocab)
            if tok >= 0:
                out[name] = self.token_text(tok)
        return out

    def tokenize(self, text: str, add_special: bool = True,
                 parse_special: bool = True) -> list[int]:
        data = text.encode("utf-8")
        cap = len(data) + 8
        buf = (L.llama_token * cap)()
        n = L.llama_tokenize(self.vocab, data, len(data), buf, cap, add_special, parse_special)
        if n < 0:
            cap = -n
            buf = (L.llama_token * cap)()
            n = L.llama_tokenize(self.vocab, data, len(data), buf, cap, add_special,
                                 parse_special)
        if n < 0:
            raise LlamaError("tokenization failed")
        return list(buf[:n])

    def tokenize_pieces(self, pieces: list[tuple[str, bool]], add_special: bool = True
                        ) -> list[int]:
        """A prompt given as ``(text, parse_special)`` pieces: control tokens are read only
        where the piece allows it (the template's own text, not a message's)."""
        out: list[int] = []
        for i, (text, special) in enumerate(pieces):
            out += self.tokenize(text, add_special=add_special and i == 0, parse_special=special)
        return out

    def piece(self, token: int) -> bytes:
        """The bytes of one token (special tokens rendered empty). Cached: pieces never change."""
        got = self._pieces.get(token)
        if got is None:
            buf = ctypes.create_string_buffer(64)
            n = L.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, False)
            if n < 0:
                buf = ctypes.create_string_buffer(-n)
                n = L.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, False)
            got = buf.raw[:n]
            self._pieces[token] = got
        return got

    def is_eog(self, token: int) -> bool:
        return bool(L.llama_vocab_is_eog(self.vocab, token))

    def close(self) -> None:
        if self.ptr:
            L.llama_model_free(self.ptr)
            self.ptr = None


# libc's atoi reads a NUL-terminated digit string without touching Python: used as the abort
# callback it reads our one-byte flag ("0"/"1") at every graph node with no GIL round-trip.
_atoi_addr = ctypes.cast(ctypes.CDLL(None).atoi, ctypes.c_void_p).value
_ABORT_CB = L.ggml_abort_callback(_atoi_addr)


class Context:
    """A llama.cpp context: the KV cache (a unified pool over ``n_seq_max`` sequences), one
    reusable batch, and per-sequence samplers."""

    def __init__(self, model: Model, p: ContextParams, abort_flag: ctypes.Array | None = None):
        """``abort_flag``: two bytes ("0"/"1" and a NUL) another process may write to stop a
        decode (a worker's, in memory the server shares)."""
        self.model = model
        cp = L.llama_context_default_params()
        cp.n_ctx = p.n_ctx
        cp.n_batch = p.n_batch
        cp.n_ubatch = min(p.n_ubatch, p.n_batch)
        cp.n_seq_max = p.n_seq_max
        threads = p.n_threads or os.cpu_count() or 1
        cp.n_threads = threads
        cp.n_threads_batch = threads
        cp.flash_attn_type = {"auto": L.LLAMA_FLASH_ATTN_TYPE_AUTO,
                              "on": L.LLAMA_FLASH_ATTN_TYPE_ENABLED,
                              "off": L.LLAMA_FLASH_ATTN_TYPE_DISABLED}[p.flash_attn]
        cp.kv_unified = p.kv_unified
        # Sliding-window models keep every cell: prefix reuse and preemption restart a sequence
        # from any position, which a window-sized cache would already have dropped.
        cp.swa_full = True
        cp.embeddings = p.embeddings
        cp.no_perf = True
        if p.embeddings:
            cp.pooling_type = L.LLAMA_POOLING_TYPE_MEAN
        self._abort_flag = abort_flag if abort_flag is not None else \
            ctypes.create_string_buffer(b"0", 2)
        cp.abort_callback = _ABORT_CB
        cp.abort_callback_data = ctypes.cast(self._abort_flag, ctypes.c_void_p)
        self.ptr = L.llama_init_from_model(model.ptr, cp)
        if not self.ptr:
            raise LlamaError("llama.cpp could not create a context (too large n_ctx?)")
        self.mem = L.llama_get_memory(self.ptr)
        self.n_ctx = L.llama_n_ctx(self.ptr)
        self.n_batch = L.llama_n_batch(self.ptr)
        self.n_ubatch = L.llama_n_ubatch(self.ptr)
        self.n_seq_max = L.llama_n_seq_max(self.ptr)
        self._batch = L.llama_batch_init(self.n_batch, 0, 1)
        self._views()
        self.embeddings = p.embeddings

    # -- batches -----------------------------------------------------------------------------
    def decode(self, tokens: Sequence[int], pos: Sequence[int], seqs: Sequence[int],
               outputs: Sequence[bool]) -> int:
        """One ``llama_decode`` over the given tokens. Returns llama.cpp's status: 0 ok,
        1 no KV slot, 2 aborted (finished ubatches stay in the KV cache)."""
        n = len(tokens)
        if n == 0:
            return 0
        if n > self.n_batch:
            raise LlamaError(f"batch of {n} tokens exceeds n_batch {self.n_batch}")
        # Whole-array copies: a per-token ctypes loop cost ~1.5 ms per 512 tokens.
        self._token[:n] = tokens
        self._pos[:n] = pos
        self._seq[:n] = seqs
        self._logits[:n] = outputs
        self._batch.n_tokens = n
        return L.llama_decode(self.ptr, self._batch)

    def _views(self) -> None:
        """numpy views of the batch's arrays. Each token's one sequence id lives in its own
        small allocation; the batch's pointers are aimed into one array here instead (the
        originals are put back before llama_batch_free)."""
        b, n = self._batch, self.n_batch
        self._token = np.ctypeslib.as_array(b.token, shape=(n,))
        self._pos = np.ctypeslib.as_array(b.pos, shape=(n,))
        self._logits = np.ctypeslib.as_array(b.logits, shape=(n,))
        np.ctypeslib.as_array(b.n_seq_id, shape=(n,))[:] = 1
        self._seq = np.zeros(n, dtype=np.int32)
        base = self._seq.ctypes.data
        kind = type(b.seq_id[0])
        # Addresses, not pointer objects: those alias the slot they were read from.
        self._own_seq_ptrs = [ctypes.cast(b.seq_id[i], ctypes.c_void_p).value for i in range(n)]
        for i in range(n):
            b.seq_id[i] = ctypes.cast(base + 4 * i, kind)

    def request_abort(self) -> None:
        """Any thread: make a running ``decode`` stop at the next graph node."""
        self._abort_flag[0] = b"1"

    def clear_abort(self) -> None:
        self._abort_flag[0] = b"0"

    @property
    def abort_requested(self) -> bool:
        return self._abort_flag[0] == b"1"

    # -- memory ------------------------------------------------------------------------------
    def seq_rm(self, seq: int, p0: int = -1, p1: int = -1) -> bool:
        return bool(L.llama_memory_seq_rm(self.mem, seq, p0, p1))

    def seq_cp(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None:
        L.llama_memory_seq_cp(self.mem, src, dst, p0, p1)

    def seq_pos_max(self, seq: int) -> int:
        return L.llama_memory_seq_pos_max(self.mem, seq)

    def clear(self) -> None:
        L.llama_memory_clear(self.mem, True)

    def seq_state_get(self, seq: int) -> tuple[ctypes.Array, int] | None:
        """A sequence's cells (positions and K/V) as llama.cpp serialises them (a buffer and
        its length, not copied again); None if empty."""
        size = L.llama_state_seq_get_size(self.ptr, seq)
        if size == 0:
            return None
        buf = (ctypes.c_uint8 * size)()
        n = L.llama_state_seq_get_data(self.ptr, buf, size, seq)
        return (buf, n) if n else None

    def seq_state_set(self, seq: int, data: tuple[ctypes.Array, int]) -> bool:
        """Put cells saved by :meth:`seq_state_get` back as ``seq`` (its old cells go first);
        llama.cpp places them in the lowest free cells."""
        buf, n = data
        return L.llama_state_seq_set_data(self.ptr, buf, n, seq) == n

    @staticmethod
    def state_bytes(data: tuple[ctypes.Array, int]) -> bytes:
        buf, n = data
        return ctypes.string_at(buf, n)

    @staticmethod
    def state_from_bytes(raw: bytes) -> tuple[ctypes.Array, int]:
        return (ctypes.c_uint8 * len(raw)).from_buffer_copy(raw), len(raw)

    # -- outputs -----------------------------------------------------------------------------
    def logits(self, i: int) -> ctypes.Array:
        return L.llama_get_logits_ith(self.ptr, i)

    def sequence_embedding(self, seq: int) -> list[float]:
        ptr = L.llama_get_embeddings_seq(self.ptr, seq)
        if not ptr:
            raise LlamaError("no pooled embedding for sequence")
        return ptr[: self.model.n_embd]

    def close(self) -> None:
        if self.ptr:
            kind = type(self._batch.seq_id[0])
            for i, addr in enumerate(self._own_seq_ptrs):  # llama_batch_free frees these
                self._batch.seq_id[i] = ctypes.cast(addr, kind)
            L.llama_batch_free(self._batch)
            L.llama_free(self.ptr)
            self.ptr = None


class Candidates:
    """A reusable llama_token_data_array over the whole vocabulary, filled from a logits row
    with numpy (the sampling thread is the only user)."""

    def __init__(self, n_vocab: int):
        self.n_vocab = n_vocab
        self.data = (L.llama_token_data * n_vocab)()
        view = np.ctypeslib.as_array(self.data)
        self._fields = view.view(np.dtype([("id", np.int32), ("logit", np.float32),
                                           ("p", np.float32)]))
        self._ids = np.arange(n_vocab, dtype=np.int32)
        self.array = L.llama_token_data_array(self.data, n_vocab, -1, False)

    def fill(self, logits: Any) -> Candidates:
        self._fields["id"] = self._ids  # samplers sort and cut the array in place
        self._fields["logit"] = np.ctypeslib.as_array(logits, shape=(self.n_vocab,))
        self._fields["p"] = 0.0
        self.array.data = self.data
        self.array.size, self.array.selected, self.array.sorted = self.n_vocab, -1, False
        return self
