"""Optional payload encryption: AES-256-GCM over every Temporal payload.

Stream URLs, header names and failure messages (which can name hosts) all land in
Temporal history, which anyone with Web UI access can read. With
``DURABLE_SSE_PAYLOAD_KEY`` set, the worker and the clients encrypt every payload and
every failure's message and stack trace before they leave the process; unset, nothing
changes.

With the key set, a payload that arrives *unencrypted* is refused, not passed through:
otherwise a client without the key could start workflows (and put plaintext in history)
at will. The codec cannot fail a workflow by itself (an error while decoding fails only
the workflow *task*, which Temporal retries for ever, and a signal's payload would wedge
the workflow it was sent to), so :meth:`EncryptionCodec.decode` replaces the payload with
a *refusal* (encoding ``binary/plaintext-refused``, data = the reason) and
:class:`SealedPayloadConverter` raises :class:`PlaintextPayloadError` (a non-retryable
``ApplicationError``) when something tries to use it. The SDK then does the right thing
per kind: plaintext workflow input fails the workflow at once, with that reason, before
it runs a line; a plaintext signal is dropped (logged); a query or a client reading a
result gets the error. Turning encryption on therefore means restarting the streams
(``stop``, then ``start`` with the key: their cursors are in the stores); the codec
server alone passes plaintext through, for display.

An encrypted payload is ``nonce (12 bytes) || ciphertext+tag`` of the serialized
original payload, with metadata ``encoding: binary/encrypted`` and
``encryption-key-id`` (first 8 hex of the key's SHA-256) so a wrong key is reported
as such instead of as a bare authentication failure.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import hashlib
import logging
import os
import re
from collections.abc import Mapping, Sequence

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from temporalio.api.common.v1 import Payload
from temporalio.converter import (
    CompositePayloadConverter,
    DataConverter,
    DefaultFailureConverterWithEncodedAttributes,
    DefaultPayloadConverter,
    EncodingPayloadConverter,
    PayloadCodec,
)
from temporalio.exceptions import ApplicationError

from durable_sse.config.temporal import PAYLOAD_KEY_ENV
from durable_sse.errors import ConfigError, DurableSSEError

logger = logging.getLogger(__name__)

ENCODING = b"binary/encrypted"
REFUSED_ENCODING = b"binary/plaintext-refused"
KEY_ID_METADATA = "encryption-key-id"
NONCE_BYTES = 12
KEY_BYTES = 32

_HEX_KEY = re.compile(r"[0-9a-fA-F]{64}")
_B64_KEY = re.compile(r"[A-Za-z0-9_-]{43}=?")


def parse_key(value: str) -> bytes:
    """The 32-byte key behind ``value`` (64 hex chars or urlsafe base64 of 32 bytes).

    The error never repeats ``value``: it is a secret, and error messages end up in logs.
    """
    text = value.strip()
    if _HEX_KEY.fullmatch(text):
        return bytes.fromhex(text)
    if _B64_KEY.fullmatch(text):
        try:
            key = base64.urlsafe_b64decode(text.rstrip("=") + "=")
        except (binascii.Error, ValueError):
            key = b""
        if len(key) == KEY_BYTES:
            return key
    raise ConfigError(
        f"{PAYLOAD_KEY_ENV} must be 32 bytes written as 64 hex characters or as urlsafe base64 "
        f"(got {len(text)} characters that are neither; generate one with "
        "`python -c 'from durable_sse.ops.codec import generate_key; print(generate_key())'`)"
    )


def key_id(key: bytes) -> str:
    """A short, non-secret fingerprint of ``key``: first 8 hex of its SHA-256."""
    return hashlib.sha256(key).hexdigest()[:8]


def generate_key() -> str:
    """A fresh random key, as the 64 hex characters ``DURABLE_SSE_PAYLOAD_KEY`` accepts."""
    return os.urandom(KEY_BYTES).hex()


class PlaintextPayloadError(ApplicationError, DurableSSEError):
    """A payload arrived unencrypted where a payload key is set.

    An ``ApplicationError`` (non-retryable) so that, raised while a workflow's input is
    converted, it fails that workflow instead of its task; a ``DurableSSEError`` so the
    CLI prints it as one line.
    """

    def __init__(self, message: str) -> None:
        super().__init__(message, type="PlaintextPayloadError", non_retryable=True)


class _RefusedPayloadConverter(EncodingPayloadConverter):
    """Reads the codec's refusals: raises their reason, never produces a value."""

    @property
    def encoding(self) -> str:
        return REFUSED_ENCODING.decode()

    def to_payload(self, value: object) -> Payload | None:
        return None

    def from_payload(self, payload: Payload, type_hint: type | None = None) -> object:
        raise PlaintextPayloadError(payload.data.decode(errors="replace"))


