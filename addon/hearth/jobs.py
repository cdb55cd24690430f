"""Durable background jobs: a SQLite store (WAL) and the runner that feeds jobs to the engine.

A job is a chat-completion or embeddings body with a class (default ``background``) and an
optional caller tag. Every state change is written together with an event row in one
transaction, so ``/v1/events`` can be resumed from any event id. A job found ``running`` at start
(the process died under it) is queued again; a finished job's result is written once.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import sqlite3
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from .api_models import ChatCompletionRequest, EmbeddingRequest
from .completions import CompletionError, check_limits
from .scheduler import class_rank
from .serving import completion, embeddings

log = logging.getLogger(__name__)

STATUSES = ("queued", "running", "done", "failed", "cancelled")
FINAL = ("done", "failed", "cancelled")

SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY,
    kind TEXT NOT NULL,
    class TEXT NOT NULL,
    tag TEXT,
    status TEXT NOT NULL,
    request TEXT NOT NULL,
    result TEXT,
    error TEXT,
    attempts INTEGER NOT NULL DEFAULT 0,
    created_at REAL NOT NULL,
    started_at REAL,
    finished_at REAL
);
CREATE INDEX IF NOT EXISTS jobs_status ON jobs (status, created_at);
CREATE TABLE IF NOT EXISTS events (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    job_id TEXT NOT NULL,
    at REAL NOT NULL,
    payload TEXT NOT NULL
);
"""


