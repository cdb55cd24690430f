"""The request classes and their ranks (0 is the best): plain constants every part of Hearth
reads, kept apart so the policy's modules can use them without importing the scheduler."""

from __future__ import annotations

CLASS_RANKS: dict[str, int] = {"voice": 0, "chat": 1, "agent": 2, "background": 3, "embedding": 4}
RANK_NAMES = {v: k for k, v in CLASS_RANKS.items()}
CHAT_RANK = CLASS_RANKS["chat"]
VOICE_RANK = CLASS_RANKS["voice"]
INTERACTIVE_RANK = CHAT_RANK  # voice and chat: someone is waiting for the answer
BACKGROUND_RANK = CLASS_RANKS["background"]


def class_rank(name_or_rank: str | int) -> int:
    """A class name or an integer rank → rank. Raises ValueError for unknown values."""
    if isinstance(name_or_rank, bool):
        raise ValueError(f"unknown class {name_or_rank!r}")
    if isinstance(name_or_rank, int):
        if name_or_rank in RANK_NAMES:
            return name_or_rank
        raise ValueError(f"priority must be 0..{max(RANK_NAMES)}, got {name_or_rank}")
    key = str(name_or_rank).strip().lower()
    if key in CLASS_RANKS:
        return CLASS_RANKS[key]
    if key.isdigit():
        return class_rank(int(key))
    raise ValueError(f"unknown class {name_or_rank!r}; expected one of {', '.join(CLASS_RANKS)}")
