"""Stream settings (``StreamSpec``) and the one place they are validated.

``StreamSpec`` is the input of ``StreamWorkflow``: a plain dataclass of JSON-friendly
values, so the plain Temporal CLI can start a stream with ``--input '{"name": …,
"url": …}'`` and Temporal's default data converter encodes and decodes it without
ever running a validator (a converter that raised would fail the workflow task
forever). The constraints live on the fields themselves (``Annotated``); a strict
pydantic dataclass derived from this class applies them, through :func:`parse_spec`,
to TOML tables, workflow input and specs built in Python alike. Every refusal is one
:class:`ConfigError` line naming the stream, the setting, the value and what was
expected.

Durations are seconds (a number) or a string such as ``"250ms"``, ``"5m"``, ``"2h"``,
in TOML and workflow input alike: the string form cannot be misread, so accepting it
everywhere costs nothing. Secrets never appear here: ``headers_from_env`` and
``query_from_env`` name environment variables of the worker, never the worker's own
configuration (:func:`is_worker_variable`).
"""

# No `from __future__ import annotations`: Temporal decodes these dataclasses, and
# string annotations make each decode several times dearer (tests/test_payload_types.py).

import dataclasses
import difflib
import re
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Annotated, Any

import httpx
import pydantic
import re2
from pydantic import AfterValidator, ConfigDict, Field, PlainValidator, ValidationError

from durable_sse.config.durations import (
    DAY,
    HOUR,
    MINUTE,
    RetentionSeconds,
    format_duration,
    seconds,
)
from durable_sse.config.durations import (
    setting_error as _fail,
)
from durable_sse.config.secrets import is_worker_variable
from durable_sse.errors import ConfigError
from durable_sse.ids import IdOrder
from durable_sse.redact import show_value

KiB = 1024
MiB = 1024 * KiB
DEFAULT_MAX_RETRY_DELAY = 300.0
"""``max_retry_delay``'s default: 5 minutes, the bound ``Retry-After`` has too."""
DEFAULT_HEARTBEAT_TIMEOUT = 300.0
"""``heartbeat_timeout``'s default: Temporal's backstop when every worker died (the worker
leases move a dead worker's streams in seconds, :mod:`durable_sse.ops.liveness`); a running
stream heartbeats every 4 minutes (15 an hour)."""
MIN_HEARTBEAT_TIMEOUT = 10.0
"""``heartbeat_timeout``'s lower bound, and the read activity's timeout before it existed."""

DEFAULT_MAX_LINE_BYTES = 1 * MiB
DEFAULT_MAX_EVENT_BYTES = 8 * MiB
DEFAULT_MAX_ID_BYTES = 1024
MAX_ID_BYTES_LIMIT = 2048
"""PostgreSQL refuses b-tree entries over ~2.7 KB; the event key also holds the stream
name and an ordinal, so an id (and ``max_id_bytes``) stops well short of that."""

NAME_PATTERN = re.compile(r"[A-Za-z0-9_.-]{1,64}\Z")
PARAM_PATTERN = re.compile(r"[A-Za-z0-9_.~-]{1,128}\Z")
HEADER_NAME_PATTERN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]{1,128}\Z")
ENV_NAME_PATTERN = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}\Z")
MAX_URL_LENGTH = 4096
MAX_LIST_ITEMS = 64
MAX_TABLE_ITEMS = 32
MAX_PATTERN_LENGTH = 1000

RESERVED_HEADERS = frozenset(
    "accept cache-control last-event-id host content-length transfer-encoding connection "
    "keep-alive upgrade te trailer".split()
)
"""Headers the reader sets itself (the cursor, SSE negotiation) or that only the HTTP
client may set: a secret under one of these names would replace them."""

# --- counts ---------------------------------------------------------------------------


def count(low: int, high: int, *, unit: str = "") -> PlainValidator:
    """An integer setting between ``low`` and ``high``, inclusive (never a bool or float)."""
    expected = f"expected an integer between {low} and {high}{unit}"

    def check(value: object) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise _fail(expected)
        return value

    return PlainValidator(check)


# --- text settings -------------------------------------------------------------------------


def _check_name(value: str) -> str:
    if not NAME_PATTERN.match(value):
        raise _fail("expected a stream name: 1 to 64 of A-Z a-z 0-9 _ . -")
    return value


