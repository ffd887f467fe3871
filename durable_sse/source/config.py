"""Per-stream settings of the demo/test SSE source, and their parsing.

One dataclass carries both the generator settings and the injectable faults, so the same
names work in Python (``SourceStreamConfig(rate=50)``), in JSON (``POST /streams/<name>``,
``POST /control/<name>``) and on the command line (``--stream demo:rate=20,start_id=990``).
"""

from __future__ import annotations

import dataclasses
import re
import typing
from dataclasses import dataclass
from typing import Any

from durable_sse.errors import ConfigError

STREAM_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}\Z")
FLUSH_MODES = ("event", "bulk")
STATUS_CODES = (200, 204, 301, 302, 303, 307, 308, 400, 401, 403, 404, 410, 429, 500, 502, 503)
_EVENT_TYPE = re.compile(r"[A-Za-z0-9_.:-]{1,64}\Z")
_NONE_WORDS = ("", "none", "null")


@dataclass
class SourceStreamConfig:
    """How one stream generates events and which faults it injects.

    Faults configured here are *standing* (they apply to every connection); one-shot
    faults (``drop``, ``malformed``, ``oversized``, ``disconnect``) are actions, see
    :meth:`durable_sse.source.SSESource.inject`.
    """

    rate: float = 20.0
    """Events per second; 0 (or ``"max"``) = generated on demand, as fast as readers read."""
    start_id: int = 1
    history: int = 100_000
    """Events kept for resuming (the oldest fall out first)."""
    history_age: float | None = None
    """Seconds an event stays resumable (None = no age limit)."""
    keepalive: float = 5.0
    """Seconds of idleness before a ``: keep-alive`` comment (0 = never)."""
    retry_ms: int | None = 1000
    """``retry:`` field sent at connect (None = none)."""
    payload_bytes: int = 32
    flush: str = "event"
    """``event``: write and drain per event; ``bulk``: coalesce writes up to 64 KiB."""
    event_type: str = "tick"
    id_prefix: str = ""
    """Text before each id's number (``id_prefix="café-"`` sends ``café-1``, ``café-2``…),
    to serve non-ASCII ids; a resume id must carry the same prefix."""
    cursor_param: str = "cursor"
    """Query parameter that carries the resume id (``lastEventId`` is accepted too)."""
    paused: bool = False
    """Stop generating (connections stay open and send keep-alives)."""
    drop_every: int | None = None
    """After every N events sent on a connection, skip the next ``drop_count`` events."""
    drop_count: int = 0
    disconnect_after: int | None = None
    """Close each connection after N events sent on it."""
    disconnect_probability: float = 0.0
    """Chance, per event sent, that the connection is closed right after it (seeded RNG)."""
    slow: float = 0.0
    """Seconds of delay before every write."""
    status: int | None = None
    """Answer the next ``status_times`` connections with this HTTP status instead of events."""
    status_times: int | None = 1
    """How many connections get ``status`` (None = all, until changed)."""
    retry_after: int | None = None
    """``Retry-After`` seconds sent with ``status`` (429 defaults to 1 when set by action)."""
    content_type: str | None = None
    """Content type of the ``status`` response (``status=200, content_type="text/plain"``
    is the wrong-content-type fault)."""
    location: str | None = None
    """``Location`` of a 3xx ``status`` (default: this stream on another origin)."""
    max_connection_seconds: float | None = None
    """Close each connection after this many seconds (None = never)."""
    token_file: str | None = None
    """Accept only the token in this file (read at each request) and the one it held
    before; anything else is answered 401. The token comes as ``Authorization: Bearer
    <token>`` (or the bare token) or as the ``access_token`` query parameter."""
    oauth: bool = False
    """Accept only unexpired tokens this source's ``POST /oauth/token`` issued."""

    def __post_init__(self) -> None:
        validate(self)


def _fail(setting: str, message: str) -> ConfigError:
    return ConfigError(f"source stream setting {setting!r} {message}")


