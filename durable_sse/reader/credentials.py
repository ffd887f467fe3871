"""The worker's credentials, with their I/O: files read again when they change, OAuth2
tokens minted and refreshed. Built once per worker, shared by every connection.

Where a value comes from and when to fetch it again are the pure rules of
:mod:`durable_sse.config.credentials`; this module applies them:

* :class:`EnvCredential`: the environment's value (it never changes in a running worker);
* :class:`FileCredential`: the file's value, read again when ``stat`` says the file
  changed (inode, size, modification or change time; ``stat`` follows symlinks, so a
  Kubernetes ``..data`` swap is a new inode) and, after a 401, unconditionally;
* :class:`MintedCredential`: an OAuth2 client-credentials token. One request at a time
  however many connections ask (single flight), cached for the worker, refreshed in the
  background at ~80 % of its lifetime while connections use it, and at once after a 401
  with the token in use. While the endpoint fails the cached token is sent as long as it
  is valid; after that, :class:`CredentialUnavailable` tells the connection to wait and
  retry (never to park), and the endpoint is asked at most once per ``retry_delay``.

The token request is built with authlib's protocol pieces (``prepare_token_request``, and
``ClientAuth`` for ``client_secret_basic``) and sent with httpx. authlib's own httpx
client (``AsyncOAuth2Client``) is not used: from authlib 1.9.10 its httpx integration is
deprecated in favour of httpx2 (a warning on every import) and it rounds ``expires_at`` to
whole seconds, too coarse for a refresh schedule of short-lived tokens.

Values live in these objects only: never in a log line, a message, a metric label, the
workflow or Redis. :meth:`Credential.view` is what may be shown: the variable, its form,
when it was last read or minted, the last failure (words, no value).
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

import httpx
from authlib.oauth2.auth import ClientAuth
from authlib.oauth2.rfc6749.parameters import prepare_token_request

from durable_sse.config.credentials import (
    DEFAULT_TOKEN_LIFETIME,
    ClientCredentialsSource,
    CredentialForm,
    CredentialSource,
    EnvSource,
    FileSource,
    file_value,
    refresh_delay,
    retry_delay,
    usable_for,
)
from durable_sse.contracts import CredentialView
from durable_sse.errors import ConfigError, DurableSSEError
from durable_sse.redact import redact_url
from durable_sse.sse.response import describe_error

logger = logging.getLogger(__name__)

TOKEN_TIMEOUT = 10.0
"""Seconds one token request may take."""
KEEP_WARM = 3600.0
"""A minted token is refreshed in the background while some connection asked for it
within this many seconds; after that the next connection mints one (and waits for it)."""

RefreshHook = Callable[[str, str, bool], None]
"""``(variable, form, ok)``: called after each read of a changed file and each token
request (the worker counts them as metrics)."""


class CredentialUnavailable(DurableSSEError):
    """No value can be sent now (the token endpoint fails and the cached token expired,
    or a file cannot be read and none was read before): wait and retry, do not park.

    Attributes:
        retry_after: seconds before it is worth asking again.
    """

    def __init__(self, message: str, *, retry_after: float) -> None:
        super().__init__(message)
        self.retry_after = retry_after


def _now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


class Credential:
    """One declared variable's value, as the worker holds it."""

    form: CredentialForm

    def __init__(self, variable: str, *, on_refresh: RefreshHook | None = None) -> None:
        self.variable = variable
        self.on_refresh = on_refresh
        self.refreshed_at: str | None = None
        """ISO time the value was last read (file) or minted (token)."""
        self.refreshes = 0
        self.failure: str | None = None
        """The last failure to read or mint, in words (no value); None after a success."""
        self.auth_failure: str | None = None
        """The last refusal of this credential by a stream's server, with its time."""

    async def value(self) -> str:
        """The value to send now."""
        raise NotImplementedError

    def header_value(self, value: str) -> str:
        """How ``value`` goes in a header (a minted token adds its scheme)."""
        return value

    async def renew(self, sent: str) -> bool:
        """After a 401 with ``sent``: read or mint again; whether the value changed."""
        return await self.value() != sent

    def view(self) -> CredentialView:
        return CredentialView(
            variable=self.variable,
            form=self.form.value,
            refreshed_at=self.refreshed_at,
            refreshes=self.refreshes,
            failure=self.failure,
            auth_failure=self.auth_failure,
        )

    def _refreshed(self, ok: bool, failure: str | None = None) -> None:
        if ok:
            self.refreshed_at = _now_iso()
            self.refreshes += 1
        self.failure = failure
        if self.on_refresh is not None:
            self.on_refresh(self.variable, self.form.value, ok)


