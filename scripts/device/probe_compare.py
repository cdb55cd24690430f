"""The worker's process beside a plain one, from the snapshots hearth.runner.snapshot wrote for
scripts/device/load_probe.py (DUMP/VARIANT/PID-POINT.json and .maps): native libraries in load
order, signal dispositions, Python modules and mapped files, as markdown."""

from __future__ import annotations

import difflib
import json
from pathlib import Path

PAIRS = (("plain", "worker"), ("plain-server-first", "worker-server-first"),
         ("plain", "plain-server-first"), ("worker", "worker-server-first"))


def snapshot(folder: Path, point: str = "loading") -> dict | None:
    found = sorted(folder.glob(f"*-{point}.json"))
    if not found:
        return None
    snap = json.loads(found[0].read_text())
    maps = found[0].with_suffix(".maps")
    snap["mapped"] = mapped_files(maps.read_text()) if maps.is_file() else []
    return snap


def mapped_files(maps: str) -> list[str]:
    """The files mapped in a /proc/PID/maps, each once, sorted (addresses differ every run)."""
    return sorted({parts[5] for line in maps.splitlines()
                   if len(parts := line.split(maxsplit=5)) == 6 and parts[5].startswith("/")})


def _diff(a: list[str], b: list[str], names: tuple[str, str]) -> list[str]:
    diff = list(difflib.unified_diff(a, b, *names, lineterm="", n=2))
    return ["```diff", *diff, "```"] if diff else ["(the same)"]


def pair(dump: Path, left: str, right: str, point: str = "loading") -> list[str]:
    a, b = snapshot(dump / left, point), snapshot(dump / right, point)
    head = [f"## {left} | {right} ({point})", ""]
    if a is None or b is None:
        return [*head, f"(no snapshot: {left if a is None else right})", ""]
    out = [*head, "Native libraries in load order:", *_diff(a["libraries"], b["libraries"],
                                                            (left, right)), ""]
    out += ["| signal | " + left + " | " + right + " |", "|---|---|---|"]
    out += [f"| {s} | {a['signals'][s]} | {b['signals'].get(s)} |" for s in a["signals"]
            if a["signals"][s] != b["signals"].get(s)] or ["| (all the same) | | |"]
    only_a = sorted(set(a["modules"]) - set(b["modules"]))
    only_b = sorted(set(b["modules"]) - set(a["modules"]))
    out += ["", f"Modules only in {left}: {', '.join(only_a) or '(none)'}",
            f"Modules only in {right}: {', '.join(only_b) or '(none)'}", "",
            "Files mapped (/proc/PID/maps; the raw files beside the snapshots):",
            *_diff(a["mapped"], b["mapped"], (left, right)), ""]
    return out


def compare(dump: Path) -> str:
    lines = ["# The worker's process beside a plain one", ""]
    for left, right in PAIRS:
        lines += pair(dump, left, right)
    return "\n".join(lines) + "\n"
