"""Hosts a stream may reach, and the host-pattern rule they share with the secrets.

``SSE_ALLOWED_HOSTS`` restricts the hosts stream URLs may name; ``SSE_SECRETS`` binds
each secret to hosts (:mod:`durable_sse.config.secrets`). Both write a host as a name, an
IP address, or ``*.domain`` for every subdomain of ``domain``, and both match a URL's
host by :func:`host_matches`.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

from durable_sse.errors import ConfigError

ALLOWED_HOSTS_ENV = "SSE_ALLOWED_HOSTS"


def host_matches(host: str, pattern: str) -> bool:
    """Whether ``host`` is ``pattern`` or, for ``*.domain``, a subdomain of ``domain``.

    ``pattern`` is lower case (the parsers make it so); ``host`` may be of any case.
    """
    host = host.lower()
    if pattern.startswith("*."):
        return host.endswith(pattern[1:])
    return host == pattern


def parse_allowed_hosts(value: str | None) -> tuple[str, ...] | None:
    """``SSE_ALLOWED_HOSTS``: comma-separated hosts, ``*.example.com`` for subdomains."""
    if value is None or not value.strip():
        return None
    hosts = tuple(host.strip().lower() for host in value.split(",") if host.strip())
    for host in hosts:
        if not re.fullmatch(r"(\*\.)?[a-z0-9.:\[\]-]+", host):
            raise ConfigError(f"{ALLOWED_HOSTS_ENV}: {host!r} is not a host name or *.domain")
    return hosts


def host_allowed(url: str, allowed: tuple[str, ...] | None) -> bool:
    """Whether ``url``'s host is in the allowlist (no allowlist: every host)."""
    if allowed is None:
        return True
    host = urlsplit(url).hostname or ""
    return any(host_matches(host, pattern) for pattern in allowed)
