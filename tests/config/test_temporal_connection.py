"""Reaching Temporal the way the ``temporal`` CLI does, and failing in one line.

The target comes from ``temporalio.envconfig`` (environment and temporal.toml profiles).
The TLS tests put a TLS terminator with a self-signed CA (made here with
``cryptography``) in front of a real dev server (``temporal server start-dev`` has no
TLS flags of its own): server-verified TLS, then mutual TLS, are reached with the
``temporal`` CLI's variables; a wrong CA, a missing client certificate, a wrong
namespace and a server that does not answer each give one line naming the address and
the namespace, never a traceback, from the CLI and from the worker.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import ipaddress
import os
import socket
import ssl
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from temporalio.testing import WorkflowEnvironment

from durable_sse import worker as worker_module
from durable_sse.config.settings import Settings
from durable_sse.config.temporal import load_target
from durable_sse.errors import ConfigError
from durable_sse.ops.temporal_client import TemporalConnectionError, connect

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``durable-sse`` in a clean environment: only these Temporal variables, no user
    temporal.toml (HOME points at an empty folder)."""
    environ = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("TEMPORAL_") and k != "DURABLE_SSE_PAYLOAD_KEY"
    }
    return subprocess.run(
        [sys.executable, "-m", "durable_sse.ops.cli", *args],
        env={**environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )


def one_line(done: subprocess.CompletedProcess[str], code: int = 1) -> str:
    assert done.returncode == code, done
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "Traceback" not in done.stderr
    return lines[0]


# --- the configuration, no server ----------------------------------------------------------


def test_environment_variables_are_read_like_the_temporal_cli(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\n-----END CERTIFICATE-----\n")
    target = load_target(
        {
            "HOME": str(tmp_path),
            "TEMPORAL_ADDRESS": "ns.acct.tmprl.cloud:7233",
            "TEMPORAL_NAMESPACE": "ns.acct",
            "TEMPORAL_TLS_SERVER_CA_CERT_PATH": str(ca),
            "TEMPORAL_TLS_SERVER_NAME": "ns.acct.tmprl.cloud",
        }
    )
    assert (target.address, target.namespace) == ("ns.acct.tmprl.cloud:7233", "ns.acct")
    assert target.tls.domain == "ns.acct.tmprl.cloud"  # type: ignore[union-attr]
    assert target.tls.server_root_ca_cert == ca.read_bytes()  # type: ignore[union-attr]
    keyed = load_target({"HOME": str(tmp_path), "TEMPORAL_API_KEY": "sekrit"})
    assert keyed.tls is True and keyed.api_key == "sekrit"  # an API key never goes in clear
    assert "sekrit" not in repr(keyed) and "sekrit" not in keyed.describe()
    plain = load_target({"HOME": str(tmp_path)})
    assert (plain.address, plain.namespace, plain.tls) == ("localhost:7233", "default", False)


def test_profiles_of_temporal_toml(tmp_path: Path) -> None:
    config = tmp_path / "temporal.toml"
    config.write_text(
        '[profile.default]\naddress = "localhost:7233"\n\n'
        '[profile.prod]\naddress = "temporal.prod:7233"\nnamespace = "streams"\n'
        'api_key = "k"\n'
    )
    env = {"HOME": str(tmp_path), "TEMPORAL_CONFIG_FILE": str(config)}
    assert load_target(env).address == "localhost:7233"
    prod = load_target(env, profile="prod")
    assert (prod.address, prod.namespace, prod.tls, prod.profile) == (
        "temporal.prod:7233",
        "streams",
        True,
        "prod",
    )
    assert load_target({**env, "TEMPORAL_PROFILE": "prod"}).namespace == "streams"
    # The environment overrides the profile, as for the temporal CLI.
    overridden = load_target({**env, "TEMPORAL_NAMESPACE": "other"}, profile="prod")
    assert overridden.namespace == "other"
    assert Settings.from_env(env, profile="prod").temporal == prod
    assert prod.describe() == "Temporal at temporal.prod:7233 (namespace streams, profile prod)"


@pytest.mark.parametrize(
    ("env", "profile", "message"),
    [
        ({}, "nope", "profile 'nope': Profile 'nope' not found"),
        ({"TEMPORAL_PROFILE": "nope"}, None, "profile 'nope'"),
        ({"TEMPORAL_CONFIG_FILE": "{tmp}/absent.toml"}, None, "TEMPORAL_CONFIG_FILE names no"),
        ({"TEMPORAL_CONFIG_FILE": "{tmp}/broken.toml"}, None, "TOML parse error"),
        ({"TEMPORAL_TLS_SERVER_CA_CERT_PATH": "{tmp}/no-ca.pem"}, None, "cannot read"),
        ({"TEMPORAL_ADDRESS": "no-port"}, None, "TEMPORAL_ADDRESS must be host:port"),
        ({"TEMPORAL_NAMESPACE": " "}, None, "TEMPORAL_NAMESPACE is set but empty"),
    ],
)
def test_a_bad_client_configuration_is_one_line(
    tmp_path: Path, env: dict[str, str], profile: str | None, message: str
) -> None:
    (tmp_path / "broken.toml").write_text("[profile.prod\naddress = ")
    env = {k: v.format(tmp=tmp_path) for k, v in env.items()}
    with pytest.raises(ConfigError) as refused:
        Settings.from_env({"HOME": str(tmp_path), **env}, profile=profile)
    assert message in str(refused.value) and "\n" not in str(refused.value)
    # The CLI: exit 2, one line, nothing contacted.
    args = ["status", *(["--profile", profile] if profile else [])]
    line = one_line(cli(*args, env={"HOME": str(tmp_path), **env}), code=2)
    assert message in line


def test_every_command_takes_a_profile_and_lists_the_temporal_variables() -> None:
    for command in ("worker", "start", "status", "replay", "pause", "resume", "stop"):
        done = cli(command, "--help", env={})
        assert done.returncode == 0, done.stderr
        assert "--profile NAME" in done.stdout, command
        for variable in (
            "TEMPORAL_ADDRESS",
            "TEMPORAL_NAMESPACE",
            "TEMPORAL_API_KEY",
            "TEMPORAL_TLS_CLIENT_CERT_PATH",
            "TEMPORAL_TLS_SERVER_CA_CERT_PATH",
            "TEMPORAL_PROFILE",
        ):
            assert variable in done.stdout, (command, variable)
    dev = cli("dev", "--help", env={})
    assert "--profile NAME" in dev.stdout and "TEMPORAL_PROFILE" in dev.stdout


# --- a real dev server: wrong namespace, unreachable ----------------------------------------


async def test_a_wrong_namespace_is_one_line_naming_it(
    temporal: WorkflowEnvironment, address: str, tmp_path: Path
) -> None:
    env = {"HOME": str(tmp_path), "TEMPORAL_ADDRESS": address, "TEMPORAL_NAMESPACE": "nope"}
    line = one_line(await asyncio.to_thread(cli, "status", env=env))
    assert line == (
        f"durable-sse: Temporal at {address} (namespace nope): namespace 'nope' does not "
        "exist there"
    )
    # The worker gives up at once (waiting will not create a namespace), in one line.
    settings = Settings.from_env(env)
    loop = asyncio.get_running_loop()
    began = loop.time()
    with pytest.raises(SystemExit) as ended:
        await worker_module.connect_client(settings, timeout=30)
    assert loop.time() - began < 10
    assert str(ended.value) == f"durable-sse worker: {line.removeprefix('durable-sse: ')}"
    # The right namespace works.
    done = await asyncio.to_thread(cli, "status", env={**env, "TEMPORAL_NAMESPACE": "default"})
    assert done.returncode == 0, done.stderr


async def test_an_unreachable_server_is_one_line_naming_address_and_namespace(
    tmp_path: Path,
) -> None:
    port = free_port()
    env = {"HOME": str(tmp_path), "TEMPORAL_ADDRESS": f"127.0.0.1:{port}"}
    line = one_line(await asyncio.to_thread(cli, "status", env=env))
    assert line.startswith(
        f"durable-sse: cannot reach Temporal at 127.0.0.1:{port} (namespace default): "
    )
    with pytest.raises(SystemExit) as ended:
        await worker_module.connect_client(Settings.from_env(env), timeout=1)
    text = str(ended.value)
    assert "\n" not in text and text.startswith(
        f"durable-sse worker: gave up waiting for Temporal at 127.0.0.1:{port} (namespace default)"
    )


# --- TLS: a self-signed CA, a TLS terminator in front of a dev server -----------------------


@dataclass
class Pki:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    other_ca: Path
    """A CA that signed nothing here (the wrong one to trust)."""


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )


def _certificate(
    subject: str,
    key: ec.EllipticCurvePrivateKey,
    *,
    issuer: tuple[x509.Certificate, ec.EllipticCurvePrivateKey] | None = None,
    ca: bool = False,
    server: bool = False,
) -> x509.Certificate:
    now = dt.datetime.now(dt.UTC)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(issuer[0].subject if issuer else name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if ca:
        builder = builder.add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
    else:
        usage = x509.oid.ExtendedKeyUsageOID
        builder = builder.add_extension(
            x509.ExtendedKeyUsage([usage.SERVER_AUTH if server else usage.CLIENT_AUTH]),
            critical=False,
        )
    if server:
        builder = builder.add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
    signer = issuer[1] if issuer else key
    return builder.sign(signer, hashes.SHA256())


def make_pki(folder: Path) -> Pki:
    def pem(path: Path, cert: x509.Certificate) -> Path:
        path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        return path

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = _certificate("durable-sse test CA", ca_key, ca=True)
    server_key = ec.generate_private_key(ec.SECP256R1())
    server = _certificate("localhost", server_key, issuer=(ca, ca_key), server=True)
    client_key = ec.generate_private_key(ec.SECP256R1())
    client = _certificate("durable-sse worker", client_key, issuer=(ca, ca_key))
    other_key = ec.generate_private_key(ec.SECP256R1())
    other = _certificate("someone else's CA", other_key, ca=True)
    _write_key(folder / "server.key", server_key)
    _write_key(folder / "client.key", client_key)
    return Pki(
        ca=pem(folder / "ca.pem", ca),
        server_cert=pem(folder / "server.pem", server),
        server_key=folder / "server.key",
        client_cert=pem(folder / "client.pem", client),
        client_key=folder / "client.key",
        other_ca=pem(folder / "other-ca.pem", other),
    )


class TlsTerminator:
    """TLS on a free port, plain bytes to the dev server behind it (gRPC is HTTP/2 either
    way). ``mutual``: a client certificate signed by the CA is required."""

    def __init__(self, pki: Pki, backend: str, *, mutual: bool) -> None:
        self.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.context.load_cert_chain(pki.server_cert, pki.server_key)
        self.context.set_alpn_protocols(["h2"])
        if mutual:
            self.context.verify_mode = ssl.CERT_REQUIRED
            self.context.load_verify_locations(pki.ca)
        host, _, port = backend.rpartition(":")
        self.backend = (host, int(port))
        self.server: asyncio.base_events.Server | None = None

    async def __aenter__(self) -> str:
        self.server = await asyncio.start_server(
            self._serve, "127.0.0.1", 0, ssl=self.context, ssl_handshake_timeout=5
        )
        return f"127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            back_reader, back_writer = await asyncio.open_connection(*self.backend)
        except OSError:
            writer.close()
            return

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            except (OSError, ConnectionError, ssl.SSLError):
                pass
            finally:
                dst.close()

        await asyncio.gather(pipe(reader, back_writer), pipe(back_reader, writer))


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return make_pki(tmp_path)


@pytest.fixture
async def tls_address(temporal: WorkflowEnvironment, address: str, pki: Pki) -> AsyncIterator[str]:
    async with TlsTerminator(pki, address, mutual=False) as front:
        yield front


@pytest.fixture
async def mtls_address(temporal: WorkflowEnvironment, address: str, pki: Pki) -> AsyncIterator[str]:
    async with TlsTerminator(pki, address, mutual=True) as front:
        yield front


async def test_tls_with_a_self_signed_ca(tls_address: str, pki: Pki, tmp_path: Path) -> None:
    env = {
        "HOME": str(tmp_path),
        "TEMPORAL_ADDRESS": tls_address,
        "TEMPORAL_TLS_SERVER_CA_CERT_PATH": str(pki.ca),
        "TEMPORAL_TLS_SERVER_NAME": "localhost",
    }
    client = await connect(load_target(env))
    assert client.namespace == "default"
    done = await asyncio.to_thread(cli, "status", env=env)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr

    # The system's roots do not know our CA; nor does another CA; plaintext is refused.
    lines: list[str] = []
    for wrong in (
        {"TEMPORAL_TLS": "true", "TEMPORAL_TLS_SERVER_NAME": "localhost"},
        {
            "TEMPORAL_TLS_SERVER_CA_CERT_PATH": str(pki.other_ca),
            "TEMPORAL_TLS_SERVER_NAME": "localhost",
        },
        {},
    ):
        bad = {"HOME": str(tmp_path), "TEMPORAL_ADDRESS": tls_address, **wrong}
        line = one_line(await asyncio.to_thread(cli, "status", env=bad))
        assert line.startswith(
            f"durable-sse: cannot reach Temporal at {tls_address} (namespace default): "
        ), line
        with pytest.raises(TemporalConnectionError) as failed:
            await connect(load_target(bad), timeout=5)
        lines.append(line)
        assert "\n" not in str(failed.value) and tls_address in str(failed.value)
    system_roots, other_ca, plaintext = lines
    assert "UnknownIssuer" in system_roots and "(a TLS failure: check" in system_roots
    assert "UnknownIssuer" in other_ca and "(a TLS failure: check" in other_ca
    assert plaintext.count(tls_address) == 1  # one line, whatever the transport said


async def test_mutual_tls_with_the_temporal_cli_variables_and_a_profile(
    mtls_address: str, pki: Pki, tmp_path: Path
) -> None:
    config = tmp_path / "temporal.toml"
    config.write_text(
        f'[profile.secure]\naddress = "{mtls_address}"\nnamespace = "default"\n\n'
        f'[profile.secure.tls]\nserver_name = "localhost"\nserver_ca_cert_path = "{pki.ca}"\n'
        f'client_cert_path = "{pki.client_cert}"\nclient_key_path = "{pki.client_key}"\n'
    )
    env = {"HOME": str(tmp_path), "TEMPORAL_CONFIG_FILE": str(config)}
    done = await asyncio.to_thread(cli, "status", "--profile", "secure", env=env)
    assert done.returncode == 0, done.stderr
    done = await asyncio.to_thread(cli, "status", env={**env, "TEMPORAL_PROFILE": "secure"})
    assert done.returncode == 0, done.stderr
    # The worker reaches it the same way.
    client = await worker_module.connect_client(
        Settings.from_env(env, profile="secure"), timeout=10
    )
    assert client.namespace == "default"

    # Without the client certificate the server refuses the handshake: one line.
    no_cert = {
        "HOME": str(tmp_path),
        "TEMPORAL_ADDRESS": mtls_address,
        "TEMPORAL_TLS_SERVER_CA_CERT_PATH": str(pki.ca),
        "TEMPORAL_TLS_SERVER_NAME": "localhost",
    }
    line = one_line(await asyncio.to_thread(cli, "status", env=no_cert))
    assert line.startswith(
        f"durable-sse: cannot reach Temporal at {mtls_address} (namespace default)"
    )
    with pytest.raises(SystemExit) as ended:
        await worker_module.connect_client(Settings.from_env(no_cert), timeout=1)
    assert "\n" not in str(ended.value) and mtls_address in str(ended.value)


async def test_dev_uses_the_temporal_a_profile_names_instead_of_starting_one(
    tmp_path: Path,
) -> None:
    from durable_sse.ops.dev import DevOptions, DevStack, start_temporal

    stack = DevStack(DevOptions(state_dir=tmp_path, profile="cloud"))
    assert await start_temporal(stack, {}) == (None, None)
    assert stack.processes == []  # nothing started