class JobStore:
    """Synchronous SQLite access; the runner calls it from a worker thread."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self._db.row_factory = sqlite3.Row
        self._lock = threading.Lock()
        with self._lock:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")  # a job acknowledged is a job kept
            self._db.executescript(SCHEMA)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    @staticmethod
    def _job(row: sqlite3.Row, with_request: bool = False) -> dict[str, Any]:
        job = {
            "id": row["id"], "object": "job", "kind": row["kind"], "class": row["class"],
            "tag": row["tag"], "status": row["status"], "created_at": row["created_at"],
            "started_at": row["started_at"], "finished_at": row["finished_at"],
            "attempts": row["attempts"],
            "result": json.loads(row["result"]) if row["result"] else None,
            "error": row["error"],
        }
        if with_request:
            job["request"] = json.loads(row["request"])
        return job

    def _event(self, job_id: str) -> dict[str, Any]:
        row = self._db.execute("SELECT * FROM jobs WHERE id=?", (job_id,)).fetchone()
        job = self._job(row)
        cur = self._db.execute("INSERT INTO events (job_id, at, payload) VALUES (?, ?, ?)",
                               (job_id, time.time(), json.dumps({"type": "job", "job": job})))
        return {"seq": cur.lastrowid, **job}

    def create(self, kind: str, cls: str, tag: str | None, request: dict[str, Any]
               ) -> dict[str, Any]:
        job_id = "job_" + uuid.uuid4().hex[:24]
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            self._db.execute(
                "INSERT INTO jobs (id, kind, class, tag, status, request, created_at) "
                "VALUES (?, ?, ?, ?, 'queued', ?, ?)",
                (job_id, kind, cls, tag, json.dumps(request), time.time()))
            ev = self._event(job_id)
            self._db.execute("COMMIT")
        return ev

    def get(self, job_id: str, with_request: bool = False) -> dict[str, Any] | None:
        with self._lock:
            row = self._db.execute("SELECT * FROM jobs WHERE id=?", (job_id,)).fetchone()
        return self._job(row, with_request) if row else None

    def list(self, status: str | None = None, limit: int = 100) -> list[dict[str, Any]]:
        with self._lock:
            if status:
                rows = self._db.execute("SELECT * FROM jobs WHERE status=? ORDER BY created_at "
                                        "DESC LIMIT ?", (status, limit)).fetchall()
            else:
                rows = self._db.execute("SELECT * FROM jobs ORDER BY created_at DESC LIMIT ?",
                                        (limit,)).fetchall()
        return [self._job(r) for r in rows]

    def next_queued(self, limit: int) -> list[dict[str, Any]]:
        with self._lock:
            rows = self._db.execute("SELECT * FROM jobs WHERE status='queued' ORDER BY "
                                    "created_at LIMIT ?", (limit,)).fetchall()
        return [self._job(r, with_request=True) for r in rows]

    def _transition(self, job_id: str, to: str, frm: tuple[str, ...], **fields: Any
                    ) -> dict[str, Any] | None:
        """Move a job between states atomically, with its event; None if it was not in
        ``frm`` (e.g. cancelled meanwhile) — this is what makes a result land exactly once."""
        sets = ", ".join(f"{k}=?" for k in fields)
        marks = ",".join("?" * len(frm))
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            cur = self._db.execute(
                f"UPDATE jobs SET status=?{', ' + sets if sets else ''} "
                f"WHERE id=? AND status IN ({marks})",
                (to, *fields.values(), job_id, *frm))
            if cur.rowcount != 1:
                self._db.execute("ROLLBACK")
                return None
            ev = self._event(job_id)
            self._db.execute("COMMIT")
        return ev

    def start(self, job_id: str) -> dict[str, Any] | None:
        with self._lock:
            self._db.execute("UPDATE jobs SET attempts=attempts+1 WHERE id=?", (job_id,))
        return self._transition(job_id, "running", ("queued",), started_at=time.time())

    def finish(self, job_id: str, result: dict[str, Any]) -> dict[str, Any] | None:
        return self._transition(job_id, "done", ("running",), result=json.dumps(result),
                                finished_at=time.time())

    def fail(self, job_id: str, error: str) -> dict[str, Any] | None:
        return self._transition(job_id, "failed", ("running", "queued"), error=error,
                                finished_at=time.time())

    def cancel(self, job_id: str) -> dict[str, Any] | None:
        return self._transition(job_id, "cancelled", ("queued", "running"),
                                finished_at=time.time())

    def requeue(self, job_id: str) -> dict[str, Any] | None:
        return self._transition(job_id, "queued", ("running",), started_at=None)

    def requeue_running(self) -> int:
        with self._lock:
            ids = [r["id"] for r in self._db.execute(
                "SELECT id FROM jobs WHERE status='running'").fetchall()]
        for job_id in ids:
            self.requeue(job_id)
        return len(ids)

    def events_after(self, seq: int, limit: int = 500) -> list[tuple[int, str]]:
        with self._lock:
            rows = self._db.execute("SELECT seq, payload FROM events WHERE seq>? ORDER BY seq "
                                    "LIMIT ?", (seq, limit)).fetchall()
        return [(r["seq"], r["payload"]) for r in rows]

    def last_event(self) -> int:
        with self._lock:
            row = self._db.execute("SELECT MAX(seq) AS s FROM events").fetchone()
        return row["s"] or 0

    def counts(self) -> dict[str, int]:
        with self._lock:
            rows = self._db.execute("SELECT status, COUNT(*) AS n FROM jobs GROUP BY status")
            got = {r["status"]: r["n"] for r in rows}
        return {s: got.get(s, 0) for s in STATUSES}

    def purge(self, older_than_s: float) -> int:
        edge = time.time() - older_than_s
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            n = self._db.execute("DELETE FROM jobs WHERE status IN ('done','failed','cancelled') "
                                 "AND finished_at < ?", (edge,)).rowcount
            self._db.execute("DELETE FROM events WHERE at < ?", (edge,))
            self._db.execute("COMMIT")
        return n

    def integrity_check(self) -> str:
        with self._lock:
            return self._db.execute("PRAGMA integrity_check").fetchone()[0]


MAX_LOST_RUNS = 3
# Errors after which a durable job waits its turn and runs again.
RETRIED = ("model_not_ready", "worker_down", "worker_unreachable", "worker_crashed",
           "worker_restarting")


class JobRunner:
    """Feeds queued jobs to the engine, a bounded number at a time (the engine's own queue
    decides the order among classes), and records their outcome."""

    def __init__(self, store: JobStore, fleet: Any, concurrency: int = 8,
                 retention_s: float = 86400.0):
        self.store = store
        self.fleet = fleet
        self.concurrency = concurrency
        self.retention_s = retention_s
        self.changed = asyncio.Condition()  # notified on every state change (for /v1/events)
        self._wake = asyncio.Event()
        self._tasks: dict[str, tuple[asyncio.Task, Any]] = {}  # a job and its completion
        self._loop_task: asyncio.Task | None = None
        self._stopping = False

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
        job = await asyncio.to_thread(self.store.create, kind, cls, tag, request)
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
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), timeout=1.0)
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
        async with self.fleet.use(self.model_for(req, job["class"]), rank) as rt:
            if job["kind"] == "embeddings":
                body = EmbeddingRequest.model_validate(req)
                return await embeddings(rt, body.input, rank, body.user)
            body = ChatCompletionRequest.model_validate({**req, "stream": False})
            comp = await completion(rt, body, rank)
            self._tasks[job["id"]] = (self._tasks[job["id"]][0], comp)
            comp.submit()
            try:
                return await comp.result()
            finally:
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
