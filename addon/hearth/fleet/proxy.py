"""The engine's backend and the model, as the server sees them when llama.cpp runs in a worker
process: the same calls as in-process (:class:`hearth.engine.Backend`), each a message."""

from __future__ import annotations

import time
from typing import Any

from ..shared.requests import SamplingParams, Utf8Decoder
from .process import WorkerError, WorkerProcess


class Boundary:
    """What crossing the process boundary costs the engine: for each iteration, the time the
    engine waited for its decode less the time the worker spent on it (messages, pickling,
    waking up), measured on every iteration served."""

    def __init__(self) -> None:
        self.iterations = 0
        self.seconds = 0.0  # the engine's wait for its decodes
        self.overhead_s = 0.0  # of which not spent decoding and sampling in the worker

    def add(self, spent: float, overhead: float) -> None:
        self.iterations += 1
        self.seconds += spent
        self.overhead_s += max(0.0, overhead)

    def report(self) -> dict[str, float | int]:
        n = self.iterations or 1
        return {"iterations": self.iterations, "seconds": round(self.seconds, 4),
                "overhead_s": round(self.overhead_s, 6),
                "per_iteration_us": round(1e6 * self.overhead_s / n, 1),
                "share_of_iteration": round(self.overhead_s / self.seconds, 4)
                if self.seconds else 0.0}


class ProcessBackend:
    """The engine's :class:`~hearth.engine.Backend` over a worker's engine channel. Only the
    engine thread calls it, except :meth:`request_abort`. The worker behind it may be replaced
    (:meth:`attach`) after a crash; the sizes stay those of the model's settings."""

    def __init__(self, worker: WorkerProcess):
        self._deferred: list[tuple] = []
        self._info: dict[int, tuple[bool, bytes]] = {}  # token -> (end of generation, text)
        self.boundary = Boundary()
        self.before_call: Any = None  # while loading: a load's turn (fleet.load_priority)
        self.attach(worker)

    def attach(self, worker: WorkerProcess) -> None:
        info = worker.info
        self.worker = worker
        self._deferred = []
        self.n_ctx, self.n_ctx_seq = info["n_ctx"], info["n_ctx_seq"]
        self.n_seq_max, self.n_batch, self.n_ubatch = (info["n_seq_max"], info["n_batch"],
                                                       info["n_ubatch"])
        self._embed_limits = tuple(info["embed_limits"])
        self._embed_pieces = bool(info.get("embed_pieces"))
        self.n_draft = int(info.get("n_draft", 0))
        self.draft_s = float(info.get("draft_s", 0.0))  # one guess, as the worker measured

    def check(self) -> None:
        """Raise WorkerLost if the worker died while the engine was idle."""
        if self.worker.lost is not None:
            raise self.worker.lost

    def _call(self, op: str, *args: Any) -> Any:
        if self.before_call is not None:
            self.before_call(self.worker)
        deferred, self._deferred = self._deferred, []
        return self.worker.call(deferred, op, *args)

    def now(self) -> float:
        return time.monotonic()

    def decode(self, tokens: list[int], pos: list[int], seqs: list[int],
               outputs: list[bool]) -> int:
        return self.decode_sample(tokens, pos, seqs, outputs, [])[0]

    def decode_sample(self, tokens: list[int], pos: list[int], seqs: list[int],
                      outputs: list[bool], samples: list[tuple]) -> tuple[int, list[Any]]:
        t0 = time.perf_counter()
        status, out, busy = self._call("decode_sample", tokens, pos, seqs, outputs, samples)
        spent = time.perf_counter() - t0
        self.boundary.add(spent, spent - busy)
        # a drafted stream's sample is a run of tokens (engine.base.sample_run)
        return status, [self._learn(x) if isinstance(x, list) else self._learn([x])[0]
                        for x in out]

    def draft(self, tokens: list[int], k: int, sampler: Any = None) -> list[int]:
        return self._learn(self._call("draft", tokens, k, sampler or 0))

    def _learn(self, out: list[tuple[int, bool, bytes]]) -> list[int]:
        """Tokens a worker sent with their text and end-of-generation flag: those kept for
        :meth:`piece` and :meth:`is_eog` (no round trip later), the tokens returned."""
        for tok, eog, piece in out:
            self._info[tok] = (eog, piece)
        return [tok for tok, _, _ in out]

    def new_sampler(self, p: SamplingParams) -> int:
        return self._call("new_sampler", p)

    def sample(self, sampler: int, i: int) -> int:
        raise NotImplementedError("a worker samples with the decode (decode_sample)")

    def force(self, sampler: int, text: str, limit: int) -> list[int]:
        return self._learn(self._call("force", sampler, text, limit))

    def free_sampler(self, sampler: int) -> None:
        self._deferred.append(("free_sampler", sampler))

    def seq_rm(self, seq: int, p0: int = -1, p1: int = -1) -> None:
        self._deferred.append(("seq_rm", seq, p0, p1))

    def seq_cp(self, src: int, dst: int, p0: int, p1: int) -> None:
        self._deferred.append(("seq_cp", src, dst, p0, p1))

    def seq_pos_max(self, seq: int) -> int:
        return self._call("seq_pos_max", seq)

    def seq_state_get(self, seq: int) -> bytes | None:
        return self._call("seq_state_get", seq)

    def seq_state_set(self, seq: int, data: bytes) -> bool:
        return self._call("seq_state_set", seq, data)

    def state_bytes(self, data: bytes) -> bytes:
        return data

    def state_from_bytes(self, raw: bytes) -> bytes:
        return raw

    def _token(self, token: int) -> tuple[bool, bytes]:
        if token not in self._info:
            self._info[token] = tuple(self._call("token_info", token))  # type: ignore[assignment]
        return self._info[token]

    def is_eog(self, token: int) -> bool:
        return self._token(token)[0]

    def piece(self, token: int) -> bytes:
        return self._token(token)[1]

    def make_decoder(self) -> Utf8Decoder:
        return Utf8Decoder()

    def request_abort(self) -> None:
        self.worker.abort.set()

    def clear_abort(self) -> None:
        self.worker.abort.clear()

    def embed(self, inputs: list[list[int]]) -> list[list[float]]:
        return self._call("embed", inputs)

    def embed_limits(self) -> tuple[int, int]:
        return self._embed_limits  # type: ignore[return-value]

    def embed_pieces(self) -> bool:
        """Whether a long input may go in pieces (the worker's model is causal)."""
        return self._embed_pieces

    def embed_piece(self, tokens: list[int], start: int, last: bool) -> list[float]:
        return self._call("embed_piece", tokens, start, last)

    def flush(self) -> None:
        """Send the calls still deferred (before a stop, or a state read)."""
        if self._deferred:
            self._call("sync")


