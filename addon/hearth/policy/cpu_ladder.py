"""The CPU ladder: the rungs a model's worker may run llama.cpp on, best first, and what serving
below the top costs. Plain Python: the worker names its rungs with it (before llama.cpp loads),
the server reports them.

A rung is a CPU variant (a ``libggml-cpu-<variant>.so`` of a GGML_BACKEND_DL build, or
``native``), with ``+no-repack`` when llama.cpp's extra buffer types are off: the repacked
weights (about a third of the generation speed) and, on the best x86 variant only, AMX.
"""

from __future__ import annotations

from typing import Any

NO_EXTRA = "+no-repack"  # a rung's suffix: llama.cpp's extra buffer types (AMX, repack) off
# Measured when the fallback dropped repacking (issue 47): Qwen2.5-Coder 1.5B, 8 chats on a
# 2-core Xeon that reports AMX, against llama-server with repacking on the same machine.
NO_REPACK_SPEED = 0.72


def ladder(variants: list[str]) -> list[str]:
    """The rungs for these CPU variants (best first), each step dropping as little as it can:
    the best variant; the next one down with its extra buffers (which leaves only what the
    best adds behind, AMX where the CPU reports it); then every variant without them."""
    return [*variants[:2], *(v + NO_EXTRA for v in variants)]


def rung_variant(rung: str) -> str:
    """The CPU variant a rung runs."""
    return rung.removesuffix(NO_EXTRA)


def extra_buffers(rung: str) -> bool:
    """Whether a rung keeps llama.cpp's extra buffer types (repacked weights, AMX)."""
    return not rung.endswith(NO_EXTRA)


def cost(best: str, rung: str) -> str:
    """What serving on ``rung`` instead of ``best`` costs, in a household's words."""
    variant, top = rung_variant(rung), rung_variant(best)
    if not extra_buffers(rung):
        where = "" if variant == top else f" (and on llama.cpp's {variant} kernels)"
        return (f"llama.cpp's repacked weights are off{where}: generation is about a third "
                f"slower ({NO_REPACK_SPEED:.2f}x of a server that repacks, measured on a "
                "Qwen2.5 1.5B)")
    return (f"llama.cpp runs its {variant} kernels instead of {top}: what only {top} adds "
            "(AMX on a CPU that reports it) is unused; repacked weights are kept, so generation "
            "keeps its speed and only long prompts may take a little longer")


def step_down(rung: str | None, rungs: list[str], skipped: list[str],
              why: dict[str, str]) -> dict[str, Any] | None:
    """A worker serving below the top of its ladder: the rung it left, what crashed there,
    where it serves and what that costs; None on the top rung (or before it serves)."""
    if not rung or not rungs or rung == rungs[0] or not skipped:
        return None
    return {"from": rungs[0], "to": rung, "skipped": list(skipped),
            "why": next((why[r] for r in skipped if r in why), "a crash at start"),
            "cost": cost(rungs[0], rung)}
