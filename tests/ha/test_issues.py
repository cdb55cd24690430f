"""A repair issue for a sub-entry set to a model the server no longer lists."""

from __future__ import annotations

import pytest
from homeassistant.core import HomeAssistant
from homeassistant.helpers import issue_registry as ir

from custom_components.hearth.const import CONF_MODEL, DOMAIN

from .conftest import AI_TASK_OPTIONS, CONVERSATION_OPTIONS, FakeHearth, async_setup_hearth

pytestmark = [pytest.mark.ha, pytest.mark.usefixtures("socket_enabled")]

SMALL = {"state": "ready", "classes": ["voice", "chat"], "aliases": ["small:voice", "small:chat"]}
BIG = {"state": "ready", "classes": ["background"], "aliases": ["big:background"]}


def _issues(hass: HomeAssistant) -> dict[str, ir.IssueEntry]:
    return {
        issue_id: issue
        for (domain, issue_id), issue in ir.async_get(hass).issues.items()
        if domain == DOMAIN
    }


async def _poll(hass: HomeAssistant, entry) -> None:
    await entry.runtime_data.coordinator.async_refresh()
    await hass.async_block_till_done()


async def test_missing_model_raises_and_withdraws_an_issue(
    hass: HomeAssistant, fake_hearth: FakeHearth, caplog: pytest.LogCaptureFixture
) -> None:
    """The agent's model is gone: one issue naming the model and the agent, logged once;
    an alias counts as served; the issue goes once the model is back, and with the entry."""
    fake_hearth.queue["models"] = {"small": SMALL}
    entry = await async_setup_hearth(
        hass,
        fake_hearth.url,
        conversation={**CONVERSATION_OPTIONS, CONF_MODEL: "big"},
        ai_task={**AI_TASK_OPTIONS, CONF_MODEL: "small:chat"},
    )
    [(issue_id, issue)] = _issues(hass).items()
    agent = next(s for s in entry.subentries.values() if s.subentry_type == "conversation")
    assert issue_id.endswith(agent.subentry_id)
    assert issue.severity is ir.IssueSeverity.ERROR
    assert issue.translation_key == "model_missing"
    assert issue.translation_placeholders["model"] == "big"
    assert issue.translation_placeholders["name"] == agent.title

    await _poll(hass, entry)  # still missing: the same issue, not logged again
    assert list(_issues(hass)) == [issue_id]
    assert caplog.text.count("no longer serves") == 1

    fake_hearth.queue["models"] = {"small": SMALL, "big": BIG}
    await _poll(hass, entry)
    assert _issues(hass) == {}

    fake_hearth.queue["models"] = {"small": SMALL}
    await _poll(hass, entry)
    assert list(_issues(hass)) == [issue_id]
    assert await hass.config_entries.async_remove(entry.entry_id)
    await hass.async_block_till_done()
    assert _issues(hass) == {}


async def test_no_issue_without_a_model_list(
    hass: HomeAssistant, fake_hearth: FakeHearth
) -> None:
    """A server that lists no models (an older one) raises no issue: nothing can be said."""
    fake_hearth.queue.pop("models", None)
    await async_setup_hearth(
        hass, fake_hearth.url, conversation={**CONVERSATION_OPTIONS, CONF_MODEL: "big"}
    )
    assert _issues(hass) == {}


STEP = {
    "from": "sapphirerapids", "to": "zen4", "skipped": ["sapphirerapids"],
    "why": "SIGSEGV: a segmentation fault",
    "cost": "llama.cpp runs its zen4 kernels instead of sapphirerapids: repacked weights are kept",
}


async def test_a_model_served_one_cpu_rung_down_raises_a_warning_with_its_cost(
    hass: HomeAssistant, fake_hearth: FakeHearth
) -> None:
    """A worker that stepped down the CPU ladder: one warning for that model saying where it
    serves, why and what it costs; withdrawn once it serves on the top rung, and with the
    entry; a model on its top rung raises none."""
    fake_hearth.queue["models"] = {
        "small": {**SMALL, "worker": {"state": "serving", "step_down": STEP}},
        "big": {**BIG, "worker": {"state": "serving", "step_down": None}},
    }
    entry = await async_setup_hearth(hass, fake_hearth.url, conversation=CONVERSATION_OPTIONS)
    [(issue_id, issue)] = _issues(hass).items()
    assert issue_id.startswith("cpu_step_down_") and issue_id.endswith("_small")
    assert issue.severity is ir.IssueSeverity.WARNING
    assert issue.translation_key == "cpu_step_down"
    placeholders = issue.translation_placeholders
    assert (placeholders["model"], placeholders["best"], placeholders["rung"]) == (
        "small", "sapphirerapids", "zen4"
    )
    assert placeholders["why"].startswith("SIGSEGV")
    assert "repacked weights are kept" in placeholders["cost"]

    fake_hearth.queue["models"]["small"]["worker"]["step_down"] = None
    await _poll(hass, entry)
    assert _issues(hass) == {}

    fake_hearth.queue["models"]["small"]["worker"]["step_down"] = STEP
    await _poll(hass, entry)
    assert list(_issues(hass)) == [issue_id]
    assert await hass.config_entries.async_remove(entry.entry_id)
    await hass.async_block_till_done()
    assert _issues(hass) == {}
