"""One server, one entry: the same server added by hand and by the add-on's discovery, or by
hand at two addresses, is recognised by the id its /health gives it."""

from __future__ import annotations

import pytest
from homeassistant import config_entries
from homeassistant.const import CONF_API_KEY, CONF_URL
from homeassistant.core import HomeAssistant
from homeassistant.data_entry_flow import FlowResultType
from homeassistant.helpers.service_info.hassio import HassioServiceInfo
from pytest_homeassistant_custom_component.common import MockConfigEntry

from custom_components.hearth.const import DOMAIN

from .conftest import API_KEY, FakeHearth, async_setup_hearth

pytestmark = [pytest.mark.ha, pytest.mark.usefixtures("socket_enabled")]

SERVER_ID = "0b6c1d9e-hearth-at-home"


@pytest.fixture
async def addon_port(fake_hearth: FakeHearth) -> int:
    """The fake server answers on a second port too: the add-on's address."""
    return await fake_hearth.another_port()


def _discovery(port: int) -> HassioServiceInfo:
    return HassioServiceInfo(
        config={"host": "127.0.0.1", "port": port, "api_key": API_KEY},
        name="Hearth", slug="local_hearth", uuid="addon-uuid-9",
    )


async def _user_flow(hass: HomeAssistant, url: str) -> dict:
    result = await hass.config_entries.flow.async_init(
        DOMAIN, context={"source": config_entries.SOURCE_USER}
    )
    return await hass.config_entries.flow.async_configure(
        result["flow_id"], {CONF_URL: url, CONF_API_KEY: API_KEY}
    )


async def test_discovery_of_a_server_added_by_hand(
    hass: HomeAssistant, fake_hearth: FakeHearth, addon_port: int
) -> None:
    """Added by hand at 127.0.0.1, then announced as the add-on at another address: no
    second entry, and the hand-chosen address stays."""
    fake_hearth.server_id = SERVER_ID
    result = await _user_flow(hass, fake_hearth.url)
    assert result["type"] is FlowResultType.CREATE_ENTRY
    entry = result["result"]
    assert entry.unique_id == SERVER_ID

    result = await hass.config_entries.flow.async_init(
        DOMAIN, context={"source": config_entries.SOURCE_HASSIO}, data=_discovery(addon_port)
    )
    assert result["type"] is FlowResultType.ABORT
    assert result["reason"] == "already_configured"
    assert entry.data[CONF_URL] == fake_hearth.url
    assert len(hass.config_entries.async_entries(DOMAIN)) == 1


async def test_adding_by_hand_a_discovered_server(
    hass: HomeAssistant, fake_hearth: FakeHearth, addon_port: int
) -> None:
    """Discovered as the add-on, then added by hand at another address: already configured."""
    fake_hearth.server_id = SERVER_ID
    result = await hass.config_entries.flow.async_init(
        DOMAIN, context={"source": config_entries.SOURCE_HASSIO}, data=_discovery(addon_port)
    )
    result = await hass.config_entries.flow.async_configure(result["flow_id"], {})
    assert result["type"] is FlowResultType.CREATE_ENTRY
    assert result["result"].unique_id == SERVER_ID

    result = await _user_flow(hass, fake_hearth.url)  # not the add-on's address
    assert result["type"] is FlowResultType.ABORT
    assert result["reason"] == "already_configured"
    assert len(hass.config_entries.async_entries(DOMAIN)) == 1


async def test_older_entry_adopts_the_server_id(
    hass: HomeAssistant, fake_hearth: FakeHearth, addon_port: int
) -> None:
    """An entry made before its server said an id takes it on set-up, and is then found by
    discovery under another address. Without an id, a second address is a second server."""
    entry = await async_setup_hearth(hass, fake_hearth.url)
    assert entry.unique_id is None
    result = await _user_flow(hass, f"http://127.0.0.1:{addon_port}")
    assert result["type"] is FlowResultType.CREATE_ENTRY  # nothing tells them apart

    fake_hearth.server_id = SERVER_ID
    await hass.config_entries.async_reload(entry.entry_id)
    await hass.async_block_till_done()
    assert entry.unique_id == SERVER_ID
    result = await hass.config_entries.flow.async_init(
        DOMAIN, context={"source": config_entries.SOURCE_HASSIO},
        data=_discovery(addon_port),
    )
    assert result["reason"] == "already_configured"


async def test_discovered_entry_follows_the_addon(
    hass: HomeAssistant, fake_hearth: FakeHearth, addon_port: int
) -> None:
    """An entry made from discovery whose set-up fails at its old address follows the add-on
    to the address it is announced at, and loads there."""
    fake_hearth.server_id = SERVER_ID
    entry = MockConfigEntry(
        domain=DOMAIN, source=config_entries.SOURCE_HASSIO, unique_id=SERVER_ID,
        data={CONF_URL: "http://127.0.0.1:1", CONF_API_KEY: API_KEY},
    )
    entry.add_to_hass(hass)
    await hass.config_entries.async_setup(entry.entry_id)
    await hass.async_block_till_done()
    assert entry.state is config_entries.ConfigEntryState.SETUP_RETRY

    result = await hass.config_entries.flow.async_init(
        DOMAIN, context={"source": config_entries.SOURCE_HASSIO}, data=_discovery(addon_port)
    )
    await hass.async_block_till_done()
    assert result["reason"] == "already_configured"
    assert entry.data[CONF_URL] == f"http://127.0.0.1:{addon_port}"
    assert entry.state is config_entries.ConfigEntryState.LOADED
