"""Warm-ups another request made needless, a part of the engine. A warm-up
(``POST /v1/cache/warm``, Home Assistant's agent after a restart or a change) only puts a
prompt into the prefix cache. It runs as background work and never beside a voice or chat
stream (the composer), so a command that arrives meanwhile computes the same prompt itself;
once that command's cells are cached, what the warm-up still had to compute is there
already."""

from __future__ import annotations

from ..shared.requests import Request
from .kv import KVSpace

# Tokens of its own prompt a warm-up may leave uncached and still be served: its prompt ends
# with the assistant's header where a command's goes on with the user's turn.
WARM_TAIL = 32


def served_warm_ups(running: list[Request], kv: KVSpace) -> list[Request]:
    """The running warm-ups still feeding their prompt whose prompt a cached prefix now holds
    (but for its last ``WARM_TAIL`` tokens): the prefix is marked as kept for the warm-up's
    class, as admitting the warm-up on it would have done."""
    served = []
    for r in running:
        if not r.warm_up or r.remaining <= 1:
            continue
        entry, hit = kv.find(r.tokens)
        if entry is None or hit <= r.n_past or hit < len(r.tokens) - WARM_TAIL:
            continue
        kv.pool.use(entry, hit, len(r.tokens), count=False, rank=r.cache_rank)
        r.cached_tokens = max(r.cached_tokens, r.n_prompt - r.prefilled_tokens)
        served.append(r)
    return served
