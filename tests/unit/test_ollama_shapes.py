"""Ollama's shapes from Hearth's OpenAI-shaped answers, without a model: streamed tool calls keep
their index, file types read as Ollama spells them, options reach the sampler as Ollama means
them, and errors name the fields the client sent."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from hearth.api.http import ApiError
from hearth.api.ollama import _file_name, _quantization, _Shaper
from hearth.api.ollama_convert import chat_request, generate_request, keep_alive_seconds
from hearth.api.ollama_models import ChatBody, GenerateBody


def _call(i: int, name: str) -> dict:
    return {"index": i, "id": f"call_{i}", "type": "function",
            "function": {"name": name, "arguments": '{"name": "Lamp"}'}}


def test_streamed_tool_calls_keep_their_index():
    shaper = _Shaper("m:voice", chat=True, raw=False)
    lines = [line for i, name in enumerate(("HassTurnOn", "HassTurnOff"))
             for line in shaper.lines({"choices": [{"delta": {"tool_calls": [_call(i, name)]},
                                                    "finish_reason": None}]})]
    calls = [c for line in lines for c in line["message"]["tool_calls"]]
    assert [c["function"]["index"] for c in calls] == [0, 1]
    assert calls[1]["function"]["arguments"] == {"name": "Lamp"}
    done = shaper.lines({"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 2},
                         "hearth": {"e2e_ms": 10.0, "ttft_ms": 4.0, "queue_ms": 1.0}})[-1]
    assert done["done"] and done["eval_count"] == 2
    assert done["total_duration"] == 10_000_000 and done["prompt_eval_duration"] == 3_000_000


@pytest.mark.parametrize(("description", "level"), [
    ("llama ?B Q4_1", "Q4_1"), ("gemma3 270M Q4_K - Medium", "Q4_K_M"),
    ("llama 8B IQ4_XS - 4.25 bpw", "IQ4_XS"), ("qwen3 4B (guessed) Q5_K - Small", "Q5_K_S"),
    ("llama", "")])
def test_quantization_as_ollama_spells_it(description, level):
    assert _quantization(description) == level


@pytest.mark.parametrize(("value", "seconds"), [
    (0, 0), ("0", 0), ("0m", 0), ("0.0s", 0), (-1, -1), ("-5m", -1), ("5m", 300),
    ("1h0m", 3600), ("1h30m", 5400), ("90", 90), (2.5, 2.5), ("250ms", 0.25), (None, None)])
def test_keep_alive_in_seconds_as_ollama_reads_it(value, seconds):
    """Zero unloads at once, a negative value keeps the model forever."""
    assert keep_alive_seconds(value) == seconds


def test_options_as_ollama_means_them():
    body = ChatBody.model_validate({
        "model": "m", "messages": [{"role": "user", "content": None}], "stream": None,
        "think": "max", "options": {"temperature": 5.0, "top_p": 0, "repeat_penalty": 0,
                                    "num_predict": -1, "num_ctx": 4096.7, "seed": 3.0}})
    inner = chat_request(body, default_max=77)
    assert body.stream is True and body.messages[0].content == ""
    assert inner.temperature == 2.0 and inner.top_p is None and inner.repeat_penalty is None
    assert inner.max_tokens == 77 and inner.seed == 3
    assert inner.chat_template_kwargs == {"enable_thinking": True, "reasoning_effort": "high"}


def test_errors_name_the_fields_the_client_sent():
    body = ChatBody.model_validate({"model": "m", "messages": [{"role": "user", "content": "x"}],
                                    "options": {"stop": [str(i) for i in range(9)]}})
    with pytest.raises(ApiError) as err:
        chat_request(body, default_max=8)
    assert err.value.param == "options.stop" and err.value.message.startswith("options.stop")
    raw = GenerateBody.model_validate({"model": "m", "prompt": "x", "raw": True,
                                       "system": "be brief"})
    with pytest.raises(ApiError, match="raw mode"):
        generate_request(raw, default_max=8)


def _worker(path: Path | None = None, model: str = "", url: str = "",
            remote_model: str = "") -> SimpleNamespace:
    spec = SimpleNamespace(url=url, remote_model=remote_model)
    return SimpleNamespace(name="small", remote=bool(url), path=path,
                           entry=SimpleNamespace(spec=spec),
                           rt=SimpleNamespace(settings=SimpleNamespace(model=model)))


@pytest.mark.parametrize(("worker", "shown"), [
    (_worker(Path("/srv/hearth/models/qwen2.5-1.5b-q4_k_m.gguf"),
             "/srv/hearth/models/qwen2.5-1.5b-q4_k_m.gguf"), "qwen2.5-1.5b-q4_k_m.gguf"),
    (_worker(None, "https://user:secret@example.org/m/qwen.gguf?token=k"), "qwen.gguf"),
    (_worker(None, "/data/models/gemma.gguf"), "gemma.gguf"),
    (_worker(None, ""), "small"),
    (_worker(None, "", url="http://192.168.1.30:8000", remote_model="Qwen/Qwen3-8B"),
     "Qwen/Qwen3-8B"),
    (_worker(None, "/srv/local.gguf", url="http://192.168.1.30:8000"), "small"),
])
def test_show_names_the_file_not_the_servers_folders(worker, shown):
    """/api/show's modelfile names the model's file alone: no folder of the server's disk, no
    download URL (which may carry a key), and for a remote model the remote's own name."""
    assert _file_name(worker) == shown
