"""Stream settings: one strict model, one-line refusals naming stream, setting, value."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from temporalio.converter import DataConverter, value_to_type

from durable_sse.config.durations import format_duration, parse_duration
from durable_sse.config.replay import ReplaySignal, parse_replay_signal
from durable_sse.config.secrets import is_worker_variable
from durable_sse.config.spec import (
    DEFAULT_MAX_EVENT_BYTES,
    DEFAULT_MAX_ID_BYTES,
    DEFAULT_MAX_RETRY_DELAY,
    DURATION_BOUNDS,
    SETTINGS,
    StreamSpec,
    parse_spec,
    validate_spec,
)
from durable_sse.config.streams import load_streams, spec_differences
from durable_sse.contracts import ReadInput
from durable_sse.errors import ConfigError

BASE = {"name": "ticks", "url": "https://example.test/sse"}
DURATION_HELP = '(seconds, or a string like "250ms", "5m", "2h")'


def refusal(**changes: Any) -> str:
    """The one-line message parse_spec gives for BASE with ``changes``."""
    data = {**BASE, **changes}
    with pytest.raises(ConfigError) as caught:
        parse_spec(data)
    message = str(caught.value)
    assert "\n" not in message and "\r" not in message
    return message


def test_defaults_are_valid_and_new_settings_have_defaults() -> None:
    spec = parse_spec(BASE)
    assert spec == StreamSpec(**BASE)
    assert (spec.id_order, spec.replay_window, spec.retention) == ("natural", 600.0, None)
    assert (spec.max_event_bytes, spec.max_id_bytes) == (DEFAULT_MAX_EVENT_BYTES, 1024)
    assert DEFAULT_MAX_EVENT_BYTES == 8 * 1024 * 1024 and DEFAULT_MAX_ID_BYTES == 1024
    assert validate_spec(spec) == spec
    assert type(spec) is StreamSpec  # the plain dataclass, not pydantic's twin
    assert spec.max_retry_delay == DEFAULT_MAX_RETRY_DELAY == 300.0  # as Retry-After's cap


def test_a_spec_built_in_python_is_checked_by_the_same_rules() -> None:
    bad = dataclasses.replace(StreamSpec(**BASE), mercure_last_event_id="no")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="setting 'mercure_last_event_id' = 'no'"):
        validate_spec(bad)


# --- the cases of issue #15, word for word ---------------------------------------------


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (
            {"replay_window": "99999999999d"},
            "stream 'ticks': setting 'replay_window' = '99999999999d': expected a duration "
            f"between 1s and 30d {DURATION_HELP}",
        ),
        (
            {"replay_window": math.inf},
            "stream 'ticks': setting 'replay_window' = inf: expected a duration between 1s "
            f"and 30d {DURATION_HELP}",
        ),
        (
            {"headers_from_env": "TOKEN"},
            "stream 'ticks': setting 'headers_from_env' = 'TOKEN': expected a table of at most "
            "32 header name = environment variable name",
        ),
        (
            {"drop_notice": "dropping"},
            "stream 'ticks': setting 'drop_notice' = 'dropping': expected a list of at most 64 "
            "RE2 patterns (strings)",
        ),
        (
            {"mercure_last_event_id": "no"},
            "stream 'ticks': setting 'mercure_last_event_id' = 'no': expected true or false",
        ),
    ],
)
def test_issue_cases_are_refused_in_one_line(changes: dict[str, Any], message: str) -> None:
    assert refusal(**changes) == message


def test_missing_name_is_refused() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_spec({"url": "https://example.test/"}, source="workflow input")
    assert str(caught.value) == (
        "workflow input: stream (unnamed): setting 'name' is missing: expected a stream "
        "name: 1 to 64 of A-Z a-z 0-9 _ . -"
    )


@pytest.mark.parametrize(
    ("changes", "fragment"),
    [
        ({"replay_window": math.nan}, "setting 'replay_window' = nan: expected a duration"),
        ({"replay_window": -5}, "setting 'replay_window' = -5: expected a duration"),
        ({"replay_window": 0}, "setting 'replay_window' = 0: expected a duration"),
        ({"replay_window": 0.5}, "between 1s and 30d"),
        ({"replay_window": True}, "setting 'replay_window' = True: expected a duration"),
        ({"replay_window": "5 minutes"}, "setting 'replay_window' = '5 minutes'"),
        ({"replay_window": "-5m"}, "setting 'replay_window' = '-5m'"),
        ({"replay_window": "inf"}, "setting 'replay_window' = 'inf'"),
        ({"replay_window": 10**400}, "setting 'replay_window' = 1000"),
        ({"replay_window": None}, "setting 'replay_window' = None"),
        ({"idle_timeout": "1ms"}, "'idle_timeout' = '1ms': expected a duration between 10ms"),
        ({"connect_timeout": "1h"}, "between 10ms and 10m"),
        ({"batch_max_delay": 61}, "between 1ms and 1m"),
        ({"max_connection_age": "31d"}, "between 1s and 30d"),
        ({"max_retry_delay": "2d"}, "'max_retry_delay' = '2d': expected a duration between 0s"),
        ({"max_retry_delay": -1}, "'max_retry_delay' = -1: expected a duration"),
        ({"retention": "30s"}, "'retention' = '30s': expected a duration between 1m and 36500d"),
        ({"retention": "5m"}, "'retention' = 5m: expected at least replay_window (10m)"),
        ({"batch_max_events": 0}, "'batch_max_events' = 0: expected an integer between 1 and"),
        ({"batch_max_events": 1.5}, "'batch_max_events' = 1.5: expected an integer"),
        ({"batch_max_events": 1000.0}, "'batch_max_events' = 1000.0: expected an integer"),
        ({"batch_max_events": True}, "'batch_max_events' = True: expected an integer"),
        ({"batch_max_events": "1000"}, "'batch_max_events' = '1000': expected an integer"),
        ({"batch_max_events": 10**6}, "between 1 and 100000"),
        ({"max_line_bytes": 100}, "'max_line_bytes' = 100: expected an integer between 1024"),
        ({"max_event_bytes": 2**40}, "'max_event_bytes' = 1099511627776: expected an integer"),
        ({"max_id_bytes": 4096}, "'max_id_bytes' = 4096: expected an integer between 1 and 2048"),
        ({"contiguous_ids": 1}, "'contiguous_ids' = 1: expected true or false"),
        ({"url": "ftp://example.test/"}, "'url' = 'ftp://example.test/': expected an http"),
        ({"url": "https://"}, "'url' = 'https://': expected an http"),
        ({"url": "https://h/a b"}, "expected an http"),
        ({"url": "https://h:99999/"}, "'url' = 'https://h:99999/': expected an http"),
        ({"url": "https://me:pw@h/?token=abc"}, "'url' = 'https://h/?token=REDACTED'"),
        ({"url": 5}, "'url' = 5: expected an http"),
        ({"name": "no spaces"}, "stream 'no spaces': setting 'name' = 'no spaces'"),
        ({"name": "x" * 65}, "setting 'name' = 'xxxx"),
        ({"name": 7}, "stream (unnamed): setting 'name' = 7"),
        ({"cursor_param": "last id"}, "'cursor_param' = 'last id': expected a plain query"),
        ({"id_order": "time"}, "'id_order' = 'time': expected 'numeric', 'lexicographic' or"),
        ({"drop_notice": ["ok", "(unclosed"]}, "'drop_notice[1]' = '(unclosed': expected an RE2"),
        ({"drop_notice": [r"(?<!no )dropped"]}, "'drop_notice[0]' = '(?<!no )dropped': expected"),
        ({"drop_notice": ["a{1001}"]}, "RE2 says: invalid repetition size: {1001}"),
        ({"drop_notice": [""]}, "'drop_notice[0]' = '': expected a non-empty pattern"),
        ({"drop_notice": [5]}, "'drop_notice[0]' = 5: expected a list of at most 64 RE2"),
        ({"drop_notice": ["x"] * 65}, "'drop_notice' = ['x', "),
        ({"drop_event_types": "events_dropped"}, "'drop_event_types' = 'events_dropped'"),
        ({"drop_event_types": ["a\nb"]}, r"'drop_event_types[0]' = 'a\nb': expected an event"),
        ({"headers_from_env": {"Bad Header": "T"}}, "'headers_from_env.Bad Header' = 'Bad Hea"),
        ({"headers_from_env": {"Last-Event-ID": "T"}}, "a header the reader does not set"),
        ({"headers_from_env": {"X": "1TOKEN"}}, "'headers_from_env.X' = '1TOKEN': expected an"),
        ({"headers_from_env": {"X": 5}}, "'headers_from_env.X' = 5: expected a table"),
        ({"headers_from_env": {"A": "T", "a": "U"}}, "expected each header once"),
        ({"query_from_env": {"a b": "T"}}, "'query_from_env.a b' = 'a b'"),
        ({"query_from_env": ["T"]}, "'query_from_env' = ['T']: expected a table"),
        ({"cursor_param": "c", "query_from_env": {"c": "T"}}, "other than cursor_param ('c')"),
        ({"replay_windw": 5}, "'replay_windw' = 5: not a stream setting; did you mean 'replay_"),
        ({"colour": "red"}, "setting 'colour' = 'red': not a stream setting"),
    ],
)
def test_bad_settings_are_refused(changes: dict[str, Any], fragment: str) -> None:
    message = refusal(**changes)
    assert fragment in message
    assert message.startswith("stream ")


@pytest.mark.parametrize(
    "variable",
    [
        "DATABASE_URL",
        "REDIS_URL",
        "TEMPORAL_API_KEY",
        "TEMPORAL_TLS_CLIENT_KEY_DATA",
        "DURABLE_SSE_PAYLOAD_KEY",
        "SSE_ALLOWED_HOSTS",
        "SSE_SECRETS",
        "PGPASSWORD",
        "PATH",
        "HOME",
        "http_proxy",
        "LD_PRELOAD",
        "PYTHONPATH",
    ],
)
def test_the_workers_own_variables_can_never_be_named(variable: str) -> None:
    assert is_worker_variable(variable)
    for table in ("headers_from_env", "query_from_env"):
        message = refusal(**{table: {"X": variable}})
        assert f"setting '{table}.X' = {variable!r}: expected a variable that is not the " in (
            message
        )


@pytest.mark.parametrize("variable", ["API_TOKEN", "ORDERS_KEY", "GITHUB_TOKEN", "token"])
def test_other_variables_may_be_named(variable: str) -> None:
    assert not is_worker_variable(variable)
    spec = parse_spec({**BASE, "headers_from_env": {"Authorization": variable}})
    assert spec.headers_from_env == {"Authorization": variable}


def test_more_problems_are_counted_on_the_same_line() -> None:
    message = refusal(replay_window="soon", idle_timeout=-1, colour="red")
    assert message.startswith("stream 'ticks': setting 'colour' = 'red': not a stream setting")
    assert message.endswith("(and 2 more)")
    message = refusal(replay_window="soon", idle_timeout=-1)
    assert message.startswith("stream 'ticks': setting 'replay_window' = 'soon'")
    assert message.endswith("(and 1 more)")


def test_a_key_named_like_a_constructor_parameter_is_just_unknown() -> None:
    assert "setting '__dataclass_self__' = 1: not a stream setting" in refusal(__dataclass_self__=1)


def test_not_a_table_is_refused() -> None:
    for value in ("ticks", None, ["ticks"], 5):
        with pytest.raises(ConfigError, match="^x: expected a table of stream settings"):
            parse_spec(value, source="x")
    with pytest.raises(ConfigError, match="setting 5: expected a setting name"):
        parse_spec({**BASE, 5: 1})


# --- durations -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        (30, 30.0),
        (2.5, 2.5),
        ("250ms", 0.25),
        ("45", 45.0),
        ("90s", 90.0),
        ("5m", 300.0),
        ("2h", 7200.0),
        ("1d", 86400.0),
        (" 1.5 h ", 5400.0),
    ],
)
def test_parse_duration(value: object, seconds: float) -> None:
    assert parse_duration(value) == seconds


@pytest.mark.parametrize("value", ["5 minutes", "", "-5m", "1e3", "inf", "nan", True, None, [5]])
def test_parse_duration_refuses(value: object) -> None:
    with pytest.raises(ValueError):
        parse_duration(value)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0.001, "1ms"), (0.01, "10ms"), (1.0, "1s"), (90.0, "90s"), (600.0, "10m"), (2592000, "30d")],
)
def test_format_duration(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


@settings(max_examples=300, deadline=None)
@given(
    setting=st.sampled_from(sorted(DURATION_BOUNDS)),
    value=st.one_of(
        st.floats(allow_nan=True, allow_infinity=True),
        st.integers(min_value=-(10**20), max_value=10**20),
        st.booleans(),
        st.text(max_size=20),
        st.builds(
            lambda n, unit: f"{n}{unit}",
            st.integers(min_value=0, max_value=10**12),
            st.sampled_from(["", "ms", "s", "m", "h", "d", "w", "x"]),
        ),
    ),
)
def test_a_duration_is_within_its_bounds_or_refused_in_one_line(setting: str, value: Any) -> None:
    low, high = DURATION_BOUNDS[setting]
    data = {**BASE, setting: value}
    if setting == "retention":
        data["replay_window"] = 1.0
    try:
        spec = parse_spec(data)
    except ConfigError as error:
        text = str(error)
        assert text.startswith(f"stream 'ticks': setting '{setting}' = ") and "\n" not in text
        return
    accepted = getattr(spec, setting)
    assert isinstance(accepted, float) and math.isfinite(accepted)
    assert low <= accepted <= high
    assert not isinstance(value, bool)


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=6,
)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from([*SETTINGS, "extra", "replay_windw"]), JSON, max_size=6))
@example({"query_from_env": {"'": None}})  # the setting's name is quoted with "…"
def test_any_input_gives_a_spec_or_one_line(data: dict[str, Any]) -> None:
    """Whatever a client sends: a valid spec (stable under re-parsing) or one line."""
    data = {**BASE, **data}
    try:
        spec = parse_spec(data, source="workflow input")
    except ConfigError as error:
        text = str(error)
        assert text.startswith("workflow input: stream ") and "\n" not in text
        # The setting is named as repr() quotes it: '…', or "…" when it holds a '.
        assert "setting '" in text or 'setting "' in text or "expected a table" in text
        return
    assert parse_spec(dataclasses.asdict(spec)) == spec


# --- the data converter never validates ------------------------------------------------


async def test_the_spec_round_trips_through_temporals_default_converter() -> None:
    spec = parse_spec(
        {
            **BASE,
            "replay_window": "5m",
            "retention": "30d",
            "drop_notice": ["dropp(ed|ing)"],
            "headers_from_env": {"Authorization": "API_TOKEN"},
        }
    )
    payloads = await DataConverter.default.encode([ReadInput(spec=spec)])
    (decoded,) = await DataConverter.default.decode(payloads, [ReadInput])
    assert decoded.spec == spec
    (raw,) = await DataConverter.default.decode(payloads)  # no type hint: a plain dict
    assert parse_spec(raw["spec"]) == spec


def test_value_to_type_builds_a_spec_without_validating() -> None:
    """Temporal's own decoding sees plain types (``Annotated`` stripped), and checks nothing
    of ours: the workflow calls parse_spec, where a refusal parks instead of failing."""
    built = value_to_type(StreamSpec, {**BASE, "replay_window": 1e12, "drop_notice": ["("]})
    assert built.replay_window == 1e12
    with pytest.raises(ConfigError):
        parse_spec(dataclasses.asdict(built))


# --- the replay signal -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, ReplaySignal()),
        ({}, ReplaySignal()),
        ({"from_id": None, "since": None}, ReplaySignal()),
        (ReplaySignal(), ReplaySignal()),
        ({"from_id": "42"}, ReplaySignal(from_id="42")),
        ({"from_id": "café"}, ReplaySignal(from_id="café")),
        ({"since": "2026-05-01T12:00:00Z"}, ReplaySignal(since="2026-05-01T12:00:00+00:00")),
        (
            ReplaySignal(since="2026-05-01T14:00:00+02:00"),
            ReplaySignal(since="2026-05-01T14:00:00+02:00"),
        ),
    ],
)
def test_replay_signal_accepted(value: object, expected: ReplaySignal) -> None:
    assert parse_replay_signal(value) == expected


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (
            {"from_id": ""},
            "stream 'ticks': replay 'from_id' = '': expected a non-empty event id of at most "
            "2048 bytes",
        ),
        (
            {"since": "yesterday"},
            "stream 'ticks': replay 'since' = 'yesterday': expected an ISO 8601 time with Z or "
            "a UTC offset, e.g. 2026-05-01T12:00:00Z (no time zone is assumed)",
        ),
        ({"since": "2026-05-01T12:00:00"}, "replay 'since' = '2026-05-01T12:00:00': expected"),
        ({"since": "2026-05-01"}, "replay 'since' = '2026-05-01': expected an ISO 8601"),
        ({"since": ""}, "replay 'since' = '': expected an ISO 8601"),
        ({"since": 1714564800}, "replay 'since' = 1714564800: expected a string"),
        ({"from_id": 5}, "replay 'from_id' = 5: expected a string"),
        ({"from_id": "a\nb"}, "expected an event id without line breaks or NUL"),
        ({"from_id": "x" * 2049}, "at most 2048 bytes"),
        ({"from_id": "\ud800"}, "expected an event id of valid Unicode text"),
        ({"form_id": "5"}, "replay 'form_id' = '5': expected only from_id or since"),
        ({"from_id": "5", "since": "2026-05-01T12:00:00Z"}, "expected from_id or since, not both"),
        ("yesterday", "replay payload = 'yesterday': expected nothing (lagged route)"),
        (["5"], "replay payload = ['5']: expected nothing"),
    ],
)
def test_replay_signal_refused(value: object, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_replay_signal(value, stream="ticks")
    text = str(caught.value)
    assert message in text and text.startswith("stream 'ticks': ") and "\n" not in text


@settings(max_examples=300, deadline=None)
@given(
    JSON
    | st.dictionaries(
        st.sampled_from(["from_id", "since", "form_id"]) | st.text(max_size=8), JSON, max_size=3
    )
    | st.dictionaries(st.integers(), st.text(), max_size=2)
)
def test_any_replay_payload_gives_a_signal_or_one_line(value: object) -> None:
    """A signal handler that raised would fail the workflow task: only ConfigError may."""
    try:
        signal = parse_replay_signal(value, stream="ticks")
    except ConfigError as error:
        assert str(error).startswith("stream 'ticks': replay") and "\n" not in str(error)
        return
    assert signal.from_id is None or signal.since is None


# --- comparing specs -------------------------------------------------------------------


def test_spec_differences_name_each_setting_with_old_and_new() -> None:
    running = parse_spec({**BASE, "replay_window": "2m"})
    declared = parse_spec(
        {
            **BASE,
            "url": "https://example.test/sse?token=abc",
            "replay_window": "5m",
            "headers_from_env": {"Authorization": "API_TOKEN"},
        }
    )
    changes = spec_differences(running, declared)
    assert [c.setting for c in changes] == ["url", "replay_window", "headers_from_env"]
    assert [str(c) for c in changes] == [
        "url 'https://example.test/sse' → 'https://example.test/sse?token=REDACTED'",
        "replay_window 2m → 5m",
        "headers_from_env {} → {'Authorization': 'API_TOKEN'}",
    ]
    assert spec_differences(running, running) == []


# --- the TOML file ---------------------------------------------------------------------


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "streams.toml"
    path.write_text(text, encoding="utf-8")
    return path


def test_load_streams(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
[[stream]]
name = "orders"
url = "https://example.test/orders"
id_order = "numeric"
replay_window = "10m"
retention = "90d"
max_event_bytes = 1_048_576
max_retry_delay = "5m"

[[stream]]
name = "prices"
url = "https://example.test/prices"
drop_notice = []
mercure_last_event_id = true
""",
    )
    orders, prices = load_streams(path)
    assert (orders.name, orders.id_order, orders.replay_window) == ("orders", "numeric", 600.0)
    assert (orders.retention, orders.max_event_bytes) == (90 * 86400.0, 1_048_576)
    assert (orders.max_retry_delay, prices.max_retry_delay) == (300.0, DEFAULT_MAX_RETRY_DELAY)
    assert (prices.name, prices.drop_notice, prices.mercure_last_event_id) == ("prices", [], True)


