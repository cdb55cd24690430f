"""What one iteration of the engine holds and spends, by class: the engine asks, these answer.
Rules over the policy's settings alone (no state), inherited by
:class:`~hearth.policy.scheduler.Policy`."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from .classes import INTERACTIVE_RANK, VOICE_RANK


class IterationRules:
    cfg: Any  # hearth.policy.scheduler.PolicyConfig

    def decode_order(self, running: Iterable[Any]) -> list[Any]:
        """Decode tokens go first in the batch, highest class first (they land in the first
        micro-batch, so a cut decode loses the least)."""
        if self.cfg.mode == "hearth":
            return sorted(running, key=lambda r: (r.rank, r.arrival, r.id))
        return sorted(running, key=lambda r: (r.arrival, r.id))

    def prefill_plan(self, prefilling: list[Any], streaming: bool) -> tuple[list[Any], bool]:
        """Which of the prefilling requests (in :meth:`order`) share this iteration, and
        whether they go in large chunks. In hearth mode an interactive prompt does not share
        its iteration with lower-class prefill, so its first token comes as fast as if the
        machine were idle; voice goes alone and in large chunks: fewer iterations to its
        first token. So do interactive prompts while no stream runs (``streaming``): a voice
        command arriving cuts their iteration (:meth:`cuts_decode`), and a chat arriving
        would wait for their prefill anyway. In ~1 s chunks the 1.5B's 1,650-token chat
        prompt alone took 22-23 s to its first token where llama-server took 19-20."""
        if not prefilling or self.cfg.mode != "hearth":
            return prefilling, False
        best = min(r.rank for r in prefilling)
        if best == VOICE_RANK:
            return [r for r in prefilling if r.rank == VOICE_RANK], True
        if best <= INTERACTIVE_RANK:
            return [r for r in prefilling if r.rank <= INTERACTIVE_RANK], not streaming
        return prefilling, False

    def yields_to_streams(self, rank: int, streams: Sequence[int]) -> bool:
        """Whether a prompt of class ``rank`` whose last iteration ran past the latency
        target beside running streams (of classes ``streams``) lets them decode alone next:
        in hearth mode, when one of them is of its class or higher. On a CPU an iteration
        holding a prompt's chunk costs several decodes (the 1.5B beside four chats: 1.1 s
        against 0.13 s), so the chats beside a long chat prompt get two tokens where they got
        one, and its first token comes ~15 % later. A voice prompt outranks the chats beside
        it and goes on."""
        return self.cfg.mode == "hearth" and min(streams, default=rank + 1) <= rank

    # -- what an iteration may spend -------------------------------------------------------
    def bounded(self, relax: bool, best_waiting: int, running: Iterable[Any]) -> bool:
        """Whether prefill and embedding iterations keep to the latency target: always, but
        in serial mode, or with the relaxed bound (``relax``) while no interactive request
        waits or runs (``best_waiting``: the best class waiting)."""
        if self.cfg.mode == "serial":
            return False
        return not relax or best_waiting <= INTERACTIVE_RANK or any(
            r.rank <= INTERACTIVE_RANK for r in running)

    def cuts_decode(self, rank: int, best_prefill: int, prefill_tokens: int,
                    min_chunk: int) -> bool:
        """Whether a request of class ``rank`` arriving cuts the decode under way (which
        prefills ``prefill_tokens`` of class ``best_prefill`` at best): voice cuts a real
        prefill chunk of lower classes only (cutting costs the unfinished micro-batch)."""
        return (self.cfg.mode == "hearth" and rank == VOICE_RANK
                and prefill_tokens >= min_chunk and best_prefill > rank)

    def embeddings_go(self, rank: int, best_other: int) -> bool:
        """Whether the head embedding request (class ``rank`` after aging) runs this
        iteration beside generation work whose best class waiting or prefilling is
        ``best_other``."""
        return self.cfg.mode != "hearth" or rank <= best_other

    # -- what the engine does by class -------------------------------------------------------
    def waited_for(self, rank: int) -> bool:
        """Whether someone waits for a request of class ``rank`` (its prompt may stretch an
        iteration past the latency target: :data:`~hearth.engine.base.VOICE_PREFILL_STRETCH`)."""
        return rank <= INTERACTIVE_RANK

    def may_use_spare_ids(self, rank: int) -> bool:
        """Whether a request of class ``rank`` may run beyond ``n_parallel`` on spare sequence
        ids (:meth:`~hearth.policy.scheduler.Policy.slots_for`): voice, in hearth mode."""
        return self.cfg.mode == "hearth" and rank == VOICE_RANK

    def skips_held_back(self) -> bool:
        """Whether a waiting request that cannot enter lets those behind it be looked at (its
        own group skipped): in hearth mode; fifo and serial keep strict arrival order."""
        return self.cfg.mode == "hearth"

    def last_resort_victim(self, running: Sequence[Any]) -> Any | None:
        """Running work needs cells and no cached prefix or policy victim gives them (only
        voice runs): the newest admitted goes if another is left, else none (the lone one has
        all the context there is)."""
        if len(running) <= 1:
            return None
        return max(running, key=lambda x: (x.admitted_at or 0.0, x.id))

    @staticmethod
    def exhausted_victim(running: Sequence[Any]) -> Any:
        """llama.cpp found no room with nothing left to give up: the newest arrival fails."""
        return max(running, key=lambda r: r.arrival)

    @staticmethod
    def retry_order(reqs: Iterable[Any]) -> list[Any]:
        """The order in which a failed decode's sequences decode alone: best class first."""
        return sorted(reqs, key=lambda r: (r.rank, r.arrival, r.id))