class EnvCredential(Credential):
    """``NAME`` in the worker's environment."""

    form = CredentialForm.ENV

    def __init__(self, variable: str, environ: Mapping[str, str] | None = None) -> None:
        super().__init__(variable)
        self.environ = os.environ if environ is None else environ

    async def value(self) -> str:
        value = self.environ.get(self.variable)
        if value is None:
            raise ConfigError(f"{self.variable} is not set on this worker")
        return value


class FileCredential(Credential):
    """``NAME_FILE``: read at start (a missing, unreadable or empty file refuses the
    worker's start) and again whenever the file changed."""

    form = CredentialForm.FILE

    def __init__(self, source: FileSource, *, on_refresh: RefreshHook | None = None) -> None:
        super().__init__(source.variable, on_refresh=on_refresh)
        self.source = source
        self.signature: tuple[int, ...] | None = None
        self.current: str | None = None

    def load(self) -> str:
        """Read the file now (ConfigError naming the setting when it cannot be)."""
        setting, path = self.source.setting, self.source.path
        try:
            with open(path, "rb") as handle:
                signature = _signature(os.fstat(handle.fileno()))
                data = handle.read()
        except FileNotFoundError:
            raise ConfigError(f"{setting}: {path} does not exist") from None
        except PermissionError:
            raise ConfigError(f"{setting}: {path} cannot be read (permission denied)") from None
        except IsADirectoryError:
            raise ConfigError(f"{setting}: {path} is a directory, not a file") from None
        except OSError as error:
            raise ConfigError(f"{setting}: {path} cannot be read ({error.strerror})") from None
        value = file_value(setting, path, data)
        changed = value != self.current
        self.signature, self.current = signature, value
        if changed:
            self._refreshed(True)
        return value

    def changed(self) -> bool:
        try:
            return _signature(os.stat(self.source.path)) != self.signature
        except OSError:
            return True

    async def value(self) -> str:
        if self.current is None or self.changed():
            self._reload()
        assert self.current is not None
        return self.current

    async def renew(self, sent: str) -> bool:
        self._reload()
        return self.current != sent

    def _reload(self) -> None:
        """Read again; a failure keeps the last value read (a file being replaced, a
        volume remounting) and says why, unless there is none."""
        try:
            self.load()
        except ConfigError as error:
            if self.failure != str(error):
                logger.warning("%s; the last value read stays in use", error)
            self.failure = str(error)
            if self.on_refresh is not None:
                self.on_refresh(self.variable, self.form.value, False)
            if self.current is None:
                raise CredentialUnavailable(str(error), retry_after=retry_delay(1)) from None


def _signature(stat: os.stat_result) -> tuple[int, ...]:
    return (stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns)


@dataclass
class _Token:
    value: str
    scheme: str
    minted: float
    """``clock()`` when it was requested."""
    usable_until: float
    refresh_at: float


