"""Durable background jobs: a SQLite store (WAL) and the runner that feeds jobs to the engine.

A job is a chat-completion or embeddings body with a class (default ``background``) and an
optional caller tag. It runs as its member (its key's name, pinned when it was submitted, or its
body's ``user``), and its voice counts against that member's ``voice_per_member`` share beside
the member's requests on every other route: past it a voice job runs as chat, so a member's
flood of voice jobs holds no more voice than a flood of requests would. Every state change is
written together with an event row in one transaction, so ``/v1/events`` can be resumed from
any event id. A job found ``running`` at start (the process died under it) is queued again; a
finished job's result is written once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from ..chat.api_models import ChatCompletionRequest, EmbeddingRequest
from ..chat.completions import CompletionError, check_limits
from ..policy.scheduler import RANK_NAMES, class_rank
from ..service.serving import completion, embeddings
from . import queue as job_queue
from .store import JobQuotaError, JobStore

if TYPE_CHECKING:  # the routes' (api) object, handed in: jobs sit below the routes
    from ..api.claims import VoiceShares

log = logging.getLogger(__name__)

MAX_LOST_RUNS = 3
# Errors after which a durable job waits its turn and runs again.
RETRIED = ("model_not_ready", "worker_down", "worker_unreachable", "worker_crashed",
           "worker_restarting")


class JobRunner:
    """Feeds queued jobs to the engine, a bounded number at a time (the engine's own queue
    decides the order among classes), and records their outcome."""

    def __init__(self, store: JobStore, fleet: Any, shares: VoiceShares, concurrency: int = 8,
                 retention_s: float = 86400.0):
        self.store = store
        self.fleet = fleet
        self.shares = shares  # the routes' own: a member's voice share counts jobs too
        self.concurrency = concurrency
        self.retention_s = retention_s
        self.changed = asyncio.Condition()  # notified on every state change (for /v1/events)
        self._wake = asyncio.Event()
        self._tasks: dict[str, tuple[asyncio.Task, Any]] = {}  # a job and its completion
        self._loop_task: asyncio.Task | None = None
        self._stopping = False
        # Finished jobs go while the server runs, not only at start: a few sweeps per
        # retention period, at least one a minute.
        self.sweep_s = min(60.0, max(0.5, retention_s / 4))
        self._swept = time.monotonic()

    async def start(self) -> None:
        n = await asyncio.to_thread(self.store.requeue_running)
        if n:
            log.info("requeued %d job(s) that were running when the server stopped", n)
        await asyncio.to_thread(self.store.purge, self.retention_s)
        self._loop_task = asyncio.create_task(self._loop(), name="hearth-jobs")

    async def stop(self) -> None:
        """Graceful shutdown: running jobs are cancelled in the engine and queued again."""
        self._stopping = True
        if self._loop_task:
            self._loop_task.cancel()
        for job_id, (task, comp) in list(self._tasks.items()):
            if comp is not None:
                comp.cancel()
            task.cancel()
            await asyncio.to_thread(self.store.requeue, job_id)
        await asyncio.gather(*(t for t, _ in self._tasks.values()), return_exceptions=True)

    async def notify(self) -> None:
        async with self.changed:
            self.changed.notify_all()

    async def submit(self, kind: str, cls: str, tag: str | None, request: dict[str, Any]
                     ) -> dict[str, Any]:
        try:
            job = await asyncio.to_thread(self.store.create, kind, cls, tag, request)
        except JobQuotaError as e:
            raise CompletionError(e.status, e.message, e.code, None, e.retry_after) from e
        self._wake.set()
        await self.notify()
        return job

    async def cancel(self, job_id: str) -> dict[str, Any] | None:
        job = await asyncio.to_thread(self.store.cancel, job_id)
        if job is not None:
            running = self._tasks.get(job_id)
            if running and running[1] is not None:
                running[1].cancel()
            elif running:  # its completion is still being built (off the loop): never submit it
                running[0].cancel()
            await self.notify()
        return job

    async def _loop(self) -> None:
        while not self._stopping:
            try:
                free = self.concurrency - len(self._tasks)
                if free > 0 and self.fleet.state == "ready":
                    for job in await asyncio.to_thread(self.store.next_queued, free):
                        if job["id"] in self._tasks:
                            continue
                        started = await asyncio.to_thread(self.store.start, job["id"])
                        if started is None:
                            continue
                        await self.notify()
                        task = asyncio.create_task(self._run(job))
                        self._tasks[job["id"]] = (task, None)
                if time.monotonic() - self._swept >= self.sweep_s:
                    self._swept = time.monotonic()
                    if n := await asyncio.to_thread(self.store.purge, self.retention_s):
                        log.info("removed %d finished job(s) past their retention", n)
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), timeout=min(1.0, self.sweep_s))
            except asyncio.CancelledError:
                raise
            except Exception:  # keep the runner alive whatever one round hits
                log.exception("job runner round failed")
                await asyncio.sleep(1.0)

    async def _run(self, job: dict[str, Any]) -> None:
        job_id = job["id"]
        rank = class_rank(job["class"])
        lost = 0  # runs a remote worker failed
        try:
            while True:
                try:
                    result = await self._execute(job, rank)
                    break
                except CompletionError as e:
                    # The class queue is full, or the model is loading or waiting for room:
                    # a durable job waits its turn. A remote worker that went away mid-run:
                    # the next try goes to its fallback, a few times at most (a request that
                    # fails a worker every time is the request's fault). Its result lands once.
                    # A local worker that crashed under it: again once it is back, until
                    # the quarantine refuses it (worker_crashed_twice fails the job).
                    lost += e.code in ("worker_unreachable", "worker_down")
                    if (e.status != 429 and e.code not in RETRIED) or lost > MAX_LOST_RUNS:
                        raise
                    await asyncio.sleep(e.retry_after or 1.0)
            done = await asyncio.to_thread(self.store.finish, job_id, result)
            if done is None:
                log.info("job %s finished after it was cancelled; result dropped", job_id)
        except CompletionError as e:
            await asyncio.to_thread(self.store.fail, job_id, e.message)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            log.exception("job %s failed", job_id)
            await asyncio.to_thread(self.store.fail, job_id, f"internal error: {e}")
        finally:
            self._tasks.pop(job_id, None)
            self._wake.set()
            if not self._stopping:
                await self.notify()

    def model_for(self, request: dict[str, Any], cls: str) -> str:
        """The model a job runs on: the one its request names, else its class's."""
        try:
            model, _ = self.fleet.registry.route(request.get("model"))
        except KeyError as e:
            raise CompletionError(404, f"request.model: no model {request.get('model')!r} "
                                  "is served here", "model_not_found", "request.model") from e
        return model or self.fleet.registry.for_class(cls)

    async def _execute(self, job: dict[str, Any], rank: int) -> dict[str, Any]:
        req = job["request"]
        user = req.get("user") or None
        # Held while this try runs (not while a retried job waits): past its member's share
        # a voice job runs as chat, on the chat class's model as a request would.
        with self.shares.hold(user, rank) as rank:
            async with self.fleet.use(self.model_for(req, RANK_NAMES[rank]), rank) as rt:
                if job["kind"] == "embeddings":
                    body = EmbeddingRequest.model_validate(req)
                    return await embeddings(rt, body.input, rank, user)
                body = ChatCompletionRequest.model_validate({**req, "stream": False})
                comp = await completion(rt, body, rank, user)
                self._tasks[job["id"]] = (self._tasks[job["id"]][0], comp)
                if hasattr(comp, "request"):
                    comp.request.meta["job"] = True  # a job queues, never shed (deadlines)
                comp.submit()
                watcher = asyncio.create_task(job_queue.watch(self.store, job["id"], comp,
                                                              self.notify))
                try:
                    return await comp.result()
                finally:
                    watcher.cancel()
                    comp.cancel()


def validate_job_request(kind: str, request: Any) -> None:
    """Raise CompletionError(400) if the job's body would never run."""
    model = EmbeddingRequest if kind == "embeddings" else ChatCompletionRequest
    try:
        body = model.model_validate(request)
    except ValidationError as e:
        err = e.errors()[0]
        loc = "request." + ".".join(str(p) for p in err["loc"])
        raise CompletionError(400, f"{loc}: {err['msg']}", "invalid_value", loc) from e
    if isinstance(body, ChatCompletionRequest):
        try:  # now, not when it runs: a schema past the limits never will
            check_limits(body)
        except CompletionError as e:
            e.param = f"request.{e.param}"
            e.message = f"request.{e.message}"
            raise
