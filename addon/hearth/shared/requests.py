"""What flows through the engine: requests, their sampling parameters, and the events they emit.

Pure Python (no llama.cpp), shared by the engine, the scheduler tests and the HTTP layer.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..policy.scheduler import RANK_NAMES

_ids = itertools.count(1)
_ids_lock = threading.Lock()


def next_id() -> int:
    with _ids_lock:
        return next(_ids)


@dataclass
class SamplingParams:
    temperature: float = 0.8
    top_p: float = 0.95
    top_k: int = 40
    min_p: float = 0.05
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64
    seed: int | None = None
    grammar: str | None = None  # GBNF, root rule "root"
    # The grammar applies only from the first match of this regex on (its first group is fed to
    # the grammar); None: from the first token. A tool call may then be constrained without
    # forcing one.
    grammar_trigger: str | None = None


@dataclass
class Event:
    """One thing that happened to a request, delivered to its sink in order.

    kind: ``token`` (text and/or token ids; text may be empty while held back; ``reasoning``:
    the part of it that is chain of thought, when the request splits that off), ``done``
    (finish_reason, usage and timing filled in), ``error`` (message, status).
    """

    kind: str
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    embedding: list[list[float]] | None = None
    usage: dict[str, int] | None = None
    timing: dict[str, Any] | None = None
    message: str | None = None
    status: int = 500
    reasoning: str = ""
    code: str | None = None  # an error's machine-readable kind (worker_crashed, ...)
    retry_after: float | None = None  # an error worth retrying: after this many seconds


Sink = Callable[[list[Event]], None]


class StopMatcher:
    """Finds stop strings in streamed text, holding back any tail that could still become one."""

    def __init__(self, stops: list[str]):
        self.stops = [s for s in stops if s]
        self._held = ""

    def feed(self, text: str) -> tuple[str, bool]:
        """Returns (text safe to emit, stopped). After a stop, the text before it is emitted and
        the stop string itself is not."""
        if not self.stops:
            return text, False
        buf = self._held + text
        first = min((i for i in (buf.find(s) for s in self.stops) if i >= 0), default=-1)
        if first >= 0:
            self._held = ""
            return buf[:first], True
        hold = 0
        for s in self.stops:
            for k in range(min(len(s) - 1, len(buf)), 0, -1):
                if buf.endswith(s[:k]):
                    hold = max(hold, k)
                    break
        self._held = buf[len(buf) - hold:] if hold else ""
        return buf[: len(buf) - hold], False

    def flush(self) -> str:
        out, self._held = self._held, ""
        return out


class Utf8Decoder:
    """Incremental detokenizer: joins token bytes and releases only complete UTF-8 text, holding
    back a partial multi-byte character until its remaining bytes arrive."""

    def __init__(self) -> None:
        self._pending = b""

    def feed(self, data: bytes) -> str:
        buf = self._pending + data
        cut = len(buf)
        # Walk back over at most 3 continuation bytes to find an unfinished lead byte.
        for back in range(1, min(4, len(buf)) + 1):
            b = buf[-back]
            if b & 0xC0 == 0x80:
                continue
            need = 2 if b & 0xE0 == 0xC0 else 3 if b & 0xF0 == 0xE0 else 4 if b & 0xF8 == 0xF0 \
                else 1
            if need > back:
                cut = len(buf) - back
            break
        self._pending = buf[cut:]
        return buf[:cut].decode("utf-8", "replace")

    def flush(self) -> str:
        out, self._pending = self._pending.decode("utf-8", "replace"), b""
        return out


@dataclass(eq=False)  # identity semantics: requests live in sets and lists
class Request:
    """A generation or embedding request, and the engine's state for it."""

    prompt: list[int] | list[list[int]]  # token ids; a list of inputs for embeddings
    rank: int
    sink: Sink
    user: str = "anonymous"
    max_tokens: int = 256
    stop: list[str] = field(default_factory=list)
    ignore_eos: bool = False
    sampling: SamplingParams = field(default_factory=SamplingParams)
    kind: str = "generate"  # generate | embed
    arrival: float = 0.0
    id: int = field(default_factory=next_id)
    meta: dict[str, Any] = field(default_factory=dict)
    # A hearth.chat.reasoning.ReasoningSplitter: stops then see the answer only.
    reasoning: Any = None
    # The class its cached prompt serves, when not its own: a warm-up runs as background (it
    # never delays anyone) and keeps the prompt for the voice turns to come.
    keep_rank: int | None = None
    warm_up: bool = False  # only its prompt matters: not a lookup the hit rates count
    # A hearth.chat.call_forcing.CallForcer: text a tool call's schemas fix is written, not sampled.
    forcer: Any = None

    # engine state
    seq_id: int | None = None
    tokens: list[int] = field(default_factory=list)  # prompt + generated: what the KV must hold
    n_past: int = 0  # how many of ``tokens`` are in the KV cache
    shared: Any = None  # the prefix-cache entry this sequence's first cells are shared with
    shared_len: int = 0
    reserved: int = 0  # KV cells set aside at admission and not computed yet
    n_generated: int = 0
    sampler: Any = None
    decoder: Any = None
    stopper: StopMatcher | None = None
    admitted_at: float | None = None
    first_admitted_at: float | None = None
    first_token_at: float | None = None
    last_token_at: float | None = None
    finished_at: float | None = None
    itl: list[float] = field(default_factory=list)
    cached_tokens: int = 0  # prompt tokens served from the prefix cache (first admission)
    prefilled_tokens: int = 0  # prompt tokens actually computed (recomputation included)
    preemptions: int = 0
    cancelled: bool = False
    finished: bool = False
    finish_reason: str | None = None

    @property
    def cls(self) -> str:
        return RANK_NAMES[self.rank]

    @property
    def cache_rank(self) -> int:
        return self.rank if self.keep_rank is None else min(self.rank, self.keep_rank)

    @property
    def n_prompt(self) -> int:
        if self.kind == "embed":
            return sum(len(p) for p in self.prompt)  # type: ignore[arg-type]
        return len(self.prompt)

    @property
    def remaining(self) -> int:
        """Tokens still to feed before the next output."""
        return len(self.tokens) - self.n_past

    def split(self, text: str, final: bool = False) -> tuple[str, str]:
        """(reasoning, answer) of newly decoded text; ``final`` once generation has ended."""
        if self.reasoning is None:
            return "", text
        return self.reasoning.flush(text) if final else self.reasoning.feed(text)

    def usage(self) -> dict[str, int]:
        u = {
            "prompt_tokens": self.n_prompt,
            "completion_tokens": self.n_generated,
            "total_tokens": self.n_prompt + self.n_generated,
            "cached_tokens": self.cached_tokens,
        }
        if self.reasoning is not None:
            u["reasoning_tokens"] = self.reasoning.reasoning_tokens
        return u

    def timing(self) -> dict[str, Any]:
        def ms(a: float | None, b: float | None) -> float | None:
            return None if a is None or b is None else round((b - a) * 1000.0, 3)

        return {
            "class": self.cls,
            "user": self.user,
            "queue_ms": ms(self.arrival, self.first_admitted_at),
            "ttft_ms": ms(self.arrival, self.first_token_at),
            # the time to first token predicted when it arrived (engine.queue_eta)
            "eta_ms": None if "eta_s" not in self.meta else round(1000 * self.meta["eta_s"], 1),
            "e2e_ms": ms(self.arrival, self.finished_at),
            "itl_ms": [round(g * 1000.0, 3) for g in self.itl],
            "prompt_tokens": self.n_prompt,
            "cached_tokens": self.cached_tokens,
            "generated_tokens": self.n_generated,
            "preemptions": self.preemptions,
        }
