"""Connecting to Temporal, with one-line failures.

Where Temporal is and how to authenticate is configuration
(:mod:`durable_sse.config.temporal`); this module connects to that target. Every failure
is one line naming the address and the namespace (never the API key), and a namespace
that does not exist is told apart from a server that does not answer.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

from temporalio.api.workflowservice.v1 import DescribeNamespaceRequest
from temporalio.client import Client
from temporalio.converter import DataConverter
from temporalio.runtime import Runtime
from temporalio.service import RPCError, RPCStatusCode

from durable_sse.config.temporal import TemporalTarget, one_line
from durable_sse.errors import DurableSSEError

CONNECT_TIMEOUT = 10.0


class TemporalConnectionError(DurableSSEError):
    """Temporal did not answer, refused the TLS handshake or the credentials, or has no
    such namespace."""


class NamespaceNotFoundError(TemporalConnectionError):
    """The server answered, but has no such namespace (waiting will not create it)."""


async def connect(
    target: TemporalTarget,
    *,
    data_converter: DataConverter | None = None,
    runtime: Runtime | None = None,
    timeout: float = CONNECT_TIMEOUT,
) -> Client:
    """A client of ``target`` whose namespace exists.

    ``Client.connect`` alone checks neither the namespace nor (lazily) much else: a
    wrong namespace would only show later as "no such workflow". So the namespace is
    described once here (a key allowed to use the namespace but not to describe it is
    let through: the first real call will tell).

    Raises:
        TemporalConnectionError: one line naming the address and the namespace.
    """
    options = target.connect_options()
    if data_converter is not None:
        options["data_converter"] = data_converter
    if runtime is not None:
        options["runtime"] = runtime
    try:
        client = await asyncio.wait_for(Client.connect(target.address, **options), timeout)
    except TimeoutError:
        raise TemporalConnectionError(
            f"cannot reach {target.describe()}: no answer within {timeout:g} s"
        ) from None
    except (RuntimeError, RPCError, OSError) as error:
        raise TemporalConnectionError(
            f"cannot reach {target.describe()}: {_explain(error, target)}"
        ) from None
    try:
        await client.workflow_service.describe_namespace(
            DescribeNamespaceRequest(namespace=target.namespace),
            timeout=timedelta(seconds=timeout),
        )
    except RPCError as error:
        if error.status is RPCStatusCode.NOT_FOUND:
            raise NamespaceNotFoundError(
                f"{target.describe()}: namespace {target.namespace!r} does not exist there"
            ) from None
        if error.status is not RPCStatusCode.PERMISSION_DENIED:
            raise TemporalConnectionError(
                f"cannot use {target.describe()}: {_explain(error, target)}"
            ) from None
    return client


def _explain(error: BaseException, target: TemporalTarget) -> str:
    """The reason in one line, with a hint for the usual TLS mistakes."""
    text = one_line(error)
    lowered = text.lower()
    hints = []
    if any(word in lowered for word in ("certificate", "tls", "handshake", "ssl", "x509")):
        hints.append(
            "a TLS failure: check TEMPORAL_TLS_SERVER_CA_CERT_PATH / TEMPORAL_TLS_SERVER_NAME"
            " and the client certificate"
        )
    elif target.tls is False and any(
        word in lowered for word in ("connection reset", "broken pipe", "transport error", "eof")
    ):
        hints.append("does the server expect TLS? set TEMPORAL_TLS=true or a TLS profile")
    if isinstance(error, RPCError) and error.status is RPCStatusCode.UNAUTHENTICATED:
        hints.append("check TEMPORAL_API_KEY or the client certificate")
    return text + (f" ({'; '.join(hints)})" if hints else "")
