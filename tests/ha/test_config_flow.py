"""Config flow: manual set-up, Supervisor discovery, reconfigure, reauth, subentries."""

from __future__ import annotations

from unittest.mock import patch

import pytest
from hearth_server import HearthServer, free_port
from homeassistant import config_entries
from homeassistant.const import CONF_API_KEY, CONF_URL
from homeassistant.core import HomeAssistant
from homeassistant.data_entry_flow import FlowResultType
from homeassistant.helpers.service_info.hassio import HassioServiceInfo
from pytest_homeassistant_custom_component.common import MockConfigEntry

from custom_components.hearth.const import CONF_CLASS_POLICY, CONF_REQUEST_CLASS, DOMAIN

from .conftest import API_KEY, FakeHearth, async_server_get

pytestmark = [pytest.mark.ha, pytest.mark.model, pytest.mark.usefixtures("socket_enabled")]


@pytest.fixture(autouse=True)
def no_setup():
    """Keep the flow tests to the flow: do not set the created entries up."""
    with patch("custom_components.hearth.async_setup_entry", return_value=True) as mock:
        yield mock


def _discovery(server: HearthServer, uuid: str = "addon-uuid-1") -> HassioServiceInfo:
    return HassioServiceInfo(
        config={"host": "127.0.0.1", "port": server.port, "api_key": API_KEY},
        name="Hearth",
        slug="local_hearth",
        uuid=uuid,
    )


async def test_user_success(hass: HomeAssistant, hearth_server: HearthServer) -> None:
    """A reachable server with the right key creates the entry with its two subentries."""
    result = await hass.config_entries.flow.async_init(
        DOMAIN, context={"source": config_entries.SOURCE_USER}
    )
    assert result["type"] is FlowResultType.FORM
    assert result["step_id"] == "user"

    result = await hass.config_entries.flow.async_configure(
        result["flow_id"], {CONF_URL: hearth_server.url + "/", CONF_API_KEY: API_KEY}
    )
    assert result["type"] is FlowResultType.CREATE_ENTRY
    assert result["data"] == {CONF_URL: hearth_server.url, CONF_API_KEY: API_KEY}
    entry = result["result"]
    types = sorted(sub.subentry_type for sub in entry.subentries.values())
    assert types == ["ai_task_data", "conversation"]
    ai_task = next(s for s in entry.subentries.values() if s.subentry_type == "ai_task_data")
    assert ai_task.data[CONF_REQUEST_CLASS] == "background"
    conversation = next(
        s for s in entry.subentries.values() if s.subentry_type == "conversation"
    )
    assert conversation.data[CONF_CLASS_POLICY] == "auto"

    # The same server cannot be added twice.
    result = await hass.config_entries.flow.async_init(
        DOMAIN, context={"source": config_entries.SOURCE_USER}
    )
    result = await hass.config_entries.flow.async_configure(
        result["flow_id"], {CONF_URL: hearth_server.url, CONF_API_KEY: API_KEY}
    )
    assert result["type"] is FlowResultType.ABORT
    assert result["reason"] == "already_configured"


async def test_user_cannot_connect(hass: HomeAssistant) -> None:
    """Nothing listening: cannot_connect, and the form stays open."""
    result = await hass.config_entries.flow.async_init(
        DOMAIN, context={"source": config_entries.SOURCE_USER}
    )
    result = await hass.config_entries.flow.async_configure(
        result["flow_id"], {CONF_URL: f"http://127.0.0.1:{free_port()}"}
    )
    assert result["type"] is FlowResultType.FORM
    assert result["errors"] == {"base": "cannot_connect"}


async def test_user_invalid_auth(hass: HomeAssistant, hearth_server: HearthServer) -> None:
    """The real server refuses a wrong key, and a missing one."""
    result = await hass.config_entries.flow.async_init(
        DOMAIN, context={"source": config_entries.SOURCE_USER}
    )
    result = await hass.config_entries.flow.async_configure(
        result["flow_id"], {CONF_URL: hearth_server.url, CONF_API_KEY: "wrong"}
    )
    assert result["type"] is FlowResultType.FORM
    assert result["errors"] == {"base": "invalid_auth"}

    result = await hass.config_entries.flow.async_configure(
        result["flow_id"], {CONF_URL: hearth_server.url}
    )
    assert result["errors"] == {"base": "invalid_auth"}

    result = await hass.config_entries.flow.async_configure(
        result["flow_id"], {CONF_URL: hearth_server.url, CONF_API_KEY: API_KEY}
    )
    assert result["type"] is FlowResultType.CREATE_ENTRY


