"""Jump-forward in tool calls, the engine's side: after a sampled token, the text its call's
schemas fix (:mod:`hearth.chat.call_forcing`) becomes the request's next output without sampling.
The worker's sampler takes it token by token as far as the call's grammar allows; the tokens
go out to the stream now and are decoded with the next iteration's token, as a short prefill
(the composer feeds all of a request's tokens not yet in the KV cache)."""

from __future__ import annotations

from collections.abc import Callable

from ..policy.scheduler import Policy
from ..shared.requests import Request
from .base import Backend
from .stats import Stats


class JumpForward:
    def __init__(self, backend: Backend, stats: Stats, policy: Policy,
                 append: Callable[[Request, int, float], str]):
        self.b, self.stats, self.policy = backend, stats, policy
        self._append = append  # the core's: one output token to the stream, stops matched

    def after(self, r: Request, text: str, now: float) -> None:
        """``r`` (with a forcer) just wrote ``text``: write what its call now fixes, within
        its token limit and its sequence's room."""
        forced = r.forcer.feed(text)
        limit = min(r.max_tokens - r.n_generated, self.b.n_ctx_seq - len(r.tokens))
        if not forced or limit <= 0:
            return
        taken = self.b.force(r.sampler, forced, limit)
        self.stats.forced_tokens += len(taken)
        for tok in taken:
            r.n_generated += 1
            self.policy.charge(r.user, output_tokens=1, now=now)
            r.forcer.note(self._append(r, tok, now))
            if r.finished:  # a stop string, or the limit
                return
