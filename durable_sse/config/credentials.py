"""Where a declared secret's value comes from, and when to fetch it again: pure rules.

A variable ``NAME`` the worker declares in ``SSE_SECRETS`` (bound to hosts, see
:mod:`durable_sse.config.secrets`) takes its value from exactly one of:

* ``NAME`` in the worker's environment, read when a connection needs it (it never
  changes while the worker runs);
* ``NAME_FILE``, the path of a file holding the value (Docker and Kubernetes secrets,
  projected service-account tokens, Vault agent sinks): read again when the file changes
  (a new inode, size, or modification time; a symlink swap counts), at the latest before
  each new connection, and after a 401; trailing line breaks are stripped;
* ``NAME_TOKEN_URL``: an OAuth2 client-credentials grant (RFC 6749 section 4.4) at that
  token endpoint, with ``NAME_CLIENT_ID``, ``NAME_CLIENT_SECRET`` or
  ``NAME_CLIENT_SECRET_FILE``, and optionally ``NAME_SCOPE`` and ``NAME_AUDIENCE``. The
  token is cached per worker and refreshed at about 80 % of its lifetime
  (:func:`refresh_delay`) and after a 401; in a header it is sent as ``Bearer <token>``,
  in a query parameter as it is.

:func:`declare_credentials` reads these names once, at start, and refuses with a
one-line :class:`ConfigError` naming the setting: two forms for one name, an ``http``
token endpoint that is not loopback, a missing client id or secret, a companion variable
declared as a secret of its own. The I/O (reading files, asking the token endpoint) is
:mod:`durable_sse.reader.credentials`; the decisions it takes are the plain functions
here: :func:`refresh_delay`, :func:`retry_delay`, :func:`usable_for`,
:func:`file_value`, :func:`after_auth_failure`.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from urllib.parse import urlsplit

from durable_sse.errors import ConfigError

FILE_SUFFIX = "_FILE"
TOKEN_URL_SUFFIX = "_TOKEN_URL"
CLIENT_ID_SUFFIX = "_CLIENT_ID"
CLIENT_SECRET_SUFFIX = "_CLIENT_SECRET"
SCOPE_SUFFIX = "_SCOPE"
AUDIENCE_SUFFIX = "_AUDIENCE"
COMPANION_SUFFIXES = (
    FILE_SUFFIX,
    TOKEN_URL_SUFFIX,
    CLIENT_ID_SUFFIX,
    CLIENT_SECRET_SUFFIX,
    CLIENT_SECRET_SUFFIX + FILE_SUFFIX,
    SCOPE_SUFFIX,
    AUDIENCE_SUFFIX,
)
"""The variables that say where ``NAME``'s value comes from: never secrets of their own."""

REFRESH_WINDOW = 0.8
"""A minted token is refreshed at this fraction of its lifetime (Kafka's OAUTHBEARER
``refresh.window.factor``) ..."""
REFRESH_JITTER = 0.05
"""... plus or minus this fraction, so workers that started together do not ask together."""
MIN_REFRESH_PERIOD = 1.0
"""Seconds between two refreshes of one token at least (a token that lives less than
twice this is refreshed at half its lifetime)."""
EXPIRY_MARGIN = 1.0
"""Seconds before its expiry a token is no longer sent (at most a tenth of its lifetime):
the server must still take it when the request arrives."""
DEFAULT_TOKEN_LIFETIME = 3600.0
"""Seconds a token lives when the endpoint does not say (``expires_in`` is optional)."""
RETRY_INITIAL = 1.0
RETRY_CAP = 30.0
"""Seconds between attempts while the token endpoint fails: 1, 2, 4 ... up to 30."""


class CredentialForm(StrEnum):
    ENV = "env"
    FILE = "file"
    OAUTH2 = "oauth2"


