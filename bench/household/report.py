"""The Markdown table and the matplotlib plots of a benchmark run."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from . import metrics

CLASSES = ("voice", "chat", "agent", "background", "embedding")
CDF_PLOT = "ttft_cdf.png"
TIMELINE_PLOT = "timeline.png"


def _f(x: float | None, nd: int = 2, unit: str = "") -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    return f"{x:.{nd}f}{unit}"


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.0f} %"


def _other_cpu(mode: dict) -> str:
    """What other processes took of the CPU during the mode (older runs recorded the load
    average before it, which lags)."""
    if mode.get("other_cpu_share") is not None:
        return f", other processes {_pct(mode['other_cpu_share'])} of the CPU"
    if mode.get("loadavg_before") is not None:
        return f", load average before {_f(mode['loadavg_before'], 2)}"
    return ""


def markdown(run: dict[str, Any], image_prefix: str = "") -> str:
    """The run's report; ``image_prefix`` is put before the plots' file names."""
    spec_slo = run["workload"]["slo"]
    modes = run["modes"]
    load = run["workload"]["load"]
    lines = [
        f"# Household benchmark — {run['started']}",
        "",
        f"Command: `{run['command']}`  ",
        f"Machine: {run['machine']['cpus']} CPUs ({run['machine']['platform']}); "
        f"model: {run['model']}; workload `{run['workload']['file']}` "
        f"(seed {run['workload']['seed']}, {run['workload']['duration_s']:.0f} s of arrivals"
        f"{', load ×' + format(load, 'g') if load != 1 else ''}"
        f"{', quick' if run['quick'] else ''}).  ",
        "Trace: " + ", ".join(f"{c} {d['sessions']} sessions / {d['calls']} calls"
                              for c, d in run["workload"]["trace"].items()) + ".  ",
        "Modes, one after the other, same trace: " + "; ".join(
            f"**{m['name']}** ({m['description']}{_other_cpu(m)})" for m in modes) + ".",
        "",
        "## Per class",
        "",
        "TTFT is measured by the client from sending the request to its first content, so it "
        "includes queueing, prefill and 429 retries; ITL is the gap between content chunks; "
        "e2e runs to the last chunk. tok/s is the class's output tokens (embeddings: input "
        "tokens) over the whole run. Times in seconds unless marked.",
        "",
        "| class | mode | calls | p50 TTFT | p95 TTFT | p99 TTFT | p95 ITL (ms) | p95 e2e "
        "| tok/s | failed/unfinished |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for cls in CLASSES:
        for m in modes:
            c = m["summary"]["classes"].get(cls)
            if not c:
                continue
            lines.append(
                f"| {cls} | {m['name']} | {c['requests']} | {_f(c['ttft_p50_s'])} | "
                f"{_f(c['ttft_p95_s'])} | {_f(c['ttft_p99_s'])} | "
                f"{_f(c['itl_p95_ms'], 0) if cls != 'embedding' else '–'} | "
                f"{_f(c['e2e_p95_s'])} | {_f(c['tokens_per_s'], 1)} | "
                f"{c['failed']}/{c['unfinished']} |")
    thr = spec_slo["voice_ttft_s"]
    lines += [
        "",
        "## Per mode",
        "",
        f"Voice SLO: TTFT ≤ {thr:g} s — {spec_slo['why']}. Throughput is over the time with "
        "at least one request outstanding (busy time): generated tokens, and generated plus "
        "uncached prompt tokens (all the work done). Jain's index (1 = even, 1/n = one user "
        "gets everything) compares the service (uncached prompt tokens + 2 × output tokens, "
        "as Hearth's fair scheduler counts it) of household members who were waiting in the "
        f"same class over the same {run['workload']['fairness_window_s']:g}-s window; "
        "'windows' is how many such contended windows there were.",
        "",
        f"| mode | voice TTFT ≤ {thr:g} s | gen tok/s (busy) | work tok/s (busy) | busy / "
        "makespan (s) | background completion p50 / max (s) | Jain (windows) | 429 retries "
        "| preemptions | prefix-cache hit |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for m in modes:
        s = m["summary"]
        t, b, f, v, srv = (s["totals"], s["background_completion_s"], s["fairness"],
                           s["voice_slo"], s["server"])
        lines.append(
            f"| {m['name']} | {_pct(v['attained'])} ({v['requests']}) | "
            f"{_f(t['generated_tokens_per_busy_s'], 1)} | "
            f"{_f(t['processed_tokens_per_busy_s'], 1)} | {_f(t['busy_s'], 0)} / "
            f"{_f(t['makespan_s'], 0)} | {_f(b['p50'], 1)} / {_f(b['max'], 1)} | "
            f"{_f(f['jain_contended'], 3)} ({f['windows']}) | {t['retries_429']} | "
            f"{srv['preemptions'] if srv['preemptions'] is not None else '–'} | "
            f"{_pct(srv['prefix_hit_rate'])} |")
    lines += verdict(modes)
    lines += [
        "",
        "## Per user",
        "",
        "Share of all service in the run (equal to the share of demand once everything has "
        "finished) and share of the service in the contended windows above.",
        "",
        "| user | " + " | ".join(f"{m['name']}: share / contended" for m in modes) + " |",
        "|---|" + "---:|" * len(modes),
    ]
    users = sorted({u for m in modes for u in m["summary"]["users"]})
    for u in users:
        cells = []
        for m in modes:
            d = m["summary"]["users"].get(u, {})
            cells.append(f"{_pct(d.get('share'))} / {_pct(d.get('contended_share'))}")
        lines.append(f"| {u} | " + " | ".join(cells) + " |")
    lines += ["", f"![TTFT CDF per class and mode]({image_prefix}{CDF_PLOT})", "",
              f"![Tokens/s and queue depth over time]({image_prefix}{TIMELINE_PLOT})", ""]
    if run.get("notes"):
        lines += ["## Notes", ""] + [f"- {n}" for n in run["notes"]] + [""]
    return "\n".join(lines)


def verdict(modes: list[dict[str, Any]]) -> list[str]:
    """hearth against fifo and against llama-server: voice TTFT p95 and throughput."""
    by = {m["name"]: m["summary"] for m in modes}
    out: list[str] = []
    for other in ("fifo", "llama-server"):
        if "hearth" in by and other in by:
            out += _against(by["hearth"], by[other], other)
    return out


def _against(h: dict[str, Any], f: dict[str, Any], other: str) -> list[str]:
    vh = h["classes"].get("voice", {}).get("ttft_p95_s")
    vf = f["classes"].get("voice", {}).get("ttft_p95_s")
    th = h["totals"]["processed_tokens_per_busy_s"]
    tf = f["totals"]["processed_tokens_per_busy_s"]
    gh = h["totals"]["generated_tokens_per_busy_s"]
    gf = f["totals"]["generated_tokens_per_busy_s"]
    if None in (vh, vf, th, tf, gh, gf) or not (vh and tf and gf):
        return []
    change = 100 * (th / tf - 1)
    return ["", f"**hearth against {other}:** voice p95 TTFT {vh:.2f} s against {vf:.2f} s "
            f"({vf / vh:.1f}× lower); throughput while busy {th:.1f} against {tf:.1f} tok/s of "
            f"all work ({change:+.0f} %) and {gh:.1f} against {gf:.1f} generated tok/s "
            f"({100 * (gh / gf - 1):+.0f} %)"
            + ((": within" if change >= -10 else ": **not** within") + " the 10 % allowed."
               if other == "fifo" else ".")]


def plots(run: dict[str, Any], records: dict[str, list[dict[str, Any]]], out: Path) -> list[Path]:
    """TTFT CDFs per class (one line per mode) and a timeline per mode."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, NullFormatter

    modes = run["modes"]
    colors = {m["name"]: f"C{i}" for i, m in enumerate(modes)}
    thr = run["workload"]["slo"]["voice_ttft_s"]
    present = [c for c in CLASSES if any(r["cls"] == c for rs in records.values() for r in rs)]
    fig, axes = plt.subplots(1, len(present), figsize=(3.6 * len(present), 3.4), squeeze=False)
    for ax, cls in zip(axes[0], present, strict=True):
        for m in modes:
            t = sorted(x for r in records[m["name"]] if r["cls"] == cls
                       if (x := metrics.ttft(r)) is not None)
            if t:
                y = [0.0] + [(i + 1) / len(t) for i in range(len(t))]
                ax.step([t[0], *t], y, where="post", color=colors[m["name"]],
                        label=f"{m['name']} ({len(t)})")
        if cls == "voice":
            ax.axvline(thr, color="grey", linestyle="--", linewidth=1)
            ax.text(thr, 0.02, f" {thr:g} s", color="grey", fontsize=8)
        ax.set_xscale("log")
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_title(cls if cls != "embedding" else "embedding (response)")
        ax.set_xlabel("TTFT (s)")
        ax.set_ylim(0, 1.02)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(loc="lower right", fontsize=7)
    axes[0][0].set_ylabel("share of requests")
    fig.suptitle("Time to first token (client-side, queue-inclusive)")
    fig.tight_layout()
    cdf = out / CDF_PLOT
    fig.savefig(cdf, dpi=110)
    plt.close(fig)

    horizon = max((m["summary"]["totals"]["makespan_s"] or 0) for m in modes) or 1.0
    fig, axes = plt.subplots(len(modes), 1, figsize=(10, 2.4 * len(modes)), sharex=True,
                             squeeze=False)
    for ax, m in zip(axes[:, 0], modes, strict=True):
        recs = records[m["name"]]
        ts, rate = metrics.token_rate_series(recs, horizon, 1.0)
        k = 3  # a 3-s moving average keeps the line readable
        smooth = [sum(rate[max(0, i - k + 1): i + 1]) / len(rate[max(0, i - k + 1): i + 1])
                  for i in range(len(rate))]
        ax.plot(ts, smooth, color=colors[m["name"]], label="generated tok/s (client)")
        ax.set_ylabel("tok/s")
        ax.set_title(m["name"], loc="left", fontsize=10)
        ax.grid(True, alpha=0.3)
        ax2 = ax.twinx()
        its, n = metrics.in_flight_series(recs, horizon, 0.5)
        ax2.step(its, n, where="post", color="grey", linewidth=0.8, label="in flight (client)")
        samples = m.get("queue_samples") or []
        if samples:
            ax2.step([q["t"] for q in samples],
                     [sum((q.get("waiting") or {}).values()) for q in samples], where="post",
                     color="C3", linewidth=0.8, label="waiting (server)")
        ax2.set_ylabel("requests")
        voice = [r["sent_s"] for r in recs if r["cls"] == "voice" and r["sent_s"] is not None]
        ax.plot(voice, [0] * len(voice), "|", color="black", markersize=8, label="voice arrival")
        h1, l1 = ax.get_legend_handles_labels()
        h2, l2 = ax2.get_legend_handles_labels()
        ax.legend(h1 + h2, l1 + l2, loc="upper right", fontsize=7)
    axes[-1][0].set_xlabel("time since start (s)")
    fig.tight_layout()
    tl = out / TIMELINE_PLOT
    fig.savefig(tl, dpi=100)
    plt.close(fig)
    return [cdf, tl]
