"""Drop-notice recognition: the defaults catch real wording and never a keep-alive."""

from __future__ import annotations

import re

import pytest

from durable_sse.sse.drops import (
    DEFAULT_DROP_PATTERNS,
    DropNoticeMatcher,
    dropped_count,
    is_keepalive,
)

DROP_NOTICES = [
    "dropping events",
    "Dropping events for slow client",
    "dropped 12 events",
    "discarded 37 events",
    "events dropped",
    "12 events were dropped",
    "slow consumer",
    "SLOW CONSUMER DETECTED",
    "buffer overflow, skipping events",
    "missed events",
    "you missed 5 messages",
    "queue full",
    "dropping the oldest events",
    "Events Dropped: 4",
]

KEEPALIVES = [
    "",
    " ",
    "ping",
    "PING",
    "keep-alive",
    "keepalive",
    "thump",
    "hi",
    "heartbeat",
    "1700000000",
    "1700000000.123",
    "2024-05-01T12:00:00Z",
    "2024-05-01 12:00:00+02:00",
]

INNOCENT = [
    "welcome to the stream",
    "connected",
    "retry in 5s",
    "stream opened at 12:00",
    "lost connection, resending events",
    "dropdown events",
    "drop shadow",
    "no events dropped",
    "0 events dropped",
    "dropped 0 events",
    "events dropped: 0",
    "sending events",
    "events follow",
]


@pytest.mark.parametrize("text", DROP_NOTICES)
def test_defaults_match_drop_notices(text: str) -> None:
    assert DropNoticeMatcher().matches(text) is True


@pytest.mark.parametrize("text", KEEPALIVES)
def test_keepalives_never_match(text: str) -> None:
    assert is_keepalive(text) is True
    assert DropNoticeMatcher().matches(text) is False
    # not even with a pattern that matches anything
    assert DropNoticeMatcher([".*"]).matches(text) is False


@pytest.mark.parametrize("text", INNOCENT)
def test_defaults_ignore_innocent_comments(text: str) -> None:
    assert DropNoticeMatcher().matches(text) is False


@pytest.mark.parametrize("text", DROP_NOTICES + INNOCENT)
def test_notices_are_not_keepalives(text: str) -> None:
    assert is_keepalive(text) is False


def test_defaults_are_valid_regexes() -> None:
    assert DEFAULT_DROP_PATTERNS
    for pattern in DEFAULT_DROP_PATTERNS:
        re.compile(pattern)
    assert DropNoticeMatcher(None).patterns == DEFAULT_DROP_PATTERNS


def test_custom_patterns_replace_the_defaults() -> None:
    matcher = DropNoticeMatcher([r"\bOVERRUN\b", r"^lagged"])
    assert matcher.matches("consumer overrun") is True  # case-insensitive
    assert matcher.matches("Lagged by 3") is True
    assert matcher.matches("dropping events") is False


def test_empty_pattern_list_disables() -> None:
    matcher = DropNoticeMatcher([])
    assert matcher.enabled is False
    assert matcher.matches("dropping events") is False
    assert DropNoticeMatcher().enabled is True


@pytest.mark.parametrize(
    ("text", "count"),
    [
        ("discarded 37 events", 37),
        ("dropped 12 events", 12),
        ("Dropped 1,024 old events", 1024),
        ("12 events were dropped", 12),
        ("events dropped: 4", 4),
        ("dropped=9", 9),
        ("lagged(3)", 3),
        ("dropping events", None),
        ("slow consumer", None),
        ("ping", None),
        ("dropped 0 events", 0),
    ],
)
def test_dropped_count(text: str, count: int | None) -> None:
    assert dropped_count(text) == count