@dataclass(frozen=True)
class EnvSource:
    """``NAME`` itself, in the worker's environment."""

    variable: str
    form: CredentialForm = CredentialForm.ENV

    @property
    def setting(self) -> str:
        return self.variable


@dataclass(frozen=True)
class FileSource:
    """``NAME_FILE``: the value is the file's content, re-read when the file changes."""

    variable: str
    path: str
    setting: str
    """The variable that names the file (``NAME_FILE``), for messages."""
    form: CredentialForm = CredentialForm.FILE


@dataclass(frozen=True)
class ClientCredentialsSource:
    """``NAME_TOKEN_URL``: an OAuth2 client-credentials grant minted for ``variable``."""

    variable: str
    token_url: str
    client_id: str
    client_secret: EnvSource | FileSource
    scope: str | None = None
    audience: str | None = None
    form: CredentialForm = CredentialForm.OAUTH2

    @property
    def setting(self) -> str:
        return self.variable + TOKEN_URL_SUFFIX


CredentialSource = EnvSource | FileSource | ClientCredentialsSource


def declare_credentials(
    variables: Iterable[str], environ: Mapping[str, str]
) -> dict[str, CredentialSource]:
    """Where each declared variable's value comes from, read from ``environ`` at start.

    Raises:
        ConfigError: one line naming the setting: two forms for one variable, a token
            endpoint that is not https (loopback aside), a missing or empty client id or
            secret, an empty ``NAME_FILE``, a companion variable declared as a secret.
            Never a value.
    """
    declared = list(dict.fromkeys(variables))
    for variable in declared:
        for other in declared:
            for suffix in COMPANION_SUFFIXES:
                if variable == other + suffix:
                    raise ConfigError(
                        f"SSE_SECRETS declares {variable}, which says where {other}'s value "
                        "comes from: it is never sent to a stream's server"
                    )
    return {variable: _source(variable, environ) for variable in declared}


def _source(variable: str, environ: Mapping[str, str]) -> CredentialSource:
    forms = [
        name
        for name in (variable, variable + FILE_SUFFIX, variable + TOKEN_URL_SUFFIX)
        if environ.get(name) is not None
    ]
    if len(forms) > 1:
        raise ConfigError(
            f"{' and '.join(forms)} are both set: a secret's value comes from one of them; "
            f"unset all but one"
        )
    if variable + FILE_SUFFIX in forms:
        return _file_source(variable, variable + FILE_SUFFIX, environ)
    if variable + TOKEN_URL_SUFFIX not in forms:
        return EnvSource(variable)
    token_url = check_token_url(
        variable + TOKEN_URL_SUFFIX, environ[variable + TOKEN_URL_SUFFIX].strip()
    )
    client_id = (environ.get(variable + CLIENT_ID_SUFFIX) or "").strip()
    if not client_id:
        raise ConfigError(
            f"{variable + TOKEN_URL_SUFFIX} is set but {variable + CLIENT_ID_SUFFIX} is not: "
            "a client-credentials grant needs the client's id"
        )
    secret_env = variable + CLIENT_SECRET_SUFFIX
    secret_file = secret_env + FILE_SUFFIX
    both = environ.get(secret_env) is not None and environ.get(secret_file) is not None
    if both:
        raise ConfigError(
            f"{secret_env} and {secret_file} are both set: the client secret comes from "
            "one of them; unset the other"
        )
    secret: EnvSource | FileSource
    if environ.get(secret_file) is not None:
        secret = _file_source(variable, secret_file, environ)
    elif environ.get(secret_env):
        secret = EnvSource(secret_env)
    else:
        raise ConfigError(
            f"{variable + TOKEN_URL_SUFFIX} is set but neither {secret_env} nor {secret_file}: "
            "a client-credentials grant needs the client's secret"
        )
    return ClientCredentialsSource(
        variable=variable,
        token_url=token_url,
        client_id=client_id,
        client_secret=secret,
        scope=(environ.get(variable + SCOPE_SUFFIX) or "").strip() or None,
        audience=(environ.get(variable + AUDIENCE_SUFFIX) or "").strip() or None,
    )


