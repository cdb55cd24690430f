"""What a web page in a household member's browser must not do: send requests cross-site, or
reach the server through DNS rebinding (a page's own name pointed at the server's address).

- ``Host`` must be a name no public DNS server can answer for: an IP literal, ``localhost``, a
  single-label name (the add-on's hostname, ``homeassistant``), a name under ``.local``,
  ``.lan``, ``.internal``, ``.home.arpa``, ``.localhost``, this machine's hostname, or one of the
  ``allowed_hosts`` setting. A rebinding page's ``Host`` is its attacker's public name.
- A request with an ``Origin`` (browsers send it cross-site; API clients never do) must come from
  the server's own origin or one of ``allowed_origins``.
- A body is JSON only as ``application/json``: the types a page may send without a preflight
  (``text/plain``, forms) are refused before the body is read.
"""

from __future__ import annotations

import contextlib
import ipaddress
import socket
from collections.abc import Iterable
from urllib.parse import urlsplit

LOCAL_SUFFIXES = (".local", ".lan", ".internal", ".home.arpa", ".localhost")


def _split(value: str) -> list[str]:
    return [v.strip().lower().rstrip("/") for v in value.split(",") if v.strip()]


def host_name(host_header: str) -> str:
    """The name in a ``Host`` header, without its port or an IPv6 literal's brackets."""
    h = host_header.strip().lower()
    if h.startswith("["):
        return h[1:h.find("]")] if "]" in h else h[1:]
    if h.count(":") == 1:
        h = h.partition(":")[0]
    return h.rstrip(".")


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


class Guard:
    def __init__(self, allowed_hosts: str = "", allowed_origins: str = "",
                 own_names: Iterable[str] = ()):
        hosts = _split(allowed_hosts)
        self.any_host = "*" in hosts
        self.hosts = {h for h in hosts if h != "*"} | {"localhost"}
        self.hosts |= {n.lower() for n in own_names if n}
        with contextlib.suppress(OSError):
            self.hosts.add(socket.gethostname().lower())
        origins = _split(allowed_origins)
        self.any_origin = "*" in origins
        self.origins = {o for o in origins if o != "*"}

    def host_allowed(self, host_header: str | None) -> bool:
        if self.any_host or host_header is None:  # HTTP/1.0 without Host: no browser sends it
            return True
        name = host_name(host_header)
        return (_is_ip(name) or "." not in name or name in self.hosts
                or name.endswith(LOCAL_SUFFIXES))

    def origin_allowed(self, origin: str | None, host_header: str | None) -> bool:
        if origin is None or self.any_origin:
            return True
        origin = origin.strip().lower().rstrip("/")
        if origin in self.origins:
            return True
        if origin == "null":  # sandboxed frames and files: never the server's own page
            return False
        parts = urlsplit(origin)
        return bool(host_header) and parts.netloc == host_header.strip().lower()

    @staticmethod
    def json_body_allowed(method: str, content_type: str, has_body: bool) -> bool:
        """Bodies on POST/PUT/PATCH must say they are JSON; an empty body may say nothing."""
        if method not in ("POST", "PUT", "PATCH") or not has_body:
            return True
        ctype = content_type.split(";")[0].strip().lower()
        return ctype == "application/json" or (ctype.startswith("application/")
                                               and ctype.endswith("+json"))
