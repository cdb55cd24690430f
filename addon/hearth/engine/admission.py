"""Admission into sequence ids and KV room, preemption, and giving cells back (part of
:class:`~hearth.engine.core.EngineCore`, which holds the state these methods use)."""

from __future__ import annotations

import logging
from typing import Any

from ..requests import Request
from .base import ADMIT_RECHECK_S, BatchItem

log = logging.getLogger("hearth.engine")


class Admission:
    """The KV side of the engine: who gets a sequence and cells, who gives them up."""

    # -- admission and preemption -----------------------------------------------------------
    def _admit(self, now: float) -> None:
        if not self.waiting or (not self._admit_dirty and now < self._admit_next):
            return
        self._admit_dirty = False
        self._admit_next = now + ADMIT_RECHECK_S
        for r in self.policy.order(list(self.waiting), now, self.running):
            if r.sampler is None:
                try:
                    r.sampler = self.b.new_sampler(r.sampling)
                except Exception as e:  # e.g. a grammar llama.cpp refuses: this request's fault
                    self._fail(r, f"cannot sample this request: {e}", now, status=400)
                    continue
            if not self.policy.may_admit(r, self.running, self.waiting, now):
                if len(self.running) < self.policy.max_running:
                    continue  # held back by its class cap; others may still go
                victim = (self.policy.priority_victim(r, self.running, now)
                          or self.policy.fairness_victim(r, self.running, self.waiting, now))
                if victim is None:
                    if self.policy.cfg.mode == "hearth":
                        continue  # a lower class behind it may not preempt either
                    break
                self._preempt(victim, now)
            entry, hit = (self.pool.find(r.tokens) if self.cfg.prefix_cache else (None, 0))
            need = len(r.tokens) - hit + 1
            while self.pool.free_cells < need:
                if self._evict_entry(avoid=entry):
                    continue
                victim = self.policy.priority_victim(r, self.running, now)
                if (victim is None and entry is not None and entry.seq_id in self.pool.entries
                        and self._evict_entry(avoid=None)):  # the hit itself must go
                    entry, hit = None, 0
                    need = len(r.tokens) + 1
                    continue
                if victim is None:
                    break
                self._preempt(victim, now)
            if self.pool.free_cells < need:
                if not self.running:  # nothing will ever free room: refuse it
                    self._fail(r, "the KV cache cannot hold this prompt", now, status=400)
                    continue
                break  # wait for room rather than let smaller requests overtake forever
            seq = self.pool.take_id()
            if seq is None:
                break
            self.waiting.remove(r)
            r.seq_id = seq
            if entry is not None and hit > 0 and entry.seq_id in self.pool.entries:
                self.b.seq_cp(entry.seq_id, seq, 0, hit)
                r.shared, r.shared_len = entry, hit
                entry.sharers.add(r)
                r.n_past = hit
            else:
                entry, hit = None, 0
                r.n_past = 0
            if self.cfg.prefix_cache:
                self.pool.use(entry, hit, len(r.tokens), count=r.first_admitted_at is None)
            if r.first_admitted_at is None:
                r.first_admitted_at = now
                r.cached_tokens = min(r.n_past, r.n_prompt)
            r.admitted_at = now
            self.running.append(r)

    def _evict_entry(self, avoid: Any) -> bool:
        """Give up one evictable cached prefix (not ``avoid``); whether one went."""
        seq = self.pool.evict(avoid=avoid)
        if seq is None:
            return False
        self._drop_seq(seq)
        return True

    def _drop_seq(self, seq: int) -> None:
        """Clear a sequence the pool gave up and hand its id back."""
        self.b.seq_rm(seq)
        self.pool.give_id(seq)

    def _release_seq(self, r: Request) -> None:
        """Free a running sequence's id and cells."""
        if r.seq_id is None:
            return
        self.b.seq_rm(r.seq_id)
        self.pool.release_cells(r.n_past - r.shared_len)
        if r.shared is not None:
            r.shared.sharers.discard(r)
        self.pool.give_id(r.seq_id)
        r.seq_id, r.shared, r.shared_len, r.n_past = None, None, 0, 0

    def _preempt(self, victim: Request, now: float) -> None:
        """Free the victim's KV; it waits again with every token it has (prompt + generated) and
        recomputes them on resume, so its stream continues where it stopped."""
        self._admit_dirty = True
        self._release_seq(victim)
        self.running.remove(victim)
        victim.preemptions += 1
        victim.admitted_at = None
        self.waiting.append(victim)
        self.stats.record_preemption(victim.cls)
        log.debug("preempted request %s (%s)", victim.id, victim.cls)

    def _out_of_kv(self, items: list[BatchItem], now: float) -> None:
        """llama_decode found no KV slot: give up cached prefixes, then the lowest-class,
        newest running sequence. Nothing of this batch was kept by llama.cpp."""
        # Only as many cached prefixes as the batch needs room for (at least one), in the
        # pool's order: one-off prompts before those that serve hits.
        self._admit_dirty = True
        needed = sum(it.n for it in items)
        if self._evict_entry(avoid=None):
            while self.pool.free_cells < needed and self._evict_entry(avoid=None):
                pass
            return
        victim = self.policy.memory_victim(self.running)
        if victim is not None and len(self.running) > 1:
            self._preempt(victim, now)
            return
        newest = max(self.running, key=lambda r: r.arrival)
        self._fail(newest, "the KV cache is exhausted", now, status=503)

    def _keep_as_prefix(self, r: Request) -> None:
        own = r.n_past - r.shared_len
        self.pool.release_cells(own)
        shared = r.shared if r.shared is not None and r.shared.seq_id in self.pool.entries else None
        if r.shared is not None:
            r.shared.sharers.discard(r)
        for seq in self.pool.insert(r.seq_id, r.tokens[: r.n_past], own, shared):  # type: ignore[arg-type]
            self._drop_seq(seq)
        r.seq_id, r.shared, r.shared_len = None, None, 0

