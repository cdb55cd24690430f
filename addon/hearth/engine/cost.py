"""The measured cost of one decode: what keeps an iteration under its latency target."""

from __future__ import annotations

from dataclasses import dataclass

# Batch sizes are grouped by powers of two: bucket k holds sizes 2**(k-1) .. 2**k - 1.
N_BUCKETS = 14  # up to 8,191 tokens
MIN_SAMPLES = 8  # a bucket's samples before attention is told apart from its tokens
SPREAD = 0.25  # and how far apart their positions (1 - cos² of the tokens and positions)
MIN_TOKEN_SHARE = 0.05  # the least of a bucket's cost its tokens (not attention) explain


def bucket(n_tokens: int) -> int:
    return min(N_BUCKETS - 1, max(1, n_tokens).bit_length())


def attention(n: int, start: int) -> int:
    """Positions ``n`` tokens from ``start`` attend to, summed (each sees all before it)."""
    return n * start + n * (n + 1) // 2


@dataclass
class _Fit:
    """Exponentially weighted least squares of t = per_token·n + per_position·attended."""

    nn: float = 0.0
    na: float = 0.0
    aa: float = 0.0
    nt: float = 0.0
    at: float = 0.0
    per_token: float = 0.0
    per_position: float | None = None  # None until the samples tell the two terms apart
    seen: bool = False
    samples: int = 0

    def add(self, n: float, a: float, t: float, keep: float) -> None:
        if not self.seen:  # the first sample replaces the seed outright
            keep = 0.0
        self.nn = keep * self.nn + n * n
        self.na = keep * self.na + n * a
        self.aa = keep * self.aa + a * a
        self.nt = keep * self.nt + n * t
        self.at = keep * self.at + a * t
        self.seen = True
        self.samples += 1
        det = self.nn * self.aa - self.na * self.na
        # Two terms need samples that tell them apart: many, over positions that vary widely.
        # From a few prompts, or decodes all at 30-60 positions, noise put a bucket's whole
        # cost on attention (SmolLM2's decodes: 0 ms a token, 533 µs a position), so a
        # 900-token summary's own attention was priced at 222 s (it took 13 s).
        if self.samples >= MIN_SAMPLES and det > SPREAD * self.nn * self.aa and self.aa > 0:
            p = (self.nn * self.at - self.na * self.nt) / det
            # And attention may not be all of it: a batch's tokens cost something.
            if p >= 0 and self.nt - p * self.na >= MIN_TOKEN_SHARE * self.nt:
                self.per_position = p
                self.per_token = max(1e-7, (self.nt - p * self.na) / self.nn)
                return
        p = self.per_position or 0.0
        self.per_token = max(1e-7, (self.nt - p * self.na) / self.nn)


class CostModel:
    """Iteration time ≈ per_token(size) × tokens + per_position(size) × the positions its
    tokens attend to, fitted per power-of-two bucket of batch sizes from every decode
    (exponentially weighted least squares).

    Not one straight line: on a CPU a small batch costs nearly as much per token as a single
    decode (SmolLM2 on 2 cores: ~12 ms a token at 4–20 tokens, ~5 ms at 128), so a line fitted
    to the many decode-only iterations priced prefill several times too high and held a long
    chat prompt to 16-token chunks beside 4 streams (25 s to its first token; llama-server
    9.6 s). And attention: it grows with a prompt's position (~13 µs an attended position
    there), so a prompt's later chunks must shrink to keep an iteration's time."""

    def __init__(self, base: float = 0.002, per_token: float = 0.0005, alpha: float = 0.2):
        self.keep = 1 - alpha
        self.samples = 0
        self.fits = [_Fit() for _ in range(N_BUCKETS)]
        self.seed(base, per_token)

    def seed(self, base: float, per_token: float) -> None:
        """Start from a straight line (a simulated backend's cost, or a prior guess)."""
        for k in range(N_BUCKETS):
            n = max(1, 3 * 2 ** (k - 1) // 2)  # the middle of the bucket
            self.fits[k] = _Fit(per_token=(base + per_token * n) / n)

    def observe(self, n_tokens: int, elapsed: float, attended: int = 0) -> None:
        if n_tokens <= 0:
            return
        self.samples += 1
        self.fits[bucket(n_tokens)].add(n_tokens, attended, elapsed, self.keep)

    def _fit(self, n_tokens: int) -> tuple[float, float]:
        k = bucket(n_tokens)
        # Unmeasured: the nearest measured smaller batch (per-token cost falls with size, so
        # this errs towards caution), else the nearest larger one, else the seed.
        order = [k, *range(k - 1, 0, -1), *range(k + 1, N_BUCKETS)]
        f = next((self.fits[j] for j in order if self.fits[j].seen), self.fits[k])
        p = f.per_position
        if p is None:  # this size never told attention apart: the nearest size that did
            p = next((self.fits[j].per_position for j in order
                      if self.fits[j].per_position is not None), 0.0)
            if f.nn > 0:  # and its tokens' cost with that attention taken out (not twice)
                return max(1e-7, (f.nt - p * f.na) / f.nn), p
        return f.per_token, p

    def predict(self, n_tokens: int, attended: int = 0) -> float:
        if n_tokens <= 0:
            return 0.0
        per_token, per_position = self._fit(n_tokens)
        return per_token * n_tokens + per_position * attended

    def tokens_within(self, seconds: float, beside: int = 0, beside_attended: int = 0,
                      start: int = 0, cap: int = 1 << 13) -> int:
        """The most prefill tokens, from position ``start`` of their sequence, a batch may add
        to ``beside`` tokens (attending ``beside_attended`` positions) within ``seconds``."""
        def fits(n: int) -> bool:
            return self.predict(beside + n, beside_attended + attention(n, start)) <= seconds

        # Cost grows with n within a bucket but not across them: a larger bucket can be
        # cheaper per token (on a CPU, 40 tokens cost less than 31). So search each bucket's
        # own range, not just its largest size, and keep the most that fits in any.
        best = 0
        for k in range(bucket(beside + 1), N_BUCKETS):
            lo = max(1, 2 ** (k - 1) - beside)
            top = cap if k == N_BUCKETS - 1 else min(cap, 2 ** k - 1 - beside)
            hi = top
            if lo <= hi and fits(lo):
                while lo < hi:
                    mid = (lo + hi + 1) // 2
                    if fits(mid):
                        lo = mid
                    else:
                        hi = mid - 1
                best = lo
            if top >= cap:  # every larger bucket is past the cap
                break
        return best

    def efficient_size(self, within: float = 0.1) -> int:
        """The smallest measured batch size whose cost per token is within ``within`` of the
        cheapest measured one: where a larger batch stops buying much (the 1.5B on 2 cores:
        19 ms a token at 16, 15 ms at 64, 14 ms at 128 and up, so 64). 0 before any decode."""
        seen = [(2 ** (k - 1), f.per_token) for k, f in enumerate(self.fits) if k and f.seen]
        if not seen:
            return 0
        cheapest = min(p for _, p in seen)
        return min(n for n, p in seen if p <= (1 + within) * cheapest)

    def view(self) -> dict[str, float]:
        """Measured ms per token and µs per attended position by bucket (keyed by its
        smallest batch size), for /v1/queue."""
        out: dict[str, float] = {}
        for k, f in enumerate(self.fits):
            if f.seen:
                out[f"{2 ** (k - 1)}_ms_per_token"] = round(1000 * f.per_token, 3)
                if f.per_position is not None:
                    out[f"{2 ** (k - 1)}_us_per_position"] = round(1e6 * f.per_position, 3)
        return out
