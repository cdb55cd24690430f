"""Jump-forward in tool calls, asked directly over the API: three commands (each twice) with two
intent tools whose ``name`` and ``area`` hold exposed names, greedy, on a server with
``jump_forward_calls`` on and then off. Prints each call's time, its tokens, the call and the
forced tokens so far (``hearth_forced_tokens_total``).

Usage: python bench/jump_forward.py [--model PATH]   (default: the 1.5B in the model cache)
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from hearth_server import HearthServer  # noqa: E402

MODEL = Path.home() / ".cache/hearth/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
PROPS = {"name": {"type": "string", "enum": ["Kitchen light", "Porch light", "Living room lamp"]},
         "area": {"type": "string", "enum": ["Kitchen", "Porch", "Living Room"]},
         "domain": {"type": "array", "items": {"type": "string", "enum": ["light"]}}}
TOOLS = [{"type": "function", "function": {"name": n, "description": d, "parameters": {
    "type": "object", "properties": PROPS}}}
    for n, d in (("HassTurnOn", "Turns on a device"), ("HassTurnOff", "Turns off a device"))]
COMMANDS = ["Turn on the kitchen light.", "Turn off the porch light.",
            "Switch off the living room lamp."] * 2


def forced(url: str) -> float:
    with urllib.request.urlopen(url + "/metrics") as r:
        m = re.search(r"^hearth_forced_tokens_total (\S+)", r.read().decode(), re.M)
    return float(m.group(1)) if m else 0.0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=str(MODEL))
    args = ap.parse_args()
    for on in (True, False):
        flag = "--jump-forward-calls" if on else "--no-jump-forward-calls"
        with HearthServer("--model", args.model, "--n-ctx", "4096", "--n-parallel", "2",
                          flag) as srv:
            for text in COMMANDS:
                body = {"messages": [{"role": "system", "content": "You control a home."},
                                     {"role": "user", "content": text}],
                        "tools": TOOLS, "temperature": 0, "max_tokens": 80}
                t0 = time.monotonic()
                _, out = srv.post("/v1/chat/completions", body)
                seconds = time.monotonic() - t0
                msg = out["choices"][0]["message"]
                calls = [(c["function"]["name"], json.loads(c["function"]["arguments"]))
                         for c in msg.get("tool_calls") or ()]
                print(f"jump_forward={on} {seconds:5.2f} s {out['usage']['completion_tokens']:3d}"
                      f" tokens, forced so far {forced(srv.url):4.0f}: {text!r} -> "
                      f"{calls or msg.get('content')!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
