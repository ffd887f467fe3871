"""The ``replay`` signal: its payload (:class:`ReplaySignal`) and its one parser.

``ReplaySignal`` is what the workflow receives (Temporal's data converter decodes it
without running a validator), so it stays a plain dataclass of JSON values; new fields
always get defaults. :func:`parse_replay_signal` holds every rule a payload must meet,
the same for the CLI, the control API and the workflow's signal handler.
"""

# No `from __future__ import annotations`: Temporal decodes these dataclasses, and
# string annotations make each decode several times dearer (tests/test_payload_types.py).

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any

import pydantic
from pydantic import AfterValidator, ConfigDict, ValidationError

from durable_sse.config.durations import setting_error as _fail
from durable_sse.config.spec import MAX_ID_BYTES_LIMIT
from durable_sse.errors import ConfigError
from durable_sse.redact import show_value


@dataclass
class ReplaySignal:
    """Payload of the ``replay`` signal: nothing = lagged route."""

    from_id: str | None = None
    since: str | None = None


def _check_from_id(value: str) -> str:
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError:  # a lone surrogate from JSON: no header can carry it
        raise _fail("expected an event id of valid Unicode text") from None
    if not value or size > MAX_ID_BYTES_LIMIT:
        raise _fail(f"expected a non-empty event id of at most {MAX_ID_BYTES_LIMIT} bytes")
    if any(c in value for c in "\r\n\0"):
        raise _fail("expected an event id without line breaks or NUL (an SSE id cannot hold them)")
    return value


def _check_since(value: str) -> str:
    expected = (
        "expected an ISO 8601 time with Z or a UTC offset, e.g. 2026-05-01T12:00:00Z "
        "(no time zone is assumed)"
    )
    try:
        moment = datetime.fromisoformat(value.strip())
    except ValueError:
        raise _fail(expected) from None
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise _fail(expected)
    return moment.isoformat()


class _ReplayPayload(pydantic.BaseModel):
    """The ``replay`` signal's payload (:class:`ReplaySignal` is its wire form)."""

    model_config = ConfigDict(strict=True, extra="forbid")

    from_id: Annotated[str, AfterValidator(_check_from_id)] | None = None
    since: Annotated[str, AfterValidator(_check_since)] | None = None


def parse_replay_signal(value: object, *, stream: str | None = None) -> ReplaySignal:
    """The validated ``replay`` payload: None/``{}`` = lagged route, else from_id or since.

    ``since`` must carry Z or an offset (a guessed zone could replay less than asked)
    and comes back normalised (``2026-05-01T12:00:00+00:00``).

    Raises:
        ConfigError: one line naming the stream (when given), the field, the value and
            what was expected.
    """
    prefix = f"stream {show_value(stream)}: " if stream else ""
    if value is None:
        return ReplaySignal()
    if isinstance(value, ReplaySignal):
        data: dict[Any, Any] = {"from_id": value.from_id, "since": value.since}
    elif isinstance(value, Mapping):
        data = dict(value)
    else:
        raise ConfigError(
            f"{prefix}replay payload = {show_value(value)}: expected nothing (lagged route), "
            '{"from_id": ID} or {"since": ISO time}'
        )
    try:
        payload = _ReplayPayload.model_validate(data)
    except ValidationError as error:
        problem = error.errors(include_url=False)[0]
        loc = problem["loc"]
        key = str(loc[0]) if loc else "?"
        if problem["type"] == "extra_forbidden":
            expected = "expected only from_id or since"
        elif problem["type"] == "durable_sse":
            expected = problem["ctx"]["reason"]
        else:
            expected = "expected a string"
        raise ConfigError(
            f"{prefix}replay {key!r} = {show_value(problem['input'])}: {expected}"
        ) from None
    if payload.from_id is not None and payload.since is not None:
        raise ConfigError(f"{prefix}replay: expected from_id or since, not both")
    return ReplaySignal(from_id=payload.from_id, since=payload.since)
