"""A simulated engine backend: a virtual clock, a linear cost model and a KV pool with shared
cells, so scheduler behaviour can be tested deterministically and fast. It stands in for
llama.cpp only in the scheduler tests; the real path is tested with the real model."""

from __future__ import annotations

import hashlib
import heapq
import json

from hearth.engine import EngineConfig, EngineCore
from hearth.engine.base import SampleAfterDecode
from hearth.engine.kv import KVSpace
from hearth.policy.scheduler import PolicyConfig, class_rank
from hearth.shared.requests import Request, SamplingParams

EOG = 2
POISON = 666_666  # a token whose batch llama_decode fails on


class _Sampler:
    def __init__(self, seed: int):
        self.seed = seed


class _Decoder:
    def feed(self, b: bytes) -> str:
        return b.decode()

    def flush(self) -> str:
        return ""


class SimBackend(SampleAfterDecode):
    def __init__(self, n_ctx: int = 32768, n_seq_max: int = 16, n_batch: int = 512,
                 n_ubatch: int = 128, base: float = 0.004, per_token: float = 0.002,
                 n_ctx_seq: int | None = None):
        self.n_ctx = n_ctx
        self.n_ctx_seq = n_ctx_seq or n_ctx
        self.n_seq_max = n_seq_max
        self.n_batch = n_batch
        self.n_ubatch = n_ubatch
        self.base = base
        self.per_token = per_token
        self.t = 0.0
        self.cells: dict[int, dict[int, int]] = {}  # seq -> pos -> cell id
        self.refs: dict[int, int] = {}  # cell id -> sequences using it
        self._next_cell = 0
        self._free_cells: list[int] = []  # freed cell ids: the lowest is used first
        self.batches: list[dict] = []  # what each decode contained
        self.abort_requested = False
        self.refusals = 0  # decodes refused for want of cells (the KV protocol should prevent)
        self.failures = 0  # decodes failed part-way (POISON)
        self.flaky = 0  # the next decodes that fail after their first micro-batch
        self._outputs: dict[int, tuple[int, ...]] = {}  # output row -> context tokens
        self._ctx: dict[int, list[int]] = {}  # seq -> tokens by position
        self.pieces = True  # long embedding inputs may go in pieces (a causal model)
        self._piece_at = 0
        self.embed_calls: list[list[int]] = []  # input lengths per embedding decode (piece: -n)

    def now(self) -> float:
        return self.t

    @property
    def used(self) -> int:
        return len(self.refs)

    def decode(self, tokens, pos, seqs, outputs) -> int:
        if len(tokens) > self.n_batch:  # llama.cpp refuses a batch over n_batch outright
            raise ValueError(f"batch of {len(tokens)} tokens exceeds n_batch {self.n_batch}")
        new = sum(1 for p, s in zip(pos, seqs, strict=True) if p not in self.cells.get(s, {}))
        if self.used + new > self.n_ctx:
            self.refusals += 1
            return 1
        # A batch with a POISON token fails as a broken kernel would (llama_decode -3): the
        # micro-batches before the one holding it stay in the cache, as llama.cpp leaves them.
        status, upto = 0, len(tokens)
        if POISON in tokens or self.flaky > 0:
            status = -3
            first = tokens.index(POISON) if POISON in tokens else min(len(tokens) - 1,
                                                                      self.n_ubatch)
            upto = first // self.n_ubatch * self.n_ubatch
            self.failures += 1
            self.flaky = max(0, self.flaky - 1)
        self.t += self.base + self.per_token * upto
        self.batches.append({"n": len(tokens), "seqs": list(seqs), "t": self.t,
                             "status": status})
        self._outputs.clear()
        for i, (tok, p, s, out) in enumerate(zip(tokens[:upto], pos, seqs, outputs,
                                                 strict=False)):
            cells = self.cells.setdefault(s, {})
            ctx = self._ctx.setdefault(s, [])
            if p in cells:
                self._unref(cells[p])
            cells[p] = self._new_cell()
            del ctx[p:]
            ctx.append(tok)
            if out:
                self._outputs[i] = tuple(ctx)
        if status:
            self._outputs.clear()
        return status

    def _new_cell(self) -> int:
        if self._free_cells:
            cell = heapq.heappop(self._free_cells)
        else:
            cell, self._next_cell = self._next_cell, self._next_cell + 1
        self.refs[cell] = 1
        return cell

    def _unref(self, cell: int) -> None:
        self.refs[cell] -= 1
        if self.refs[cell] == 0:
            del self.refs[cell]
            heapq.heappush(self._free_cells, cell)

    @property
    def cells_spanned(self) -> int:
        """Cells up to the highest in use: what llama.cpp's attention runs over."""
        return max(self.refs, default=-1) + 1

    def new_sampler(self, p: SamplingParams) -> _Sampler:
        return _Sampler(p.seed or 0)

    def sample(self, sampler: _Sampler, i: int) -> int:
        # A pure function of the context, like greedy decoding: resumption is exact.
        h = hashlib.blake2b(repr((sampler.seed, self._outputs[i][-8:])).encode(), digest_size=4)
        return 10 + int.from_bytes(h.digest(), "little") % 1000

    def free_sampler(self, sampler) -> None:
        pass

    def force(self, sampler, text: str, limit: int) -> list[int]:
        return []  # no text to tokens here: nothing is forced

    def seq_rm(self, seq: int, p0: int = -1, p1: int = -1) -> None:
        cells = self.cells.get(seq, {})
        lo = 0 if p0 < 0 else p0
        for p in [p for p in cells if p >= lo and (p1 < 0 or p < p1)]:
            self._unref(cells.pop(p))
        ctx = self._ctx.get(seq, [])
        del ctx[lo:]

    def seq_cp(self, src: int, dst: int, p0: int, p1: int) -> None:
        lo = 0 if p0 < 0 else p0
        dcells = self.cells.setdefault(dst, {})
        for p, c in self.cells.get(src, {}).items():
            if p >= lo and (p1 < 0 or p < p1):
                dcells[p] = c
                self.refs[c] += 1
        self._ctx[dst] = list(self._ctx.get(src, [])[: p1 if p1 >= 0 else None])

    def seq_pos_max(self, seq: int) -> int:
        return max(self.cells.get(seq, {}), default=-1)

    def seq_state_get(self, seq: int):
        cells = self.cells.get(seq)
        if not cells:
            return None
        return sorted(cells), list(self._ctx.get(seq, []))

    def seq_state_set(self, seq: int, data) -> bool:
        positions, ctx = data
        self.seq_rm(seq)
        if self.used + len(positions) > self.n_ctx:
            return False
        self.cells[seq] = {p: self._new_cell() for p in positions}
        self._ctx[seq] = list(ctx)
        return True

    def state_bytes(self, data) -> bytes:
        return json.dumps(data).encode()

    def state_from_bytes(self, raw: bytes):
        return json.loads(raw)

    def is_eog(self, token: int) -> bool:
        return token == EOG

    def piece(self, token: int) -> bytes:
        return f"<{token}>".encode()

    def make_decoder(self) -> _Decoder:
        return _Decoder()

    def request_abort(self) -> None:
        self.abort_requested = True

    def clear_abort(self) -> None:
        self.abort_requested = False

    @staticmethod
    def _token_state(tok: int) -> list[float]:
        return [float(tok % 13), float(tok % 5), 1.0]

    def _mean(self, tokens) -> list[float]:
        states = [self._token_state(t) for t in tokens]
        return [sum(col) / len(tokens) for col in zip(*states, strict=True)]

    def embed(self, inputs):
        """Mean-pooled and normalised, as the real backend's."""
        self.t += self.base + self.per_token * sum(len(x) for x in inputs)
        self.embed_calls.append([len(x) for x in inputs])
        out = []
        for x in inputs:
            m = self._mean(x)
            norm = sum(v * v for v in m) ** 0.5
            out.append([v / norm for v in m])
        return out

    def embed_pieces(self) -> bool:
        return self.pieces

    def embed_piece(self, tokens, start, last):
        """A causal model's piece: its tokens' mean (they see the earlier pieces)."""
        assert start == self._piece_at or start == 0, "a piece out of order"
        self.t += self.base + self.per_token * len(tokens)
        self.embed_calls.append([-len(tokens)])
        self._piece_at = 0 if last else start + len(tokens)
        return self._mean(tokens)

    def embed_limits(self):
        return 2048, 32


