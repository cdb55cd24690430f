"""Nothing lost: SIGKILL at random points while jobs run, and (``make soak``) long mixed load.

``HEARTH_KILL_ROUNDS`` (default 2; ``make soak`` uses 10) sets the kill rounds;
``HEARTH_SOAK_MINUTES`` (unset: skipped; ``make soak`` uses 20) runs the soak.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import sqlite3
import time
from pathlib import Path

import aiohttp
import pytest
from hearth_server import HearthServer

pytestmark = pytest.mark.model

ROUNDS = int(os.environ.get("HEARTH_KILL_ROUNDS", "2"))
SOAK_MINUTES = float(os.environ.get("HEARTH_SOAK_MINUTES", "0"))
RESULTS = Path(os.environ.get("HEARTH_SOAK_RESULTS", "/tmp/hearth-soak"))


def job_body(i: int) -> dict:
    return {"request": {"messages": [{"role": "user", "content": f"Summarise note {i}."}],
                        "max_tokens": 60 + 20 * (i % 4), "ignore_eos": True, "seed": i},
            "tag": f"t{i}"}


def test_random_kills_lose_no_job_and_finish_each_exactly_once(tmp_path):
    rng = random.Random(7)
    srv = HearthServer("--n-parallel", "3", data_dir=tmp_path).start()
    ids: list[str] = []
    try:
        for rnd in range(ROUNDS):
            for i in range(3):
                status, job = srv.post("/v1/jobs", job_body(rnd * 3 + i))
                assert status == 202
                ids.append(job["id"])
            time.sleep(rng.uniform(0.3, 2.5))  # somewhere in admission, prefill or decode
            srv.stop(signal.SIGKILL)
            srv.start()
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            _, listing = srv.get("/v1/jobs?limit=1000")
            states = {j["id"]: j["status"] for j in listing["data"]}
            if all(states.get(i) == "done" for i in ids):
                break
            time.sleep(0.5)
        assert all(states.get(i) == "done" for i in ids), states
    finally:
        srv.stop()
    db = sqlite3.connect(tmp_path / "jobs.sqlite3")
    assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    done = dict(db.execute("SELECT job_id, COUNT(*) FROM events WHERE payload LIKE "
                           "'%\"status\": \"done\"%' GROUP BY job_id").fetchall())
    assert done == dict.fromkeys(ids, 1)  # every job finished, exactly once
    results = db.execute("SELECT COUNT(*) FROM jobs WHERE status='done' AND result IS NOT NULL"
                         ).fetchone()[0]
    assert results == len(ids)
    assert db.execute("SELECT MAX(attempts) FROM jobs").fetchone()[0] >= 2  # kills did bite


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


async def _mixed_load(url: str, seconds: float, errors: list[str], counts: dict) -> None:
    rng = random.Random(1)
    system = "You are a home assistant. Devices: " + ", ".join(
        f"light.room_{i}" for i in range(120))
    end = time.monotonic() + seconds

    async def one(session: aiohttp.ClientSession, kind: str) -> None:
        if kind == "embedding":
            path, body = "/v1/embeddings", {"input": [f"text {rng.random()}"] * 8}
        elif kind == "job":
            path, body = "/v1/jobs", job_body(rng.randrange(1000))
        else:
            body = {"messages": [{"role": "system", "content": system},
                                 {"role": "user", "content": f"command {rng.random()}"}],
                    "max_tokens": {"voice": 16, "chat": 80, "background": 120}[kind],
                    "ignore_eos": True, "priority": kind, "stream": kind == "chat",
                    "user": rng.choice(["alice", "bob"])}
            path = "/v1/chat/completions"
        try:
            async with session.post(url + path, json=body) as r:
                await r.read()
                if r.status not in (200, 202, 429):
                    errors.append(f"{kind}: {r.status}")
                counts[kind] = counts.get(kind, 0) + 1
        except aiohttp.ClientError as e:
            errors.append(f"{kind}: {e!r}")

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
        tasks: set[asyncio.Task] = set()
        while time.monotonic() < end:
            kind = rng.choices(["voice", "chat", "background", "embedding", "job"],
                               [5, 3, 1, 1, 1])[0]
            t = asyncio.create_task(one(session, kind))
            tasks.add(t)
            t.add_done_callback(tasks.discard)
            await asyncio.sleep(rng.expovariate(1.5))
        await asyncio.gather(*tasks)


@pytest.mark.skipif(SOAK_MINUTES <= 0, reason="set HEARTH_SOAK_MINUTES (make soak)")
def test_soak_mixed_load(tmp_path):
    errors: list[str] = []
    counts: dict[str, int] = {}
    samples: list[tuple[float, int]] = []
    with HearthServer(data_dir=tmp_path) as srv:
        pid = srv.proc.pid
        _, idle = srv.get("/v1/queue")
        asyncio.run(_mixed_load(srv.url, 60, errors, counts))  # warm-up minute
        base = rss_kib(pid)
        t0 = time.monotonic()

        async def sample() -> None:
            while time.monotonic() - t0 < SOAK_MINUTES * 60:
                samples.append((time.monotonic() - t0, rss_kib(pid)))
                await asyncio.sleep(10)

        async def main() -> None:
            await asyncio.gather(_mixed_load(srv.url, SOAK_MINUTES * 60, errors, counts),
                                 sample())

        asyncio.run(main())
        end = rss_kib(pid)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            _, q = srv.get("/v1/queue")
            if sum(q["running"].values()) == 0 and q["jobs"]["queued"] == 0 and \
                    q["jobs"]["running"] == 0 and q["kv"]["used_by_running"] == 0:
                break
            time.sleep(1)
    report = {"minutes": SOAK_MINUTES, "requests": counts, "errors": errors[:50],
              "rss_kib_after_warmup": base, "rss_kib_end": end,
              "rss_growth": (end - base) / base, "rss_samples": samples,
              "idle_kv_used_by_running": idle["kv"]["used_by_running"],
              "final_kv_used_by_running": q["kv"]["used_by_running"],
              "final_running": sum(q["running"].values()),
              "kv_use_end": q["kv"]["use"], "preemptions": q["preemptions"]}
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "soak.json").write_text(json.dumps(report, indent=2))
    print(json.dumps({k: v for k, v in report.items() if k != "rss_samples"}, indent=2))
    assert not errors
    assert report["rss_growth"] < 0.10
    assert report["final_running"] == 0 and report["final_kv_used_by_running"] == 0
