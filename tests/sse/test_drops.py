"""Drop-notice recognition: the defaults catch real wording and never a keep-alive, in linear
time (RE2), deciding as the Python-re originals did."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from durable_sse.errors import ConfigError
from durable_sse.sse.drops import (
    _NOUN,
    _VERB,
    _VERB_PAST,
    COUNT_PATTERNS,
    DEFAULT_DROP_PATTERNS,
    MAX_COUNT_DIGITS,
    MAX_NOTICE_BYTES,
    DropNoticeMatcher,
    compile_drop_pattern,
    dropped_count,
    is_keepalive,
    notice_bytes,
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


# -- RE2: linear time, the scan cap, refused patterns (issue #13, case 1) ---------------

ISSUE_NOTICE = "dropped " + ",".join(str(i) for i in range(100, 140)) + " (backpressure)"


def test_the_issue_notice_is_a_drop_notice() -> None:
    """182 bytes that took 19.8 s with Python's re (and then did not match)."""
    assert len(ISSUE_NOTICE.encode()) == 182
    assert DropNoticeMatcher().matches(ISSUE_NOTICE) is True
    assert dropped_count(ISSUE_NOTICE) is None  # a list of ids, not a count


@pytest.mark.parametrize(
    "text",
    [
        "dropped 100,101,102",
        "skipped ids 7, 8, 9",
        "Dropped 5 (backpressure)",
        "backpressure: discarding",
        "discarded 3 (back-pressure)",
    ],
)
def test_id_lists_and_backpressure_are_drop_notices(text: str) -> None:
    assert DropNoticeMatcher().matches(text) is True


@pytest.mark.parametrize(
    "text",
    [
        "lost connection (backpressure)",
        "backpressure on",
        "dropped 1.5",
        "skipped 2024-05-01",
        "dropped 0,0 events",
    ],
)
def test_near_misses_of_the_new_patterns(text: str) -> None:
    assert DropNoticeMatcher().matches(text) is False


def test_only_the_first_max_notice_bytes_are_scanned() -> None:
    pad = ("x " * MAX_NOTICE_BYTES)[: MAX_NOTICE_BYTES - len("dropping events") - 1] + " "
    assert DropNoticeMatcher().matches(pad + "dropping events") is True
    assert DropNoticeMatcher().matches(pad + "x" + "dropping events") is False
    beyond = ("x " * MAX_NOTICE_BYTES)[:MAX_NOTICE_BYTES] + " dropping events"
    assert DropNoticeMatcher().matches(beyond) is False
    assert len(notice_bytes("é" * MAX_NOTICE_BYTES)) == MAX_NOTICE_BYTES
    assert notice_bytes("a\ud800b") == b"a?b"  # a lone surrogate never raises


