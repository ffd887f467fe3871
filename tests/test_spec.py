"""Stream settings: validation messages name the stream and the setting."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from durable_sse.errors import ConfigError
from durable_sse.spec import (
    StreamSpec,
    load_streams,
    parse_duration,
    spec_from_mapping,
    validate_spec,
)


def spec(**changes: object) -> StreamSpec:
    return dataclasses.replace(StreamSpec(name="orders", url="https://example.test/sse"), **changes)


def test_defaults_are_valid() -> None:
    valid = validate_spec(spec())
    assert valid.id_order == "natural" and valid.replay_window == 600.0


@pytest.mark.parametrize(
    ("changes", "setting"),
    [
        ({"url": "ftp://example.test/"}, "url"),
        ({"cursor_param": "last id"}, "cursor_param"),
        ({"id_order": "chronological"}, "id_order"),
        ({"replay_window": 0}, "replay_window"),
        ({"idle_timeout": -1.0}, "idle_timeout"),
        ({"connect_timeout": True}, "connect_timeout"),
        ({"drop_notice": ["(unclosed"]}, "drop_notice"),
        ({"headers_from_env": {"Bad Header": "TOKEN"}}, "headers_from_env"),
        ({"headers_from_env": {"Authorization": "1TOKEN"}}, "headers_from_env"),
        ({"batch_max_events": 0}, "batch_max_events"),
        ({"max_line_bytes": 1.5}, "max_line_bytes"),
    ],
)
def test_validate_spec_names_stream_and_setting(changes: dict[str, object], setting: str) -> None:
    with pytest.raises(ConfigError) as caught:
        validate_spec(spec(**changes))
    assert f"stream 'orders': setting '{setting}'" in str(caught.value)


def test_invalid_name_is_refused() -> None:
    with pytest.raises(ConfigError, match="setting 'name'"):
        validate_spec(spec(name="no spaces allowed"))
    with pytest.raises(ConfigError, match="setting 'name'"):
        validate_spec(spec(name="x" * 65))


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
    assert parse_duration(value, setting="replay_window") == seconds


@pytest.mark.parametrize("value", ["5 minutes", "", "-5m", True, None, [5]])
def test_parse_duration_errors_name_stream_and_setting(value: object) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_duration(value, setting="idle_timeout", stream="orders")
    assert "stream 'orders': setting 'idle_timeout'" in str(caught.value)


def test_spec_from_mapping_parses_durations() -> None:
    built = spec_from_mapping(
        {"name": "orders", "url": "http://h/sse", "replay_window": "2h", "idle_timeout": "45s"}
    )
    assert (built.replay_window, built.idle_timeout) == (7200.0, 45.0)


@pytest.mark.parametrize(
    ("data", "fragment"),
    [
        (
            {"name": "orders", "url": "http://h/", "replay_windw": 5},
            "setting 'replay_windw' is not a known",
        ),
        ({"name": "orders"}, "stream 'orders': setting 'url' is required"),
        ({"url": "http://h/"}, "setting 'name' is required"),
        (
            {"name": "orders", "url": "http://h/", "replay_window": "soon"},
            "stream 'orders': setting 'replay_window'",
        ),
        (
            {"name": "orders", "url": "http://h/", "id_order": "time"},
            "stream 'orders': setting 'id_order'",
        ),
    ],
)
def test_spec_from_mapping_errors(data: dict[str, object], fragment: str) -> None:
    with pytest.raises(ConfigError) as caught:
        spec_from_mapping(data)
    assert fragment in str(caught.value)


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

[[stream]]
name = "prices"
url = "https://example.test/prices"
drop_notice = []
""",
    )
    orders, prices = load_streams(path)
    assert (orders.name, orders.id_order, orders.replay_window) == ("orders", "numeric", 600.0)
    assert (prices.name, prices.drop_notice) == ("prices", [])


def test_load_streams_with_no_streams(tmp_path: Path) -> None:
    assert load_streams(write(tmp_path, "# nothing yet\n")) == []


def test_malformed_toml_gives_a_line_number(tmp_path: Path) -> None:
    path = write(tmp_path, '[[stream]]\nname = "orders"\nurl "https://example.test/"\n')
    with pytest.raises(ConfigError) as caught:
        load_streams(path)
    assert str(path) in str(caught.value)
    assert "line 3" in str(caught.value)


def test_load_streams_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such file"):
        load_streams(tmp_path / "missing.toml")
    with pytest.raises(ConfigError, match="array of tables"):
        load_streams(write(tmp_path, '[stream]\nname = "x"\n'))
    twice = '[[stream]]\nname = "a"\nurl = "http://h/"\n' * 2
    with pytest.raises(ConfigError, match="stream 'a' is declared twice"):
        load_streams(write(tmp_path, twice))
    bad = '[[stream]]\nname = "a"\nurl = "http://h/"\nbatch_max_events = 0\n'
    with pytest.raises(ConfigError, match="stream 'a': setting 'batch_max_events'"):
        load_streams(write(tmp_path, bad))