class ModelProxy:
    """What the server's request handling reads of the model: its description and vocabulary
    size, its chat template, and tokenizing and grammar checks, which the worker answers on
    its service channel (off the engine's path)."""

    def __init__(self, backend: ProcessBackend):
        self._backend = backend
        info = backend.worker.info
        self.description: str = info["description"]
        self.n_vocab: int = info["n_vocab"]
        self.n_ctx_train: int = info["n_ctx_train"]
        self._template = info["chat_template"]
        self._specials = info["specials"]
        self._arch = info["architecture"]

    def chat_template(self) -> str | None:
        return self._template

    def special_tokens(self) -> dict[str, str]:
        return dict(self._specials)

    def meta(self, key: str) -> str | None:
        return self._arch if key == "general.architecture" else None

    def tokenize(self, text: str, add_special: bool = True,
                 parse_special: bool = True) -> list[int]:
        return self._backend.worker.service("tokenize", text, add_special, parse_special)

    def tokenize_pieces(self, pieces: list[tuple[str, bool]], add_special: bool = True
                        ) -> list[int]:
        return self._backend.worker.service("tokenize_pieces", pieces, add_special)

    def check_grammar(self, gbnf: str) -> None:
        """Raise ValueError if llama.cpp will not parse ``gbnf``."""
        try:
            self._backend.worker.service("check_grammar", gbnf)
        except WorkerError as e:
            raise ValueError(str(e).partition(": ")[2] or str(e)) from e