def _check_url(value: str) -> str:
    expected = (
        f"expected an http:// or https:// URL of at most {MAX_URL_LENGTH} characters, "
        "with a host and no credentials (use headers_from_env or query_from_env)"
    )
    if len(value) > MAX_URL_LENGTH or any(c.isspace() or not c.isprintable() for c in value):
        raise _fail(expected)
    try:
        parts = httpx.URL(value)
    except (httpx.InvalidURL, ValueError, TypeError):
        raise _fail(expected) from None
    if parts.scheme not in ("http", "https") or not parts.host or parts.userinfo:
        raise _fail(expected)
    if parts.port is not None and not 1 <= parts.port <= 65535:
        raise _fail(expected)
    return value


def _check_param(value: str) -> str:
    if not PARAM_PATTERN.match(value):
        raise _fail("expected a plain query parameter name: 1 to 128 of A-Z a-z 0-9 _ . ~ -")
    return value


def _check_id_order(value: str) -> str:
    if value not in {order.value for order in IdOrder}:
        raise _fail("expected 'numeric', 'lexicographic' or 'natural'")
    return value


def check_drop_pattern(pattern: str) -> None:
    """Raise ValueError unless RE2 compiles ``pattern`` the way the drop matcher will.

    Stand-in until ``durable_sse.sse.drops`` offers ``compile_drop_pattern`` (its move
    to RE2 is under way): then this delegates to it, so the check and the matcher
    cannot disagree.
    """
    if not pattern or len(pattern) > MAX_PATTERN_LENGTH:
        raise ValueError(f"expected a non-empty pattern of at most {MAX_PATTERN_LENGTH} characters")
    options = re2.Options()
    options.case_sensitive = False
    options.log_errors = False
    try:
        re2.compile(pattern, options)
    except re2.error as error:
        reason = error.args[0] if error.args else "invalid"
        if isinstance(reason, bytes):
            reason = reason.decode("utf-8", "replace")
        raise ValueError(f"expected an RE2 regular expression (RE2 says: {reason})") from None


def _check_drop_pattern(value: str) -> str:
    try:
        check_drop_pattern(value)
    except ValueError as error:
        raise _fail(str(error)) from None
    return value


def _check_event_type(value: str) -> str:
    if not 1 <= len(value) <= 256 or any(c in value for c in "\r\n\0"):
        raise _fail("expected an event type: 1 to 256 characters, no line breaks")
    return value


def _check_header_name(value: str) -> str:
    if not HEADER_NAME_PATTERN.match(value):
        raise _fail("expected an HTTP header name (a token of at most 128 characters)")
    if value.lower() in RESERVED_HEADERS:
        raise _fail("expected a header the reader does not set itself")
    return value


def _check_env_name(value: str) -> str:
    if not ENV_NAME_PATTERN.match(value):
        raise _fail("expected an environment variable name ([A-Za-z_][A-Za-z0-9_]*)")
    if is_worker_variable(value):
        raise _fail(
            "expected a variable that is not the worker's own configuration "
            "(DATABASE_URL, REDIS_*, TEMPORAL_*, DURABLE_SSE_*, SSE_*, PG*, PATH, HOME, …)"
        )
    return value


StreamName = Annotated[str, AfterValidator(_check_name)]
HttpURL = Annotated[str, AfterValidator(_check_url)]
ParamName = Annotated[str, AfterValidator(_check_param)]
IdOrderName = Annotated[str, AfterValidator(_check_id_order)]
DropPattern = Annotated[str, AfterValidator(_check_drop_pattern)]
EventType = Annotated[str, AfterValidator(_check_event_type)]
HeaderName = Annotated[str, AfterValidator(_check_header_name)]
EnvName = Annotated[str, AfterValidator(_check_env_name)]


