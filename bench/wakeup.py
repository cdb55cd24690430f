"""What one hand-off between two processes, or two threads, costs on this machine, without
llama.cpp: the floor under the process boundary's cost (bench/boundary.py, issue 26).

Two processes joined by a socket pair, as the server and a model's worker are, send a
decode-sized message back and forth. The answering side holds each message for 10 ms (busy,
as a decode keeps its CPU, or asleep), and the asking side is busy 0.3 ms between answers (the
engine's work between two decodes). Each leg is timed on the shared monotonic clock from
just before the send to just after the receive returns. The same is then measured between two
threads of one process over pipes.

Usage: python bench/wakeup.py [--rounds 300] [--out bench/results]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import threading
import time
from datetime import datetime
from multiprocessing.connection import Connection
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MESSAGE = ([], "decode_sample", ([1], [0], [0], [True], [(1, 0)]))


def hold(seconds: float, busy: bool) -> None:
    if busy:
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            pass
    else:
        time.sleep(seconds)


def answerer(conn: Connection, busy: bool) -> None:
    while (msg := conn.recv()) is not None:
        got = time.monotonic()
        hold(0.010, busy)
        conn.send((got, time.monotonic(), msg))


def legs(conn: Connection, rounds: int) -> dict:
    ask, answer = [], []
    for _ in range(rounds):
        t0 = time.monotonic()
        conn.send(MESSAGE)
        got, sent, _ = conn.recv()
        answer.append(1e6 * (time.monotonic() - sent))
        ask.append(1e6 * (got - t0))
        hold(0.0003, True)
    conn.send(None)
    return {"request_leg_us_p50": round(statistics.median(ask)),
            "reply_leg_us_p50": round(statistics.median(answer))}


def processes(busy: bool, rounds: int) -> dict:
    ours, theirs = socket.socketpair()
    pid = os.fork()
    if pid == 0:
        ours.close()
        answerer(Connection(theirs.detach()), busy)
        os._exit(0)
    theirs.close()
    row = legs(Connection(ours.detach()), rounds)
    os.waitpid(pid, 0)
    return row


def threads(rounds: int) -> dict:
    # Connection over a socket pair works between threads too; the answerer sleeps (a busy
    # Python thread would hold the interpreter's lock, which is not what is measured).
    ours, theirs = socket.socketpair()
    a, b = Connection(ours.detach()), Connection(theirs.detach())
    t = threading.Thread(target=answerer, args=(b, False), daemon=True)
    t.start()
    row = legs(a, rounds)
    t.join()
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=300)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    args = ap.parse_args()
    rows = [{"between": "two processes, answerer busy", **processes(True, args.rounds)},
            {"between": "two processes, answerer asleep", **processes(False, args.rounds)},
            {"between": "two threads, answerer asleep", **threads(args.rounds)}]
    for row in rows:
        print(json.dumps(row))
    out = Path(args.out) / f"wakeup-{datetime.now():%Y%m%d-%H%M%S}"
    out.mkdir(parents=True, exist_ok=True)
    (out / "wakeup.json").write_text(json.dumps(rows, indent=2) + "\n")
    print(f"written to {out}")


if __name__ == "__main__":
    main()
