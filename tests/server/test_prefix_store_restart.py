"""The real server keeps the household's voice prompts across a restart: saved to data_dir when
it stops (SIGTERM, as the Supervisor stops the add-on), restored before it says it is ready.
Damaged and foreign files are skipped with a log line."""

from __future__ import annotations

import json
import signal

import pytest
from hearth_server import HearthServer

pytestmark = [pytest.mark.model, pytest.mark.timeout(900)]

ARGS = ("--n-ctx", "4096", "--n-parallel", "2", "--prefix-cache-entries", "4")


def _system(word: str) -> str:
    return (f"You are the {word} voice assistant of a Home Assistant household. Answer in one "
            "short sentence. Exposed entities:\n"
            + "\n".join(f"- light.{word}_{i} ('{word} {i} light', area {i % 9}): off"
                        for i in range(55)))


def _turn(server: HearthServer, system: str, text: str) -> dict:
    status, body = server.post("/v1/chat/completions", {
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": text}],
        "max_tokens": 4, "temperature": 0, "priority": "voice"}, timeout=600)
    assert status == 200, body
    return body


def test_voice_prompts_survive_a_restart_and_bad_files_are_skipped(tmp_path):
    system = _system("kitchen")
    with HearthServer(*ARGS, data_dir=tmp_path) as first:
        cold = _turn(first, _system("cellar"), "Turn on the light.")  # nothing cached
        status, warmed = first.post("/v1/cache/warm",
                                    {"messages": [{"role": "system", "content": system}]},
                                    timeout=600)
        assert status == 200, warmed
        warm = _turn(first, system, "Turn on the light.")
        assert first.stop(signal.SIGTERM) == 0
        saved_log = first.log()
    # The cellar turn, the warm-up and the kitchen turn (which shares the warm-up's cells).
    assert "saved 3 cached prefixes" in saved_log
    files = sorted((tmp_path / "prefix-cache").glob("*.kvstate"))
    assert len(files) == 3

    with HearthServer(*ARGS, data_dir=tmp_path) as second:
        _, queue = second.get("/v1/queue")
        restored = _turn(second, system, "Turn off the light.")
        second.stop(signal.SIGTERM)
    store = queue["prefix_cache"]["store"]
    assert store["restored"] == 3 and store["skipped"] == 0
    assert queue["prefix_cache"]["by_class"]["voice"]["entries"] == 3
    system_len = warmed["prompt_tokens"] - 3  # all but the next message's role
    assert restored["usage"]["prompt_tokens_details"]["cached_tokens"] >= system_len
    ttft = {name: r["hearth"]["ttft_ms"] for name, r in
            (("cold", cold), ("warm", warm), ("restored", restored))}
    # Restored is a warm turn: far from the cold prefill of a prompt this long.
    assert ttft["restored"] < ttft["cold"] / 4, ttft
    assert warm["usage"]["prompt_tokens_details"]["cached_tokens"] >= system_len

    # Damage: one file truncated, one saved for another model; the server starts regardless.
    files = sorted((tmp_path / "prefix-cache").glob("*.kvstate"))
    assert files, "the second server saved its prefixes too"
    files[0].write_bytes(files[0].read_bytes()[:-1000])
    foreign = tmp_path / "prefix-cache" / "0123456789abcdef0123456789abcdef.kvstate"
    raw = files[-1].read_bytes() if len(files) > 1 else files[0].read_bytes()
    foreign.write_bytes(raw.replace(b'"n_ctx":4096', b'"n_ctx":8192'))
    with HearthServer(*ARGS, data_dir=tmp_path) as third:
        _, queue = third.get("/v1/queue")
        assert _turn(third, system, "Is the light on?")["choices"]
        third.stop(signal.SIGTERM)
        log = third.log()
    assert "truncated" in log and "skipped the saved prefix" in log
    assert queue["prefix_cache"]["store"]["skipped"] >= 2
    print(json.dumps({"ttft_ms": ttft, "store": store}))
