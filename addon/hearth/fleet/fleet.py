"""The models this server serves, each a :class:`~hearth.fleet.runtime.Runtime` (its own context and
engine thread), loaded and unloaded off the request path.

A request leases its model for as long as it runs (``use``): a leased model is never unloaded.
A request for a model that is not resident asks the residency policy what to do (load it, first
unloading idle models least recently used; wait for running work to finish; or refuse a model
that can never fit), then waits for the load within ``load_wait_s``. Idle models past their
keep-alive are unloaded by a background task. All of this runs on the event loop; loading and
unloading run in threads and wake the waiters when they end.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from ..chat.completions import CompletionError
from ..chat.prompts import template_capabilities
from ..engine.arbiter import Arbiter
from ..policy.arbitration import Arbitration
from ..policy.residency import Plan, ResidencyPolicy
from ..policy.scheduler import INTERACTIVE_RANK
from ..settings import CLASS_NAMES, Settings
from .gguf import GGUFError, read_metadata, shape_of
from .load_priority import turn_for
from .models import ModelNotFound, resolve
from .registry import Registry
from .remote import RemoteWorker
from .runtime import Runtime
from .worker import Worker, memory_budget, settings_for

log = logging.getLogger(__name__)

RETRY_FAILED_S = 30.0  # a model that failed to load is tried again after this long
SWEEP_S = 1.0


class Fleet:
    def __init__(self, settings: Settings, runtime: Runtime | None = None):
        self.settings = settings
        self.registry = Registry.from_settings(settings)
        self.policy = ResidencyPolicy(memory_budget(settings), settings.interactive_grace_s)
        embed_at = self.registry.for_class("embedding")
        # One accelerator: while one model has voice or chat work, the others wait their turn.
        self.arbiter = Arbiter(Arbitration(enabled=settings.arbitrate)) \
            if len(self.registry.entries) > 1 else None
        self.workers: dict[str, Worker] = {}
        for e in self.registry.entries:
            if e.spec.url:
                rt: Any = RemoteWorker(settings, e)
            elif e.implicit:  # one model: its prefix cache stays where it always was
                rt = runtime or Runtime(settings)
            else:
                rt = Runtime(settings_for(settings, e, e.name == embed_at), name=e.name,
                             prefix_dir=Path(settings.data_dir) / "prefix-cache" / e.name,
                             arbiter=self.arbiter)
                rt.state = "unloaded"
            self.workers[e.name] = Worker(e, rt)
        local = [w for w in self.workers.values() if not w.remote]
        self.start_models = [w.name for w in local if w.entry.spec.pinned] or \
            [w.name for w in local[:1]]
        self._loop: asyncio.AbstractEventLoop | None = None
        self._changed = asyncio.Event()
        self._sweeper: asyncio.Task | None = None

    # -- what the routes read ------------------------------------------------------------------
    @property
    def primary(self) -> Worker:
        """The model voice goes to: its queue is the household's headline."""
        return self.workers[self.registry.for_class("voice")]

    @property
    def engine_error(self) -> BaseException | None:
        """Why an engine thread died, if one did (the process is stopping then)."""
        for w in self.workers.values():
            if w.rt.engine is not None and w.rt.engine.error is not None:
                return w.rt.engine.error
        return None

    @property
    def state(self) -> str:
        """ready once every model loaded at start has loaded; failed if one of those first
        loads failed or any engine died. A model unloaded and loading again later (or failing
        to) is that model's business: its requests wait or get its error, the rest serve."""
        if self.engine_error is not None:
            return "failed"
        first = [self.workers[n].first_load for n in self.start_models]
        if "failed" in first:
            return "failed"
        return "loading" if None in first else "ready"

    def degraded(self) -> str | None:
        """Why a model's worker degrades the service (a crash, a restart), or None."""
        for w in self.workers.values():
            sup = getattr(w.rt, "supervisor", None)
            if sup is not None and (why := sup.problem()):
                return f"{w.name}: {why}" if len(self.workers) > 1 else why
        return None

    @property
    def error(self) -> str | None:
        for n in self.start_models:
            if (w := self.workers[n]).first_load == "failed" and w.rt.error:
                return f"{n}: {w.rt.error}" if len(self.workers) > 1 else w.rt.error
        return None

    @property
    def exit_code(self) -> int:
        return max(w.rt.exit_code for w in self.workers.values())

    def loaded(self) -> list[Worker]:
        return [w for w in self.workers.values() if w.rt.state == "ready"]

    def report(self) -> dict[str, Any]:
        """Each model's residency, for /v1/queue."""
        now = time.monotonic()
        models = {}
        for w in self.workers.values():
            v = w.view()
            expires = None  # a load sets last_used, so a loaded model's idle time is known
            if v.loaded and not v.pinned and v.keep_alive_s is not None and not w.leases:
                expires = max(0.0, v.keep_alive_s - (now - w.last_used))
            if w.remote:
                spec = w.entry.spec
                models[w.name] = {
                    "state": w.rt.state, "error": w.rt.error, "url": w.rt.shown_url,
                    "kind": spec.kind, "fallback": spec.fallback or None,
                    "classes": self._classes(w), "aliases": list(spec.aliases),
                    "in_use": w.leases, "max_concurrency": spec.max_concurrency,
                    **self.queue_depth(w)}
                continue
            models[w.name] = {
                "state": w.rt.state, "error": w.rt.error, "pinned": v.pinned,
                "classes": self._classes(w),
                "aliases": list(w.entry.spec.aliases), "memory_bytes": w.bytes,
                "keep_alive_s": v.keep_alive_s, "expires_in_s": expires, "in_use": w.leases,
                "progress": w.rt.progress, "loads": w.loads, "unloads": w.unloads,
                # what the model can do (its template's, once it has been loaded)
                "capabilities": template_capabilities(w.rt.formatter.source)
                if w.rt.formatter is not None else [],
                "last_load_s": w.rt.load_s,
                "worker": w.rt.supervisor.report() if w.rt.supervisor else None,
                "paused_for_others_s": self._paused(w),
                "load_turn": w.rt.load_turn.report() if w.rt.load_turn else None,
                **self.queue_depth(w)}
        resident = self.policy.used(w.view() for w in self.workers.values())
        return {"models": models,
                "memory": {"budget_bytes": min(self.policy.budget_bytes, 2**53),
                           "resident_bytes": resident}}

    def _classes(self, w: Worker) -> list[str]:
        return [c for c in CLASS_NAMES if self.registry.for_class(c) == w.name]

    def _paused(self, w: Worker) -> float:
        core = w.rt.core
        if self.arbiter is None or core is None:
            return 0.0
        return round(self.arbiter.paused_s.get(id(core), 0.0), 3)

    @staticmethod
    def queue_depth(w: Worker) -> dict[str, Any]:
        """Requests waiting and running on a model; on a remote, its own queue (None where it
        does not tell) and the requests in flight there."""
        if w.remote:
            return {"waiting": w.rt.remote_waiting, "running": w.leases}
        core = w.rt.core
        if core is None or w.rt.state != "ready":
            return {"waiting": 0, "running": 0}
        with core.lock:
            q = core.queue_state()
        return {"waiting": sum(q["waiting"].values()), "running": sum(q["running"].values()),
                "eta_s": q.get("eta_s"), "waiting_requests": q.get("waiting_requests", [])}

    # -- lifecycle -----------------------------------------------------------------------------
    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        for w in self.workers.values():
            w.rt.on_settled = lambda w=w: self._from_thread(self._settled, w)
        for name in self.start_models:
            w = self.workers[name]
            if w.rt.engine is None and w.rt.state in ("loading", "unloaded"):
                self._begin_load(w, [])
        await asyncio.to_thread(self._estimate_all)
        self._check_remotes()
        self._sweeper = asyncio.create_task(self._sweep(), name="hearth-keep-alive")

    async def stop(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            await asyncio.gather(self._sweeper, return_exceptions=True)
        # An unload under way must end before close() frees what it frees.
        await asyncio.gather(*(t for w in self.workers.values() for t in list(w.tasks)),
                             return_exceptions=True)
        for w in self.workers.values():
            if w.remote:
                await w.rt.close()

    def close(self) -> None:
        """Blocking: every engine stopped, prefixes saved, contexts freed."""
        for w in self.workers.values():
            if not w.remote:
                w.rt.close()

    def _estimate_all(self) -> None:
        for w in self.workers.values():
            if not w.remote:
                w.bytes = self._estimate(w)

    def _check_remotes(self) -> None:
        now = time.monotonic()
        for w in self.workers.values():
            if w.remote:
                w.rt.check_soon(now)

    def _estimate(self, w: Worker) -> int:
        s = w.rt.settings
        try:
            path = resolve(s.model, s.models_dir, download=False)
        except ModelNotFound:
            return w.bytes  # not downloaded yet: estimated once it is loaded
        w.path = path
        try:
            w.meta = read_metadata(path)
            n = shape_of(path, w.meta).resident_bytes(s.n_ctx)
        except (GGUFError, OSError):
            n = path.stat().st_size
        for extra in (s.embedding_model, s.draft_model):
            if extra:
                with contextlib.suppress(ModelNotFound, OSError):
                    n += resolve(extra, s.models_dir, download=False).stat().st_size
        return n

    async def _estimate_later(self, w: Worker) -> None:
        w.bytes = await asyncio.to_thread(self._estimate, w)

    def _from_thread(self, fn: Any, *args: Any) -> None:
        loop = self._loop
        if loop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(fn, *args)

    def _wake(self) -> None:
        """Everyone waiting for a change looks again."""
        self._changed.set()
        self._changed = asyncio.Event()

    def _spawn(self, w: Worker, coro: Any) -> None:
        task = asyncio.create_task(coro)
        w.tasks.add(task)
        task.add_done_callback(w.tasks.discard)

    def _begin_load(self, w: Worker, victims: list[Worker]) -> None:
        w.rt.state, w.rt.error = "loading", None  # resident from now: the policy counts it
        w.last_used = time.monotonic()  # its keep-alive counts from here, not a past use
        for v in victims:
            v.rt.state = "unloading"
        self._spawn(w, self._load_after(w, victims))

    async def _load_after(self, w: Worker, victims: list[Worker]) -> None:
        for v in victims:
            await self._unload(v)
        log.info("loading model %s", w.name)
        w.loads += 1
        w.rt.load_turn = turn_for(self, w)  # yields to the other models' voice and chat
        w.rt.start_loading()  # its thread calls _settled when it ends

    def _settled(self, w: Worker) -> None:
        if w.first_load is None:
            w.first_load = "ready" if w.rt.state == "ready" else "failed"
        if w.rt.state == "ready":
            if not w.bytes:  # downloaded by this load: its header can be read now
                self._spawn(w, self._estimate_later(w))
            w.last_used = time.monotonic()
            log.info("model %s loaded in %.1f s", w.name, w.rt.load_s or 0.0)
        self._wake()

    async def _unload(self, w: Worker) -> None:
        w.rt.state = "unloading"
        # Counted as it starts, as a load is: the runtime reports "unloaded" from its thread,
        # and /v1/queue must never show that state with the unload not yet counted.
        w.unloads += 1
        t0 = time.monotonic()
        await asyncio.to_thread(w.rt.unload)
        if w.rt.state == "failed":  # a stuck engine: its context is kept, never reloaded
            w.unloads -= 1
            log.error("model %s could not be unloaded: %s", w.name, w.rt.error)
            self._wake()
            return
        w.keep_alive_s = None
        log.info("model %s unloaded in %.1f s", w.name, time.monotonic() - t0)
        self._wake()

    async def _sweep(self) -> None:
        """Unload idle models past their keep-alive."""
        while True:
            await asyncio.sleep(SWEEP_S)
            self._check_remotes()
            now = time.monotonic()
            views = [w.view() for w in self.workers.values()]
            for name in self.policy.expired(views, now):
                w = self.workers[name]
                if w.rt.state == "ready" and not w.leases:
                    log.info("model %s idle past its keep-alive", name)
                    w.rt.state = "unloading"
                    self._spawn(w, self._unload(w))

    # -- requests ------------------------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def use(self, name: str, rank: int, keep_alive_s: float | None = None
                  ) -> AsyncIterator[Runtime]:
        """The model, loaded and leased for the duration (it is not unloaded under it); for a
        remote worker that is unreachable or saturated, its fallback."""
        w = await self._choose(self.workers[name])
        await self._acquire(w, rank)
        try:
            yield w.rt
        finally:
            w.leases -= 1
            w.last_used = time.monotonic()
            if rank <= INTERACTIVE_RANK:
                w.interactive_at = w.last_used
            if keep_alive_s is not None:
                w.keep_alive_s = keep_alive_s
            self._wake()  # a request waiting for room may find it now

    def _available(self, w: Worker) -> bool:
        return not w.remote or (w.rt.state == "ready" and not w.rt.saturated(w.leases))

    async def _choose(self, w: Worker) -> Worker:
        """``w``, or the first of its fallbacks that can take a request now; waits (within
        ``load_wait_s``) while none can."""
        deadline = time.monotonic() + self.settings.load_wait_s
        while True:
            target = w
            while not self._available(target) and target.entry.spec.fallback:
                target = self.workers[target.entry.spec.fallback]
            if self._available(target):
                return target
            if not await self._await_change(deadline):
                why = target.rt.error or ("saturated" if target.rt.state == "ready"
                                          else "not checked yet")
                raise CompletionError(503, f"worker {target.name!r} cannot take the request "
                                      f"({why}); try again shortly", "model_not_ready",
                                      retry_after=5)

    async def _await_change(self, deadline: float) -> bool:
        """Wait for a load, unload or finished request, a second at most: a grace, a
        keep-alive or a remote's cool-down running out changes the answer without an event.
        False once ``deadline`` has passed."""
        changed, left = self._changed, deadline - time.monotonic()
        if left <= 0:
            return False
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(changed.wait(), min(left, SWEEP_S))
        return True

    async def _acquire(self, w: Worker, rank: int) -> None:
        if w.remote:
            w.leases += 1
            return
        w.waiting_ranks.append(rank)  # busy for the policy while it waits: not a victim
        try:
            await self._wait_loaded(w, rank)
        finally:
            w.waiting_ranks.remove(rank)
        w.leases += 1
        w.last_used = time.monotonic()

    async def _wait_loaded(self, w: Worker, rank: int) -> None:
        deadline = time.monotonic() + self.settings.load_wait_s
        while True:
            st = w.rt.state
            if st == "ready":
                return
            if st == "failed" and (w.rt.engine is not None or time.monotonic() -
                                   (w.rt.failed_at or 0.0) < RETRY_FAILED_S):
                # Failed to load (tried again after a while), or an engine that would not
                # stop: its context is still held, so it is never loaded over.
                raise CompletionError(503, f"model {w.name!r} failed: {w.rt.error}",
                                      "model_failed", retry_after=RETRY_FAILED_S)
            if st in ("unloaded", "failed"):
                plan = self._plan(w, rank)
                if plan.error:
                    raise CompletionError(503, plan.error, "model_too_large")
                if plan.load:
                    self._begin_load(w, [self.workers[v] for v in plan.unload])
                    continue
            if not await self._await_change(deadline):
                why = "waiting for memory" if st in ("unloaded", "failed") else st
                raise CompletionError(503, f"model {w.name!r} is {why}; try again shortly",
                                      "model_not_ready", retry_after=5)

    def expire(self, name: str) -> None:
        """Ollama's ``keep_alive: 0`` on an empty request: unloaded once idle, not loaded."""
        self.workers[name].keep_alive_s = 0.0

    def _plan(self, w: Worker, rank: int) -> Plan:
        views = [x.view() for x in self.workers.values()]
        return self.policy.plan(views, w.name, rank, time.monotonic())