@pytest.mark.parametrize(
    ("unit", "suffix", "expected"),
    [
        ("1 ", "", False),
        ("the old 1,_ ", "", False),
        ("no events zero events 0 events ", "", False),
        ("x ", "dropped 1,2", True),
        ("stream ", "events dropped", True),
    ],
)
def test_hostile_comments_at_the_cap_are_decided(unit: str, suffix: str, expected: bool) -> None:
    """The worst cases of bench/drops.py, here for their answer (their time is measured
    there). With a backtracking engine the first three would not finish."""
    body = "dropped " + unit * (MAX_NOTICE_BYTES // len(unit))
    text = body[: MAX_NOTICE_BYTES - len(suffix) - 1] + " " + suffix
    assert len(text.encode()) == MAX_NOTICE_BYTES
    matcher = DropNoticeMatcher()
    for _ in range(100):
        assert matcher.matches(text) is expected


def test_catastrophic_user_patterns_run_in_linear_time() -> None:
    """Exponential for a backtracking engine (2**4096 paths); RE2 answers at once."""
    matcher = DropNoticeMatcher(["(x+x+)+y", r"^(\w+\s?)+!$", "(a|aa)*b"])
    assert matcher.matches("x" * MAX_NOTICE_BYTES) is False
    assert matcher.matches("word " * 800) is False
    assert matcher.matches("a" * 4000 + "b") is True


@pytest.mark.parametrize(
    ("pattern", "says"),
    [
        (r"(?<!no )events dropped", "invalid perl operator"),
        (r"dropped(?= events)", "invalid perl operator"),
        (r"(dropped) \1", "invalid escape sequence"),
        (r"dropped\Z", "\\z"),
        ("x{1001}", "invalid repetition size"),
        ("(unclosed", "missing )"),
    ],
)
def test_patterns_re2_refuses_are_config_errors(pattern: str, says: str) -> None:
    with pytest.raises(ConfigError) as caught:
        compile_drop_pattern(pattern, stream="orders")
    message = str(caught.value)
    assert "stream 'orders'" in message
    assert "'drop_notice'" in message
    assert repr(pattern) in message
    assert says in message
    with pytest.raises(ConfigError):
        DropNoticeMatcher(["dropping", pattern])


def test_compile_drop_pattern_refuses_non_strings_and_surrogates() -> None:
    with pytest.raises(ConfigError, match="must be a string"):
        compile_drop_pattern(12)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="lone surrogate"):
        compile_drop_pattern("drop\ud800")


def test_compile_drop_pattern_is_case_insensitive_re2() -> None:
    compiled = compile_drop_pattern(r"\bOVERRUN\b")
    assert compiled.search("consumer overrun") is not None
    assert compiled.search(b"CONSUMER OVERRUN") is not None
    assert compiled.search("overrunning") is None


@pytest.mark.parametrize(
    ("text", "count"),
    [
        ("dropped " + "9" * 19 + " events", None),  # more than MAX_COUNT_DIGITS
        ("dropped " + "9" * 5000 + " events", None),  # more than int() parses
        ("dropped " + "0" * 30 + "7 events", 7),  # leading zeros are not significant
        ("dropped ²³ events", None),  # not ASCII digits
        ("dropped ١٢ events", None),
    ],
)
def test_dropped_count_never_raises_on_odd_digits(text: str, count: int | None) -> None:
    assert dropped_count(text) == count
    assert MAX_COUNT_DIGITS == 18


# -- counts without a noun (issue #33, item 4) -----------------------------------------

ISSUE_33_NOTICE = ": dropping events (slow consumer), 30 discarded"

NEW_COUNT_WORDINGS = [
    (ISSUE_33_NOTICE, 30),
    ("dropping events (slow consumer), 30 discarded", 30),
    ("30 discarded", 30),
    ("30 dropped", 30),
    ("30 skipped", 30),
    ("30 were dropped", 30),
    ("30 dropped events", 30),
    ("slow consumer: 30 dropped", 30),
    ("slow consumer; 30 skipped!", 30),
    ("(30 dropped)", 30),
    ("30 discarded (slow consumer)", 30),
    ("dropped 30", 30),
    ("Dropped 30.", 30),
    ("discarded 30", 30),
    ("skipped 30", 30),
    ("lost 30", 30),
    ("dropped 30, resuming", 30),
    ("dropped 30 (slow consumer)", 30),
    ("dropped 30 - slow consumer", 30),
    ("dropped 30 due to backpressure", 30),
    ("discarded 5 since id 42", 5),
    ("dropped 1,024", 1024),
    ("1,024 discarded", 1024),
    ("dropped 12,345,678", 12345678),
    ("dropped 1_000", 1000),
    ("2_500 skipped", 2500),
    ("dropped 00030", 30),
    ("dropped 0", 0),
    ("0 discarded", 0),
]


@pytest.mark.parametrize(("text", "count"), NEW_COUNT_WORDINGS)
def test_counts_without_a_noun(text: str, count: int) -> None:
    assert dropped_count(text) == count
    assert _old_count(text) is None  # the original patterns read no count here


