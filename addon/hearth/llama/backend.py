"""The engine's backend on llama.cpp: a model, its generation context and (lazily) an embedding
context on the same weights or a separate embedding model."""

from __future__ import annotations

import time
from typing import Any

from ..shared.decode_sample import SampleAfterDecode
from ..shared.requests import SamplingParams, Utf8Decoder
from .llama_adapter import Context, ContextParams, Model
from .llama_sampling import Sampler


def l2_normalised(vector: Any) -> list[float]:
    """``vector`` scaled to unit length (a zero vector stays zero)."""
    norm = sum(x * x for x in vector) ** 0.5 or 1.0
    return [x / norm for x in vector]


class LlamaBackend(SampleAfterDecode):
    def __init__(self, model: Model, params: ContextParams, embed_model: Model | None = None,
                 embed_batch: int = 2048, embed_inputs: int = 32, abort_flag: Any = None):
        self.model = model
        self.ctx = Context(model, params, abort_flag)
        self.n_ctx = self.ctx.n_ctx
        # A unified pool lets one sequence use the whole cache; keep it within what the model
        # was trained for.
        self.n_ctx_seq = min(self.n_ctx, model.n_ctx_train or self.n_ctx)
        self.n_seq_max = self.ctx.n_seq_max
        self.n_batch = self.ctx.n_batch
        self.n_ubatch = self.ctx.n_ubatch
        self._embed_model = embed_model or model
        self._embed_ctx: Context | None = None
        self._embed_batch = embed_batch
        self._embed_inputs = embed_inputs
        self._threads = params.n_threads

    def now(self) -> float:
        return time.monotonic()

    def decode(self, tokens: list[int], pos: list[int], seqs: list[int],
               outputs: list[bool]) -> int:
        return self.ctx.decode(tokens, pos, seqs, outputs)

    def new_sampler(self, p: SamplingParams) -> Sampler:
        return Sampler(self.model, p)

    def sample(self, sampler: Sampler, i: int) -> int:
        return sampler.sample(self.ctx, i)

    def force(self, sampler: Sampler, text: str, limit: int) -> list[int]:
        """``text`` as tokens that ``sampler`` takes as its own, as far as its grammar allows
        (at most ``limit``)."""
        tokens = self.model.tokenize(text, add_special=False, parse_special=False)
        return sampler.force(tokens[:limit])

    def free_sampler(self, sampler: Sampler) -> None:
        sampler.close()

    def seq_rm(self, seq: int, p0: int = -1, p1: int = -1) -> None:
        self.ctx.seq_rm(seq, p0, p1)

    def seq_cp(self, src: int, dst: int, p0: int, p1: int) -> None:
        self.ctx.seq_cp(src, dst, p0, p1)

    def seq_pos_max(self, seq: int) -> int:
        return self.ctx.seq_pos_max(seq)

    def seq_state_get(self, seq: int) -> Any:
        return self.ctx.seq_state_get(seq)

    def seq_state_set(self, seq: int, data: Any) -> bool:
        return self.ctx.seq_state_set(seq, data)

    def state_bytes(self, data: Any) -> bytes:
        return Context.state_bytes(data)

    def state_from_bytes(self, raw: bytes) -> Any:
        return Context.state_from_bytes(raw)

    def is_eog(self, token: int) -> bool:
        return self.model.is_eog(token)

    def piece(self, token: int) -> bytes:
        return self.model.piece(token)

    def make_decoder(self) -> Utf8Decoder:
        return Utf8Decoder()

    def request_abort(self) -> None:
        self.ctx.request_abort()

    def clear_abort(self) -> None:
        self.ctx.clear_abort()

    # -- embeddings -------------------------------------------------------------------------
    def embed_limits(self) -> tuple[int, int]:
        return self._embed_batch, self._embed_inputs

    def _embed_context(self) -> Context:
        if self._embed_ctx is None:
            self._embed_ctx = Context(self._embed_model, ContextParams(
                n_ctx=self._embed_batch, n_seq_max=self._embed_inputs,
                n_batch=self._embed_batch, n_ubatch=self._embed_batch,
                n_threads=self._threads, embeddings=True, kv_unified=True))
        return self._embed_ctx

    def embed_pieces(self) -> bool:
        """Whether one long input may go in pieces (:meth:`embed_piece`): a causal model's
        tokens see only those before them, so a piece decoded after the earlier ones' cells
        gives the tokens' states the whole input would. The generation model is causal; a
        separate embedding model may not be (BERT-like encoders attend both ways)."""
        return self._embed_model is self.model

    def embed_piece(self, tokens: list[int], start: int, last: bool) -> list[float]:
        """Positions ``start``.. of one long input, after its earlier pieces (kept in the
        embedding context's sequence 0; a piece at 0 starts afresh, the ``last`` clears it):
        the mean of these tokens' states, not normalised (the caller weighs the pieces)."""
        ctx = self._embed_context()
        if start == 0:
            ctx.clear()
        try:
            status = ctx.decode(tokens, list(range(start, start + len(tokens))),
                                [0] * len(tokens), [True] * len(tokens))
            if status != 0:
                raise RuntimeError(f"llama_decode returned {status}")
            return list(ctx.sequence_embedding(0))
        except BaseException:
            ctx.clear()
            raise
        finally:
            if last:
                ctx.clear()

    def embed(self, inputs: list[list[int]]) -> list[list[float]]:
        """Mean-pooled, L2-normalised embeddings of several inputs in one decode."""
        ctx = self._embed_context()
        ctx.clear()  # an input given up part-way (its request cancelled) left its pieces
        tokens: list[int] = []
        pos: list[int] = []
        seqs: list[int] = []
        for s, toks in enumerate(inputs):
            tokens.extend(toks)
            pos.extend(range(len(toks)))
            seqs.extend([s] * len(toks))
        try:
            status = ctx.decode(tokens, pos, seqs, [True] * len(tokens))
            if status != 0:
                raise RuntimeError(f"llama_decode returned {status}")
            out = []
            for s in range(len(inputs)):
                out.append(l2_normalised(ctx.sequence_embedding(s)))
            return out
        finally:
            ctx.clear()

    def describe(self) -> dict[str, Any]:
        return {"n_ctx": self.n_ctx, "n_ctx_seq": self.n_ctx_seq, "n_seq_max": self.n_seq_max,
                "n_batch": self.n_batch, "n_ubatch": self.n_ubatch}

    def close(self) -> None:
        if self._embed_ctx is not None:
            self._embed_ctx.close()
        self.ctx.close()
