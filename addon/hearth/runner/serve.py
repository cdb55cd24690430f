"""What a model's worker serves once its model is loaded (:mod:`.entry` starts it): the
server's engine and service channels (:mod:`hearth.shared.protocol`) answered from llama.cpp.
Imported only after the load; nothing here belongs to the server stack (the engine, the runtime)."""

from __future__ import annotations

import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.connection import Connection
from typing import Any

from ..llama.drafting import Drafter, same_vocabulary
from ..llama.llama_adapter import LlamaError, Model
from ..llama.llama_backends import backend_names, cpu_variant
from ..llama.llama_sampling import Sampler, check_grammar
from ..shared.decode_sample import sample_run
from . import boot, faults
from .low_priority import LowPriorityThread

log = logging.getLogger("hearth.worker")


class Runner:
    def __init__(self, engine: Connection, service: Connection, cfg: dict[str, Any],
                 loaded: boot.Loaded, low: LowPriorityThread | None = None):
        self.eng, self.svc, self.cfg = engine, service, cfg
        self.model, self.b, self.abort = loaded.model, loaded.backend, loaded.abort
        self.loaded = loaded
        self.samplers: dict[int, Sampler] = {}
        self.poisoned: set[int] = set()  # test faults only
        self._next_sampler = 0
        self._svc_lock = threading.Lock()
        self.drafter: Drafter | None = None
        # The load phase's thread at the lowest CPU priority, when the server asked for one:
        # engine calls (calibration, the prefix restore) go through it until op_normal_priority.
        self.low = low

    # -- start ------------------------------------------------------------------------------
    def ready(self) -> None:
        """After the bootstrap's load: the draft model, then the ready message."""
        cfg, loaded, model, b = self.cfg, self.loaded, self.model, self.b
        self.drafter = self._drafter(model)
        draft_s = self.drafter.calibrate(loaded.canary_token) if self.drafter else 0.0
        if self.drafter:
            log.info("draft model %s: a guess costs %.1f ms", self.drafter.model.path.name,
                     1000 * draft_s)
        specials = model.special_tokens()
        self.eng.send(("ready", {
            "pid": os.getpid(), "rung": loaded.rung, "cpu_variant": cpu_variant(),
            "rungs": loaded.rungs,
            "backends": backend_names(), "n_ctx": b.n_ctx, "n_ctx_seq": b.n_ctx_seq,
            "n_seq_max": b.n_seq_max, "n_batch": b.n_batch, "n_ubatch": b.n_ubatch,
            "embed_limits": b.embed_limits(), "embed_pieces": b.embed_pieces(),
            "description": model.description,
            "n_vocab": model.n_vocab, "n_ctx_train": model.n_ctx_train,
            "chat_template": model.chat_template(), "specials": specials,
            "architecture": model.meta("general.architecture"),
            "canary_token": loaded.canary_token,
            "n_draft": cfg.get("draft_tokens", 0) if self.drafter else 0,
            "draft_s": draft_s}))

    def _drafter(self, model: Model) -> Drafter | None:
        """The draft model, where one is set and can draft for this model; else None (a
        draft that cannot serve is logged and left out: the model serves without it)."""
        cfg = self.cfg
        if not cfg.get("draft_model") or cfg.get("draft_tokens", 0) <= 0:
            return None
        try:
            draft = boot.open_model(cfg["draft_model"], n_gpu_layers=cfg["n_gpu_layers"],
                                    use_mmap=cfg["use_mmap"])
        except LlamaError as e:
            log.warning("the draft model cannot be loaded (%s); serving without a draft", e)
            return None
        if why := same_vocabulary(model, draft):
            log.warning("%s cannot draft for %s: %s; serving without a draft",
                        draft.path.name, model.path.name, why)
            draft.close()
            return None
        return Drafter(draft, cfg["context"].get("n_threads", 0))

    # -- the engine channel ---------------------------------------------------------------
    def serve(self) -> None:
        threading.Thread(target=self._service, name="hearth-worker-service", daemon=True).start()
        while True:
            try:
                deferred, op, args = self.eng.recv()
            except (EOFError, OSError):
                return  # the server is gone
            try:
                if op == "exit":
                    self._apply(deferred, "sync", ())
                    self.eng.send(("ok", None))
                    return
                reply = ("ok", self.low.call(self._apply, deferred, op, args) if self.low
                         else self._apply(deferred, op, args))
            except Exception as e:  # the request's or the call's fault: the server decides
                reply = ("err", f"{type(e).__name__}: {e}")
            self.eng.send(reply)

    def _apply(self, deferred: list[tuple], op: str, args: tuple) -> Any:
        for d in deferred:
            getattr(self, "op_" + d[0])(*d[1:])
        return getattr(self, "op_" + op)(*args)

    def op_normal_priority(self) -> None:
        """The load is over (or a voice or chat request waits for this model): the next
        calls run in the main thread, at the worker's own priority."""
        if self.low is not None:
            self.low.close()
            self.low = None

    def op_seq_rm(self, seq: int, p0: int, p1: int) -> None:
        self.b.seq_rm(seq, p0, p1)

    def op_seq_cp(self, src: int, dst: int, p0: int, p1: int) -> None:
        self.b.seq_cp(src, dst, p0, p1)

    def op_free_sampler(self, sid: int) -> None:
        s = self.samplers.pop(sid, None)
        if s is not None:
            s.close()
        self.poisoned.discard(sid)

    def op_sync(self) -> None:
        return None

    def op_new_sampler(self, params: Any) -> int:
        self._next_sampler += 1
        self.samplers[self._next_sampler] = Sampler(self.model, params)
        if faults.poisoned(params.grammar):
            self.poisoned.add(self._next_sampler)
        return self._next_sampler

    def op_decode_sample(self, tokens: list[int], pos: list[int], seqs: list[int],
                         outputs: list[bool], samples: list[tuple]) -> tuple[int, list, float]:
        """Decode, then sample each output: ``(sampler, row)`` gives one described token,
        ``(sampler, row, drafts)`` the run :func:`~hearth.shared.decode_sample.sample_run` takes."""
        t0 = time.perf_counter()
        status = self.b.decode(tokens, pos, seqs, outputs)
        if status != 0:
            return status, [], time.perf_counter() - t0
        out: list = []
        for sid, i, *drafts in samples:
            self.abort.blame = sid  # a crash in here is this request's
            if sid in self.poisoned:
                faults.on_poisoned_sample()
            sampler = self.samplers[sid]
            if drafts:
                run = sample_run(lambda j, s=sampler: self.b.sample(s, j), i, drafts[0])
                out.append([self._described(tok) for tok in run])
            else:
                out.append(self._described(self.b.sample(sampler, i)))
        self.abort.blame = 0
        return status, out, time.perf_counter() - t0  # the server subtracts it from its wait

    def op_draft(self, tokens: list[int], k: int, sid: int = 0
                 ) -> list[tuple[int, bool, bytes]]:
        if self.drafter is None:
            return []
        self.abort.blame = sid  # a crash in the draft is charged to the stream drafted for
        guessed = self.drafter.draft(tokens, k)
        self.abort.blame = 0
        return [self._described(tok) for tok in guessed]

    def op_force(self, sid: int, text: str, limit: int) -> list[tuple[int, bool, bytes]]:
        self.abort.blame = sid  # a crash in the grammar is this request's
        taken = self.b.force(self.samplers[sid], text, limit)
        self.abort.blame = 0
        return [self._described(tok) for tok in taken]

    def _described(self, tok: int) -> tuple[int, bool, bytes]:
        """A token as the server keeps it: with its end-of-generation flag and its text."""
        return tok, self.b.is_eog(tok), self.b.piece(tok)

    def op_token_info(self, tok: int) -> tuple[bool, bytes]:
        return self.b.is_eog(tok), self.b.piece(tok)

    def op_seq_pos_max(self, seq: int) -> int:
        return self.b.seq_pos_max(seq)

    def op_seq_state_get(self, seq: int) -> bytes | None:
        data = self.b.seq_state_get(seq)
        return None if data is None else self.b.state_bytes(data)

    def op_seq_state_set(self, seq: int, raw: bytes) -> bool:
        return self.b.seq_state_set(seq, self.b.state_from_bytes(raw))

    def op_embed(self, inputs: list[list[int]]) -> list[list[float]]:
        return self.b.embed(inputs)

    def op_embed_piece(self, tokens: list[int], start: int, last: bool) -> list[float]:
        return self.b.embed_piece(tokens, start, last)

    # -- the service channel ----------------------------------------------------------------
    def _service(self) -> None:
        pool = ThreadPoolExecutor(2, thread_name_prefix="hearth-worker-tokenize")
        while True:
            try:
                mid, op, args = self.svc.recv()
            except (EOFError, OSError):
                os._exit(0)  # the server is gone: nothing left to serve
            pool.submit(self._answer, mid, op, args)

    def _answer(self, mid: int, op: str, args: tuple) -> None:
        try:
            if op == "tokenize":
                value: Any = self.model.tokenize(*args)
            elif op == "tokenize_pieces":
                value = self.model.tokenize_pieces(*args)
            elif op == "check_grammar":
                check_grammar(self.model, *args)
                value = None
            elif op == "ping":
                value = os.getpid()
            else:
                raise ValueError(f"unknown service call {op!r}")
            reply = (mid, "ok", value)
        except Exception as e:
            reply = (mid, "err", f"{type(e).__name__}: {e}")
        with self._svc_lock:
            self.svc.send(reply)