@pytest.mark.parametrize(
    ("text", "count"),
    [
        ("30 events dropped", 30),
        ("dropped 30 events", 30),
        ("30 events were dropped", 30),
        ("30 messages discarded", 30),
        ("lost 30 events", 30),
        ("skipped 30 events", 30),
        ("dropped 1,024 events", 1024),
        ("1_000 events dropped", 1000),
        ("0 events dropped", 0),
        ("dropped 0,0 events", 0),
        ("dropped 100,101,102 events", 100101102),  # as the original patterns read it
    ],
)
def test_counts_with_a_noun_read_as_before(text: str, count: int) -> None:
    assert dropped_count(text) == count == _old_count(text)


@pytest.mark.parametrize(
    "text",
    [
        "dropped 100,101,102",  # an id list (issue #13)
        ISSUE_NOTICE,
        "skipped ids 7, 8, 9",
        "dropped 123,456",  # cannot be told from two ids: unknown, not a guess
        "100,101 dropped",
        "retry in 30 s",
        "since id 42",
        "dropped events since id 42",
        "event 42 dropped",
        "id 42 dropped",
        "#42 dropped",
        "ids 5-30 dropped",
        "12:30 dropped",
        "1.5 dropped",
        "dropped 1.5",
        "skipped 2024-05-01",
        "dropped 30 s",
        "dropped 30 seconds ago",
        "dropped 30 clients",
        "lost 2 connections",
        "missed 5 heartbeats",
        "dropped 1,0245",
        "dropped " + "9" * 19,  # more than MAX_COUNT_DIGITS
        "9" * 19 + " dropped",
    ],
)
def test_numbers_that_are_not_the_count(text: str) -> None:
    assert dropped_count(text) is None


def test_the_issue_33_notice_announces_its_count() -> None:
    assert DropNoticeMatcher().matches(ISSUE_33_NOTICE) is True
    assert dropped_count(ISSUE_33_NOTICE) == 30


@pytest.mark.parametrize("text", ["slow consumer, 0 dropped", "dropped 0 (backpressure)"])
def test_a_zero_count_without_a_noun_is_not_a_drop(text: str) -> None:
    """As for "0 events dropped": a notice that counts nothing lost opens no gap."""
    assert DropNoticeMatcher().matches(text) is False


def test_count_patterns_are_one_re2_list() -> None:
    for pattern in COUNT_PATTERNS:
        compile_drop_pattern(pattern)  # RE2 accepts each (no lookaround)
        assert re.compile(pattern).groups >= 1
    assert len(set(COUNT_PATTERNS)) == len(COUNT_PATTERNS)


_ID_VERBS = ["dropped", "discarded", "skipped", "lost", "Dropped", "dropping"]


@settings(max_examples=1000, deadline=None)
@given(
    st.sampled_from(_ID_VERBS),
    st.lists(st.integers(100, 10**9), min_size=2, max_size=6),
    st.sampled_from(["", " (backpressure)", ", resuming", ".", " since id 7"]),
)
def test_id_lists_of_wide_ids_give_no_count(verb: str, ids: list[int], tail: str) -> None:
    """Ids of three digits or more, comma-separated after a verb with no noun, are a list."""
    assert dropped_count(verb + " " + ",".join(map(str, ids)) + tail) is None


# -- same decisions as the Python-re implementation (ASCII text) -------------------------