@dataclass
class StreamSpec:
    """One stream's settings. New fields always get defaults (history compatibility).

    Bounds are on the annotations; :func:`parse_spec` applies them. Constructing a
    StreamSpec directly checks nothing.
    """

    name: StreamName
    url: HttpURL
    cursor_param: ParamName | None = None
    """Send the cursor as this query parameter instead of the ``Last-Event-ID`` header."""
    id_order: IdOrderName = IdOrder.NATURAL.value
    """``numeric``, ``lexicographic`` or ``natural`` (the default: right for integers
    and ``<time>-<seq>`` ids; ULIDs need ``lexicographic``)."""
    replay_window: Annotated[float, seconds(1.0, 30 * DAY)] = 600.0
    """Seconds the server's history reaches back; the lagging id trails by this much.
    It is also the checkpoint schedule's interval: under a second it would fire
    continuously; no server keeps a month of history for a reconnect."""
    lagged_reconnect_interval: Annotated[float, seconds(0.01, 30 * DAY)] = 60.0
    drop_notice: Annotated[list[DropPattern], Field(max_length=MAX_LIST_ITEMS)] | None = None
    """RE2 patterns matched (case-insensitively) against comment text; None = defaults;
    an empty list disables comment drop notices."""
    drop_event_types: Annotated[list[EventType], Field(max_length=MAX_LIST_ITEMS)] = field(
        default_factory=list
    )
    """Event types that announce drops (e.g. ``events_dropped``)."""
    mercure_last_event_id: bool = False
    """Treat a ``Mercure-Last-Event-ID`` response header unlike the cursor sent as a drop."""
    contiguous_ids: bool = False
    """Ids are consecutive integers: a hole in them is a drop signal."""
    verify_reconnects: bool = False
    """After a connection ended mid-read (by the server, or cancelled by the workflow),
    re-read from the lagging id (throttled like a repair): for servers that may skip
    events and announce it only a few events later, a notice lost with the connection,
    which no drop signal can show without contiguous ids."""
    idle_timeout: Annotated[float, seconds(0.01, 30 * DAY)] = 45.0
    headers_from_env: Annotated[dict[HeaderName, EnvName], Field(max_length=MAX_TABLE_ITEMS)] = (
        field(default_factory=dict)
    )
    """Header name -> name of an environment variable on the worker."""
    query_from_env: Annotated[dict[ParamName, EnvName], Field(max_length=MAX_TABLE_ITEMS)] = field(
        default_factory=dict
    )
    """Query parameter -> name of an environment variable on the worker, for servers that
    take a token in the URL: the token then never enters workflow input or history."""
    batch_max_events: Annotated[int, count(1, 100_000)] = 1000
    batch_max_delay: Annotated[float, seconds(0.001, 60.0)] = 0.05
    """Longest a received event waits for its batch: 1 ms is per-event commits already;
    past a minute a "live" stream is not live."""
    max_line_bytes: Annotated[int, count(1 * KiB, 64 * MiB, unit=" (bytes)")] = (
        DEFAULT_MAX_LINE_BYTES
    )
    max_connection_age: Annotated[float, seconds(1.0, 30 * DAY)] = 3600.0
    connect_timeout: Annotated[float, seconds(0.01, 10 * MINUTE)] = 10.0
    """Also bounds writes and the pool wait; a connect slower than minutes is a dead host."""
    max_event_bytes: Annotated[int, count(1 * KiB, 256 * MiB, unit=" (bytes)")] = (
        DEFAULT_MAX_EVENT_BYTES
    )
    """One event's data, all lines together: bounds a worker's memory per connection."""
    max_id_bytes: Annotated[int, count(1, MAX_ID_BYTES_LIMIT, unit=" (bytes)")] = (
        DEFAULT_MAX_ID_BYTES
    )
    """Longest event id (UTF-8 bytes) the event log takes (see MAX_ID_BYTES_LIMIT)."""
    retention: RetentionSeconds | None = None
    """Seconds events are kept (None = forever); at least ``replay_window``."""
    heartbeat_timeout: Annotated[float, seconds(MIN_HEARTBEAT_TIMEOUT, HOUR)] = (
        DEFAULT_HEARTBEAT_TIMEOUT
    )
    """How long a connection's worker may stay silent before Temporal takes it for dead
    and starts the connection again elsewhere: a worker that dies is noticed this late.
    While the worker hears nudges the connection heartbeats a minute before it runs out
    (signals come with a nudge's heartbeat, at once), so it is also what a running stream costs in
    heartbeats (docs/benchmarks.md)."""
    max_retry_delay: Annotated[float, seconds(0.0, DAY)] = DEFAULT_MAX_RETRY_DELAY
    """Longest wait the server's ``retry:`` field buys (as ``Retry-After`` is capped):
    a server that sends ``retry: 99999999999`` cannot put the stream to sleep for years.
    0 ignores the field (backoff only)."""


