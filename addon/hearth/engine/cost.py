"""The measured cost of one decode: what keeps an iteration under its latency target."""

from __future__ import annotations


class CostModel:
    """Iteration time ≈ base + per_token × tokens, learnt from every decode (exponentially
    weighted), so the prefill budget tracks what this machine really costs."""

    def __init__(self, base: float = 0.002, per_token: float = 0.0005, alpha: float = 0.2):
        self.base = base
        self.per_token = per_token
        self.alpha = alpha
        self.samples = 0

    def observe(self, n_tokens: int, elapsed: float) -> None:
        a = self.alpha
        self.samples += 1
        if n_tokens <= 2:
            self.base = (1 - a) * self.base + a * max(0.0, elapsed - self.per_token * n_tokens)
        else:
            est = max(1e-7, (elapsed - self.base) / n_tokens)
            self.per_token = (1 - a) * self.per_token + a * est

    def predict(self, n_tokens: int) -> float:
        return self.base + self.per_token * n_tokens

    def tokens_within(self, seconds: float) -> int:
        return int(max(0.0, seconds - self.base) / self.per_token)
