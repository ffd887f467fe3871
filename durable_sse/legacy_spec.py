"""The stream-spec rules from before strict validation, for replaying old histories only.

A ``StreamWorkflow`` run started before :func:`durable_sse.spec.parse_spec` existed
may run a spec the strict rules refuse (an ``SSE_*`` variable in ``headers_from_env``,
a duration past 30 days). Replaying its history must take the decisions it took, or
the worker fails its tasks with a nondeterminism error. ``workflows/stream.py`` calls
:func:`pre_strict_spec` only when the strict rules refuse a spec *and* the run carries
no ``strict-spec`` patch marker; its next continue-as-new validates strictly. Delete
this module once no run started before the patch is left.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from durable_sse.errors import ConfigError
from durable_sse.ids import IdOrder
from durable_sse.spec import SETTINGS, StreamSpec, parse_duration

_DURATIONS = (
    "replay_window",
    "lagged_reconnect_interval",
    "idle_timeout",
    "batch_max_delay",
    "max_connection_age",
    "connect_timeout",
)
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+\Z")
_ENV = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_PARAM = re.compile(r"[A-Za-z0-9_.~-]+\Z")


def pre_strict_spec(value: object) -> StreamSpec:
    """The spec as the pre-strict code read it; ConfigError where that code parked."""
    if not isinstance(value, Mapping):
        raise ConfigError("workflow input must be a stream spec")
    data = dict(value)
    if set(data) - set(SETTINGS) or "name" not in data or "url" not in data:
        raise ConfigError("unknown or missing settings")
    for setting in _DURATIONS:
        if isinstance(data.get(setting), str):
            try:
                data[setting] = parse_duration(data[setting])
            except ValueError:
                raise ConfigError(setting) from None
    spec = StreamSpec(**data)
    if not isinstance(spec.name, str) or not re.match(r"[A-Za-z0-9_.-]{1,64}\Z", spec.name):
        raise ConfigError("name")
    if not isinstance(spec.url, str) or not re.match(r"https?://[^/\s]+", spec.url):
        raise ConfigError("url")
    if spec.cursor_param is not None and not re.match(r"[A-Za-z0-9_.~-]+\Z", spec.cursor_param):
        raise ConfigError("cursor_param")
    if spec.id_order not in {order.value for order in IdOrder}:
        raise ConfigError("id_order")
    for setting in _DURATIONS:
        number = getattr(spec, setting)
        if isinstance(number, bool) or not isinstance(number, int | float) or not number > 0:
            raise ConfigError(setting)
    for pattern in spec.drop_notice or ():
        try:
            re.compile(pattern)
        except (re.error, TypeError):
            raise ConfigError("drop_notice") from None
    for table, key_pattern in (("headers_from_env", _TOKEN), ("query_from_env", _PARAM)):
        for key, env_name in getattr(spec, table).items():
            if not key_pattern.match(str(key)) or not _ENV.match(str(env_name)):
                raise ConfigError(table)
    for setting in ("batch_max_events", "max_line_bytes"):
        number = getattr(spec, setting)
        if isinstance(number, bool) or not isinstance(number, int) or number < 1:
            raise ConfigError(setting)
    return spec