class Scripted(SimBackend):
    """Generates the given text pieces in order, one a token, then end-of-generation."""

    def __init__(self, pieces: list[str]):
        super().__init__()
        self.pieces = pieces
        self.n = 0
        self.forced: list[int] = []  # tokens taken by force, not sampled

    def sample(self, sampler, i):
        self.n += 1
        return 100 + self.n if self.n <= len(self.pieces) else EOG

    def piece(self, token):
        return self.pieces[token - 101].encode()

    def force(self, sampler, text: str, limit: int) -> list[int]:
        """The script's next pieces, as far as they spell the start of ``text``: the model
        would have written them anyway."""
        taken: list[int] = []
        while len(taken) < limit and self.n < len(self.pieces):
            done = "".join(self.pieces[self.n - len(taken): self.n])
            nxt = self.pieces[self.n]
            if not text.startswith(done + nxt):
                break
            self.n += 1
            taken.append(100 + self.n)
        self.forced.extend(taken)
        return taken


class Collector:
    """A sink that records events with the virtual time they were delivered."""

    def __init__(self, backend: SimBackend):
        self.b = backend
        self.events: list = []
        self.times: list[float] = []

    def __call__(self, events) -> None:
        for e in events:
            self.events.append(e)
            self.times.append(self.b.t)

    @property
    def tokens(self) -> list[int]:
        return [t for e in self.events if e.kind == "token" for t in e.token_ids]

    @property
    def done(self):
        return next((e for e in self.events if e.kind in ("done", "error")), None)


