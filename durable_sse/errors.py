"""Errors raised by durable-sse.

    DurableSSEError
    ├── ConfigError            a setting or stream declaration is invalid (names the setting),
    │   │                      or a stream names a secret the worker does not declare for
    │   │                      its host, or a workflow id does not own the stream it names
    │   └── IdOrderMismatchError  a stream's ``id_order`` is not the one its stored keys
    │                          were made with; the stream parks, retention deletes nothing
    ├── PlaintextPayloadError  (durable_sse.ops.codec; also a non-retryable ApplicationError)
    │                          an unencrypted payload where a payload key is set
    ├── StoreError             a store (database, Redis) could not be reached or refused a write
    │   └── BatchRefusedError  the database refused a batch for its own rows (a trigger, a
    │                          constraint, a value it cannot hold); the stream parks
    ├── EmbeddedServiceError   a throwaway PostgreSQL or redis-server could not start or stop
    ├── ConsumerError          a consumer of the log (durable_sse.consume) cannot go on
    │   └── LeaseLostError     an acknowledgement from a process that no longer owns the
    │                          stream (its lease expired, another took it over): refused
    └── StreamError            the SSE server or the bytes it sent cannot be consumed
        ├── LineTooLongError   a line exceeded ``max_line_bytes``
        ├── EventTooLargeError one event's data exceeded ``max_event_bytes``
        ├── IdTooLongError     an event id exceeded ``max_id_bytes``
        ├── UnsendableIdError  an id cannot be sent back to resume (a header cannot carry it)
        └── StreamRefusedError the server refused the stream for good (401/403/404/410,
            │                  wrong content type, cross-origin redirect); retrying cannot help
            └── CredentialsRefusedError  401 (or 403 invalid_token): the credentials
                               sent were refused; new ones are worth one retry, else it parks

Activities translate these into ``temporalio.exceptions.ApplicationError`` with the class
name as the error type, so workflows can tell them apart without importing this module.
"""

from __future__ import annotations

from typing import Any


class DurableSSEError(Exception):
    """Base class of every error durable-sse raises on purpose."""


class ConfigError(DurableSSEError, ValueError):
    """An invalid setting; the message names the stream (if any) and the setting."""


class IdOrderMismatchError(ConfigError):
    """A stream's ``id_order`` differs from the one recorded in ``sse_checkpoints``.

    Every key stored for the stream (``sse_events.id_key``, the lagging id's key, the
    retention horizon) was made under the recorded order; compared with keys made under
    another, new ids pass for duplicates and retention's fence sorts where it should not.
    Retrying cannot help: the stream parks until it is started with the recorded order.

    Attributes:
        stored: the order the stream's keys were made with.
        wanted: the order the caller asked for.
    """

    def __init__(self, message: str, *, stored: str, wanted: str) -> None:
        super().__init__(message)
        self.stored = stored
        self.wanted = wanted


class StoreError(DurableSSEError):
    """A store could not be reached or refused an operation."""


class BatchRefusedError(StoreError):
    """The database refused one batch for what its rows hold; the other streams' rows of
    its group committed. Writing the same rows again would be refused again, so the
    stream parks with this message until someone changes the database and resumes it."""


class EmbeddedServiceError(DurableSSEError):
    """A throwaway server from a wheel (tests, ``dev --postgres``) could not start or stop."""


class ConsumerError(DurableSSEError):
    """A consumer of the log cannot do what was asked (see :mod:`durable_sse.consume`)."""


class LeaseLostError(ConsumerError):
    """An acknowledgement came from a process that no longer owns the stream: its lease
    expired, and another process may have taken the stream over. Nothing moved; the batch
    is delivered again (at least once: the handler's effect must be idempotent)."""


class StreamError(DurableSSEError):
    """The SSE server or the bytes it sent cannot be consumed."""


class LineTooLongError(StreamError):
    """A line grew past ``max_line_bytes``; the connection is ended to bound memory.

    Attributes:
        items: what the decoder completed in the same chunk before the long line.
    """

    def __init__(self, message: str, *, items: list[Any] | None = None) -> None:
        super().__init__(message)
        self.items: list[Any] = items or []


class EventTooLargeError(StreamError):
    """One event's data grew past ``max_event_bytes``; the connection is ended to bound
    memory, and the cursor stays before that event.

    Attributes:
        items: what the decoder completed in the same chunk before the event (events and
            comments, in stream order), so a caller can still commit them.
    """

    def __init__(self, message: str, *, items: list[Any] | None = None) -> None:
        super().__init__(message)
        self.items: list[Any] = items or []


class IdTooLongError(StreamError):
    """An event id was longer than ``max_id_bytes``: such an id cannot become a cursor.

    Raised when the event carrying it is dispatched (the id would be committed then).

    Attributes:
        items: what the decoder completed in the same chunk before that event.
    """

    def __init__(self, message: str, *, items: list[Any] | None = None) -> None:
        super().__init__(message)
        self.items: list[Any] = items or []


class UnsendableIdError(StreamError):
    """An id cannot be sent back to the server to resume from it exactly.

    ``Last-Event-ID`` is an HTTP header: an id with a leading or trailing space or tab, or
    with NUL, CR, LF, VT or FF, cannot be carried by it (HTTP clients refuse such a header,
    and trimming it would resume from another id). Retrying cannot help.
    """


class StreamRefusedError(StreamError):
    """The server refused the stream in a way that retrying cannot fix."""


class CredentialsRefusedError(StreamRefusedError):
    """The server refused the credentials sent (``401``, or ``403`` with
    ``error="invalid_token"``). The reader re-reads or refreshes the stream's secrets and
    reconnects once when one changed; otherwise (or on a second refusal) the stream parks
    with a message naming the secrets, never their values.

    Attributes:
        status_code: the status the server answered with.
    """

    def __init__(self, message: str, *, status_code: int) -> None:
        super().__init__(message)
        self.status_code = status_code