async def test_user_invalid_url(hass: HomeAssistant) -> None:
    """A URL that is not one is refused before anything is contacted."""
    result = await hass.config_entries.flow.async_init(
        DOMAIN, context={"source": config_entries.SOURCE_USER}
    )
    result = await hass.config_entries.flow.async_configure(
        result["flow_id"], {CONF_URL: "not a url"}
    )
    assert result["errors"] == {CONF_URL: "invalid_url"}


async def test_user_unexpected_answer(hass: HomeAssistant, fake_hearth: FakeHearth) -> None:
    """A server that answers, but with an error Hearth does not expect: unknown."""
    fake_hearth.health_status = 500
    result = await hass.config_entries.flow.async_init(
        DOMAIN, context={"source": config_entries.SOURCE_USER}
    )
    result = await hass.config_entries.flow.async_configure(
        result["flow_id"], {CONF_URL: fake_hearth.url, CONF_API_KEY: API_KEY}
    )
    assert result["type"] is FlowResultType.FORM
    assert result["errors"] == {"base": "unknown"}


async def test_hassio_discovery_confirm(
    hass: HomeAssistant, hearth_server: HearthServer
) -> None:
    """The add-on's discovery shows a confirmation; only confirming creates the entry."""
    result = await hass.config_entries.flow.async_init(
        DOMAIN,
        context={"source": config_entries.SOURCE_HASSIO},
        data=_discovery(hearth_server),
    )
    assert result["type"] is FlowResultType.FORM
    assert result["step_id"] == "hassio_confirm"
    assert result["description_placeholders"] == {"addon": "Hearth"}
    assert not hass.config_entries.async_entries(DOMAIN)

    result = await hass.config_entries.flow.async_configure(result["flow_id"], {})
    assert result["type"] is FlowResultType.CREATE_ENTRY
    assert result["data"] == {CONF_URL: hearth_server.url, CONF_API_KEY: API_KEY}
    entry = result["result"]
    # The server's own id (any address, by hand or discovered); the add-on's uuid for a
    # server that gives none.
    health = await async_server_get(hass, hearth_server, "/health")
    assert entry.unique_id == health.get("server_id", "addon-uuid-1")
    assert len(entry.subentries) == 2


async def test_hassio_discovery_confirm_cannot_connect(hass: HomeAssistant) -> None:
    """Confirming an add-on that does not answer shows an error instead of an entry."""
    info = HassioServiceInfo(
        config={"host": "127.0.0.1", "port": free_port()},
        name="Hearth",
        slug="local_hearth",
        uuid="addon-uuid-2",
    )
    result = await hass.config_entries.flow.async_init(
        DOMAIN, context={"source": config_entries.SOURCE_HASSIO}, data=info
    )
    result = await hass.config_entries.flow.async_configure(result["flow_id"], {})
    assert result["type"] is FlowResultType.FORM
    assert result["errors"] == {"base": "cannot_connect"}
    assert not hass.config_entries.async_entries(DOMAIN)


async def test_hassio_discovery_updates_url(
    hass: HomeAssistant, hearth_server: HearthServer
) -> None:
    """A known add-on announced at a new address: the entry follows it, nothing new."""
    entry = MockConfigEntry(
        domain=DOMAIN,
        data={CONF_URL: "http://127.0.0.1:1", CONF_API_KEY: "old"},
        unique_id="addon-uuid-1",
    )
    entry.add_to_hass(hass)

    result = await hass.config_entries.flow.async_init(
        DOMAIN,
        context={"source": config_entries.SOURCE_HASSIO},
        data=_discovery(hearth_server),
    )
    assert result["type"] is FlowResultType.ABORT
    assert result["reason"] == "already_configured"
    assert entry.data == {CONF_URL: hearth_server.url, CONF_API_KEY: API_KEY}
    assert len(hass.config_entries.async_entries(DOMAIN)) == 1


