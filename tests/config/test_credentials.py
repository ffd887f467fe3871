"""Credentials that change (issue 36): where a secret's value comes from, when it is read
or minted again, and what a 401 does. The rules are plain functions with plain tests; the
files are real files; the token endpoint is an ``httpx.MockTransport`` (the whole path,
with Temporal, is tests/system/test_credentials_rotation.py)."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
import os
import re
from pathlib import Path

import httpx
import pytest

from durable_sse.config.credentials import (
    AUTH_RENEWALS,
    AuthDecision,
    ClientCredentialsSource,
    EnvSource,
    FileSource,
    after_auth_failure,
    declare_credentials,
    file_value,
    refresh_delay,
    retry_delay,
    usable_for,
)
from durable_sse.config.secrets import DeclaredSecrets, parse_secret_bindings
from durable_sse.config.settings import Settings
from durable_sse.config.spec import parse_spec
from durable_sse.contracts import ConnectionProgress, CredentialView, parse_progress, progress_json
from durable_sse.errors import ConfigError
from durable_sse.ops.cli.tables import credentials_text
from durable_sse.reader.credentials import (
    Credentials,
    CredentialUnavailable,
    FileCredential,
    MintedCredential,
)
from durable_sse.sse.response import is_auth_failure

CLIENT_SECRET = "client-secret-value-7f3a"


def one_line_error(environ: dict[str, str], *names: str) -> str:
    with pytest.raises(ConfigError) as caught:
        Settings.from_env(environ)
    message = str(caught.value)
    assert "\n" not in message
    for name in names:
        assert name in message, message
    assert CLIENT_SECRET not in message
    return message


# -- the rules ---------------------------------------------------------------------------


def test_each_declared_secret_has_one_source() -> None:
    environ = {
        "PLAIN": "v",
        "FROM_FILE_FILE": "/run/secrets/token",
        "MINTED_TOKEN_URL": "https://auth.example.com/token",
        "MINTED_CLIENT_ID": "worker",
        "MINTED_CLIENT_SECRET_FILE": "/run/secrets/client",
        "MINTED_SCOPE": "events:read",
        "MINTED_AUDIENCE": "https://events.example.com",
    }
    found = declare_credentials(["PLAIN", "FROM_FILE", "MINTED"], environ)
    assert found["PLAIN"] == EnvSource("PLAIN")
    assert found["FROM_FILE"] == FileSource("FROM_FILE", "/run/secrets/token", "FROM_FILE_FILE")
    minted = found["MINTED"]
    assert isinstance(minted, ClientCredentialsSource)
    assert minted.client_secret == FileSource(
        "MINTED", "/run/secrets/client", "MINTED_CLIENT_SECRET_FILE"
    )
    assert (minted.scope, minted.audience) == ("events:read", "https://events.example.com")
    # http is fine on loopback only
    loop = declare_credentials(
        ["T"],
        {"T_TOKEN_URL": "http://127.0.0.1:9/t", "T_CLIENT_ID": "a", "T_CLIENT_SECRET": "s"},
    )
    assert isinstance(loop["T"], ClientCredentialsSource)


@pytest.mark.parametrize(
    ("environ", "names"),
    [
        ({"API": "v", "API_FILE": "/x"}, ["API and API_FILE are both set"]),
        ({"API_FILE": "/x", "API_TOKEN_URL": "https://a/t"}, ["API_FILE", "API_TOKEN_URL"]),
        (
            {"API_TOKEN_URL": "http://auth.example.com/t", "API_CLIENT_ID": "a"},
            ["API_TOKEN_URL", "https://"],
        ),
        ({"API_TOKEN_URL": "https://a/t", "API_CLIENT_SECRET": CLIENT_SECRET}, ["API_CLIENT_ID"]),
        ({"API_TOKEN_URL": "https://a/t", "API_CLIENT_ID": "a"}, ["API_CLIENT_SECRET"]),
        (
            {
                "API_TOKEN_URL": "https://a/t",
                "API_CLIENT_ID": "a",
                "API_CLIENT_SECRET": CLIENT_SECRET,
                "API_CLIENT_SECRET_FILE": "/x",
            },
            ["API_CLIENT_SECRET and API_CLIENT_SECRET_FILE"],
        ),
        ({"API_FILE": " "}, ["API_FILE is set but empty"]),
    ],
)
def test_bad_declarations_are_one_line_errors_naming_the_setting(
    environ: dict[str, str], names: list[str]
) -> None:
    one_line_error({"SSE_SECRETS": "API@events.example.com", **environ}, *names)


def test_a_companion_variable_is_never_a_secret_of_its_own() -> None:
    one_line_error(
        {"SSE_SECRETS": "API@e.example.com,API_CLIENT_SECRET@e.example.com"},
        "API_CLIENT_SECRET",
        "never sent",
    )


def test_a_binding_with_a_port_matches_that_port_only() -> None:
    secrets = DeclaredSecrets(
        parse_secret_bindings("T@127.0.0.1:8443,U@[::1]:80,V@events.example.com:443"),
        environ={"T": "t", "U": "u", "V": "v"},
    )

    def resolve(variable: str, url: str) -> dict[str, str]:
        return secrets.resolve({"X": variable}, url=url, stream="s", setting="headers_from_env")

    assert resolve("T", "https://127.0.0.1:8443/s") == {"X": "t"}
    assert resolve("U", "http://[::1]/s") == {"X": "u"}  # the scheme's default port
    assert resolve("V", "https://events.example.com/s") == {"X": "v"}
    for variable, url in (
        ("T", "https://127.0.0.1:9443/s"),
        ("T", "https://127.0.0.1/s"),
        ("V", "http://events.example.com/s"),
    ):
        with pytest.raises(ConfigError, match="binds to .*:(8443|443), not to"):
            resolve(variable, url)
    with pytest.raises(ConfigError, match="NAME@host:port"):
        parse_secret_bindings("T@127.0.0.1:99999")


def test_a_file_value_loses_its_trailing_line_breaks_only() -> None:
    assert file_value("T_FILE", "/p", b"tok en \n") == "tok en "
    assert file_value("T_FILE", "/p", b"tok\r\n\n") == "tok"
    for data in (b"", b"\n", b"  \n"):
        with pytest.raises(ConfigError, match="T_FILE: /p is empty"):
            file_value("T_FILE", "/p", data)
    with pytest.raises(ConfigError, match="not UTF-8"):
        file_value("T_FILE", "/p", b"\xff\xfe")


def test_a_token_is_refreshed_at_about_80_percent_of_its_lifetime() -> None:
    assert refresh_delay(100.0, rand=0.5) == pytest.approx(80.0)
    assert refresh_delay(100.0, rand=0.0) == pytest.approx(75.0)
    assert refresh_delay(100.0, rand=0.999999) == pytest.approx(85.0, abs=0.01)
    assert refresh_delay(5.0, rand=0.5) == pytest.approx(4.0)
    assert refresh_delay(1.0, rand=0.0) == 0.75  # under twice the floor: no floor above half
    assert refresh_delay(2.0, rand=0.0) == 1.5
    assert usable_for(5.0) == 4.5 and usable_for(3600.0) == 3599.0
    assert [retry_delay(n) for n in (1, 2, 3, 6, 20)] == [1, 2, 4, 30, 30]


def test_only_fresh_credentials_are_worth_a_reconnect() -> None:
    assert after_auth_failure(changed=True, renewals=0) is AuthDecision.RETRY
    assert after_auth_failure(changed=True, renewals=AUTH_RENEWALS - 1) is AuthDecision.RETRY
    assert after_auth_failure(changed=True, renewals=AUTH_RENEWALS) is AuthDecision.PARK
    for renewals in range(AUTH_RENEWALS + 1):
        assert after_auth_failure(changed=False, renewals=renewals) is AuthDecision.PARK


def test_which_refusals_are_of_the_credentials() -> None:
    assert is_auth_failure(401)
    assert is_auth_failure(403, 'Bearer realm="x", error="invalid_token"')
    assert is_auth_failure(403, "Bearer error=invalid_token")
    assert not is_auth_failure(403, 'Bearer error="insufficient_scope"')
    assert not is_auth_failure(403)
    assert not is_auth_failure(404)


def test_a_client_secret_in_a_stream_spec_is_refused_without_its_value() -> None:
    for key in ("client_secret", "token_url", "password", "oauth"):
        with pytest.raises(ConfigError) as caught:
            parse_spec({"name": "s", "url": "https://e.example/s", key: CLIENT_SECRET})
        message = str(caught.value)
        assert f"'{key}'" in message and "\n" not in message, message
        assert CLIENT_SECRET not in message and "worker" in message, message
    with pytest.raises(ConfigError) as caught:
        parse_spec(
            {
                "name": "s",
                "url": "https://e.example/s",
                "headers_from_env": {"Authorization": f"Bearer {CLIENT_SECRET}"},
            }
        )
    assert CLIENT_SECRET not in str(caught.value)
    assert "headers_from_env.Authorization" in str(caught.value)


# -- files ---------------------------------------------------------------------------------


def file_credential(path: Path) -> FileCredential:
    return FileCredential(FileSource("TOKEN", str(path), "TOKEN_FILE"))


async def test_a_file_is_read_again_when_it_changes_and_a_symlink_swap_counts(
    tmp_path: Path,
) -> None:
    # Kubernetes' atomic writer: token -> ..data/token, ..data -> a timestamped directory.
    first, second = tmp_path / "v1", tmp_path / "v2"
    first.mkdir()
    second.mkdir()
    (first / "token").write_text("tok-1\n")
    (second / "token").write_text("tok-2\n")
    (tmp_path / "..data").symlink_to(first)
    (tmp_path / "token").symlink_to(tmp_path / "..data" / "token")
    credential = file_credential(tmp_path / "token")
    credential.load()
    assert await credential.value() == "tok-1"
    (tmp_path / "..data_tmp").symlink_to(second)
    os.replace(tmp_path / "..data_tmp", tmp_path / "..data")
    assert await credential.value() == "tok-2"
    # rewritten in place, same length: the inode stays, the modification time moves
    (second / "token").write_text("tok-3\n")
    os.utime(second / "token", ns=(1, 1))
    assert await credential.value() == "tok-3"
    assert credential.refreshes == 3 and credential.refreshed_at is not None
    # after a 401 the file is read whatever stat says
    assert not await credential.renew("tok-3")
    assert await credential.renew("tok-2")


def test_an_unreadable_file_refuses_the_start(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("tok")
    path.chmod(0)
    pattern = r"TOKEN_FILE: .* cannot be read \(permission denied\)"
    if os.geteuid() != 0:
        with pytest.raises(ConfigError, match=pattern):
            file_credential(path).load()
        return
    # Root reads any file: the check runs in a forked child that dropped to nobody.
    child = os.fork()
    if child == 0:  # pragma: no cover - the child's exit code is the verdict
        code = 1
        try:
            os.setgid(65534)
            os.setuid(65534)
            file_credential(path).load()
        except ConfigError as error:
            code = 0 if re.search(pattern, str(error)) else 2
        except BaseException:  # noqa: BLE001 - any other outcome fails the test
            code = 3
        os._exit(code)
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_a_missing_empty_or_directory_file_refuses_the_start(tmp_path: Path) -> None:
    (tmp_path / "empty").write_text("\n")
    cases = (
        ("missing", "does not exist"),
        ("empty", "is empty"),
        ("", "directory"),
        ("empty/token", "cannot be read"),  # under a file: unreadable whoever runs it
    )
    for name, fragment in cases:
        credentials = Credentials(
            {"TOKEN": FileSource("TOKEN", str(tmp_path / name), "TOKEN_FILE")}
        )
        with pytest.raises(ConfigError) as caught:
            credentials.load()
        assert str(caught.value).startswith("TOKEN_FILE: ") and fragment in str(caught.value)


async def test_a_file_that_goes_missing_keeps_its_last_value(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("tok-1")
    credential = file_credential(path)
    credential.load()
    path.unlink()
    assert await credential.value() == "tok-1"
    assert credential.failure is not None and "does not exist" in credential.failure
    never_read = file_credential(path)
    with pytest.raises(CredentialUnavailable):
        await never_read.value()


# -- a token endpoint ----------------------------------------------------------------------


class TokenEndpoint:
    """A token endpoint behind an ``httpx.MockTransport``: counts requests, can be down."""

    def __init__(self, lifetime: float = 5.0) -> None:
        self.lifetime = lifetime
        self.requests: list[httpx.Request] = []
        self.down = False
        self.delay = 0.0

    async def handle(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        if self.delay:
            await asyncio.sleep(self.delay)
        if self.down:
            return httpx.Response(503, json={"error": "temporarily_unavailable"})
        number = len(self.requests)
        return httpx.Response(
            200,
            json={
                "access_token": f"tok-{number}",
                "token_type": "bearer",
                "expires_in": self.lifetime,
            },
        )


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def minted(endpoint: TokenEndpoint, clock: Clock) -> MintedCredential:
    source = ClientCredentialsSource(
        variable="API",
        token_url="https://auth.example.com/token",
        client_id="worker one",
        client_secret=EnvSource("API_CLIENT_SECRET"),
        scope="events:read",
    )
    credentials = Credentials(
        {"API": source},
        http=httpx.AsyncClient(transport=httpx.MockTransport(endpoint.handle)),
        environ={"API_CLIENT_SECRET": CLIENT_SECRET},
    )
    credential = credentials.get("API")
    assert isinstance(credential, MintedCredential)
    credential.clock = clock
    credential.rand = lambda: 0.5
    return credential


async def test_one_token_request_however_many_streams_ask() -> None:
    endpoint, clock = TokenEndpoint(), Clock()
    endpoint.delay = 0.05
    credential = minted(endpoint, clock)
    values = await asyncio.gather(*(credential.value() for _ in range(50)))
    assert set(values) == {"tok-1"} and len(endpoint.requests) == 1
    assert credential.header_value("tok-1") == "Bearer tok-1"
    request = endpoint.requests[0]
    assert request.url == "https://auth.example.com/token"
    assert dict(httpx.QueryParams(request.content.decode())) == {
        "grant_type": "client_credentials",
        "scope": "events:read",
    }
    user = base64.b64decode(request.headers["authorization"].split()[1]).decode()
    assert user == f"worker one:{CLIENT_SECRET}"
    credential.close()


async def test_refreshed_in_the_background_at_80_percent_and_once_after_a_401() -> None:
    endpoint, clock = TokenEndpoint(lifetime=5.0), Clock()
    credential = minted(endpoint, clock)
    assert await credential.value() == "tok-1"
    clock.now += 3.9
    assert await credential.value() == "tok-1" and len(endpoint.requests) == 1
    clock.now += 0.2  # past 4.0 s: the current token is sent, a new one is asked for
    assert await credential.value() == "tok-1"
    await asyncio.sleep(0.01)
    assert len(endpoint.requests) == 2 and await credential.value() == "tok-2"
    # a 401 with the current token mints a new one; with an older one it does not
    assert await credential.renew("tok-2") and await credential.value() == "tok-3"
    assert await credential.renew("tok-2") and len(endpoint.requests) == 3
    assert credential.refreshes == 3
    credential.close()


async def test_while_the_endpoint_is_down_the_cached_token_serves_then_streams_wait() -> None:
    endpoint, clock = TokenEndpoint(lifetime=5.0), Clock()
    credential = minted(endpoint, clock)
    assert await credential.value() == "tok-1"
    endpoint.down = True
    clock.now += 4.2
    assert await credential.value() == "tok-1"  # refresh due: asked, failed
    await asyncio.sleep(0.01)
    assert len(endpoint.requests) == 2 and credential.failure is not None
    assert "HTTP 503" in credential.failure and "API_TOKEN_URL" in credential.failure
    clock.now += 0.2
    assert await credential.value() == "tok-1"  # still valid; not asked again within 1 s
    assert len(endpoint.requests) == 2
    clock.now += 0.5  # 4.9 s: past its usable life
    with pytest.raises(CredentialUnavailable) as caught:
        await credential.value()
    assert caught.value.retry_after >= 1.0 and CLIENT_SECRET not in str(caught.value)
    requests = len(endpoint.requests)
    for _ in range(20):  # many connections meanwhile: the endpoint is not asked for each
        with pytest.raises(CredentialUnavailable):
            await credential.value()
    assert len(endpoint.requests) == requests
    endpoint.down = False
    clock.now += 30
    assert (await credential.value()).startswith("tok-") and credential.failure is None
    credential.close()


def test_the_token_url_must_be_https() -> None:
    one_line_error(
        {
            "SSE_SECRETS": "API@e.example.com",
            "API_TOKEN_URL": "http://auth.example.com/token?key=abc",
            "API_CLIENT_ID": "x",
            "API_CLIENT_SECRET": CLIENT_SECRET,
        },
        "API_TOKEN_URL",
        "https://",
    )


def test_the_view_names_never_values(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("file-secret-value")
    credentials = Credentials({"T": FileSource("T", str(path), "T_FILE")})
    credentials.load()
    credentials.refused(["T"], status_code=401, stream="s1")
    [view] = credentials.views(["T", "T"])
    text = json.dumps(view.__dict__)
    assert view.form == "file" and view.refreshes == 1 and "HTTP 401" in (view.auth_failure or "")
    assert "file-secret-value" not in text


def test_the_status_shows_each_credential_from_the_live_progress() -> None:
    view = CredentialView(
        variable="API",
        form="oauth2",
        refreshed_at="2026-01-02T08:12:01+00:00",
        refreshes=3,
        auth_failure="HTTP 401 from stream 's1' at 2026-01-02T08:11:59+00:00",
    )
    progress = parse_progress(progress_json(ConnectionProgress(connection=2, credentials=[view])))
    assert progress is not None and progress.credentials == [view]
    assert credentials_text([dataclasses.asdict(view)]) == "API oauth2 08:12:01 401 08:11:59"
    assert credentials_text(None) == "-"
