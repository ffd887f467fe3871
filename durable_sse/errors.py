"""Errors raised by durable-sse.

    DurableSSEError
    ├── ConfigError            a setting or stream declaration is invalid (names the setting)
    ├── StoreError             a store (database, Redis) could not be reached or refused a write
    ├── EmbeddedServiceError   a throwaway PostgreSQL or redis-server could not start or stop
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


class EmbeddedServiceError(DurableSSEError):
    """A throwaway server from a wheel (tests, ``dev --postgres``) could not start or stop."""


class StreamError(DurableSSEError):
    """The SSE server or the bytes it sent cannot be consumed."""


class LineTooLongError(StreamError):
    """A line grew past ``max_line_bytes``; the connection is ended to bound memory."""


class StreamRefusedError(StreamError):
    """The server refused the stream in a way that retrying cannot fix."""
