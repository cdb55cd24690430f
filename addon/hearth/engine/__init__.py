"""The engine: continuous (iteration-level) batching with chunked prefill, a prefix cache and
preemption, driven by :mod:`hearth.policy.scheduler`.

:class:`EngineCore` is the iteration logic over an abstract :class:`Backend` (llama.cpp in
production, a simulated cost model in the scheduler tests). :class:`Engine` runs it in the one
thread that owns the llama.cpp context; other threads only ``submit`` and ``cancel``.

One iteration (design §3): admit waiting requests into free sequence ids if the KV pool holds
their prompt; build one batch — a decode token for every running sequence, highest class first,
then prefill chunks in scheduler order under a token budget sized from measured per-token cost;
decode once; sample, detokenize, check stops; emit events; retire finished sequences.
"""

from .base import ADMIT_RECHECK_S, VOICE_PREFILL_STRETCH, Backend, EngineConfig, RequestError
from .core import EngineCore
from .cost import CostModel
from .thread import AsyncStream, Engine, monotonic

__all__ = ["ADMIT_RECHECK_S", "VOICE_PREFILL_STRETCH", "AsyncStream", "Backend", "CostModel",
           "Engine", "EngineConfig", "EngineCore", "RequestError", "monotonic"]
