"""The models setting and the registry: which model a name, an alias or a class goes to, and the
settings a household cannot get wrong without a clear error."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from hearth.fleet.registry import Registry, UnknownModel
from hearth.fleet.worker import memory_budget
from hearth.settings import Settings


def test_one_model_answers_to_its_file_name_and_serves_every_class():
    reg = Registry.from_settings(Settings())
    (entry,) = reg.entries
    assert entry.implicit and entry.name == "SmolLM2-135M-Instruct.Q4_1"
    assert entry.spec.pinned and entry.spec.keep_alive_s == -1
    assert {reg.for_class(c) for c in ("voice", "background", "embedding")} == {entry.name}
    assert reg.route("smollm2-135m-instruct.q4_1:latest") == (entry.name, None)
    assert reg.route("hearth:voice") == (None, "voice") and reg.route(None) == (None, None)
    with pytest.raises(UnknownModel):
        reg.route("gpt-4o")


def test_several_models_route_by_name_alias_and_class():
    s = Settings(models=[{"name": "small", "classes": ["voice", "chat"]},
                         {"name": "big", "file": "big.gguf", "classes": "background",
                          "aliases": "summariser, qwen"}])
    reg = Registry.from_settings(s)
    assert reg.for_class("voice") == "small" and reg.for_class("background") == "big"
    assert reg.for_class("agent") == "small"  # unclaimed: the first model
    assert reg.route("Summariser") == ("big", None)
    assert reg.route("qwen:voice") == ("big", "voice")
    assert reg.route("default:background") == (None, "background")
    assert reg.route("small:") == ("small", None)  # an empty tag is no tag
    for bad in ("big:huge", "other"):
        with pytest.raises(UnknownModel):
            reg.route(bad)
    assert reg.all_names()[:2] == ["small", "small:voice"]


@pytest.mark.parametrize(("models", "extra", "message"), [
    ([{"name": "a"}, {"name": "a"}], {}, "used twice"),
    ([{"name": "a", "aliases": ["b"]}, {"name": "b"}], {}, "used twice"),
    ([{"name": "hearth"}], {}, "used twice"),
    ([{"name": "a", "classes": ["voice"]}, {"name": "b", "classes": ["voice"]}], {},
     "claimed by both"),
    ([{"name": "a"}], {"model": "x.gguf"}, "either model or models"),
    ([{"name": "a", "file": "x.gguf", "url": "http://h:1"}], {}, "both a file and a url"),
    ([{"name": "a", "url": "ftp://h"}], {}, "must start with http"),
    ([{"name": "a", "url": "http://h:1", "fallback": "nowhere"}], {}, "not a model here"),
    ([{"name": "a", "url": "http://h:1", "fallback": "b"},
      {"name": "b", "url": "http://h:2", "fallback": "a"}], {}, "go round"),
    ([{"name": "Big"}], {}, "should match pattern"),
    ([{"name": "a", "aliases": ["has space"]}], {}, "lowercase letters"),
])
def test_models_a_household_gets_wrong_are_refused_by_name(models, extra, message):
    with pytest.raises(ValidationError, match=message):
        Settings(models=models, **extra)


def test_the_memory_budget_is_the_setting_or_four_fifths_of_ram(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       10000000 kB\nMemFree:  1 kB\n")
    assert memory_budget(Settings(), meminfo) == 10000000 * 1024 * 4 // 5
    assert memory_budget(Settings(memory_budget_mb=500), meminfo) == 500 * 2**20
    assert memory_budget(Settings(), tmp_path / "missing") >= 2**60
