"""How to reach Temporal: the configuration the ``temporal`` CLI reads.

The target comes from the SDK's environment configuration (:mod:`temporalio.envconfig`),
so the worker, the CLI and ``dev`` reach a local dev server, an mTLS cluster or Temporal
Cloud with the very settings the ``temporal`` CLI uses:

* a profile of the shared ``temporal.toml`` (``--profile`` or ``TEMPORAL_PROFILE``,
  ``default`` otherwise; the file is ``TEMPORAL_CONFIG_FILE`` or the platform's
  ``temporalio/temporal.toml`` under the user's configuration folder);
* overridden by ``TEMPORAL_ADDRESS``, ``TEMPORAL_NAMESPACE``, ``TEMPORAL_API_KEY`` (which
  turns TLS on), ``TEMPORAL_TLS``, ``TEMPORAL_TLS_CLIENT_CERT_PATH`` /
  ``TEMPORAL_TLS_CLIENT_KEY_PATH`` (mTLS), ``TEMPORAL_TLS_SERVER_CA_CERT_PATH``,
  ``TEMPORAL_TLS_SERVER_NAME`` (and the ``*_DATA`` forms), ``TEMPORAL_GRPC_META_*``;
* ``localhost:7233`` and namespace ``default`` when nothing says otherwise.

``DURABLE_SSE_PAYLOAD_KEY`` (:data:`PAYLOAD_KEY_ENV`), the key of the payload codec every
client of the task queue needs, is named here too. Connecting is
:mod:`durable_sse.ops.temporal_client`'s job.

This module imports temporalio (and so does :mod:`durable_sse.config.settings`, which
holds a target): reading ``temporal.toml`` the way the ``temporal`` CLI does is the SDK's
job (its ``envconfig`` runs in the SDK's native bridge), and a second reader of that file
could disagree with the CLI. No other module of ``config`` imports either of the two.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from temporalio.envconfig import ClientConfigProfile
from temporalio.service import TLSConfig

from durable_sse.errors import ConfigError

DEFAULT_ADDRESS = "localhost:7233"
DEFAULT_NAMESPACE = "default"

CLIENT_ENVIRONMENT = {
    "TEMPORAL_ADDRESS": "Temporal frontend, host:port (default localhost:7233, or the profile's)",
    "TEMPORAL_NAMESPACE": "Temporal namespace (default: default, or the profile's)",
    "TEMPORAL_API_KEY": "API key (Temporal Cloud); turns TLS on",
    "TEMPORAL_TLS": "true: TLS with the system's root certificates",
    "TEMPORAL_TLS_CLIENT_CERT_PATH": "client certificate for mTLS (PEM); also *_DATA",
    "TEMPORAL_TLS_CLIENT_KEY_PATH": "client private key for mTLS (PEM); also *_DATA",
    "TEMPORAL_TLS_SERVER_CA_CERT_PATH": "CA that signed the server's certificate (PEM)",
    "TEMPORAL_TLS_SERVER_NAME": "server name to verify (SNI) when it differs from the host",
    "TEMPORAL_PROFILE": "profile of temporal.toml to use (same as --profile)",
    "TEMPORAL_CONFIG_FILE": "temporal.toml to read (default: the temporal CLI's)",
}
"""What :func:`load_target` reads, as the CLI's ``--help`` lists it (the same as the
``temporal`` CLI; see ``temporal config --help``)."""

PAYLOAD_KEY_ENV = "DURABLE_SSE_PAYLOAD_KEY"
"""The payload codec's key (:mod:`durable_sse.ops.codec`): with it set, every payload and
failure message is encrypted before it leaves the process."""


@dataclass(frozen=True)
class TemporalTarget:
    """Where Temporal is and how to authenticate: what ``Client.connect`` needs."""

    address: str = DEFAULT_ADDRESS
    namespace: str = DEFAULT_NAMESPACE
    profile: str | None = None
    """The temporal.toml profile asked for (None: the default one, if any)."""
    api_key: str | None = field(default=None, repr=False)
    tls: bool | TLSConfig = field(default=False, repr=False)
    rpc_metadata: Mapping[str, str] = field(default_factory=dict, repr=False)

    def describe(self) -> str:
        """``Temporal at HOST:PORT (namespace NS[, profile P])``: no secret in it."""
        extra = f", profile {self.profile}" if self.profile else ""
        return f"Temporal at {self.address} (namespace {self.namespace}{extra})"

    def connect_options(self) -> dict[str, Any]:
        options: dict[str, Any] = {"namespace": self.namespace, "tls": self.tls}
        if self.api_key is not None:
            options["api_key"] = self.api_key
        if self.rpc_metadata:
            options["rpc_metadata"] = dict(self.rpc_metadata)
        return options


def load_target(
    environ: Mapping[str, str] | None = None, *, profile: str | None = None
) -> TemporalTarget:
    """The Temporal target from the environment and temporal.toml, as the CLI finds it.

    Raises:
        ConfigError: a profile that does not exist, an unreadable or malformed
            temporal.toml, a certificate file that cannot be read, or a malformed
            address (one line naming the variable or the file).
    """
    env = dict(os.environ if environ is None else environ)
    chosen = profile or env.get("TEMPORAL_PROFILE") or None
    config_file = env.get("TEMPORAL_CONFIG_FILE")
    if config_file is not None and not Path(config_file).is_file():
        raise ConfigError(f"TEMPORAL_CONFIG_FILE names no file: {config_file}")
    try:
        loaded = ClientConfigProfile.load(profile=chosen, override_env_vars=env)
    except Exception as error:  # noqa: BLE001 - the bridge's ConfigError is not importable
        where = f"profile {chosen!r}" if chosen else "the Temporal client configuration"
        raise ConfigError(f"{where}: {one_line(error)}") from None
    tls: bool | TLSConfig = False
    if loaded.tls is not None:
        try:
            tls = loaded.tls.to_connect_tls_config()
        except OSError as error:
            raise ConfigError(
                f"Temporal TLS: cannot read {error.filename}: {error.strerror}"
            ) from None
    elif loaded.api_key is not None:
        tls = True  # an API key never travels in the clear (as the temporal CLI does)
    address = loaded.address or DEFAULT_ADDRESS
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(
            f"TEMPORAL_ADDRESS (or the profile's address) must be host:port, got {address!r}"
        )
    namespace = loaded.namespace if loaded.namespace is not None else DEFAULT_NAMESPACE
    if not namespace.strip():
        raise ConfigError("TEMPORAL_NAMESPACE (or the profile's namespace) is set but empty")
    if loaded.api_key is not None and not loaded.api_key.strip():
        raise ConfigError("TEMPORAL_API_KEY (or the profile's api_key) is set but empty")
    return TemporalTarget(
        address=address,
        namespace=namespace,
        profile=chosen,
        api_key=loaded.api_key,
        tls=tls,
        rpc_metadata=dict(loaded.grpc_meta),
    )


def one_line(error: BaseException) -> str:
    """An error as one line of at most 400 characters (SDK errors span several)."""
    text = re.sub(r"\s+", " ", str(error)).strip() or type(error).__name__
    return text if len(text) <= 400 else text[:397] + "..."
