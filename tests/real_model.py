"""Greedy decoding on the real model, for tests that compare what a sampler makes of it."""

from __future__ import annotations

from hearth.llama.llama_adapter import Context, ContextParams


def greedy(model, text: str, sample_with, n: int = 40) -> str:
    """``n`` greedy tokens after ``text``, sampled by ``sample_with(ctx)``."""
    ctx = Context(model, ContextParams(n_ctx=1024, n_seq_max=2, n_batch=256, n_threads=2))
    try:
        prompt = model.tokenize(text)
        ctx.decode(prompt, list(range(len(prompt))), [0] * len(prompt),
                   [False] * (len(prompt) - 1) + [True])
        sample = sample_with(ctx)
        out, pos, row = [], len(prompt), len(prompt) - 1
        for _ in range(n):
            out.append(sample(row))
            ctx.decode([out[-1]], [pos], [0], [True])
            pos, row = pos + 1, 0
        return b"".join(model.piece(t) for t in out).decode("utf-8", "replace")
    finally:
        ctx.close()