_OLD_NOUN_VERB = (
    rf"(?<!\bno\s)(?<!\b0\s)(?<!zero\s)\b{_NOUN}\b\W{{0,3}}(?:\(\d+\)\W*)?"
    rf"(?:(?:were|was|have\s+been|has\s+been|are\s+being|is\s+being|being|got)\s+)?{_VERB_PAST}\b"
)
_OLD_PATTERNS = (DEFAULT_DROP_PATTERNS[0], _OLD_NOUN_VERB, *DEFAULT_DROP_PATTERNS[2:4])
_OLD_KEEPALIVE_SHAPE = re.compile(r"[\d\s:.,\-+/TZtz]*|[.\-_*~]+")
_OLD_COUNTS = (
    re.compile(rf"\b{_VERB}\s+(\d[\d,_]*)\s+(?:\w+\s+){{0,2}}?{_NOUN}\b", re.IGNORECASE),
    re.compile(
        rf"\b(\d[\d,_]*)\s+(?:\w+\s+){{0,2}}?{_NOUN}\s+"
        rf"(?:(?:were|was|have\s+been|has\s+been|are\s+being|being)\s+)?{_VERB_PAST}\b",
        re.IGNORECASE,
    ),
    re.compile(rf"\b(?:{_NOUN}\s+)?{_VERB_PAST}\s*[:=]\s*(\d[\d,_]*)", re.IGNORECASE),
    re.compile(rf"\b(?:{_VERB_PAST}|lagged)\s*\(\s*(\d[\d,_]*)\s*\)", re.IGNORECASE),
)
_WORDS = [
    "no", "No", "0", "10", "zero", "Zero", "nonzero", "piano", "go", "pro", "hero", "o",
    "events", "Event", "messages", "updates", "dropped", "dropping", "discarded", "lost",
    "missed", "skipped", "were", "have been", "being", "got", "(3)", "12", "1,024", "the",
    "old", "oldest", "some", "slow", "consumer", "buffer", "overflow", "queue", "full",
    "lagged", "(7)", ":", "=", "5", ",", ".", "-", "_", "~", "connection", "x", "",
]  # fmt: skip
_SEPARATORS = [" ", "  ", "", ",", ", ", ": ", "-", "\t", "(", ")", "!", "_"]


@st.composite
def ascii_comments(draw: st.DrawFn) -> str:
    words = draw(st.lists(st.sampled_from(_WORDS), max_size=8))
    text = ""
    for word in words:
        text += draw(st.sampled_from(_SEPARATORS)) + word
    return text + draw(st.sampled_from(["", " ", "!", "x"]))


def _old_count(text: str) -> int | None:
    for pattern in _OLD_COUNTS:
        match = pattern.search(text)
        if match is not None:
            return int(match.group(1).replace(",", "").replace("_", ""))
    return None


@settings(max_examples=3000, deadline=None)
@given(ascii_comments())
def test_defaults_decide_as_the_python_re_originals(text: str) -> None:
    """Each of the original four patterns (with their lookbehinds, on Python's re) and
    its RE2 form agree, as do the counts the originals read, on ASCII comments built from
    their words."""
    scanned = notice_bytes(text)
    for old, new in zip(_OLD_PATTERNS, DEFAULT_DROP_PATTERNS[:4], strict=True):
        expected = re.search(old, text, re.IGNORECASE) is not None
        assert (compile_drop_pattern(new).search(scanned) is not None) is expected, (old, text)
    # The original count patterns come first and decide as they did; where they read no
    # count, the noun-less forms of issue #33 may.
    old_count = _old_count(text)
    if old_count is not None:
        assert dropped_count(text) == old_count


_KEEPALIVE_CHARS = "0189٠٣۵०੪０ \t\x0b\x0c\x1c\x1f\x85\xa0\u2003\u2028\u3000:.,-+/TZtz_*~xé²"


@settings(max_examples=3000, deadline=None)
@given(st.text(alphabet=_KEEPALIVE_CHARS, max_size=12))
def test_keepalive_shape_decides_as_the_python_re_original(text: str) -> None:
    stripped = text.strip()
    words = stripped.lower().rstrip("!.") in {"ok", "hi"}
    expected = not stripped or words or _OLD_KEEPALIVE_SHAPE.fullmatch(stripped) is not None
    assert is_keepalive(text) is expected


def test_the_unicode_space_class_is_pythons_whitespace() -> None:
    spaces = "".join(chr(c) for c in range(0x3001) if chr(c).isspace())
    assert is_keepalive("1" + spaces + "2") is True
    assert is_keepalive("1\u200b2") is False  # zero-width space is not whitespace
