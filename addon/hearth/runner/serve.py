"""A model's worker process: it alone loads llama.cpp, holds the model and its context, and
answers the server's engine and service channels (:mod:`.protocol`). When it dies, whatever
killed it (a segfault, an illegal instruction, an abort, the OOM killer) kills only it."""

from __future__ import annotations

import faulthandler
import logging
import os
import signal
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.connection import Connection
from typing import Any

from ..backend import LlamaBackend
from ..drafting import Drafter, same_vocabulary
from ..engine.base import sample_run
from ..llama_adapter import ContextParams, LlamaError, Model
from ..llama_backends import NO_EXTRA, backend_names, cpu_rungs, cpu_variant, init_backend
from ..llama_sampling import Sampler, check_grammar
from ..runtime import unservable
from . import faults
from .low_priority import LowPriorityThread
from .protocol import AbortFlag

log = logging.getLogger("hearth.worker")


class Runner:
    def __init__(self, engine: Connection, service: Connection, cfg: dict[str, Any]):
        self.eng, self.svc, self.cfg = engine, service, cfg
        self.samplers: dict[int, Sampler] = {}
        self.poisoned: set[int] = set()  # test faults only
        self._next_sampler = 0
        self._svc_lock = threading.Lock()
        # The load phase's thread at the lowest CPU priority, when the server asked for one
        # (cfg load_priority "low"); engine calls go through it until op_normal_priority.
        self.low = LowPriorityThread() if cfg.get("load_priority") == "low" else None

    # -- start ------------------------------------------------------------------------------
    def load(self) -> None:
        cfg = self.cfg
        rungs = cpu_rungs()
        rung = next((r for r in rungs if r not in cfg["skip"]), rungs[-1])
        self.eng.send(("rung", rung))
        init_backend(verbose=cfg["verbose"], rung=rung)
        model = Model(cfg["model"], n_gpu_layers=cfg["n_gpu_layers"], use_mmap=cfg["use_mmap"],
                      extra_buffers=not rung.endswith(NO_EXTRA))
        if reason := unservable(model):
            raise ValueError(f"{model.path.name}: {reason}")
        embed_model = None
        if cfg["embedding_model"]:
            embed_model = Model(cfg["embedding_model"], n_gpu_layers=cfg["n_gpu_layers"],
                                use_mmap=cfg["use_mmap"], extra_buffers=not rung.endswith(NO_EXTRA))
        self.abort = AbortFlag(cfg["abort_path"])
        b = LlamaBackend(model, ContextParams(**cfg["context"]), embed_model=embed_model,
                         embed_batch=cfg["embed_batch"], abort_flag=self.abort.array)
        self.model, self.b = model, b
        self.drafter = self._drafter(model, rung)
        # The canary: a CPU that reports instructions it cannot run dies here, not mid-request.
        token = model.tokenize("Hearth warms up.", add_special=False)[0]
        faults.at_canary(rung)
        if b.decode([token], [0], [0], [True]) != 0:
            raise RuntimeError("the canary decode failed")
        b.seq_rm(0)
        draft_s = self.drafter.calibrate(token) if self.drafter else 0.0
        if self.drafter:
            log.info("draft model %s: a guess costs %.1f ms", self.drafter.model.path.name,
                     1000 * draft_s)
        specials = model.special_tokens()
        self.eng.send(("ready", {
            "pid": os.getpid(), "rung": rung, "cpu_variant": cpu_variant(), "rungs": rungs,
            "backends": backend_names(), "n_ctx": b.n_ctx, "n_ctx_seq": b.n_ctx_seq,
            "n_seq_max": b.n_seq_max, "n_batch": b.n_batch, "n_ubatch": b.n_ubatch,
            "embed_limits": b.embed_limits(), "embed_pieces": b.embed_pieces(),
            "description": model.description,
            "n_vocab": model.n_vocab, "n_ctx_train": model.n_ctx_train,
            "chat_template": model.chat_template(), "specials": specials,
            "architecture": model.meta("general.architecture"), "canary_token": token,
            "n_draft": cfg.get("draft_tokens", 0) if self.drafter else 0,
            "draft_s": draft_s}))

    def _drafter(self, model: Model, rung: str) -> Drafter | None:
        """The draft model, where one is set and can draft for this model; else None (a
        draft that cannot serve is logged and left out: the model serves without it)."""
        cfg = self.cfg
        if not cfg.get("draft_model") or cfg.get("draft_tokens", 0) <= 0:
            return None
        try:
            draft = Model(cfg["draft_model"], n_gpu_layers=cfg["n_gpu_layers"],
                          use_mmap=cfg["use_mmap"], extra_buffers=not rung.endswith(NO_EXTRA))
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
        ``(sampler, row, drafts)`` the run :func:`~hearth.engine.base.sample_run` takes."""
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


def main(argv: list[str]) -> int:
    # The server decides when its workers stop (after saving their prefixes): a Ctrl-C or a
    # SIGTERM sent to the whole process group is the server's to handle.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    # Where it died, in the log: each thread's Python stack on a fatal signal (the signal
    # still ends the process), and on SIGUSR1, which the watchdog sends before its SIGKILL.
    faulthandler.enable(all_threads=True)
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(levelname)s %(name)s: %(message)s")
    engine, service = Connection(int(argv[0])), Connection(int(argv[1]))
    runner = Runner(engine, service, engine.recv())
    t0 = time.monotonic()
    try:
        runner.low.call(runner.load) if runner.low else runner.load()
    except Exception as e:  # not a crash: the server reports it and does not restart
        engine.send(("failed", str(e)))
        return 0
    log.info("worker %d ready in %.1f s", os.getpid(), time.monotonic() - t0)
    runner.serve()
    return 0
