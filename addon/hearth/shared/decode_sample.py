"""Decode, then sample: what a backend in this process does for the engine's
``decode_sample``, and the run of tokens one decode yields when it checked a draft's guesses.
Shared by the engine (an in-process backend) and the model worker, which must not import the
engine (see :mod:`hearth.runner.boot`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def sample_run(sample: Callable[[int], int], row: int, drafts: list[int]) -> list[int]:
    """The tokens a stream gets from one decode that checked ``drafts`` after its last token:
    sampled at ``row`` and on, in order, while each equals the draft fed after it. Every token
    is the model's own sample given the tokens before it, so the output is what decoding one
    token at a time would give (for any sampler); the drafts only decide how many come of one
    decode. The last token is always one the draft did not guess (or there were no more)."""
    run: list[int] = []
    for j in range(len(drafts) + 1):
        run.append(sample(row + j))
        if j == len(drafts) or run[-1] != drafts[j]:
            return run
    return run


class SampleAfterDecode:
    """``decode_sample`` for an in-process backend: decode, then sample each output. A worker
    process's backend does both in one round trip."""

    n_draft = 0
    draft_s = 0.0

    def decode_sample(self, tokens: list[int], pos: list[int], seqs: list[int],
                      outputs: list[bool], samples: list[tuple]) -> tuple[int, list[Any]]:
        status = self.decode(tokens, pos, seqs, outputs)  # type: ignore[attr-defined]
        if status != 0:
            return status, []
        out: list[Any] = []
        for s, i, *drafts in samples:
            if drafts:
                out.append(sample_run(lambda j, s=s: self.sample(s, j),  # type: ignore[attr-defined]
                                      i, drafts[0]))
            else:
                out.append(self.sample(s, i))  # type: ignore[attr-defined]
        return status, out

    def draft(self, tokens: list[int], k: int, sampler: Any = None) -> list[int]:
        return []
