"""Secrets the worker declares, each bound to the hosts it may be sent to.

A stream names its secrets (``headers_from_env``, ``query_from_env``) by variable name,
and whoever can start a workflow on the task queue writes that input. So the worker,
not the stream, says what is a secret and where it may go: ``SSE_SECRETS`` declares
``NAME@host`` pairs (``NAME@*.example.org`` for subdomains, ``NAME@host:port`` for one
port of a host only), and
:class:`DeclaredSecrets` resolves a stream's names for the host of the URL about to be
requested (:func:`request_secrets` does it for one request, before ``sse/`` builds it).
A name that is not declared, not bound to that host, not set, or part of the worker's
own configuration (:func:`is_worker_variable`, refused even when declared) is a
:class:`ConfigError` that names the stream, the setting, the variable and the host, never
a value; the reader turns it into a parked stream before any request is sent. Only
declared variables are ever read from the environment. Where a value comes from (the
variable, a ``<NAME>_FILE``, a token endpoint) is :mod:`durable_sse.config.credentials`';
the caller may pass the values it holds (:func:`request_secrets`'s ``values``).
"""

from __future__ import annotations

import os
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import NamedTuple
from urllib.parse import SplitResult, urlsplit

from durable_sse.config.hosts import host_matches
from durable_sse.errors import ConfigError
from durable_sse.sse.request import id_header_problem

SECRETS_ENV = "SSE_SECRETS"

WORKER_VARIABLES = frozenset(
    "DATABASE_URL REDIS_URL PATH HOME USER LOGNAME SHELL PWD OLDPWD HOSTNAME TERM TMPDIR TMP "
    "TEMP TZ LANG LANGUAGE VIRTUAL_ENV SSL_CERT_FILE SSL_CERT_DIR REQUESTS_CA_BUNDLE "
    "CURL_CA_BUNDLE HTTP_PROXY HTTPS_PROXY ALL_PROXY NO_PROXY".split()
)
WORKER_VARIABLE_PREFIXES = (
    "TEMPORAL_",
    "DURABLE_SSE_",
    "SSE_",
    "REDIS_",
    "PG",
    "POSTGRES_",
    "LC_",
    "LD_",
    "DYLD_",
    "PYTHON",
)
"""The worker's own configuration (Temporal, the stores, the codec key, ``SSE_*``), the
database and Redis client variables (libpq's ``PG*``, which psycopg reads, ``POSTGRES_*``)
and the process environment (``PATH``, ``HOME``, proxies, loader and interpreter
variables). A stream can never name one of these in ``headers_from_env`` /
``query_from_env``, and ``SSE_SECRETS`` can never declare one: whoever can start a
workflow would otherwise have the worker send them to a host of their choosing."""

_VARIABLE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_HOST = re.compile(r"(\*\.)?[a-z0-9-]+(\.[a-z0-9-]+)*\Z|[0-9a-f:.]*:[0-9a-f:.]*\Z")


def is_worker_variable(name: str) -> bool:
    """True for a variable of the worker's own configuration or process, in any case:
    programs read lower-case spellings too (``http_proxy``), Windows does not tell
    ``database_url`` from ``DATABASE_URL``, and a refusal must not hinge on spelling."""
    upper = name.upper()
    return upper in WORKER_VARIABLES or upper.startswith(WORKER_VARIABLE_PREFIXES)


@dataclass(frozen=True)
class SecretBinding:
    """One ``NAME@host`` of ``SSE_SECRETS``: ``variable`` may be sent to ``host`` only
    (``NAME@host:port``: to that port of the host only)."""

    variable: str
    host: str
    """A host name or IP address, or ``*.domain`` for every subdomain of ``domain``."""
    port: int | None = None
    """Only URLs whose port is this one (written or the scheme's default); None: any."""

    def allows(self, host: str, port: int | None = None) -> bool:
        """Whether a URL with this host and port (None: unknown) may carry the secret."""
        if self.port is not None and port != self.port:
            return False
        return host_matches(host, self.host)

    @property
    def where(self) -> str:
        """The binding's host (and port), as written back in messages."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if self.port is None else f"{host}:{self.port}"

    def __str__(self) -> str:
        return f"{self.variable}@{self.where}"


def url_port(parts: SplitResult) -> int | None:
    """The port a request to this URL goes to: written, else the scheme's default."""
    try:
        port = parts.port
    except ValueError:
        return None
    if port is not None:
        return port
    return {"http": 80, "https": 443}.get(parts.scheme.lower())


def _host_and_port(text: str) -> tuple[str, int | None] | None:
    """``host``, ``host:port``, ``[v6]``, ``[v6]:port`` or a bare IPv6 address (no port);
    None when the port is not 1-65535."""
    if text.startswith("["):
        inside, _, rest = text[1:].partition("]")
        if not rest:
            return inside, None
        if not rest.startswith(":"):
            return None
        text, port = inside, rest[1:]
    elif text.count(":") == 1:
        text, _, port = text.partition(":")
    else:
        return text, None
    if not port.isdigit() or not 0 < int(port) < 65536:
        return None
    return text, int(port)


def parse_secret_bindings(value: str | None) -> tuple[SecretBinding, ...]:
    """``SSE_SECRETS``: comma-separated ``NAME@host`` (a name may be bound to several hosts).

    Refuses a malformed entry, a bare ``*`` host, and any variable of the worker's own
    configuration. Entries hold names and hosts only, so errors may repeat them.
    """
    if value is None or not value.strip():
        return ()
    bindings = []
    for entry in (part.strip() for part in value.split(",")):
        if not entry:
            continue
        variable, sep, where = entry.partition("@")
        variable = variable.strip()
        found = _host_and_port(where.strip().lower())
        host, port = found if found is not None else ("", None)
        if not sep or not _VARIABLE.match(variable) or not _HOST.match(host):
            raise ConfigError(
                f"{SECRETS_ENV}: {entry!r} is not NAME@host or NAME@host:port (a host name, "
                "an IP address, or *.domain for its subdomains; a port 1-65535)"
            )
        if is_worker_variable(variable):
            raise ConfigError(
                f"{SECRETS_ENV}: {variable} is part of the worker's own configuration "
                "and can never be sent to a stream's server"
            )
        bindings.append(SecretBinding(variable, host, port))
    return tuple(bindings)


