"""Host cost per engine iteration against the queue's length, on the simulated backend: the
Python time one ``EngineCore.step`` spends outside the backend's calls, with 8 streams running
and 0, 60 or 250 requests waiting (``full slots``: the streams never end; ``churn``: short
turns end and are replaced, the queue kept as long). Part of ``bench/engine_bench.py --only
host``; run alone with ``--profile`` for where the time goes (cProfile, 250 waiting).
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))


def host_cost(waiting: int, churn: bool, iters: int = 600) -> dict:
    from sim_backend import SimBackend, make_core, request

    b = SimBackend(n_ctx=16384, n_seq_max=16)
    core, _ = make_core("hearth", n_parallel=8, backend=b, max_queue=1000)
    systems = [[9000 + 1000 * k + i for i in range(300)] for k in range(6)]
    classes, seq = ("chat", "agent", "background"), iter(range(10**9))

    def add(cls: str, max_tokens: int) -> None:
        j = next(seq)
        r, _ = request(b, cls, 40, max_tokens, user=f"m{j % 4}", seed=j,
                       prefix=systems[j % 6] if churn or j % 2 else None)
        core.submit(r)

    for _ in range(8):
        add("chat", 20 if churn else 10**6)
    while not churn and (len(core.running) < 8 or not all(r.n_generated for r in core.running)):
        core.step()
    for i in range(waiting):
        add(classes[i % 3], 20)
    spent = [0.0]
    def timing(f):
        def timed(*a):
            t = time.perf_counter()
            try:
                return f(*a)
            finally:
                spent[0] += time.perf_counter() - t
        return timed

    for name in ("decode_sample", "new_sampler", "seq_rm", "seq_cp", "seq_pos_max", "now"):
        setattr(b, name, timing(getattr(b, name)))
    host = []
    for _ in range(iters):
        while churn and len(core.waiting) + len(core._inbox) < waiting + 8 - len(core.running):
            add(classes[next(seq) % 3], 20)  # the queue stays as long
        spent[0] = 0.0
        t = time.perf_counter()
        core.step()
        host.append(1000 * (time.perf_counter() - t - spent[0]))
    host.sort()
    return {"waiting": waiting, "churn": churn, "iterations": iters,
            "median_ms": statistics.median(host), "mean_ms": statistics.mean(host),
            "p95_ms": host[int(0.95 * iters)], "max_ms": host[-1]}


def host_rows() -> list[dict]:
    return [host_cost(n, churn) for churn in (False, True) for n in (0, 60, 250)]


def host_table(rows: list[dict]) -> list[str]:
    out = ["| workload | waiting | median | mean | p95 | max |", "|---|---|---|---|---|---|"]
    out += [f"| {'churn' if x['churn'] else 'full slots'} | {x['waiting']} | "
            f"{x['median_ms']:.3f} ms | {x['mean_ms']:.3f} ms | {x['p95_ms']:.3f} ms | "
            f"{x['max_ms']:.2f} ms |" for x in rows]
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--profile", action="store_true", help="cProfile the churn at 250 waiting")
    args = ap.parse_args()
    if args.profile:
        prof = cProfile.Profile()
        prof.runcall(host_cost, 250, True)
        pstats.Stats(prof).sort_stats("cumulative").print_stats(40)
        return 0
    print("\n".join(host_table(host_rows())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
