"""The durable job store: SQLite (WAL), every state change written with an event row in one
transaction, so ``/v1/events`` can be resumed from any event id; a finished job's result is
written once. Bounded: queued jobs and stored bytes have caps (a flood must not fill Home
Assistant's data partition), and finished jobs go when their retention ends.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
import uuid
from pathlib import Path
from typing import Any

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


class JobQuotaError(Exception):
    """A job refused by a cap: ``status`` 413 (the job itself is too big) or 429 (the queue or
    the store is full, ``retry_after`` seconds)."""

    def __init__(self, status: int, message: str, code: str, retry_after: float | None = None):
        super().__init__(message)
        self.status, self.message, self.code, self.retry_after = status, message, code, \
            retry_after


class JobStore:
    """Synchronous SQLite access; the runner calls it from a worker thread.

    ``max_active``: most jobs queued or running; ``max_bytes``: most bytes of requests, results,
    errors and events stored; ``max_request_bytes``: most bytes of one job's request (0 = no
    cap). The stored bytes are counted as rows come and go, not scanned per job."""

    def __init__(self, path: str | Path, max_active: int = 0, max_bytes: int = 0,
                 max_request_bytes: int = 0):
        self.max_active, self.max_bytes = max_active, max_bytes
        self.max_request_bytes = max_request_bytes
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self._db.row_factory = sqlite3.Row
        self._lock = threading.Lock()
        with self._lock:
            # Pages freed by the retention sweep go back to the file system (a store made before
            # this setting is rebuilt once to take it), and the WAL is cut back after each
            # checkpoint: the store's size on disk follows its contents and its budget.
            if self._db.execute("PRAGMA auto_vacuum").fetchone()[0] != 2:
                self._db.execute("PRAGMA auto_vacuum=INCREMENTAL")
                self._db.execute("VACUUM")
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")  # a job acknowledged is a job kept
            self._db.execute("PRAGMA wal_autocheckpoint=256")
            self._db.execute("PRAGMA journal_size_limit=1048576")
            self._db.executescript(SCHEMA)
            self.bytes = self._db.execute(
                "SELECT COALESCE(SUM(LENGTH(request) + IFNULL(LENGTH(result), 0) + "
                "IFNULL(LENGTH(error), 0)), 0) FROM jobs").fetchone()[0]
            self.bytes += self._db.execute(
                "SELECT COALESCE(SUM(LENGTH(payload)), 0) FROM events").fetchone()[0]

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

    def _event(self, job_id: str, queue: dict[str, Any] | None = None) -> dict[str, Any]:
        row = self._db.execute("SELECT * FROM jobs WHERE id=?", (job_id,)).fetchone()
        job = self._job(row)
        job["queue"] = queue  # where it waits in its model's queue (progress), else null
        payload = json.dumps({"type": "job", "job": job})
        cur = self._db.execute("INSERT INTO events (job_id, at, payload) VALUES (?, ?, ?)",
                               (job_id, time.time(), payload))
        self.bytes += len(payload)
        return {"seq": cur.lastrowid, **job}

    def create(self, kind: str, cls: str, tag: str | None, request: dict[str, Any]
               ) -> dict[str, Any]:
        job_id = "job_" + uuid.uuid4().hex[:24]
        text = json.dumps(request)
        if self.max_request_bytes and len(text) > self.max_request_bytes:
            raise JobQuotaError(413, f"request: the job's request is {len(text):,} bytes; at "
                                f"most {self.max_request_bytes:,} are kept (job_request_max_kb)",
                                "job_too_large")
        with self._lock:
            self._check_room(len(text))
            self._db.execute("BEGIN IMMEDIATE")
            self._db.execute(
                "INSERT INTO jobs (id, kind, class, tag, status, request, created_at) "
                "VALUES (?, ?, ?, ?, 'queued', ?, ?)",
                (job_id, kind, cls, tag, text, time.time()))
            ev = self._event(job_id)
            self._db.execute("COMMIT")
            self.bytes += len(text)
        return ev

    def _check_room(self, size: int) -> None:
        if self.max_active:
            active = self._db.execute("SELECT COUNT(*) FROM jobs WHERE status IN "
                                      "('queued', 'running')").fetchone()[0]
            if active >= self.max_active:
                raise JobQuotaError(429, f"{active} jobs are queued or running, the most "
                                    "this server keeps (job_queue_max); try again later",
                                    "job_queue_full", retry_after=30)
        if self.max_bytes and self.bytes + size > self.max_bytes:
            raise JobQuotaError(429, f"the job store holds {self.bytes / 1e6:.1f} MB of its "
                                f"{self.max_bytes / 1e6:.0f} MB (job_store_max_mb) until "
                                "finished jobs expire (job_retention_hours)", "job_store_full",
                                retry_after=60)

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
            self.bytes += sum(len(v) for v in fields.values() if isinstance(v, str))
        return ev

    def progress(self, job_id: str, queue: dict[str, Any]) -> dict[str, Any] | None:
        """An event for a running job that waits in its model's queue: its place and ETA."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            row = self._db.execute("SELECT status FROM jobs WHERE id=?", (job_id,)).fetchone()
            if row is None or row["status"] != "running":
                self._db.execute("ROLLBACK")
                return None
            ev = self._event(job_id, queue)
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
        done = "status IN ('done','failed','cancelled') AND finished_at < ?"
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            freed = self._db.execute(
                "SELECT COALESCE(SUM(LENGTH(request) + IFNULL(LENGTH(result), 0) + "
                f"IFNULL(LENGTH(error), 0)), 0) FROM jobs WHERE {done}", (edge,)).fetchone()[0]
            freed += self._db.execute("SELECT COALESCE(SUM(LENGTH(payload)), 0) FROM events "
                                      "WHERE at < ?", (edge,)).fetchone()[0]
            n = self._db.execute(f"DELETE FROM jobs WHERE {done}", (edge,)).rowcount
            self._db.execute("DELETE FROM events WHERE at < ?", (edge,))
            self._db.execute("COMMIT")
            self._db.execute("PRAGMA incremental_vacuum").fetchall()  # one page per step
            self.bytes -= freed
        return n

    def integrity_check(self) -> str:
        with self._lock:
            return self._db.execute("PRAGMA integrity_check").fetchone()[0]