@pytest.mark.parametrize("text", ["", "# nothing yet\n", "stream = []\n"])
def test_no_streams_declared(tmp_path: Path, text: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as caught:
        load_streams(path)
    assert str(caught.value) == f"no streams declared in {path}"


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ('[[stream]]\nname = "orders"\nurl "https://example.test/"\n', "line 3"),
        ('[stream]\nname = "x"\n', "array of tables"),
        ('[[streams]]\nname = "x"\n', "unknown key 'streams': expected [[stream]] tables only"),
        ('[[stream]]\nname = "a"\nurl = "http://h/"\n' * 2, "stream 'a' is declared twice"),
        (
            '[[stream]]\nname = "a"\nurl = "http://h/"\n[[stream]]\nurl = "http://h/"\n',
            "streams.toml [[stream]] #2: stream (unnamed): setting 'name' is missing",
        ),
        (
            '[[stream]]\nname = "a"\nurl = "http://h/"\nreplay_window = inf\n',
            "stream 'a': setting 'replay_window' = inf: expected a duration",
        ),
        (
            '[[stream]]\nname = "a"\nurl = "http://h/"\nreplay_window = 1979-05-27\n',
            "setting 'replay_window' = datetime.date(1979, 5, 27): expected a duration",
        ),
    ],
)
def test_load_streams_errors(tmp_path: Path, text: str, fragment: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as caught:
        load_streams(path)
    assert fragment in str(caught.value) and "\n" not in str(caught.value)
    assert str(path) in str(caught.value)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such file"):
        load_streams(tmp_path / "missing.toml")


def test_example_stream_file_is_valid() -> None:
    specs = load_streams(Path(__file__).resolve().parents[2] / "examples" / "streams.toml")
    assert [spec.name for spec in specs] == ["ticks", "noisy", "guarded"]