async def test_hassio_discovery_of_manual_entry(
    hass: HomeAssistant, hearth_server: HearthServer
) -> None:
    """An add-on already set up by hand at the same address is not offered again."""
    MockConfigEntry(
        domain=DOMAIN, data={CONF_URL: hearth_server.url, CONF_API_KEY: API_KEY}
    ).add_to_hass(hass)
    result = await hass.config_entries.flow.async_init(
        DOMAIN,
        context={"source": config_entries.SOURCE_HASSIO},
        data=_discovery(hearth_server),
    )
    assert result["type"] is FlowResultType.ABORT
    assert result["reason"] == "already_configured"


async def test_reconfigure(hass: HomeAssistant, hearth_server: HearthServer) -> None:
    """Reconfigure validates the new address and key, then updates the entry."""
    entry = MockConfigEntry(
        domain=DOMAIN, data={CONF_URL: "http://127.0.0.1:1", CONF_API_KEY: API_KEY}
    )
    entry.add_to_hass(hass)

    result = await entry.start_reconfigure_flow(hass)
    assert result["type"] is FlowResultType.FORM
    assert result["step_id"] == "reconfigure"

    result = await hass.config_entries.flow.async_configure(
        result["flow_id"], {CONF_URL: hearth_server.url, CONF_API_KEY: "wrong"}
    )
    assert result["errors"] == {"base": "invalid_auth"}

    result = await hass.config_entries.flow.async_configure(
        result["flow_id"], {CONF_URL: hearth_server.url, CONF_API_KEY: API_KEY}
    )
    assert result["type"] is FlowResultType.ABORT
    assert result["reason"] == "reconfigure_successful"
    assert entry.data == {CONF_URL: hearth_server.url, CONF_API_KEY: API_KEY}


async def test_reconfigure_refusals(hass: HomeAssistant, hearth_server: HearthServer) -> None:
    """Reconfigure refuses a malformed URL (the form stays open) and the address of another
    entry (aborts); nothing changes."""
    taken = MockConfigEntry(domain=DOMAIN, data={CONF_URL: hearth_server.url})
    taken.add_to_hass(hass)
    entry = MockConfigEntry(domain=DOMAIN, data={CONF_URL: "http://127.0.0.1:1"})
    entry.add_to_hass(hass)

    result = await entry.start_reconfigure_flow(hass)
    result = await hass.config_entries.flow.async_configure(
        result["flow_id"], {CONF_URL: "not a url"}
    )
    assert result["type"] is FlowResultType.FORM
    assert result["errors"] == {CONF_URL: "invalid_url"}

    result = await hass.config_entries.flow.async_configure(
        result["flow_id"], {CONF_URL: hearth_server.url + "/v1"}
    )
    assert result["type"] is FlowResultType.ABORT
    assert result["reason"] == "already_configured"
    assert entry.data == {CONF_URL: "http://127.0.0.1:1"}


async def test_reauth(hass: HomeAssistant, hearth_server: HearthServer) -> None:
    """Reauth asks for a new key and keeps asking while the server refuses it."""
    entry = MockConfigEntry(
        domain=DOMAIN, data={CONF_URL: hearth_server.url, CONF_API_KEY: "expired"}
    )
    entry.add_to_hass(hass)

    result = await entry.start_reauth_flow(hass)
    assert result["type"] is FlowResultType.FORM
    assert result["step_id"] == "reauth_confirm"

    result = await hass.config_entries.flow.async_configure(
        result["flow_id"], {CONF_API_KEY: "still-wrong"}
    )
    assert result["errors"] == {"base": "invalid_auth"}

    result = await hass.config_entries.flow.async_configure(
        result["flow_id"], {CONF_API_KEY: API_KEY}
    )
    assert result["type"] is FlowResultType.ABORT
    assert result["reason"] == "reauth_successful"
    assert entry.data[CONF_API_KEY] == API_KEY
