"""The loaded service: model, engine and chat formatter, built from the settings. The HTTP layer
talks to this; nothing here knows about HTTP."""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from importlib import metadata
from pathlib import Path
from typing import Any

from .engine import Engine, EngineConfig, EngineCore
from .engine.arbiter import Arbiter
from .models import resolve
from .prefix_store import PrefixStore
from .prompts import ChatFormatter
from .scheduler import PolicyConfig
from .settings import Settings
from .stats import Stats

log = logging.getLogger(__name__)


def _llama_cpp_version() -> str:
    try:
        return metadata.version("llama_cpp_python")
    except metadata.PackageNotFoundError:
        return "unknown"


def unservable(model: Any) -> str | None:
    """Why the engine cannot serve this model correctly, or None. Recurrent and hybrid models
    (Mamba, RWKV, Jamba, ...) keep a state per sequence that cannot be copied for a range or
    cut at a position, which the prefix cache and preemption do all the time."""
    if model.is_recurrent or model.is_hybrid:
        kind = "a recurrent" if model.is_recurrent else "a hybrid (attention + recurrent)"
        return (f"{kind} model: Hearth shares and trims each sequence's KV cache, which such "
                "models' memory does not allow; serve a transformer model")
    return None


class Runtime:
    """One model in its own context and engine thread. The fleet may unload it and load it
    again; its stats live across loads."""

    def __init__(self, settings: Settings, name: str | None = None,
                 prefix_dir: Path | None = None, arbiter: Arbiter | None = None):
        self.settings = settings
        self.arbiter = arbiter  # shared with the other models' engines
        self.name = name  # None: the file's stem once loaded
        self.prefix_dir = prefix_dir or Path(settings.data_dir) / "prefix-cache"
        self.state = "loading"  # loading | ready | failed | unloading | unloaded
        self.error: str | None = None
        self.model: Any = None
        self.backend: Any = None
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
            self.error = str(e)
            log.error("loading the model failed: %s", e)
        finally:
            self.progress = None
            self.settled.set()
            if self.on_settled is not None:
                self.on_settled()

    def load(self) -> None:
        # Imported here: llama.cpp is loaded only by a process that serves a model.
        from .backend import LlamaBackend
        from .llama_adapter import Model, backend_names, init_backend

        s = self.settings
        init_backend(verbose=s.verbose)
        self.backends = backend_names()
        log.info("llama.cpp backends: %s", ", ".join(self.backends))
        path = resolve(s.model, s.models_dir, progress=self._downloaded)
        self.progress = {"phase": "loading"}
        self.model_path = path
        log.info("loading %s", path)
        opened: list[Any] = []  # closed again, newest first, if the load fails part-way
        try:
            model = Model(path, n_gpu_layers=s.n_gpu_layers, use_mmap=s.use_mmap)
            opened.append(model)
            if reason := unservable(model):
                raise ValueError(f"{path.name}: {reason}")
            embed_model = None
            if s.embedding_model:
                embed_model = Model(resolve(s.embedding_model, s.models_dir),
                                    n_gpu_layers=s.n_gpu_layers, use_mmap=s.use_mmap)
                opened.append(embed_model)
            backend = LlamaBackend(model, self._context_params(), embed_model=embed_model,
                                   embed_batch=min(2048, s.n_batch * 4))
            opened.append(backend)
            core = self._core(backend)
            if self._costs is not None:  # a reload: what the engine learnt still holds
                core.cost, core.embed_cost = self._costs
            else:
                core.calibrate(model.tokenize("Hearth warms up.", add_special=False)[0])
        except BaseException:
            for x in reversed(opened):
                x.close()
            raise
        if s.prefix_cache and s.prefix_store_mb > 0:
            self._restore_prefixes(core, path, backend.n_ctx)
        specials = model.special_tokens()
        self.formatter = ChatFormatter(model.chat_template(), specials.get("bos_token", ""),
                                       specials.get("eos_token", ""),
                                       model.meta("general.architecture"))
        self.model, self.backend, self.core = model, backend, core
        self.model_id = self.name or path.stem
        if self.arbiter is not None:
            self.arbiter.join(core)
        self.engine = Engine(core, on_death=self._engine_died)
        self.engine.start()
        self.state = "ready"
        log.info("model %s ready (%s, n_ctx=%d, n_parallel=%d, policy=%s)", self.model_id,
                 model.description, backend.n_ctx, s.n_parallel, s.policy)

    def _context_params(self) -> Any:
        from .llama_adapter import ContextParams

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
                         prefix_cache_kept_share=s.prefix_cache_kept_share),
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

    def tokenize_prompt(self, text: str) -> list[int]:
        bos = self.formatter.bos_token if self.formatter else ""
        add_special = not (bos and text.startswith(bos))
        return self.model.tokenize(text, add_special=add_special, parse_special=True)

    def close(self) -> bool:
        """Stop the engine, save the voice and chat prefixes, free the context. False when a
        stuck decode still uses the context (freeing it would crash the process)."""
        if self.engine is not None and not self.engine.stop():
            log.warning("the engine thread did not stop in time; its context is not freed")
            return False
        if self.core is not None and self.core.store is not None and self.engine is not None \
                and self.engine.error is None:
            self._save_prefixes(self.core)
        if self.backend is not None:
            self.backend.close()
        return True

    def unload(self) -> None:
        """Free the model's memory, ready to load it again (the fleet's keep-alive and swaps)."""
        self.state = "unloading"
        if not self.close():
            self.state, self.error = "failed", "the engine did not stop to unload"
            return
        if self.core is not None:
            self._costs = (self.core.cost, self.core.embed_cost)
            if self.arbiter is not None:
                self.arbiter.leave(self.core)
        backend, self.backend = self.backend, None
        for m in {id(x): x for x in (self.model, getattr(backend, "_embed_model", None))
                  if x is not None}.values():
            m.close()
        self.model = self.engine = self.core = self.formatter = None
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
        except Exception:  # the cache is worth less than a clean stop
            log.exception("could not save the prefix cache")
            return
        stats = store.stats()
        log.info("saved %d cached prefixes (%.1f MB) to %s in %.0f ms", stats["files"],
                 stats["bytes"] / 1e6, store.folder, 1000 * (time.monotonic() - t0))
