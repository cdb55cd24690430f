"""llama.cpp's own llama-server as a remote worker of Hearth (``kind: llama-server``), checked
by hand: it needs the llama-server binary (built by scripts/build_llama_server, which ``make
test`` does not build), so it is not part of the test suite.

It starts llama-server on SmolLM2 and a Hearth whose background class goes to it with the local
model as fallback; sends a whole request, one to a class alias, and one over Ollama's streamed
API; then stops llama-server and sends two more (found down before it took them, both go to
the local fallback). Prints what each answered.

Usage: python bench/remote_llama_server.py
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from hearth_server import HearthServer  # noqa: E402
from llama_server import LlamaServer  # noqa: E402

from hearth.fleet.models import packaged_model  # noqa: E402


def main() -> int:
    ls = LlamaServer(packaged_model(), "-c", "4096", "-np", "2").start()
    models = [{"name": "local", "classes": ["voice", "chat"], "pinned": True},
              {"name": "ls", "url": ls.url, "kind": "llama-server", "classes": ["background"],
               "fallback": "local"}]
    with tempfile.TemporaryDirectory() as tmp:
        h = HearthServer("--n-ctx", "4096", "--n-parallel", "2", "--models", json.dumps(models),
                         data_dir=Path(tmp)).start()
        try:
            deadline = time.monotonic() + 30
            while h.get("/v1/queue")[1]["models"]["ls"]["state"] != "ready":
                assert time.monotonic() < deadline, "llama-server never became ready"
                time.sleep(0.2)
            print("worker:", h.get("/v1/queue")[1]["models"]["ls"])
            body = {"messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 8,
                    "priority": "background"}
            status, a = h.post("/v1/chat/completions", body)
            print("background:", status, a.get("model"), repr(a["choices"][0]["message"]
                                                             ["content"]), a.get("usage"))
            status, b = h.post("/v1/chat/completions", {**body, "model": "ls:voice"})
            print("alias ls:voice:", status, b.get("model"))
            req = urllib.request.Request(h.url + "/api/chat", data=json.dumps({
                "model": "ls", "messages": [{"role": "user", "content": "Hi"}],
                "options": {"num_predict": 8}}).encode(),
                headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=60) as r:
                lines = [json.loads(x) for x in r.read().splitlines() if x.strip()]
            print("Ollama stream:", len(lines), "lines, last",
                  {k: lines[-1].get(k) for k in ("done", "done_reason", "eval_count")})
            ls.stop()
            for n in (1, 2):
                status, c = h.post("/v1/chat/completions", body)
                print(f"after llama-server stopped ({n}):", status, c.get("model") or c)
            print("worker:", h.get("/v1/queue")[1]["models"]["ls"])
        finally:
            h.stop()
            ls.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
