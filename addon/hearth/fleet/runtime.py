"""The loaded service: model, engine and chat formatter, built from the settings. The HTTP layer
talks to this; nothing here knows about HTTP."""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from dataclasses import asdict
from importlib import metadata
from pathlib import Path
from typing import Any

from ..chat.prompts import ChatFormatter
from ..engine import Engine, EngineConfig, EngineCore
from ..engine.arbiter import Arbiter
from ..engine.base import WorkerLost
from ..engine.prefix_store import PrefixStore
from ..engine.stats import Stats
from ..policy.scheduler import PolicyConfig
from ..redact import redact
from ..settings import Settings
from ..shared.protocol import ContextParams
from ..shared.requests import Event, Request
from .models import ModelNotFound, resolve
from .proxy import Boundary, ModelProxy, ProcessBackend
from .supervisor import BACKOFF_S, CRASHED_TWICE, STRIKES, Supervisor

log = logging.getLogger(__name__)


def _llama_cpp_version() -> str:
    try:
        return metadata.version("llama_cpp_python")
    except metadata.PackageNotFoundError:
        return "unknown"


class Runtime:
    """One model: its worker process (llama.cpp), and in this process its engine thread,
    chat formatter and stats. The fleet may unload it and load it again; its stats live
    across loads, and across its worker's crashes."""

    def __init__(self, settings: Settings, name: str | None = None,
                 prefix_dir: Path | None = None, arbiter: Arbiter | None = None):
        self.settings = settings
        self.arbiter = arbiter  # shared with the other models' engines
        self.name = name  # None: the file's stem once loaded
        self.prefix_dir = prefix_dir or Path(settings.data_dir) / "prefix-cache"
        self.state = "loading"  # loading | ready | failed | unloading | unloaded
        self.error: str | None = None
        self.model: ModelProxy | None = None
        self.backend: ProcessBackend | None = None
        self.supervisor: Supervisor | None = None
        self.engine: Engine | None = None
        self.core: EngineCore | None = None
        self.formatter: ChatFormatter | None = None
        self.model_id = name or "hearth"
        self.backends: list[str] = []  # llama.cpp backends in use, once loaded
        self.model_path: Path | None = None
        self._thread: threading.Thread | None = None
        self.stats = Stats()  # exists before the engine, so observers can subscribe early
        self.exit_code = 0  # the process's, once the server stops
        self.settled = threading.Event()  # set once loading ended, ready or failed
        self.on_settled: Any = None  # called from the loading thread once it has settled
        self.load_s: float | None = None  # how long the last load took
        self.failed_at: float | None = None  # when the last load failed
        self.progress: dict[str, Any] | None = None  # while loading: downloading, loading
        # The cost model of the last load: a reload skips the calibration decodes (5 of the
        # 5.5 s SmolLM2 takes to load on 2 cores).
        self._costs: tuple[Any, Any] | None = None
        self.load_turn: Any = None  # the next load yields to other models (fleet.load_priority)

    def start_loading(self) -> None:
        self.state, self.error = "loading", None
        self.settled.clear()
        self._thread = threading.Thread(target=self._load_safely, name="hearth-load",
                                        daemon=True)
        self._thread.start()

    def _downloaded(self, got: int, total: int | None) -> None:
        self.progress = {"phase": "downloading", "bytes": got, "total_bytes": total}

    def _load_safely(self) -> None:
        t0 = time.monotonic()
        try:
            self.load()
            self.load_s = time.monotonic() - t0
        except Exception as e:
            self.failed_at = time.monotonic()
            self.state = "failed"
            self.error = redact(str(e))  # a download URL's password stays out of /health
            log.error("loading the model failed: %s", e)
        finally:
            self.progress = None
            if self.load_turn is not None:  # a failed load's worker is never left stopped
                self.load_turn.finish()
            self.settled.set()
            if self.on_settled is not None:
                self.on_settled()

    def load(self) -> None:
        """Start the model's worker process (walking down the CPU ladder past rungs that
        crash at start), calibrate, restore the saved prefixes, start the engine thread."""
        s = self.settings
        path = resolve(s.model, s.models_dir, progress=self._downloaded)
        embed_path = resolve(s.embedding_model, s.models_dir) if s.embedding_model else None
        self.progress = {"phase": "loading"}
        self.model_path = path
        log.info("loading %s in a worker process", path)
        sup = self.supervisor = Supervisor(
            self._worker_cfg(path, embed_path),
            Path(s.data_dir) / "workers" / (self.name or "default"), s.worker_watchdog_s)
        turn = self.load_turn
        if turn is not None:
            turn.begin(sup)
        backend: ProcessBackend | None = None
        while True:
            worker = sup.start()
            if backend is None:
                backend = ProcessBackend(worker)
                backend.before_call = turn.before_call if turn is not None else None
            else:
                backend.attach(worker)
            core = self._core(backend)
            try:
                if self._costs is not None:  # a reload: what the engine learnt still holds
                    core.cost, core.embed_cost = self._costs
                else:  # the calibration decodes are the canary's second half
                    core.calibrate(worker.info["canary_token"])
                if s.prefix_cache and s.prefix_store_mb > 0:
                    self._restore_prefixes(core, path, backend.n_ctx)
                backend.flush()
                if turn is not None:  # it serves at its own priority from here on
                    turn.finish(backend)
                break
            except WorkerLost as lost:
                sup.crashed(lost, at_start=True)
        sup.state, sup.failures_in_row = "serving", 0
        backend.boundary = sup.boundary = Boundary()  # served iterations, not calibration
        worker.on_lost = core.wakeup.set
        self.backends = worker.info["backends"]
        self.model = ModelProxy(backend)
        specials = self.model.special_tokens()
        self.formatter = ChatFormatter(self.model.chat_template(), specials.get("bos_token", ""),
                                       specials.get("eos_token", ""),
                                       self.model.meta("general.architecture"))
        self.backend, self.core = backend, core
        self.model_id = self.name or path.stem
        if self.arbiter is not None:
            self.arbiter.join(core)
        self.engine = Engine(core, on_death=self._engine_died, on_worker_lost=self._worker_lost)
        self.engine.admit_check = sup.quarantine.check
        self.engine.start()
        self.state = "ready"
        log.info("model %s ready (%s, n_ctx=%d, n_parallel=%d, policy=%s)", self.model_id,
                 self.model.description, backend.n_ctx, s.n_parallel, s.policy)

    def _worker_cfg(self, path: Path, embed_path: Path | None) -> dict[str, Any]:
        s = self.settings
        draft = None
        if s.draft_model:
            try:
                draft = resolve(s.draft_model, s.models_dir)
            except ModelNotFound as e:  # the model serves without it
                log.warning("draft model %s not found (%s); serving without a draft",
                            s.draft_model, e)
        return {"model": str(path), "embedding_model": str(embed_path) if embed_path else "",
                "draft_model": str(draft) if draft else "", "draft_tokens": s.draft_tokens,
                "n_gpu_layers": s.n_gpu_layers, "use_mmap": s.use_mmap, "verbose": s.verbose,
                "context": asdict(self._context_params()),
                "embed_batch": min(2048, s.n_batch * 4)}

    # -- a worker that died ---------------------------------------------------------------
    def _worker_lost(self, lost: WorkerLost, in_flight: list[Request],
                     suspects: list[Request], stop: threading.Event) -> None:
        """In the engine thread, once the engine has forgotten the dead worker: answer the
        requests it was serving (a suspect for the second time is quarantined), then start a
        new worker (after a backoff) and give it the saved prefixes. Waiting requests wait
        for it."""
        sup = self.supervisor
        assert sup is not None and self.core is not None and self.backend is not None
        sup.crashed(lost, requests=len(in_flight))
        sup.state = "restarting"
        delay = sup.backoff()
        for r in in_flight:
            if any(r is x for x in suspects) and sup.quarantine.strike(r) >= STRIKES:
                ev = Event("error", message=CRASHED_TWICE, status=422,
                           code="worker_crashed_twice")
            else:
                ev = Event("error", status=503, code="worker_crashed", retry_after=delay + 2,
                           message=f"the model's worker crashed ({lost.cause}); it is "
                                   "restarting, try again")
            try:
                r.sink([ev])
            except Exception:
                log.exception("could not tell request %d that its worker crashed", r.id)
        while not stop.wait(delay):
            try:
                worker = sup.start()
                self.backend.attach(worker)
                worker.on_lost = self.core.wakeup.set
                if self.core.store is not None:
                    self.core.restore(self.core.store.load())
                self.backend.flush()
            except WorkerLost as again:  # it died restoring: as at start
                sup.crashed(again, at_start=True)
                delay = sup.backoff()
                continue
            except Exception as e:  # WorkerFailed, or crashed at every start: keep trying
                log.error("the model's worker could not be restarted: %s", e)
                sup.state, self.error = "failed", str(e)
                delay = BACKOFF_S[-1]
                continue
            sup.state, self.error = "serving", None
            sup.restarts += 1
            self.backends = worker.info["backends"]
            log.info("the model's worker is back (pid %d); %d request(s) waiting", worker.pid,
                     len(self.core.waiting))
            return

    @property
    def serving(self) -> bool:
        """Whether the model's worker is up (False while it restarts after a crash)."""
        return self.supervisor is not None and self.supervisor.state == "serving"

    def _context_params(self) -> ContextParams:
        s = self.settings
        entries = s.prefix_cache_entries if s.prefix_cache else 0
        return ContextParams(
            n_ctx=s.n_ctx, n_seq_max=s.n_parallel + entries, n_batch=s.n_batch,
            n_ubatch=s.n_ubatch, n_threads=s.n_threads or (os.cpu_count() or 1),
            flash_attn=s.flash_attn)

    def _core(self, backend: Any) -> EngineCore:
        s = self.settings
        entries = s.prefix_cache_entries if s.prefix_cache else 0
        return EngineCore(
            backend,
            PolicyConfig(mode=s.policy, n_parallel=s.n_parallel, aging_seconds=s.aging_seconds(),
                         fair_slots=s.fair_slots, caps=s.caps()),
            EngineConfig(latency_target_s=s.latency_target_ms / 1000.0,
                         relax_prefill_bound=s.relax_prefill_bound, prefix_cache=s.prefix_cache,
                         prefix_cache_entries=entries, max_queue=s.max_queue,
                         prefix_cache_kept_share=s.prefix_cache_kept_share,
                         draft_policy=s.draft_policy, deadlines=s.deadline_seconds(),
                         reservation_s=s.reservation_s),
            self.stats)

    def _restore_prefixes(self, core: EngineCore, path: Path, n_ctx: int) -> None:
        """The voice and chat prompts saved at the last stop go back into the KV cache before
        the server says it is ready: the first voice command after a restart is warm."""
        st = path.stat()
        key = {"model": str(path.resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns,
               "n_ctx": n_ctx, "flash_attn": self.settings.flash_attn,
               "llama_cpp": _llama_cpp_version()}
        store = PrefixStore(self.prefix_dir, key, self.settings.prefix_store_mb * 1024 * 1024)
        core.store = store
        n = core.restore(store.load())
        if n or store.skipped:
            log.info("restored %d cached prefixes (%d cells) from %s in %.0f ms", n,
                     core.pool.cached_cells, store.folder, 1000 * store.restore_s)

    def _engine_died(self, err: BaseException) -> None:
        """The engine thread died (its requests already have their errors): /health says so,
        and the process stops gracefully with a failure status, jobs requeued, so that the
        Supervisor (or systemd, or the user's loop) starts it afresh."""
        self.state, self.error = "failed", f"engine stopped: {err}"
        self.exit_code = 70  # EX_SOFTWARE
        os.kill(os.getpid(), signal.SIGTERM)

    def tokenize_prompt(self, text: str, pieces: list[tuple[str, bool]]) -> list[int]:
        """A rendered chat prompt (``text``) given as :meth:`ChatFormatter.render_pieces`'
        pieces: its messages' content is tokenized as text."""
        bos = self.formatter.bos_token if self.formatter else ""
        add_special = not (bos and text.startswith(bos))
        return self.model.tokenize_pieces(pieces, add_special=add_special)

    def close(self) -> bool:
        """Stop the engine, save the voice and chat prefixes, stop the worker. A decode that
        will not stop no longer pins the process: its worker is killed."""
        stopped = self.engine is None or self.engine.stop()
        if not stopped:
            log.warning("the engine thread did not stop in time; killing its worker")
        elif self.core is not None and self.core.store is not None and self.serving \
                and self.engine is not None and self.engine.error is None:
            self._save_prefixes(self.core)
        sup = self.supervisor
        if sup is not None:
            sup.closing = True
            for w in (sup.starting, sup.worker):
                if w is not None:
                    w.stop(timeout=10.0 if stopped and w is sup.worker else 0.0)
            sup.state = "stopped"
        if not stopped and self.engine is not None:
            self.engine.stop(timeout=5.0)  # it was waiting on the worker: it ends now
        return True

    def unload(self) -> None:
        """Free the model's memory, ready to load it again (the fleet's keep-alive and swaps)."""
        self.state = "unloading"
        self.close()
        if self.core is not None:
            self._costs = (self.core.cost, self.core.embed_cost)
            if self.arbiter is not None:
                self.arbiter.leave(self.core)
        self.backend = self.model = self.engine = self.core = self.formatter = None
        self.supervisor = None
        self.settled.clear()
        self.state = "unloaded"

    @staticmethod
    def _save_prefixes(core: EngineCore) -> None:
        store = core.store
        assert store is not None
        t0 = time.monotonic()
        try:
            core.persist(force=True)
            store.close()
        except (Exception, WorkerLost):  # the cache is worth less than a clean stop
            log.exception("could not save the prefix cache")
            return
        stats = store.stats()
        log.info("saved %d cached prefixes (%.1f MB) to %s in %.0f ms", stats["files"],
                 stats["bytes"] / 1e6, store.folder, 1000 * (time.monotonic() - t0))
