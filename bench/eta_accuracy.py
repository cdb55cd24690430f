"""How good is the expected time to first token a request is told? (issue 45)

Sends a household mix (voice turns, typed chats, background summaries; staggered arrivals,
prompts and answers of several lengths; a fixed seed) to a Hearth server and compares each
answer's ETA predicted when it arrived (``hearth.eta_ms``, engine.queue_eta) with its real time
to first token (``hearth.ttft_ms``): the median and 90th percentile relative error, overall
and by class, and the same for the requests that had to wait (queue > 0).

Usage: python bench/eta_accuracy.py [--url URL | --model GGUF] [--requests N] [--seed S]
       [--waves W]  (W mixes of N one after another: the ETA learns from each)
       (without --url it starts a server with the model: the embedded SmolLM2 by default)
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

WORDS = ["kitchen", "light", "porch", "door", "window", "garden", "heating", "music", "alarm",
         "evening", "weather", "morning", "coffee", "lamp", "thermostat", "curtain", "fan"]


def _body(rng: random.Random, cls: str) -> dict[str, Any]:
    sizes = {"voice": (6, 30, 4, 24), "chat": (40, 200, 16, 80),
             "background": (300, 900, 8, 40)}[cls]
    lo, hi, out_lo, out_hi = sizes
    text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi)))
    return {"messages": [{"role": "user", "content": f"Summarise: {text}"}],
            "max_tokens": rng.randint(out_lo, out_hi), "ignore_eos": True, "temperature": 0,
            "priority": cls, "user": f"member{rng.randint(1, 3)}"}


def _post(url: str, body: dict[str, Any]) -> dict[str, Any]:
    req = urllib.request.Request(url + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.loads(r.read())["hearth"]


def _errors(rows: list[dict[str, Any]]) -> dict[str, Any]:
    errs = sorted(abs(r["eta_ms"] - r["ttft_ms"]) / r["ttft_ms"] for r in rows)
    if not errs:
        return {"n": 0}
    return {"n": len(errs), "median_rel_error": round(statistics.median(errs), 3),
            "p90_rel_error": round(errs[math.ceil(0.9 * len(errs)) - 1], 3)}  # nearest rank


def run(url: str, n: int, seed: int, waves: int = 1) -> dict[str, Any]:
    """``waves`` mixes one after another on the same server: the ETA learns its bias from
    the first tokens it sees (engine.queue_eta), as it would over a household's day, so the
    last wave is the one a running server's household sees; each wave is reported."""
    rng = random.Random(seed)
    # Two warm-up answers: the cost model measures real decodes before the mix starts.
    for cls in ("chat", "voice"):
        _post(url, _body(rng, cls))
    each = [_wave(url, n, rng) for _ in range(max(1, waves))]
    with urllib.request.urlopen(url + "/v1/queue", timeout=60) as r:
        bias = json.loads(r.read()).get("eta_bias")
    return {**each[-1], "waves": [{k: v for k, v in w.items() if k != "rows"} for w in each],
            "eta_bias_after": bias, "rows": [r for w in each for r in w["rows"]]}


def _wave(url: str, n: int, rng: random.Random) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    lock = threading.Lock()

    def one(body: dict[str, Any]) -> None:
        timing = _post(url, body)
        with lock:
            rows.append(timing)

    threads = []
    for _ in range(n):
        cls = rng.choices(("voice", "chat", "background"), (3, 3, 2))[0]
        t = threading.Thread(target=one, args=(_body(rng, cls),))
        t.start()
        threads.append(t)
        time.sleep(rng.expovariate(1 / 0.6))
    for t in threads:
        t.join()
    rows = [r for r in rows if r.get("eta_ms") is not None and r.get("ttft_ms")]
    out = {"all": _errors(rows),
           "waited": _errors([r for r in rows if (r.get("queue_ms") or 0) > 0]),
           "by_class": {c: _errors([r for r in rows if r["class"] == c])
                        for c in ("voice", "chat", "background")},
           "rows": [{k: r[k] for k in ("class", "eta_ms", "ttft_ms", "queue_ms")} for r in rows]}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--url")
    ap.add_argument("--model", default="")
    ap.add_argument("--requests", type=int, default=40)
    ap.add_argument("--seed", type=int, default=45)
    ap.add_argument("--n-parallel", default="4")
    ap.add_argument("--waves", type=int, default=1,
                    help="mixes one after another; the last is the one reported at the top")
    args = ap.parse_args()
    if args.url:
        result = run(args.url, args.requests, args.seed, args.waves)
    else:
        import tempfile

        from hearth_server import HearthServer
        extra = ["--model", args.model] if args.model else []
        with tempfile.TemporaryDirectory() as d, \
                HearthServer("--n-parallel", args.n_parallel, *extra, data_dir=Path(d)) as srv:
            result = run(srv.url, args.requests, args.seed, args.waves)
    rows = result.pop("rows")
    print(json.dumps(result, indent=2))
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
