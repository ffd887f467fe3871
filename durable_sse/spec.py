"""Stream settings (``StreamSpec``), their validation, and the TOML stream file.

``StreamSpec`` is the input of ``StreamWorkflow``; it must stay JSON-friendly so the
plain Temporal CLI can start a stream with ``--input '{"name": …, "url": …}'``.
Durations are seconds in the spec; the TOML file may also write ``"5m"``, ``"2h"``.
Secrets never appear here: ``headers_from_env`` names environment variables.
"""

from __future__ import annotations

import dataclasses
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from durable_sse.errors import ConfigError
from durable_sse.ids import IdOrder

NAME_PATTERN = re.compile(r"[A-Za-z0-9_.-]{1,64}\Z")
HEADER_NAME_PATTERN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+\Z")
ENV_NAME_PATTERN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")

DEFAULT_MAX_LINE_BYTES = 1024 * 1024


@dataclass
class StreamSpec:
    """One stream's settings. New fields always get defaults (history compatibility)."""

    name: str
    url: str
    cursor_param: str | None = None
    """Send the cursor as this query parameter instead of the ``Last-Event-ID`` header."""
    id_order: str = IdOrder.NATURAL.value
    """``numeric``, ``lexicographic`` or ``natural`` (the default: right for integers
    and ``<time>-<seq>`` ids; ULIDs need ``lexicographic``)."""
    replay_window: float = 600.0
    """Seconds the server's history reaches back; the lagging id trails by this much."""
    lagged_reconnect_interval: float = 60.0
    drop_notice: list[str] | None = None
    """Regexes matched (case-insensitively) against comment text; None = defaults;
    an empty list disables comment drop notices."""
    drop_event_types: list[str] = field(default_factory=list)
    """Event types that announce drops (e.g. ``events_dropped``)."""
    mercure_last_event_id: bool = False
    """Treat a ``Mercure-Last-Event-ID`` response header unlike the cursor sent as a drop."""
    contiguous_ids: bool = False
    """Ids are consecutive integers: a hole in them is a drop signal."""
    idle_timeout: float = 45.0
    headers_from_env: dict[str, str] = field(default_factory=dict)
    """Header name -> name of an environment variable on the worker."""
    query_from_env: dict[str, str] = field(default_factory=dict)
    """Query parameter -> name of an environment variable on the worker, for servers that
    take a token in the URL: the token then never enters workflow input or history."""
    batch_max_events: int = 1000
    batch_max_delay: float = 0.05
    max_line_bytes: int = DEFAULT_MAX_LINE_BYTES
    max_connection_age: float = 3600.0
    connect_timeout: float = 10.0


DURATION_FIELDS = (
    "replay_window",
    "lagged_reconnect_interval",
    "idle_timeout",
    "batch_max_delay",
    "max_connection_age",
    "connect_timeout",
)
_DURATION = re.compile(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*\Z")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}


def parse_duration(value: Any, *, setting: str, stream: str | None = None) -> float:
    """Seconds from a number or a string such as ``"250ms"``, ``"5m"``, ``"2h"``."""
    if isinstance(value, bool):
        raise ConfigError(_where(stream, setting, f"must be a duration, got {value!r}"))
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        match = _DURATION.match(value)
        if match:
            return float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
    raise ConfigError(
        _where(stream, setting, f'must be a duration like 30, "30s", "5m", got {value!r}')
    )


def validate_spec(spec: StreamSpec) -> StreamSpec:
    """Raise :class:`ConfigError` naming the stream and the first invalid setting."""
    if not isinstance(spec.name, str) or not NAME_PATTERN.match(spec.name):
        raise ConfigError(f"stream {spec.name!r}: setting 'name' must match [A-Za-z0-9_.-]{{1,64}}")

    def bad(setting: str, message: str) -> ConfigError:
        return ConfigError(_where(spec.name, setting, message))

    if not isinstance(spec.url, str) or not re.match(r"https?://[^/\s]+", spec.url):
        raise bad("url", "must be an http:// or https:// URL")
    if spec.cursor_param is not None and not re.match(r"[A-Za-z0-9_.~-]+\Z", spec.cursor_param):
        raise bad("cursor_param", "must be a plain query parameter name")
    if spec.id_order not in {order.value for order in IdOrder}:
        raise bad("id_order", f"must be numeric, lexicographic or natural, not {spec.id_order!r}")
    for name in DURATION_FIELDS:
        value = getattr(spec, name)
        if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
            raise bad(name, f"must be a positive number of seconds, got {value!r}")
    if spec.drop_notice is not None:
        for pattern in spec.drop_notice:
            try:
                re.compile(pattern)
            except (re.error, TypeError) as error:
                message = f"pattern {pattern!r} is not a valid regex: {error}"
                raise bad("drop_notice", message) from None
    for header, env_name in spec.headers_from_env.items():
        if not HEADER_NAME_PATTERN.match(str(header)):
            raise bad("headers_from_env", f"{header!r} is not a valid header name")
        if not ENV_NAME_PATTERN.match(str(env_name)):
            raise bad("headers_from_env", f"{env_name!r} is not an environment variable name")
    for param, env_name in spec.query_from_env.items():
        if not re.match(r"[A-Za-z0-9_.~-]+\Z", str(param)):
            raise bad("query_from_env", f"{param!r} is not a plain query parameter name")
        if not ENV_NAME_PATTERN.match(str(env_name)):
            raise bad("query_from_env", f"{env_name!r} is not an environment variable name")
    for name in ("batch_max_events", "max_line_bytes"):
        value = getattr(spec, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise bad(name, f"must be a positive integer, got {value!r}")
    return spec


def spec_from_mapping(data: dict[str, Any], *, source: str = "stream") -> StreamSpec:
    """Build and validate a spec from a TOML table or JSON object."""
    name = data.get("name")
    known = {f.name for f in dataclasses.fields(StreamSpec)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ConfigError(_where(name, unknown[0], "is not a known stream setting"))
    for required in ("name", "url"):
        if required not in data:
            raise ConfigError(_where(name, required, f"is required ({source})"))
    values = dict(data)
    for setting in DURATION_FIELDS:
        if setting in values:
            values[setting] = parse_duration(values[setting], setting=setting, stream=name)
    return validate_spec(StreamSpec(**values))


def load_streams(path: str | Path) -> list[StreamSpec]:
    """Read ``[[stream]]`` tables from a TOML file; errors name the line or the setting."""
    path = Path(path)
    try:
        document = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file") from None
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"{path}: invalid TOML: {error}") from None
    tables = document.get("stream", [])
    if not isinstance(tables, list):
        raise ConfigError(f"{path}: 'stream' must be an array of tables ([[stream]])")
    specs = [spec_from_mapping(table, source=str(path)) for table in tables]
    seen: set[str] = set()
    for spec in specs:
        if spec.name in seen:
            raise ConfigError(f"{path}: stream {spec.name!r} is declared twice")
        seen.add(spec.name)
    return specs


def _where(stream: str | None, setting: str, message: str) -> str:
    prefix = f"stream {stream!r}: " if stream else ""
    return f"{prefix}setting {setting!r} {message}"