_CheckedSpec = pydantic.dataclasses.dataclass(config=ConfigDict(strict=True, extra="forbid"))(
    StreamSpec
)
"""The strict pydantic twin of StreamSpec: a subclass, StreamSpec itself stays plain."""

SETTINGS = tuple(f.name for f in dataclasses.fields(StreamSpec))

EXPECTED = {
    "name": "expected a stream name: 1 to 64 of A-Z a-z 0-9 _ . -",
    "url": "expected an http:// or https:// URL",
    "cursor_param": "expected a query parameter name (a string)",
    "id_order": "expected 'numeric', 'lexicographic' or 'natural'",
    "drop_notice": f"expected a list of at most {MAX_LIST_ITEMS} RE2 patterns (strings)",
    "drop_event_types": f"expected a list of at most {MAX_LIST_ITEMS} event types (strings)",
    "mercure_last_event_id": "expected true or false",
    "contiguous_ids": "expected true or false",
    "verify_reconnects": "expected true or false",
    "headers_from_env": (
        f"expected a table of at most {MAX_TABLE_ITEMS} header name = environment variable name"
    ),
    "query_from_env": (
        f"expected a table of at most {MAX_TABLE_ITEMS} query parameter = environment variable name"
    ),
}
"""What a setting takes, for errors pydantic words itself (wrong type, too many items)."""


# --- parsing -------------------------------------------------------------------------------


ATTEMPT_MARGIN = timedelta(seconds=60)
"""What a read attempt may take beyond its connection's own bounds (age, connect, idle)."""


def attempt_timeout(spec: StreamSpec) -> timedelta:
    """A read attempt's start-to-close timeout; also how long its registration in
    ``sse_readers`` lasts when it runs outside a workflow, with no such timeout."""
    bounds = spec.max_connection_age + spec.connect_timeout + spec.idle_timeout
    return timedelta(seconds=bounds) + ATTEMPT_MARGIN


def parse_spec(value: object, *, source: str = "") -> StreamSpec:
    """The validated StreamSpec for a TOML table, a JSON object or a StreamSpec.

    Args:
        value: a mapping of settings (TOML, workflow input) or a StreamSpec.
        source: where it came from, prefixed to the message (``streams.toml``).

    Raises:
        ConfigError: one line naming the stream, the setting, the value and what was
            expected (the first problem found, and how many more there are).
    """
    prefix = f"{source}: " if source else ""
    if isinstance(value, StreamSpec):
        data: dict[str, Any] = {name: getattr(value, name) for name in SETTINGS}
    elif isinstance(value, Mapping):
        data = dict(value)
    else:
        raise ConfigError(
            f"{prefix}expected a table of stream settings (name, url, …), "
            f"got {show_value(value)} ({type(value).__name__})"
        )
    label = _stream_label(data.get("name"))
    odd_keys = [key for key in data if not isinstance(key, str)]
    if odd_keys:
        raise ConfigError(
            f"{prefix}{label}: setting {show_value(odd_keys[0])}: "
            "expected a setting name (a string)"
        )
    # Unknown keys never reach the constructor: one named like its own parameter
    # (``__dataclass_self__``) would raise a TypeError, not a validation error.
    problems: list[Any] = [
        {"type": "extra_forbidden", "loc": (key,), "input": data[key]}
        for key in data
        if key not in SETTINGS
    ]
    try:
        checked = _CheckedSpec(**{key: data[key] for key in SETTINGS if key in data})
    except ValidationError as error:
        problems += error.errors(include_url=False)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise ConfigError(f"{prefix}{label}: {_describe(problems[0])}{more}")
    spec = StreamSpec(**{name: getattr(checked, name) for name in SETTINGS})
    problem = _check_together(spec)
    if problem is not None:
        raise ConfigError(f"{prefix}{label}: {problem}")
    return spec


def validate_spec(spec: StreamSpec) -> StreamSpec:
    """``parse_spec`` for a spec built in Python (same rules, same messages)."""
    return parse_spec(spec)


