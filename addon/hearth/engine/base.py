"""What the engine's parts share: the backend it drives, its settings, its errors, one batch
item, and the constants that tune it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from ..shared.decode_sample import SampleAfterDecode as SampleAfterDecode
from ..shared.decode_sample import sample_run as sample_run
from ..shared.requests import Request, SamplingParams

# While other streams decode, a voice prompt's prefill iterations may run this many latency
# targets: a voice command after a cached system prompt still goes in one iteration, and an
# uncached prompt (seconds of prefill on a CPU) holds other streams up for ~0.5 s at a time
# rather than for its whole prefill. Measured on 2 CPU cores with a 1,221-token prompt beside
# 4 streaming chats: stretch 4 → 280 ms gaps, voice TTFT +35 %; 8 → 631 ms, +15 %; unbounded
# → 2,049 ms, +2 % (bench/engine_bench.py --only voice_beside_streams).
VOICE_PREFILL_STRETCH = 8
# An iteration may always last this many single decodes of the model served: a latency target
# below one decode (60 ms against a 1.5B model's 116 ms a token on a slow 2-core CPU) would hold
# every prompt beside a stream to the minimum chunk. At two, a prefill chunk costs about what
# the streams' decode does: their cadence at most halves and prompts keep moving.
DECODES_PER_TARGET = 2
# How often admission runs with nothing changed, so that aging (which moves classes with time)
# is still seen: well below the aging periods (20 s and up).
ADMIT_RECHECK_S = 0.25



class Backend(Protocol):
    n_ctx: int  # KV cells in the pool
    n_ctx_seq: int  # most tokens one sequence may hold
    n_seq_max: int
    n_batch: int
    n_ubatch: int
    n_draft: int  # most tokens a draft model guesses at a time (0: no draft model)
    draft_s: float  # what one guess costs, measured at load

    def now(self) -> float: ...
    def decode(self, tokens: list[int], pos: list[int], seqs: list[int],
               outputs: list[bool]) -> int: ...
    # Each sample is (sampler, row): one token; or (sampler, row, drafts): a list of tokens
    # (:func:`sample_run`).
    def decode_sample(self, tokens: list[int], pos: list[int], seqs: list[int],
                      outputs: list[bool], samples: list[tuple]
                      ) -> tuple[int, list[Any]]: ...
    # The draft model's guess at the next tokens after ``tokens`` (at most ``k``), for the
    # stream sampled with ``sampler`` (blamed if the draft kills the worker).
    def draft(self, tokens: list[int], k: int, sampler: Any = None) -> list[int]: ...
    def new_sampler(self, p: SamplingParams) -> Any: ...
    def sample(self, sampler: Any, i: int) -> int: ...
    def free_sampler(self, sampler: Any) -> None: ...
    # Text written for the model in a tool call: its tokens that the sampler took (a prefix).
    def force(self, sampler: Any, text: str, limit: int) -> list[int]: ...
    def seq_rm(self, seq: int, p0: int = -1, p1: int = -1) -> None: ...
    def seq_cp(self, src: int, dst: int, p0: int, p1: int) -> None: ...
    def seq_pos_max(self, seq: int) -> int: ...
    def seq_state_get(self, seq: int) -> Any: ...
    def seq_state_set(self, seq: int, data: Any) -> bool: ...
    def state_bytes(self, data: Any) -> bytes: ...  # a saved state, to write to a file
    def state_from_bytes(self, raw: bytes) -> Any: ...
    def is_eog(self, token: int) -> bool: ...
    def piece(self, token: int) -> bytes: ...
    def make_decoder(self) -> Any: ...
    def request_abort(self) -> None: ...
    def clear_abort(self) -> None: ...
    def embed(self, inputs: list[list[int]]) -> list[list[float]]: ...
    def embed_limits(self) -> tuple[int, int]: ...  # (tokens per batch, inputs per batch)


class WorkerLost(BaseException):
    """The process that runs the backend is gone (a crash, a kill, a hang). A BaseException:
    the engine's handlers for one request's failure (``except Exception``) must not take it
    for that request's fault; the engine thread handles it."""

    def __init__(self, cause: str, signal: int | None = None, during: str = "",
                 rung: str | None = None, blame: int = 0, suspect: bool = True,
                 output: str = ""):
        super().__init__(cause)
        self.cause = cause
        self.signal = signal
        self.during = during  # the call under way: new_sampler, decode_sample, ...
        self.rung = rung
        self.blame = blame  # the sampler it died sampling with (0: not while sampling)
        # Whether what it was computing may have killed it: not for a SIGKILL from outside
        # (the OOM killer, an operator), which no request's code sends.
        self.suspect = suspect
        # A worker that died before it was ready: all it wrote from its start (bounded).
        self.output = output


class RequestError(Exception):
    """A request the engine refuses at submission (HTTP layer maps ``status``)."""

    def __init__(self, message: str, status: int = 400, code: str = "invalid_request_error",
                 retry_after: float | None = None):
        super().__init__(message)
        self.status = status
        self.code = code
        self.retry_after = retry_after


def check_request(r: Request, backend: Backend) -> None:
    """Raise RequestError for a prompt this model cannot take: empty or longer than its context
    (generation), or an input empty or over the embedding limit."""
    if r.kind == "generate":
        if not r.prompt:
            raise RequestError("the prompt is empty")
        if len(r.prompt) >= backend.n_ctx_seq:
            raise RequestError(
                f"the prompt has {len(r.prompt)} tokens; this model's context holds "
                f"{backend.n_ctx_seq}", status=400, code="context_length_exceeded")
    else:
        limit, _ = backend.embed_limits()
        for p in r.prompt:
            if not p:
                raise RequestError("an embedding input is empty")
            if len(p) > limit:  # type: ignore[arg-type]
                raise RequestError(
                    f"an embedding input has {len(p)} tokens; the limit is {limit}",
                    code="context_length_exceeded")


@dataclass
class EngineConfig:
    latency_target_s: float = 0.06
    relax_prefill_bound: bool = False
    prefix_cache: bool = True
    prefix_cache_entries: int = 8
    compact_prefix_cache: bool = True  # pack cached prefixes into low cells when idle
    # Share of the pool's cells in which voice and chat prefixes are kept against lower
    # classes (hearth.policy.cache).
    prefix_cache_kept_share: float = 0.5
    max_queue: int = 64
    min_prefill_chunk: int = 16
    # "measured": a draft model guesses as many tokens as pay (engine.drafts); "always": as
    # many as it may, every voice decode (to measure what drafting does).
    draft_policy: str = "measured"
    # Seconds by class name: a request expected to wait longer for its first token is
    # refused at once (engine.queue_eta); absent or 0: none.
    deadlines: dict[str, float] = field(default_factory=dict)
    reservation_s: float = 5.0  # a wake word's reservation, unless it names its own



@dataclass
class BatchItem:
    req: Request
    start: int  # first position fed
    n: int
    output: bool
    # Tokens a draft model guessed after the item's one decode token, fed with it at the
    # next positions and checked (:mod:`.drafts`): the KV cells of those refused are freed.
    draft: list[int] = field(default_factory=list)