def validate(config: SourceStreamConfig) -> None:
    """Refuse values that would make the source misbehave in ways nobody asked for."""
    if config.rate < 0:
        raise _fail("rate", f"must be >= 0 (0 = max), got {config.rate!r}")
    if config.history < 1:
        raise _fail("history", f"must be >= 1, got {config.history!r}")
    if config.history_age is not None and config.history_age <= 0:
        raise _fail("history_age", f"must be > 0 or None, got {config.history_age!r}")
    if config.keepalive < 0:
        raise _fail("keepalive", f"must be >= 0, got {config.keepalive!r}")
    if config.retry_ms is not None and config.retry_ms < 0:
        raise _fail("retry_ms", f"must be >= 0 or None, got {config.retry_ms!r}")
    if not 0 <= config.payload_bytes <= 1_000_000:
        raise _fail("payload_bytes", f"must be in 0..1000000, got {config.payload_bytes!r}")
    if config.flush not in FLUSH_MODES:
        raise _fail("flush", f"must be one of {FLUSH_MODES}, got {config.flush!r}")
    if not _EVENT_TYPE.match(config.event_type):
        raise _fail("event_type", f"must match {_EVENT_TYPE.pattern}, got {config.event_type!r}")
    if (
        len(config.id_prefix) > 64
        or any(c in config.id_prefix for c in "\r\n\x00")
        or config.id_prefix != config.id_prefix.strip()
        or config.id_prefix[-1:].isdigit()
    ):
        raise _fail(
            "id_prefix",
            "must be at most 64 characters without CR, LF, NUL, surrounding spaces or a "
            f"final digit, got {config.id_prefix!r}",
        )
    if not config.cursor_param or not config.cursor_param.isidentifier():
        raise _fail("cursor_param", f"must be an identifier, got {config.cursor_param!r}")
    for name in ("drop_every", "disconnect_after", "status_times"):
        value = getattr(config, name)
        if value is not None and value < 1:
            raise _fail(name, f"must be >= 1 or None, got {value!r}")
    if config.drop_count < 0:
        raise _fail("drop_count", f"must be >= 0, got {config.drop_count!r}")
    if not 0.0 <= config.disconnect_probability <= 1.0:
        raise _fail("disconnect_probability", "must be in [0, 1]")
    if config.max_connection_seconds is not None and config.max_connection_seconds <= 0:
        raise _fail("max_connection_seconds", "must be > 0 or None")
    if config.slow < 0:
        raise _fail("slow", f"must be >= 0, got {config.slow!r}")
    if config.status is not None and config.status not in STATUS_CODES:
        raise _fail("status", f"must be one of {STATUS_CODES}, got {config.status!r}")
    if config.retry_after is not None and config.retry_after < 0:
        raise _fail("retry_after", f"must be >= 0, got {config.retry_after!r}")
    for name in ("content_type", "location"):
        value = getattr(config, name)
        if value is not None and any(c in value for c in "\r\n\x00"):
            raise _fail(name, "must not contain CR, LF or NUL")


_HINTS: dict[str, Any] = typing.get_type_hints(SourceStreamConfig)
FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(SourceStreamConfig))


def _convert(name: str, value: Any) -> Any:
    """Coerce a JSON or command-line value to the field's type, or say why not."""
    hint = _HINTS[name]
    args = typing.get_args(hint)
    optional = type(None) in args
    base = next((a for a in args if a is not type(None)), hint) if args else hint
    if isinstance(value, str):
        text = value.strip()
        if optional and text.lower() in _NONE_WORDS:
            return None
        if name == "rate" and text.lower() == "max":
            return 0.0
        try:
            if base is bool:
                if text.lower() in ("1", "true", "yes", "on"):
                    return True
                if text.lower() in ("0", "false", "no", "off"):
                    return False
                raise ValueError(text)
            if base is int:
                return int(text)
            if base is float:
                return float(text)
        except ValueError:
            raise _fail(name, f"must be {base.__name__}, got {value!r}") from None
        return value
    if value is None:
        if optional:
            return None
        raise _fail(name, "must not be null")
    if base is float and isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if base is int and isinstance(value, float) and value.is_integer():
        return int(value)
    if not isinstance(value, base) or (base is not bool and isinstance(value, bool)):
        raise _fail(name, f"must be {base.__name__}, got {value!r}")
    return value


def config_updates(values: dict[str, Any]) -> dict[str, Any]:
    """Validated, type-coerced field values; unknown names are refused by name."""
    unknown = sorted(set(values) - set(FIELDS))
    if unknown:
        raise ConfigError(f"unknown source stream setting(s) {unknown}; known: {list(FIELDS)}")
    return {name: _convert(name, value) for name, value in values.items()}


def config_from_dict(values: dict[str, Any] | None) -> SourceStreamConfig:
    """Build a config from JSON-ish values (strings are converted, as on the command line)."""
    return SourceStreamConfig(**config_updates(values or {}))


def updated(config: SourceStreamConfig, values: dict[str, Any]) -> SourceStreamConfig:
    """A copy of ``config`` with ``values`` applied (validated as a whole)."""
    return dataclasses.replace(config, **config_updates(values))


def parse_stream_arg(text: str) -> tuple[str, SourceStreamConfig]:
    """``name`` or ``name:key=value,key=value`` (the CLI's ``--stream``)."""
    name, _, rest = text.partition(":")
    check_stream_name(name)
    values: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in rest.split(","))):
        key, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"stream {name!r}: expected key=value, got {item!r}")
        values[key.strip()] = value
    try:
        return name, config_from_dict(values)
    except ConfigError as exc:
        raise ConfigError(f"stream {name!r}: {exc}") from None


def check_stream_name(name: str) -> None:
    if not STREAM_NAME.match(name):
        raise ConfigError(f"stream name must match {STREAM_NAME.pattern}, got {name!r}")