def _file_source(variable: str, setting: str, environ: Mapping[str, str]) -> FileSource:
    path = environ[setting].strip()
    if not path:
        raise ConfigError(f"{setting} is set but empty: expected the path of a file")
    return FileSource(variable=variable, path=path, setting=setting)


def check_token_url(setting: str, url: str) -> str:
    """``url`` when it may carry a client secret: ``https``, or ``http`` to a loopback
    address (a local test server, a sidecar); else a :class:`ConfigError` naming
    ``setting`` (the URL is shown without query or userinfo)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    shown = f"{parts.scheme}://{host}{parts.path}" if host else "(not a URL)"
    if parts.scheme == "https" and host:
        return url
    if parts.scheme == "http" and host and is_loopback(host):
        return url
    raise ConfigError(
        f"{setting} = {shown}: expected an https:// URL (http:// only to a loopback "
        "address): the client secret would travel in clear text"
    )


def is_loopback(host: str) -> bool:
    """``localhost`` or a loopback IP address (``127.0.0.0/8``, ``::1``)."""
    if host.lower().rstrip(".") == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def file_value(setting: str, path: str, data: bytes) -> str:
    """A secret file's value: UTF-8, its trailing line breaks stripped, not empty.

    Raises:
        ConfigError: the file is empty (once stripped) or not UTF-8, naming ``setting``
            and the path, never the content.
    """
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"{setting}: {path} is not UTF-8 text") from None
    value = text.rstrip("\r\n")
    if not value.strip():
        raise ConfigError(f"{setting}: {path} is empty: expected the secret's value")
    return value


def refresh_delay(lifetime: float, *, rand: float) -> float:
    """Seconds after a token was minted to mint the next one: ``REFRESH_WINDOW`` of its
    ``lifetime``, moved by up to ``REFRESH_JITTER`` of it either way (``rand`` in
    ``[0, 1)``), never sooner than ``MIN_REFRESH_PERIOD`` unless the token lives less
    than twice that (then half its lifetime)."""
    delay = lifetime * (REFRESH_WINDOW + REFRESH_JITTER * (2 * rand - 1))
    floor = min(MIN_REFRESH_PERIOD, lifetime / 2)
    return max(delay, floor)


def usable_for(lifetime: float) -> float:
    """Seconds after minting a token is still sent: its lifetime less ``EXPIRY_MARGIN``
    (at most a tenth of the lifetime)."""
    return lifetime - min(EXPIRY_MARGIN, lifetime / 10)


def retry_delay(failures: int) -> float:
    """Seconds before asking a failing token endpoint again, after ``failures`` in a row."""
    return min(RETRY_CAP, RETRY_INITIAL * 2 ** max(failures - 1, 0))


class AuthDecision(StrEnum):
    RETRY = "retry"
    """Reconnect at once, on the same route, with the credentials as they are now."""
    PARK = "park"
    """Retrying cannot help: the stream parks, naming the secret."""


AUTH_RENEWALS = 2
"""Fresh credentials one connection tries after refusals before it parks. Two, not one:
a token minted while the machine is slow can expire, or be revoked by a rotation, before
its first use, and one more refresh tells that apart from a server that will not take
what the worker has."""


def after_auth_failure(*, changed: bool, renewals: int) -> AuthDecision:
    """What a connection does after a 401 (or a 403 saying ``invalid_token``) once its
    credentials were re-read or refreshed: ``changed`` says whether any value differs
    from the one sent, ``renewals`` how many fresh values this connection already tried.
    The same value would be refused again; a fresh one is worth a reconnect, up to
    :data:`AUTH_RENEWALS` of them."""
    if changed and renewals < AUTH_RENEWALS:
        return AuthDecision.RETRY
    return AuthDecision.PARK
