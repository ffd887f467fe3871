"""Durations: the one parser, formatter and bounds every setting shares.

A duration is seconds (a number) or a string such as ``"250ms"``, ``"45"``, ``"5m"``,
``"2h"``, ``"7d"``, in TOML, workflow input, signals and the environment alike. The
retention bounds live here too, since a stream's ``retention`` and the worker's
``DURABLE_SSE_RETENTION`` are the same setting with one rule.
"""

from __future__ import annotations

import math
import re
from typing import Annotated

import pydantic
from pydantic import PlainValidator
from pydantic_core import PydanticCustomError

from durable_sse.errors import ConfigError

MINUTE = 60.0
HOUR = 3600.0
DAY = 86400.0

RETENTION_ENV = "DURABLE_SSE_RETENTION"
MIN_RETENTION = MINUTE
MAX_RETENTION = 36_500 * DAY


def setting_error(reason: str) -> PydanticCustomError:
    """A refusal of one setting, with ``reason`` as its whole message."""
    # The reason goes through the context: pydantic formats ``{…}`` in the template,
    # and reasons quote user text (an RE2 error can contain ``{1001}``).
    return PydanticCustomError("durable_sse", "{reason}", {"reason": reason})


_DURATION = re.compile(r"\s*(\d{1,12}(?:\.\d{1,9})?)\s*(ms|s|m|h|d)?\s*\Z")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": MINUTE, "h": HOUR, "d": DAY, None: 1.0}


def parse_duration(value: object) -> float:
    """Seconds from a number or a string such as ``"250ms"``, ``"45"``, ``"5m"``, ``"2h"``.

    Raises ValueError for anything else: booleans, negative, infinite or NaN numbers.
    Bounds are the caller's (each setting has its own).
    """
    if isinstance(value, bool):
        raise ValueError("a boolean is not a duration")
    if isinstance(value, int | float):
        try:
            seconds = float(value)
        except OverflowError:
            raise ValueError("too large") from None
    elif isinstance(value, str) and (match := _DURATION.match(value)):
        seconds = float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
    else:
        raise ValueError(f"not a duration: {value!r}")
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"not a finite, non-negative duration: {value!r}")
    return seconds


def format_duration(seconds: float) -> str:
    """``0.01`` -> ``"10ms"``, ``2592000`` -> ``"30d"``: the largest unit that is exact."""
    for unit in ("d", "h", "m", "s", "ms"):
        count = seconds / _UNIT_SECONDS[unit]
        if count >= 1 and abs(count - round(count)) < 1e-9:
            return f"{round(count)}{unit}"
    return f"{seconds:g}s"


def seconds(low: float, high: float) -> PlainValidator:
    """A duration setting between ``low`` and ``high`` seconds, inclusive."""
    expected = (
        f"expected a duration between {format_duration(low)} and {format_duration(high)} "
        '(seconds, or a string like "250ms", "5m", "2h")'
    )

    def check(value: object) -> float:
        try:
            result = parse_duration(value)
        except ValueError:
            raise setting_error(expected) from None
        if not low <= result <= high:
            raise setting_error(expected)
        return result

    # A function attribute mypy does not model; spec.DURATION_BOUNDS reads it back.
    check.bounds = (low, high)  # type: ignore[attr-defined]
    return PlainValidator(check)


RetentionSeconds = Annotated[float, seconds(MIN_RETENTION, MAX_RETENTION)]
"""A retention in seconds, a minute to 36500 days: a stream's ``retention`` and the
worker's ``DURABLE_SSE_RETENTION`` are checked by this one validator."""

_SETTING = pydantic.TypeAdapter(RetentionSeconds)


def parse_retention_setting(value: str | None, *, name: str = RETENTION_ENV) -> float | None:
    """The worker's retention in seconds (None: unset or empty, keep forever).

    Validated like a stream's ``retention`` (the same duration forms and bounds, strict:
    ``"7d"``, ``"36h"``, ``604800``), and refused in one line naming the variable.
    """
    if value is None or not value.strip():
        return None
    text = value.strip()
    try:
        return _SETTING.validate_python(float(text) if _is_number(text) else text)
    except pydantic.ValidationError as error:
        problem = error.errors(include_url=False)[0]
        reason = problem.get("ctx", {}).get("reason") or problem["msg"]
        raise ConfigError(f"{name} = {value!r}: {reason}") from None


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def effective_retention(
    stream_retention: float | None, worker_retention: float | None, replay_window: float
) -> tuple[float | None, str | None]:
    """``(seconds, source)``: the stream's own setting, else the worker's (never shorter
    than the replay window), else ``(None, None)``: keep forever."""
    if stream_retention is not None:
        return max(stream_retention, replay_window), "stream"
    if worker_retention is not None:
        return max(worker_retention, replay_window), "worker"
    return None, None
