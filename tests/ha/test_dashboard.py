"""The dashboard the documentation offers references only entities the integration creates."""

from __future__ import annotations

from pathlib import Path

import yaml
from homeassistant.core import HomeAssistant
from homeassistant.helpers import entity_registry as er
from pytest_homeassistant_custom_component.common import MockConfigEntry

DASHBOARD = Path(__file__).resolve().parents[2] / "docs" / "dashboard.yaml"


def _entities(node: object) -> set[str]:
    found: set[str] = set()
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "entity" and isinstance(value, str):
                found.add(value)
            elif key == "entities" and isinstance(value, list):
                for item in value:
                    if isinstance(item, str):
                        found.add(item)
                    else:
                        found |= _entities(item)
            else:
                found |= _entities(value)
    elif isinstance(node, list):
        for item in node:
            found |= _entities(item)
    return found


async def test_dashboard_entities_exist_and_are_enabled(
    hass: HomeAssistant, fake_entry: MockConfigEntry
) -> None:
    registry = er.async_get(hass)
    ours = {e.entity_id: e for e in er.async_entries_for_config_entry(registry,
                                                                        fake_entry.entry_id)}
    wanted = _entities(yaml.safe_load(DASHBOARD.read_text()))
    assert wanted, "the dashboard references no entities"
    missing = sorted(wanted - set(ours))
    assert not missing, f"not created by the integration: {missing}; have {sorted(ours)}"
    disabled = sorted(e for e in wanted if ours[e].disabled_by is not None)
    assert not disabled, f"disabled by default: {disabled}"


def test_docs_show_this_dashboard() -> None:
    """docs/home-assistant.md shows the file itself, to paste: the two cannot drift apart."""
    page = (DASHBOARD.parent / "home-assistant.md").read_text()
    assert DASHBOARD.read_text() in page


def _cards(node: object) -> list[dict]:
    if isinstance(node, dict):
        return [node] * ("type" in node) + [c for v in node.values() for c in _cards(v)]
    if isinstance(node, list):
        return [c for item in node for c in _cards(item)]
    return []


def test_charts_show_the_last_hour() -> None:
    """A new household has minutes of history, not days: the charts span one hour, so they
    show lines rather than a dot at the right edge of an empty week."""
    graphs = [c for c in _cards(yaml.safe_load(DASHBOARD.read_text()))
              if c["type"] == "history-graph"]
    assert graphs
    assert all(graph.get("hours_to_show") == 1 for graph in graphs), graphs
