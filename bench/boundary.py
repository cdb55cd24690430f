"""What the process boundary costs (issue 26): llama.cpp runs in a worker process, and each
engine iteration is one round trip to it. The server measures, on every iteration served, the
time the engine waited for its decode less the time the worker spent decoding and sampling
(`worker.boundary` in /v1/queue); this runs a fixed workload and reads it per phase:

- one stream of 200 tokens (the shortest iterations, so the largest share), three times;
- 8 concurrent streams of 150 tokens;
- 8 streams beside a 1,500-token background prompt (prefill chunks in the iterations).

Usage: python bench/boundary.py [--model PATH] [--out bench/results]
       (the environment's OMP_* and HEARTH_* variables reach the server and its worker)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from hearth_server import HearthServer  # noqa: E402


def chat(srv: HearthServer, content: str, tokens: int, cls: str = "chat") -> dict:
    status, out = srv.post("/v1/chat/completions", {
        "messages": [{"role": "user", "content": content}], "max_tokens": tokens,
        "ignore_eos": True, "priority": cls}, timeout=600)
    assert status == 200, out
    return out["hearth"]


def boundary(srv: HearthServer) -> dict:
    return srv.get("/v1/queue")[1]["worker"]["boundary"]


def phase(srv: HearthServer, name: str, run) -> dict:
    b0 = boundary(srv)
    timings = run()
    b1 = boundary(srv)
    n = b1["iterations"] - b0["iterations"]
    over = 1e6 * (b1["overhead_s"] - b0["overhead_s"])  # µs
    waited = 1e6 * (b1["seconds"] - b0["seconds"])
    itl = [x for t in timings for x in t["itl_ms"]]
    row = {"phase": name, "iterations": n, "overhead_us_per_iteration": round(over / n, 1),
           "iteration_ms": round(waited / n / 1000, 2),
           "share": round(over / waited, 4) if waited else None,
           "itl_p50_ms": round(statistics.median(itl), 2)}
    print(json.dumps(row))
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    args = ap.parse_args()
    extra = ("--model", args.model) if args.model else ()
    with tempfile.TemporaryDirectory() as tmp, \
            HearthServer(*extra, data_dir=Path(tmp)) as srv:
        chat(srv, "Warm up.", 16)
        rows = [phase(srv, "1 stream", lambda: [chat(srv, f"Story {i}.", 200)
                                                for i in range(3)])]

        def streams(background: bool):
            with ThreadPoolExecutor(9) as pool:
                jobs = [pool.submit(chat, srv, f"Tale {i}.", 150) for i in range(8)]
                if background:
                    long = "Summarise: " + "the household's energy report, " * 250
                    pool.submit(chat, srv, long, 16, "background")
                return [j.result() for j in jobs]

        rows.append(phase(srv, "8 streams", lambda: streams(False)))
        rows.append(phase(srv, "8 streams + a long prompt", lambda: streams(True)))
    out = Path(args.out) / f"boundary-{datetime.now():%Y%m%d-%H%M%S}"
    out.mkdir(parents=True, exist_ok=True)
    (out / "boundary.json").write_text(json.dumps(rows, indent=2))
    print(f"written to {out}")


if __name__ == "__main__":
    main()