class SealedPayloadConverter(CompositePayloadConverter):
    """The default payload converter, plus the refusal of unencrypted payloads."""

    def __init__(self) -> None:
        super().__init__(
            *DefaultPayloadConverter.default_encoding_payload_converters,
            _RefusedPayloadConverter(),
        )


class EncryptionCodec(PayloadCodec):
    """AES-256-GCM payload codec; an unencrypted payload decodes to a refusal.

    ``accept_plaintext`` (the codec server only, which decodes for display) passes
    unencrypted payloads through instead.
    """

    def __init__(self, key: bytes, *, accept_plaintext: bool = False) -> None:
        if len(key) != KEY_BYTES:
            raise ConfigError(f"{PAYLOAD_KEY_ENV} must be {KEY_BYTES} bytes, got {len(key)}")
        self._aead = AESGCM(key)
        self.key_id = key_id(key)
        self.accept_plaintext = accept_plaintext

    @classmethod
    def from_env(
        cls, environ: Mapping[str, str] | None = None, *, accept_plaintext: bool = False
    ) -> EncryptionCodec | None:
        """The codec for ``DURABLE_SSE_PAYLOAD_KEY``, or None when it is unset.

        A variable that is set but empty is refused rather than read as "off": a key that
        went missing in a deployment file must not silently turn encryption off.
        """
        env = os.environ if environ is None else environ
        value = env.get(PAYLOAD_KEY_ENV)
        if value is None:
            return None
        if not value.strip():
            raise ConfigError(
                f"{PAYLOAD_KEY_ENV} is set but empty; unset it to turn encryption off"
            )
        return cls(parse_key(value), accept_plaintext=accept_plaintext)

    async def encode(self, payloads: Sequence[Payload]) -> list[Payload]:
        return [self._encrypt(payload) for payload in payloads]

    async def decode(self, payloads: Sequence[Payload]) -> list[Payload]:
        return [self._decrypt(payload) for payload in payloads]

    def _encrypt(self, payload: Payload) -> Payload:
        nonce = os.urandom(NONCE_BYTES)
        sealed = self._aead.encrypt(nonce, payload.SerializeToString(), None)
        return Payload(
            metadata={"encoding": ENCODING, KEY_ID_METADATA: self.key_id.encode()},
            data=nonce + sealed,
        )

    def _decrypt(self, payload: Payload) -> Payload:
        encoding = payload.metadata.get("encoding")
        if encoding != ENCODING:
            if self.accept_plaintext or encoding == REFUSED_ENCODING:
                return payload
            return refusal(encoding, self.key_id)
        found = payload.metadata.get(KEY_ID_METADATA, b"").decode(errors="replace")
        if found != self.key_id:
            raise ConfigError(
                f"payload was encrypted with key id {found or '(none)'!r} but {PAYLOAD_KEY_ENV} "
                f"has key id {self.key_id!r}: the worker and client need the same key"
            )
        if len(payload.data) <= NONCE_BYTES:
            raise DurableSSEError("encrypted payload is truncated")
        nonce, sealed = payload.data[:NONCE_BYTES], payload.data[NONCE_BYTES:]
        try:
            plain = self._aead.decrypt(nonce, sealed, None)
        except InvalidTag:
            raise DurableSSEError(
                f"encrypted payload (key id {found!r}) failed authentication: "
                "it was corrupted or altered"
            ) from None
        return Payload.FromString(plain)


def refusal(encoding: bytes | None, key_id: str) -> Payload:
    """What an unencrypted payload decodes to: the one-line reason, never its data."""
    shown = (encoding or b"none").decode(errors="replace")[:40]
    reason = (
        f"refused an unencrypted payload (encoding {shown!r}): {PAYLOAD_KEY_ENV} is set here "
        f"(key id {key_id}), so whoever sends payloads needs the same key"
    )
    return Payload(metadata={"encoding": REFUSED_ENCODING}, data=reason.encode())


def data_converter_from_env(environ: Mapping[str, str] | None = None) -> DataConverter:
    """The data converter for clients and workers, encrypting when the key is set.

    Failures use the encoded-attributes failure converter so their message and stack
    trace go through the codec too (both can mention hosts and URLs); the payload
    converter turns the codec's refusals of unencrypted payloads into errors.
    """
    codec = EncryptionCodec.from_env(environ)
    if codec is None:
        return DataConverter.default
    logger.info("payload encryption on (key id %s)", codec.key_id)
    return dataclasses.replace(
        DataConverter.default,
        payload_codec=codec,
        payload_converter_class=SealedPayloadConverter,
        failure_converter_class=DefaultFailureConverterWithEncodedAttributes,
    )