def _check_together(spec: StreamSpec) -> str | None:
    """Rules between settings; None when they agree."""
    if spec.retention is not None and spec.retention < spec.replay_window:
        return (
            f"setting 'retention' = {show_setting('retention', spec.retention)}: expected at least "
            f"replay_window ({format_duration(spec.replay_window)}): rows the replay window "
            "can re-deliver are never deleted"
        )
    if spec.cursor_param is not None and spec.cursor_param in spec.query_from_env:
        return (
            f"setting 'query_from_env.{spec.cursor_param}' = "
            f"{show_value(spec.query_from_env[spec.cursor_param])}: expected a parameter other "
            f"than cursor_param ({spec.cursor_param!r})"
        )
    seen: dict[str, str] = {}
    for header in spec.headers_from_env:
        if header.lower() in seen:
            return (
                f"setting 'headers_from_env.{header}': expected each header once "
                f"(also given as {seen[header.lower()]!r})"
            )
        seen[header.lower()] = header
    return None


_CREDENTIAL_KEY = re.compile(
    r"secret|token|passw|api_?key|credential|oauth|client_id|auth|bearer", re.IGNORECASE
)
"""An unknown setting named like a credential: its value is never repeated."""


def _describe(problem: Mapping[str, Any]) -> str:
    """One pydantic error as ``setting 'x' = value: expected …``."""
    loc = tuple(problem["loc"])
    kind = problem["type"]
    setting = str(loc[0]) if loc else "?"
    path = setting + "".join(
        f"[{part}]" if isinstance(part, int) else f".{part}" for part in loc[1:] if part != "[key]"
    )
    if kind == "extra_forbidden" and _CREDENTIAL_KEY.search(setting):
        # Never repeated: the message goes to logs, the status and the Web UI.
        return (
            f"setting {path!r}: not a stream setting, and a credential never goes in a "
            "stream's settings (its value is not shown): the worker declares it "
            "(SSE_SECRETS, with NAME, NAME_FILE or NAME_TOKEN_URL, NAME_CLIENT_ID, "
            "NAME_CLIENT_SECRET) and the stream names it in headers_from_env or query_from_env"
        )
    value = problem.get("input")
    if (
        setting in ("headers_from_env", "query_from_env")
        and "[key]" not in loc
        and isinstance(value, str)
        and (len(value) > 40 or any(c.isspace() for c in value))
    ):
        # A value where a variable's name belongs that looks like a credential
        # ("Bearer …", a long token) may be the secret itself.
        expected = EXPECTED[setting] if kind != "durable_sse" else problem["ctx"]["reason"]
        return f"setting {path!r} (its value is not shown: it may be a secret): {expected}"
    if kind == "extra_forbidden":
        close = difflib.get_close_matches(setting, SETTINGS, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        return f"setting {path!r} = {show_value(problem['input'])}: not a stream setting{hint}"
    if kind in ("missing", "missing_argument"):
        return f"setting {path!r} is missing: {EXPECTED.get(setting, 'required')}"
    if kind == "durable_sse":
        expected = problem["ctx"]["reason"]
    else:
        expected = EXPECTED.get(setting, problem["msg"])
    return f"setting {path!r} = {show_value(problem['input'], url=setting == 'url')}: {expected}"


def _stream_label(name: object) -> str:
    if isinstance(name, str) and name:
        return f"stream {show_value(name)}"
    return "stream (unnamed)"


def _duration_bounds() -> dict[str, tuple[float, float]]:
    hints = typing.get_type_hints(StreamSpec, include_extras=True)
    bounds = {}
    for name, hint in hints.items():
        for arg in (hint, *typing.get_args(hint)):
            for meta in getattr(arg, "__metadata__", ()):
                found = getattr(getattr(meta, "func", None), "bounds", None)
                if found is not None:
                    bounds[name] = found
    return bounds


DURATION_BOUNDS = _duration_bounds()
"""Duration setting -> (lowest, highest) seconds, read off the annotations."""


def show_setting(setting: str, value: Any) -> str:
    """A setting's value for a one-line message: durations as ``5m``, URLs redacted."""
    if value is None:
        return "-"
    if setting in DURATION_BOUNDS and isinstance(value, int | float):
        return format_duration(float(value))
    return show_value(value, url=setting == "url")


__all__ = [
    "DEFAULT_MAX_EVENT_BYTES",
    "DEFAULT_MAX_ID_BYTES",
    "DEFAULT_MAX_LINE_BYTES",
    "DEFAULT_MAX_RETRY_DELAY",
    "DURATION_BOUNDS",
    "SETTINGS",
    "StreamSpec",
    "check_drop_pattern",
    "parse_spec",
    "show_setting",
    "validate_spec",
]
