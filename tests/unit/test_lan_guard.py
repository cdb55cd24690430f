"""The LAN guard's rules on their own: which Host names are local, which origins are the
server's own, which bodies say they are JSON."""

from __future__ import annotations

import pytest

from hearth.api.guard import Guard, host_name


@pytest.mark.parametrize("header,name", [
    ("127.0.0.1:8080", "127.0.0.1"), ("[::1]:8080", "::1"), ("Hearth.Local.", "hearth.local"),
    ("fe80::1", "fe80::1"), ("a0d7b954-hearth:8080", "a0d7b954-hearth"),
])
def test_host_name_drops_port_and_brackets(header, name):
    assert host_name(header) == name


@pytest.mark.parametrize("host", [
    "127.0.0.1:8080", "192.168.1.20", "[::1]:8080", "localhost:8080", "a0d7b954-hearth:8080",
    "homeassistant", "nas.local", "nas.lan:8080", "gpu.internal", "box.home.arpa",
    "thing.localhost", None,
])
def test_local_names_and_addresses_are_served(host):
    assert Guard().host_allowed(host)


@pytest.mark.parametrize("host", [
    "attacker.example", "rebind.attacker.example:8080", "evil.com", "192.168.1.20.nip.io",
    "localhost.evil.com",
])
def test_public_names_are_refused_unless_configured(host):
    assert not Guard().host_allowed(host)
    name = host.partition(":")[0]
    assert Guard(allowed_hosts=f"other.example, {name.upper()}").host_allowed(host)
    assert Guard(allowed_hosts="*").host_allowed(host)


def test_origins_same_as_host_or_configured():
    g = Guard(allowed_origins="https://dash.example:8443")
    assert g.origin_allowed(None, "x:8080")  # API clients send no Origin
    assert g.origin_allowed("http://nas.lan:8080", "nas.lan:8080")
    assert g.origin_allowed("https://dash.example:8443/", "nas.lan:8080")
    assert not g.origin_allowed("https://evil.example", "nas.lan:8080")
    assert not g.origin_allowed("http://nas.lan:9999", "nas.lan:8080")
    assert not g.origin_allowed("null", "nas.lan:8080")
    assert Guard(allowed_origins="*").origin_allowed("https://evil.example", "nas.lan:8080")


@pytest.mark.parametrize("ctype,ok", [
    ("application/json", True), ("application/json; charset=utf-8", True),
    ("Application/JSON", True), ("application/merge-patch+json", True), ("text/plain", False),
    ("text/plain;charset=UTF-8", False), ("application/x-www-form-urlencoded", False),
    ("multipart/form-data; boundary=x", False), ("", False),
])
def test_bodies_must_say_json(ctype, ok):
    assert Guard.json_body_allowed("POST", ctype, has_body=True) is ok
    assert Guard.json_body_allowed("GET", ctype, has_body=True)
    assert Guard.json_body_allowed("POST", ctype, has_body=False)  # e.g. DELETE-like POSTs
