"""The household benchmark: one seeded home workload against Hearth's hearth, fifo and serial
modes (same model, same machine, back to back), and optionally against other
OpenAI-compatible servers.

    python bench/run_household.py            # full: 240 s of arrivals per mode
    python bench/run_household.py --quick    # 60 s of arrivals per mode
    python bench/run_household.py --url http://127.0.0.1:8081 --modes hearth

Results go to bench/results/<timestamp>/ (results.json, table.md, ttft_cdf.png, timeline.png;
per-request records, the trace and server logs under raw/), and bench/results/latest.md is
refreshed to show the newest table.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import urllib.request
from dataclasses import asdict
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "tests"))

from household import metrics, report  # noqa: E402
from household.cpu import CpuWatch  # noqa: E402
from household.driver import Replay, Target, warmup_calls  # noqa: E402
from household.progress import Progress  # noqa: E402
from household.workload import (  # noqa: E402
    DEFAULT_WORKLOAD,
    describe,
    generate,
    load_spec,
    to_json,
)

HEARTH_MODES = {
    "hearth": "classes with aging, fair share per user, preemption, bounded prefill",
    "fifo": "arrival order, same continuous batching",
    "serial": "one request at a time",
}
SERVER_ARGS = ["--n-parallel", "8", "--n-ctx", "16384", "--max-queue", "64"]
# llama.cpp's own server on the same model and pool: the anchor row. One llama-server serves
# either completions or embeddings, so a second one (same weights, mmap-shared) embeds.
ANCHOR = "llama-server"
LLAMA_ARGS = ["-c", "16384", "-np", "8", "-b", "512", "-ub", "128", "--kv-unified"]
LLAMA_EMBED_ARGS = ["-c", "4096", "-np", "2", "-b", "2048", "-ub", "2048", "--embeddings",
                    "--pooling", "mean"]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="short run (about 60 s per mode)")
    ap.add_argument("--modes", default=f"hearth,fifo,serial,{ANCHOR}",
                    help="Hearth policies to run, and llama-server, comma-separated (empty: "
                    "none)")
    ap.add_argument("--url", action="append", default=[], metavar="[NAME=]URL",
                    help="also replay against this OpenAI-compatible base URL (repeatable)")
    ap.add_argument("--api-key", default=os.environ.get("HEARTH_BENCH_API_KEY"),
                    help="bearer key for the --url servers")
    ap.add_argument("--api", default="openai",
                    help="comma list of openai,ollama: the wire Hearth's modes are driven over; "
                    "with both, each Hearth mode runs twice on the same trace (NAME and "
                    "NAME-ollama) so the table shows the Ollama path's overhead")
    ap.add_argument("--workload", default=str(DEFAULT_WORKLOAD), help="workload definition")
    ap.add_argument("--duration", type=float, help="seconds of arrivals per mode")
    ap.add_argument("--load", type=float, default=1.0, help="scale every arrival rate")
    ap.add_argument("--seed", type=int, help="override the workload's seed")
    ap.add_argument("--server-arg", action="append", default=[], metavar="ARG",
                    help="extra argument for 'hearth serve' (repeatable, e.g. "
                    "--server-arg=--latency-target-ms=80)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"), help="results folder")
    ap.add_argument("--no-latest", action="store_true", help="leave latest.md alone")
    ap.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    ap.add_argument("--report-only", metavar="DIR",
                    help="only redo table.md and the plots of an earlier run's folder")
    return ap.parse_args(argv)


def model_of(url: str, api_key: str | None) -> str:
    req = urllib.request.Request(url.rstrip("/") + "/v1/models",
                                 headers={"Authorization": f"Bearer {api_key}"} if api_key else {})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            data = json.loads(r.read()).get("data") or []
        return data[0]["id"] if data else "default"
    except (OSError, ValueError, KeyError):
        return "default"


def git_commit() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, text=True,
                              capture_output=True, check=True).stdout.strip() or None
    except (OSError, subprocess.CalledProcessError):
        return None


def replay(target: Target, sessions: list, duration: float,
           drain: float, progress: Progress) -> Replay:
    def show(r: Replay) -> None:
        progress.show("", r.elapsed_s, r.done, r.total_calls, r.in_flight)

    rp = Replay(target, sessions, duration_s=duration, drain_timeout_s=drain, on_progress=show)
    progress.show("warming up")
    asyncio.run(rp.run(warmup_calls(sessions)))
    return rp


def write_report(run: dict[str, Any], records: dict[str, list[dict[str, Any]]], out: Path,
                 plots: bool = True, latest: bool = True) -> str:
    if plots:
        report.plots(run, records, out)
    table = report.markdown(run)
    (out / "table.md").write_text(table)
    if latest:
        text = report.markdown(run, image_prefix=f"{out.name}/")
        (out.parent / "latest.md").write_text(
            f"<!-- newest run: {out.name}/table.md (written by bench/run_household.py) -->\n"
            + text)
    return table


def report_only(folder: Path, plots: bool, latest: bool) -> int:
    run = json.loads((folder / "results.json").read_text())
    records = {}
    for m in run["modes"]:
        records[m["name"]] = json.loads((folder / "raw" / f"requests-{m['name']}.json")
                                        .read_text())
        q = folder / "raw" / f"queue-{m['name']}.json"
        m["queue_samples"] = json.loads(q.read_text()) if q.exists() else []
    print(write_report(run, records, folder, plots, latest))
    return 0


def run_anchor(sessions: list, duration: float, drain: float, progress: Progress,
               raw: Path) -> tuple[Target, Replay, str]:
    from llama_server import LlamaServer

    from hearth.fleet.models import packaged_model

    model = packaged_model()
    with LlamaServer(model, *LLAMA_ARGS) as chat, LlamaServer(model, *LLAMA_EMBED_ARGS) as emb:
        target = Target(ANCHOR, chat.url, model_of(chat.url, None), hearth=False,
                        embed_url=emb.url)
        rp = replay(target, sessions, duration, drain, progress)
    for srv, tag in ((chat, "chat"), (emb, "embed")):
        if srv.log_path is not None and srv.log_path.exists():
            srv.log_path.rename(raw / f"server-{ANCHOR}-{tag}.log")
    return target, rp, ("llama.cpp's llama-server from the same vendored llama.cpp, same "
                        f"model ({' '.join(LLAMA_ARGS)}; embeddings: a second one, "
                        f"{' '.join(LLAMA_EMBED_ARGS)})")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not args.no_plots:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            sys.exit("matplotlib is needed for the plots: pip install matplotlib "
                     "(or pass --no-plots)")
    if args.report_only:
        return report_only(Path(args.report_only), not args.no_plots, not args.no_latest)
    spec = load_spec(args.workload)
    kind = "quick" if args.quick else "full"
    duration = args.duration or spec["duration_s"][kind]
    drain = spec["drain_timeout_s"][kind]
    seed = spec["seed"] if args.seed is None else args.seed
    sessions = generate(spec, duration, load=args.load, seed=seed)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    for m in modes:
        if m not in HEARTH_MODES and m != ANCHOR:
            sys.exit(f"unknown mode {m!r}: choose from {', '.join([*HEARTH_MODES, ANCHOR])}")
    apis = [a.strip() for a in args.api.split(",") if a.strip()]
    if not apis or set(apis) - {"openai", "ollama"}:
        sys.exit("--api takes openai, ollama or both")
    # The Ollama rows follow each Hearth mode (llama-server has no Ollama API).
    modes = [n for m in modes for n in ([m] if m not in HEARTH_MODES else
                                        [m if a == "openai" else f"{m}-ollama" for a in apis])]
    urls = []
    for u in args.url:
        name, _, url = u.partition("=") if "=" in u.split("://")[0] else ("", "", u)
        urls.append((name or f"url:{url.split('://')[-1].rstrip('/')}", url))
    names = modes + [n for n, _ in urls]
    if not names:
        sys.exit("nothing to run: give --modes and/or --url")

    started = datetime.now()
    stamp = started.strftime("%Y%m%d-%H%M%S")
    out_root = Path(args.out)
    out = out_root / stamp
    raw = out / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    (raw / "trace.json").write_text(json.dumps(to_json(sessions)))
    os.environ["HEARTH_TEST_LOGS"] = str(raw)  # HearthServer writes its server log there

    progress = Progress(names, duration, drain)
    trace = describe(sessions)
    progress.message(f"household benchmark ({kind}): {duration:.0f} s of arrivals per mode, "
                     f"{sum(d['calls'] for d in trace.values())} calls; modes: "
                     f"{', '.join(names)}; results in {out}")
    results: list[dict[str, Any]] = []
    records: dict[str, list[dict[str, Any]]] = {}
    model = None
    for i, name in enumerate(names):
        progress.start_mode(i)
        cpu = CpuWatch()
        cpu.start()
        policy, api = (name[:-7], "ollama") if name.endswith("-ollama") else (name, "openai")
        if policy in HEARTH_MODES:
            from hearth_server import HearthServer

            progress.show("starting server")
            server_args = ["--policy", policy, *SERVER_ARGS, *args.server_arg]
            with tempfile.TemporaryDirectory(prefix="hearth-bench-") as tmp:
                server = HearthServer(*server_args, data_dir=Path(tmp))
                server.start(timeout=300)
                try:
                    target = Target(name, server.url, model_of(server.url, None),
                                    hearth=api == "openai", api=api)
                    rp = replay(target, sessions, duration, drain, progress)
                finally:
                    server.stop()
                log = server.log_path
                if log is not None and log.exists():
                    log.rename(raw / f"server-{name}.log")
            description = HEARTH_MODES[policy] + " (" + " ".join(server_args) + ")"
            if api == "ollama":
                description += "; over Ollama's /api/chat and /api/embed, class as model alias"
        elif name == ANCHOR:
            progress.show("starting llama-server")
            target, rp, description = run_anchor(sessions, duration, drain, progress, raw)
        else:
            url = dict(urls)[name]
            target = Target(name, url, model_of(url, args.api_key), hearth=False,
                            api_key=args.api_key)
            rp = replay(target, sessions, duration, drain, progress)
            description = f"OpenAI-compatible server at {url}"
        other_cpu = cpu.stop()
        model = model or target.model
        recs = [asdict(r) for r in rp.results]
        records[name] = recs
        summary = metrics.summarize(recs, rp.queue_samples, spec, rp.end_s)
        (raw / f"requests-{name}.json").write_text(json.dumps(recs))
        (raw / f"queue-{name}.json").write_text(json.dumps(rp.queue_samples))
        results.append({"name": name, "description": description, "url": target.url,
                        "model": target.model,
                        "other_cpu_share": None if other_cpu is None else round(other_cpu, 3),
                        "queue_polled": bool(rp.queue_available), "summary": summary,
                        "queue_samples": rp.queue_samples})
        t = summary["totals"]
        v = summary["voice_slo"]
        progress.message(
            f"{name}: {t['ok']}/{t['calls']} calls ok in {t['makespan_s']:.0f} s; voice p95 "
            f"TTFT {report._f(summary['classes'].get('voice', {}).get('ttft_p95_s'))} s, "
            f"SLO {report._pct(v['attained'])}; {report._f(t['generated_tokens_per_busy_s'], 1)}"
            " generated tok/s while busy")

    notes = []
    busy = [m for m in results if (m["other_cpu_share"] or 0) > 0.05]
    if busy:
        notes.append("other processes took CPU time during " + ", ".join(
            f"{m['name']} ({100 * m['other_cpu_share']:.0f} % of the machine)" for m in busy)
            + ": absolute numbers are pessimistic and noisier.")
    if args.quick:
        notes.append("quick run: few requests per class, so p95/p99 rest on a handful of "
                     "samples; run without --quick for the numbers to quote.")
    run = {
        "started": started.strftime("%Y-%m-%d %H:%M:%S"),
        "command": " ".join(shlex.quote(a) for a in ["python", "bench/run_household.py",
                                                     *(argv if argv is not None
                                                       else sys.argv[1:])]),
        "quick": args.quick,
        "git_commit": git_commit(),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                    "python": platform.python_version()},
        "model": model,
        "workload": {"file": os.path.relpath(args.workload, ROOT), "seed": seed,
                     "duration_s": duration, "load": args.load, "trace": trace,
                     "slo": spec["slo"], "fairness_window_s": spec.get("fairness_window_s", 2.0),
                     "drain_timeout_s": drain},
        "modes": results,
        "notes": notes,
    }
    slim = {**run, "modes": [{k: v for k, v in m.items() if k != "queue_samples"}
                             for m in results]}
    (out / "results.json").write_text(json.dumps(slim, indent=1))
    table = write_report(run, records, out, not args.no_plots, not args.no_latest)
    print(table)
    progress.message(f"results: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
