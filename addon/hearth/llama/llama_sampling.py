"""Sampling and grammars over llama-cpp-python's low-level bindings: the other half of the
thin adapter (``llama_adapter`` holds the model, the context and the backends). Owned by the
engine thread, like everything there.
"""

from __future__ import annotations

import ctypes
import os
from typing import Any

import llama_cpp as L

from ..shared.requests import SamplingParams
from .llama_adapter import Context, LlamaError, Model


class Sampler:
    """One llama.cpp sampler chain (a sequence's own RNG, penalties and grammar state)."""

    def __init__(self, model: Model, p: SamplingParams):
        cparams = L.llama_sampler_chain_default_params()
        cparams.no_perf = True
        self.model = model
        self.grammar = None  # kept out of the chain: checked on the sampled token first
        self.ptr = L.llama_sampler_chain_init(cparams)
        add = lambda s: L.llama_sampler_chain_add(self.ptr, s)  # noqa: E731
        if p.grammar:
            self.grammar = _grammar_sampler(model, p.grammar, p.grammar_trigger)
            if not self.grammar:
                self.grammar = None
                self.close()  # before __del__ sees the pointer: a second free would crash
                raise LlamaError("invalid grammar")
        if p.repeat_penalty != 1.0:
            add(L.llama_sampler_init_penalties(model.n_vocab, p.repeat_last_n, p.repeat_penalty,
                                               0.0, 0.0))
        if p.temperature <= 0:
            add(L.llama_sampler_init_greedy())
        else:
            if p.top_k > 0:
                add(L.llama_sampler_init_top_k(p.top_k))
            if p.top_p < 1.0:
                add(L.llama_sampler_init_top_p(p.top_p, 1))
            if p.min_p > 0:
                add(L.llama_sampler_init_min_p(p.min_p, 1))
            add(L.llama_sampler_init_temp(p.temperature))
            seed = p.seed if p.seed is not None else int.from_bytes(os.urandom(4), "little")
            add(L.llama_sampler_init_dist(seed & 0xFFFFFFFF))

    def sample(self, ctx: Context, i: int) -> int:
        """Sample from output row ``i`` of the last decode; the chain accepts the token.

        With a grammar, as llama.cpp's own common sampler does: sample without it, check only
        the chosen token against the grammar, and apply the grammar to the whole vocabulary
        only when that token is refused (a grammar over ~50k candidates costs ~4 ms a token
        here, one candidate next to nothing)."""
        if self.grammar is None:
            return L.llama_sampler_sample(self.ptr, ctx.ptr, i)
        candidates = self.model.candidates(L.llama_get_logits_ith(ctx.ptr, i))
        L.llama_sampler_apply(self.ptr, ctypes.byref(candidates.array))
        token = int(candidates.data[candidates.array.selected].id)
        if not _grammar_allows(self.grammar, token):
            candidates = self.model.candidates(L.llama_get_logits_ith(ctx.ptr, i))
            L.llama_sampler_apply(self.grammar, ctypes.byref(candidates.array))
            L.llama_sampler_apply(self.ptr, ctypes.byref(candidates.array))
            token = int(candidates.data[candidates.array.selected].id)
        L.llama_sampler_accept(self.grammar, token)
        L.llama_sampler_accept(self.ptr, token)
        return token

    def accept(self, token: int) -> None:
        """Feed a token the chain did not sample itself (resumed or forced history)."""
        if self.grammar is not None:
            L.llama_sampler_accept(self.grammar, token)
        L.llama_sampler_accept(self.ptr, token)

    def force(self, tokens: list[int]) -> list[int]:
        """Take ``tokens`` as if sampled, as far as the grammar lets each come next: those
        taken, a prefix of ``tokens`` (text forced in a tool call,
        :mod:`hearth.chat.call_forcing`)."""
        taken: list[int] = []
        for tok in tokens:
            if self.grammar is not None and not _grammar_allows(self.grammar, tok):
                break
            self.accept(tok)
            taken.append(tok)
        return taken

    def close(self) -> None:
        if self.grammar:
            L.llama_sampler_free(self.grammar)
            self.grammar = None
        if self.ptr:
            L.llama_sampler_free(self.ptr)
            self.ptr = None

    __del__ = close


def _grammar_allows(grammar: Any, token: int) -> bool:
    """Whether the grammar, in its current state, lets ``token`` come next."""
    one = (L.llama_token_data * 1)(L.llama_token_data(token, 0.0, 0.0))
    arr = L.llama_token_data_array(one, 1, -1, False)
    L.llama_sampler_apply(grammar, ctypes.byref(arr))
    return one[0].logit != float("-inf")


def _grammar_sampler(model: Model, gbnf: str, trigger: str | None = None) -> ctypes.c_void_p | None:
    """llama.cpp's grammar sampler for ``gbnf`` (root rule ``root``), lazy if ``trigger`` (a
    regex over the output so far) is given; NULL if it will not parse it."""
    if trigger is None:
        return L.llama_sampler_init_grammar(model.vocab, gbnf.encode(), b"root")
    patterns = (ctypes.c_char_p * 1)(trigger.encode())
    return L.llama_sampler_init_grammar_lazy_patterns(model.vocab, gbnf.encode(), b"root",
                                                      patterns, 1, None, 0)


def check_grammar(model: Model, gbnf: str) -> None:
    """Raise ValueError if llama.cpp will not parse ``gbnf``: the converter emits grammars
    llama.cpp refuses, e.g. a maxLength past its repetition limit."""
    g = _grammar_sampler(model, gbnf)
    if not g:
        raise ValueError("llama.cpp cannot use the grammar made from this schema (too many "
                         "repetitions, e.g. a large maxLength or maxItems?)")
    L.llama_sampler_free(g)