def observe_slow_cpu(cost) -> None:
    """Feed ``cost`` (a CostModel) a large model on a CPU: a decode 50 ms, a small batch
    nearly as dear a token (26 ms at 16-32), 64 tokens and up 15 ms a token."""
    for _ in range(4):
        for n, per_token in ((1, 0.05), (4, 0.038), (16, 0.026), (32, 0.026), (64, 0.015),
                             (128, 0.0145)):
            cost.observe(n, per_token * n)


def make_core(mode: str = "hearth", n_parallel: int = 8, latency_target: float = 0.06,
              backend: SimBackend | None = None, **cfg) -> tuple[EngineCore, SimBackend]:
    b = backend or SimBackend(n_seq_max=n_parallel + 8)
    aging = cfg.pop("aging_seconds", None)
    caps = cfg.pop("caps", None)
    pc = PolicyConfig(mode=mode, n_parallel=n_parallel, fair_slots=cfg.pop("fair_slots", True),
                      voice_spare_slots=cfg.pop("voice_spare_slots", 2))
    if aging is not None:
        pc.aging_seconds = aging
    if caps is not None:
        pc.caps = caps
    core = EngineCore(b, pc, EngineConfig(latency_target_s=latency_target, **cfg))
    core.cost.seed(b.base, b.per_token)  # as if calibrated
    core.embed_cost.seed(b.base, b.per_token)
    return core, b


def request(b: SimBackend, cls: str, prompt_len: int, max_tokens: int, user: str = "u",
            seed: int = 0, prefix: list[int] | None = None) -> tuple[Request, Collector]:
    sink = Collector(b)
    body = list(prefix or []) + [100 + (seed * 7919 + i) % 5000 for i in range(prompt_len)]
    r = Request(prompt=body, rank=class_rank(cls), sink=sink, user=user, max_tokens=max_tokens,
                ignore_eos=True, sampling=SamplingParams(seed=seed))
    return r, sink


def run_until(core: EngineCore, cond, max_steps: int = 100_000) -> int:
    steps = 0
    while not cond() and steps < max_steps:
        core.step()
        steps += 1
    assert cond(), "condition not reached"
    return steps


def computed(kv: KVSpace, b: SimBackend, cls: str, n: int, seed: int,
             prefix: list[int] | None = None) -> Request:
    """A request seated in ``kv`` and its prompt computed, as the engine would (for a part
    tested without the engine)."""
    r, _ = request(b, cls, n, 1, seed=seed, prefix=prefix)
    r.tokens = list(r.prompt)
    entry, hit = kv.find(r.tokens)
    seq = kv.pool.take_id()
    assert seq is not None
    kv.seat(r, seq, entry, hit, len(r.tokens) - hit + 1)
    todo = len(r.tokens) - r.n_past
    assert b.decode(r.tokens[r.n_past:], list(range(r.n_past, len(r.tokens))), [seq] * todo,
                    [False] * (todo - 1) + [True]) == 0
    kv.computed(r, todo)
    r.n_past = len(r.tokens)
    return r