class DeclaredSecrets:
    """The worker's declared secrets: resolves a stream's variable names for one host.

    Built once by the worker from ``Settings.secrets`` (``SSE_SECRETS``); each value is
    read from ``environ`` when a connection needs it, and only for declared variables.
    """

    def __init__(
        self,
        bindings: tuple[SecretBinding, ...] = (),
        *,
        environ: Mapping[str, str] | None = None,
        sourced: Collection[str] = (),
    ) -> None:
        """``sourced``: declared variables whose value comes from elsewhere (a file, a
        token endpoint: :mod:`durable_sse.config.credentials`), never unset."""
        self.bindings = bindings
        self.sourced = frozenset(sourced)
        self._environ = os.environ if environ is None else environ
        self._hosts: dict[str, list[SecretBinding]] = {}
        for binding in bindings:
            self._hosts.setdefault(binding.variable, []).append(binding)

    def unset(self) -> list[str]:
        """Declared variables that are not set (the worker warns about them at start)."""
        return sorted(
            name for name in self._hosts if name not in self.sourced and not self._environ.get(name)
        )

    def resolve(
        self,
        names: Mapping[str, str],
        *,
        url: str,
        stream: str,
        setting: str,
        values: Mapping[str, str] | None = None,
    ) -> dict[str, str]:
        """``{header or parameter: variable}`` -> ``{header or parameter: value}`` for
        a request to ``url``'s host; a :class:`ConfigError` for the first refusal.

        ``values``: variable -> value, for variables whose value the caller holds (read
        from a file, minted); the others are read from the environment."""
        self.check(names, url=url, stream=stream, setting=setting)
        host = (urlsplit(url).hostname or "").lower()
        resolved = {}
        for target, variable in names.items():
            where = f"stream {stream!r}: setting {setting!r} names {variable} for {target}"
            value = (values or {}).get(variable)
            if value is None:
                value = self._environ.get(variable)
            if value is None:
                raise ConfigError(
                    f"{where} (host {host}), and it is not set on this worker; nothing was sent"
                )
            resolved[target] = value
        return resolved

    def check(self, names: Mapping[str, str], *, url: str, stream: str, setting: str) -> None:
        """Refuse (:class:`ConfigError`) a variable that may not go to ``url``'s host and
        port, before any value is read, minted or sent."""
        parts = urlsplit(url)
        host, port = (parts.hostname or "").lower(), url_port(parts)
        for target, variable in names.items():
            where = f"stream {stream!r}: setting {setting!r} names {variable} for {target}"
            if is_worker_variable(variable):
                raise ConfigError(
                    f"{where}, a variable of the worker's own configuration: it is never "
                    f"sent to {host or 'any host'}; nothing was sent"
                )
            bindings = self._hosts.get(variable)
            if not bindings:
                raise ConfigError(
                    f"{where}, which this worker does not declare in {SECRETS_ENV} "
                    f"(for host {host or '?'}); nothing was sent"
                )
            if not any(binding.allows(host, port) for binding in bindings):
                bound = ", ".join(binding.where for binding in bindings)
                asked = (
                    host
                    if port is None or all(b.port is None for b in bindings)
                    else (f"{host}:{port}")
                )
                raise ConfigError(
                    f"{where}, which {SECRETS_ENV} binds to {bound}, not to {asked or '?'}; "
                    "nothing was sent"
                )


class RequestSecrets(NamedTuple):
    """A stream's secrets resolved for one request: plain values for ``sse/`` to send."""

    headers: dict[str, str]
    """Header name -> value (``headers_from_env``); each can be a header value."""
    query: dict[str, str]
    """Query parameter -> value (``query_from_env``)."""


def request_secrets(
    secrets: DeclaredSecrets,
    *,
    headers_from_env: Mapping[str, str],
    query_from_env: Mapping[str, str],
    url: str,
    stream: str,
    values: Mapping[str, str] | None = None,
    header_values: Mapping[str, str] | None = None,
) -> RequestSecrets:
    """The values of a stream's ``headers_from_env`` and ``query_from_env`` for a request
    to ``url``'s host, resolved inside the worker before any request is built.

    ``values``: variable -> value the caller holds (a file's, a minted token); others come
    from the environment. ``header_values``: the same for a header where it differs (a
    minted token goes in a header as ``Bearer <token>``, in a query as it is).

    Raises:
        ConfigError: a variable is not declared for this host or not set (see
            :meth:`DeclaredSecrets.resolve`), or a header's value cannot be a header value
            (named by variable, the value never shown). Headers are checked first.
    """
    headers = secrets.resolve(
        headers_from_env,
        url=url,
        stream=stream,
        setting="headers_from_env",
        values={**(values or {}), **(header_values or {})},
    )
    for name, value in headers.items():
        problem = id_header_problem(value)
        if problem is not None:
            raise ConfigError(
                f"stream {stream!r}: setting 'headers_from_env': the value of environment "
                f"variable {headers_from_env[name]} for {name} cannot be a header value: "
                f"{problem.replace('it ', '', 1)}"
            )
    query = secrets.resolve(
        query_from_env, url=url, stream=stream, setting="query_from_env", values=values
    )
    return RequestSecrets(headers=headers, query=query)
