"""Static checks of the integration's metadata: manifest, translations, icons, actions."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from homeassistant import components

from custom_components.hearth.const import GENERATION_CLASSES
from custom_components.hearth.sensor import SENSORS, WORKER_SENSORS

pytestmark = pytest.mark.ha

COMPONENT = Path(__file__).resolve().parents[2] / "custom_components" / "hearth"


def _json(name: str) -> dict:
    return json.loads((COMPONENT / name).read_text())


def test_manifest() -> None:
    """The manifest has what a custom integration needs, keys in hassfest's order."""
    manifest = _json("manifest.json")
    keys = list(manifest)
    assert keys[:2] == ["domain", "name"]
    assert keys[2:] == sorted(keys[2:])
    assert manifest["domain"] == "hearth"
    assert manifest["config_flow"] is True
    assert manifest["dependencies"] == ["conversation", "ai_task"]
    assert manifest["after_dependencies"] == ["assist_pipeline", "intent", "hassio"]
    assert manifest["iot_class"] == "local_push"  # the server pushes queue health
    assert manifest["categories"] == ["ai_voice.ai_models"]
    assert manifest["connectivity"] == ["network"]
    assert manifest["integration_type"] == "service"
    assert manifest["version"]
    hacs = json.loads((COMPONENT.parents[1] / "hacs.json").read_text())
    assert hacs["homeassistant"] == "2026.2.3"  # the oldest release the tests run on
    assert (COMPONENT / "brand" / "icon.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_translations_cover_entities_and_actions() -> None:
    """strings.json and translations/en.json agree and name every entity, action and field;
    every sensor has an icon."""
    strings = _json("strings.json")
    assert strings == _json("translations/en.json")
    sensors = strings["entity"]["sensor"]
    icons = _json("icons.json")
    for description in (*SENSORS, *WORKER_SENSORS):
        assert description.translation_key in sensors
        assert description.translation_key in icons["entity"]["sensor"]
    assert "reachable" in strings["entity"]["binary_sensor"]

    services = yaml.safe_load((COMPONENT / "services.yaml").read_text())
    for service, spec in services.items():
        assert service in strings["services"]
        assert service in icons["services"]
        for field in spec["fields"]:
            assert field in strings["services"][service]["fields"], (service, field)
    assert set(strings["selector"]["request_class"]["options"]) == set(GENERATION_CLASSES)
    assert set(strings["selector"]["class_policy"]["options"]) == {"auto", *GENERATION_CLASSES}


def test_quality_scale_is_complete_and_cites_real_tests() -> None:
    """quality_scale.yaml judges every rule a core integration of the installed release is
    judged on (its own LLM integration's list where it ships one), and the tests its comments
    cite exist."""
    ours = yaml.safe_load((COMPONENT / "quality_scale.yaml").read_text())["rules"]
    core = Path(components.__file__).parent
    graded = next(
        path for name in ("openai_conversation", "brother")
        if (path := core / name / "quality_scale.yaml").is_file()
    )
    theirs = yaml.safe_load(graded.read_text())["rules"]
    assert set(theirs) <= set(ours), set(theirs) - set(ours)
    text = (COMPONENT / "quality_scale.yaml").read_text()
    cited = set(re.findall(r"test_\w+\.py", text))
    assert cited, "no test cited"
    for name in cited:
        assert (Path(__file__).parent / name).is_file(), name
    for rule, judged in ours.items():
        status = judged if isinstance(judged, str) else judged["status"]
        assert status in ("done", "todo", "exempt"), rule
        if status == "exempt":
            assert isinstance(judged, dict) and judged.get("comment"), rule