class MintedCredential(Credential):
    """An OAuth2 client-credentials token, minted at the token endpoint."""

    form = CredentialForm.OAUTH2

    def __init__(
        self,
        source: ClientCredentialsSource,
        *,
        http: httpx.AsyncClient,
        client_secret: EnvCredential | FileCredential,
        on_refresh: RefreshHook | None = None,
        clock: Callable[[], float] = time.monotonic,
        rand: Callable[[], float] = random.random,
    ) -> None:
        super().__init__(source.variable, on_refresh=on_refresh)
        self.source = source
        self.http = http
        self.client_secret = client_secret
        self.clock = clock
        self.rand = rand
        self.token: _Token | None = None
        self.requests = 0
        """Token requests sent (for tests and the status)."""
        self.failures = 0
        """Token requests failed in a row."""
        self.next_attempt = 0.0
        """``clock()`` before which a failed endpoint is not asked again."""
        self.used_at = 0.0
        self._flight: asyncio.Task[_Token] | None = None
        self._timer: asyncio.TimerHandle | None = None

    def header_value(self, value: str) -> str:
        scheme = self.token.scheme if self.token is not None else "Bearer"
        return f"{scheme} {value}"

    async def value(self) -> str:
        now = self.clock()
        self.used_at = now
        token = self.token
        if token is not None and now < token.usable_until:
            if now >= token.refresh_at and now >= self.next_attempt:
                self._start()  # in the background: the current token is still good
            return token.value
        return (await self._mint()).value

    async def renew(self, sent: str) -> bool:
        token = self.token
        if token is not None and token.value != sent and self.clock() < token.usable_until:
            return True  # refreshed meanwhile (another stream's 401, the schedule)
        return (await self._mint()).value != sent

    async def _mint(self) -> _Token:
        """The token of the request in flight, or of a new one (single flight)."""
        now = self.clock()
        if self._flight is None and now < self.next_attempt:
            # The endpoint failed a moment ago: not asked again before its retry delay,
            # however many connections (or 401s) want a token meanwhile.
            raise self._unavailable(self.next_attempt - now)
        task = self._start()
        try:
            return await asyncio.shield(task)
        except (httpx.HTTPError, ConfigError, _EndpointError):
            raise self._unavailable(max(self.next_attempt - self.clock(), 0.0)) from None

    def _unavailable(self, retry_after: float) -> CredentialUnavailable:
        return CredentialUnavailable(
            f"credential {self.variable}: no valid token ({self.failure or 'not minted yet'}); "
            f"the token endpoint is asked again in {retry_after:.0f} s",
            retry_after=max(retry_after, RETRY_FLOOR),
        )

    def _start(self) -> asyncio.Task[_Token]:
        if self._flight is None:
            self._flight = asyncio.create_task(self._request())
            self._flight.add_done_callback(self._landed)
        return self._flight

    def _landed(self, task: asyncio.Task[_Token]) -> None:
        self._flight = None
        if task.cancelled():
            return
        error = task.exception()
        now = self.clock()
        if error is not None:
            self.failures += 1
            self.next_attempt = now + retry_delay(self.failures)
            failure = _failure_text(self.source.setting, error)
            if self.failure != failure:
                logger.warning("credential %s: %s; %s", self.variable, failure, self._fallback(now))
            self._refreshed(False, failure)
            self._schedule(self.next_attempt)
            return
        self.failures = 0
        self.next_attempt = 0.0
        self.token = task.result()
        self._refreshed(True)
        self._schedule(self.token.refresh_at)

    def _fallback(self, now: float) -> str:
        token = self.token
        if token is not None and now < token.usable_until:
            return f"the cached token stays in use for {token.usable_until - now:.0f} s more"
        return "streams that need it wait and retry"

    def _schedule(self, when: float) -> None:
        """The next background refresh, while connections use the token."""
        if self._timer is not None:
            self._timer.cancel()
        delay = max(when - self.clock(), 0.0)
        self._timer = asyncio.get_running_loop().call_later(delay, self._due)

    def _due(self) -> None:
        self._timer = None
        if self.clock() - self.used_at < KEEP_WARM:
            self._start()

    async def _request(self) -> _Token:
        self.requests += 1
        source = self.source
        secret = await self.client_secret.value()
        extra = {
            key: value
            for key, value in (("scope", source.scope), ("audience", source.audience))
            if value
        }
        body = prepare_token_request("client_credentials", **extra)
        url, headers, body = ClientAuth(source.client_id, secret, "client_secret_basic").prepare(
            "POST", source.token_url, {}, body
        )
        headers["Content-Type"] = "application/x-www-form-urlencoded"
        headers["Accept"] = "application/json"
        started = self.clock()
        response = await self.http.post(
            url, content=body, headers=headers, timeout=TOKEN_TIMEOUT, follow_redirects=False
        )
        return self._token(response, started)

    def _token(self, response: httpx.Response, started: float) -> _Token:
        try:
            payload = response.json()
        except ValueError:
            payload = None
        if not isinstance(payload, dict):
            payload = {}
        if response.status_code != 200:
            code = payload.get("error")
            plain = isinstance(code, str) and code.isascii() and len(code) < 64
            said = f" ({code})" if plain else ""
            raise _EndpointError(f"HTTP {response.status_code}{said}")
        token = payload.get("access_token")
        if not isinstance(token, str) or not token.strip():
            raise _EndpointError("an answer without an access_token")
        scheme = payload.get("token_type")
        scheme = "Bearer" if not isinstance(scheme, str) or scheme.lower() == "bearer" else scheme
        lifetime = payload.get("expires_in")
        try:
            lifetime = float(lifetime) if lifetime is not None else DEFAULT_TOKEN_LIFETIME
        except (TypeError, ValueError):
            lifetime = DEFAULT_TOKEN_LIFETIME
        lifetime = max(lifetime, 0.0)
        return _Token(
            value=token,
            scheme=scheme,
            minted=started,
            usable_until=started + usable_for(lifetime),
            refresh_at=started + refresh_delay(lifetime, rand=self.rand()),
        )

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._flight is not None:
            self._flight.cancel()


RETRY_FLOOR = 1.0
"""A connection told to wait for a credential waits at least this long."""


class _EndpointError(DurableSSEError):
    """The token endpoint answered, but not with a token (words only, no value)."""


def _failure_text(setting: str, error: BaseException) -> str:
    if isinstance(error, _EndpointError | ConfigError):
        return f"{setting}: {error}"
    return f"{setting}: {describe_error(error)}"


