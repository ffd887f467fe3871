"""Errors raised by durable-sse.

    DurableSSEError
    ├── ConfigError            a setting or stream declaration is invalid (names the setting),
    │                          or a stream names a secret the worker does not declare for
    │                          its host, or a workflow id does not own the stream it names
    ├── PlaintextPayloadError  (durable_sse.codec; also a non-retryable ApplicationError)
    │                          an unencrypted payload where a payload key is set
    ├── StoreError             a store (database, Redis) could not be reached or refused a write
    └── StreamError            the SSE server or the bytes it sent cannot be consumed
        ├── LineTooLongError   a line exceeded ``max_line_bytes``
        └── StreamRefusedError the server refused the stream for good (401/403/404/410,
                               wrong content type, cross-origin redirect); retrying cannot help

Activities translate these into ``temporalio.exceptions.ApplicationError`` with the class
name as the error type, so workflows can tell them apart without importing this module.
"""

from __future__ import annotations


class DurableSSEError(Exception):
    """Base class of every error durable-sse raises on purpose."""


class ConfigError(DurableSSEError, ValueError):
    """An invalid setting; the message names the stream (if any) and the setting."""


class StoreError(DurableSSEError):
    """A store could not be reached or refused an operation."""


class StreamError(DurableSSEError):
    """The SSE server or the bytes it sent cannot be consumed."""


class LineTooLongError(StreamError):
    """A line grew past ``max_line_bytes``; the connection is ended to bound memory."""


class StreamRefusedError(StreamError):
    """The server refused the stream in a way that retrying cannot fix."""