class Credentials:
    """Every declared variable's :class:`Credential`, built once per worker.

    Args:
        sources: where each variable's value comes from
            (:func:`~durable_sse.config.credentials.declare_credentials`).
        http: the client token requests go through.
        environ: the environment (``os.environ``).
        on_refresh: called after each file read and each token request.
    """

    def __init__(
        self,
        sources: Mapping[str, CredentialSource] | None = None,
        *,
        http: httpx.AsyncClient | None = None,
        environ: Mapping[str, str] | None = None,
        on_refresh: RefreshHook | None = None,
    ) -> None:
        sources = dict(sources or {})
        self._own_http: httpx.AsyncClient | None = None
        if http is None and any(isinstance(s, ClientCredentialsSource) for s in sources.values()):
            # Its own client: no proxy from the environment, no redirect followed (a token
            # endpoint that redirects could take the client secret elsewhere).
            http = self._own_http = httpx.AsyncClient(trust_env=False, follow_redirects=False)
        self.by_variable: dict[str, Credential] = {}
        for variable, source in sources.items():
            self.by_variable[variable] = _credential(source, http, environ, on_refresh)

    @property
    def sourced(self) -> frozenset[str]:
        """Variables whose value comes from a file or a token endpoint."""
        return frozenset(
            name
            for name, credential in self.by_variable.items()
            if credential.form is not CredentialForm.ENV
        )

    def load(self) -> None:
        """Read every file once, at start: a missing, unreadable or empty one (or a
        client secret file so) is a one-line :class:`ConfigError` naming its setting."""
        for credential in self.by_variable.values():
            if isinstance(credential, FileCredential):
                credential.load()
            elif isinstance(credential, MintedCredential) and isinstance(
                credential.client_secret, FileCredential
            ):
                credential.client_secret.load()

    def get(self, variable: str) -> Credential | None:
        return self.by_variable.get(variable)

    async def values(self, variables: Iterable[str]) -> dict[str, str]:
        """The value to send now of each variable that is a file's or a token (the
        environment's are read by ``DeclaredSecrets`` itself)."""
        found = {}
        for variable in dict.fromkeys(variables):
            credential = self.by_variable.get(variable)
            if credential is not None and credential.form is not CredentialForm.ENV:
                found[variable] = await credential.value()
        return found

    def header_values(self, values: Mapping[str, str]) -> dict[str, str]:
        """``values`` as they go in a header (a minted token with its scheme)."""
        return {
            variable: self.by_variable[variable].header_value(value)
            for variable, value in values.items()
            if variable in self.by_variable
        }

    async def renew(self, sent: Mapping[str, str]) -> list[str]:
        """After a 401: read or mint again each variable that was sent; the ones whose
        value changed (an environment variable never does)."""
        changed = []
        for variable, value in sent.items():
            credential = self.by_variable.get(variable)
            if credential is not None and credential.form is not CredentialForm.ENV:
                if await credential.renew(value):
                    changed.append(variable)
        return changed

    def refused(self, sent: Iterable[str], *, status_code: int, stream: str) -> None:
        """A server refused these credentials (noted on each, for the status)."""
        text = f"HTTP {status_code} from stream {stream!r} at {_now_iso()}"
        for variable in sent:
            credential = self.by_variable.get(variable)
            if credential is not None:
                credential.auth_failure = text

    def views(self, variables: Iterable[str]) -> list[CredentialView]:
        return [
            credential.view()
            for variable in dict.fromkeys(variables)
            if (credential := self.by_variable.get(variable)) is not None
        ]

    def describe(self) -> list[str]:
        """Where each value comes from, for the worker's start log (paths and URLs)."""
        lines = []
        for credential in self.by_variable.values():
            if isinstance(credential, FileCredential):
                lines.append(f"{credential.variable} from {credential.source.setting}")
            elif isinstance(credential, MintedCredential):
                lines.append(
                    f"{credential.variable} minted at {redact_url(credential.source.token_url)} "
                    f"(client {credential.source.client_id})"
                )
        return lines

    async def aclose(self) -> None:
        for credential in self.by_variable.values():
            if isinstance(credential, MintedCredential):
                credential.close()
        if self._own_http is not None:
            await self._own_http.aclose()


def _credential(
    source: CredentialSource,
    http: httpx.AsyncClient | None,
    environ: Mapping[str, str] | None,
    on_refresh: RefreshHook | None,
) -> Credential:
    if isinstance(source, EnvSource):
        return EnvCredential(source.variable, environ)
    if isinstance(source, FileSource):
        return FileCredential(source, on_refresh=on_refresh)
    secret: EnvCredential | FileCredential
    if isinstance(source.client_secret, FileSource):
        secret = FileCredential(source.client_secret)
    else:
        secret = EnvCredential(source.client_secret.variable, environ)
    assert http is not None
    return MintedCredential(
        source,
        http=http,
        client_secret=secret,
        on_refresh=on_refresh,
    )
