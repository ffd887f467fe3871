"""Recognise drop notices among SSE comments.

Some servers announce, in a comment line, that they are discarding events for a slow
consumer (``: dropping events``). Such a notice means a hole to repair, so it must be
told apart from the keep-alive comments that servers send all the time (``:``,
``: ping``, ``:thump``), which must never count as a drop. The default patterns are
deliberately conservative: a false drop costs one throttled replay, a keep-alive that
matched would cost one on every ping.

Every pattern (the defaults and a stream's own ``drop_notice``) and every other match on
server text here runs on RE2 (``google-re2``), whose time is linear in the text whatever
the pattern. A server chooses its comments: with Python's backtracking ``re`` the old
defaults took 19.8 s on one 182-byte comment, on the event loop, stalling every connection
of the worker. RE2 has no lookaround and no backreferences, so a pattern it cannot compile
is refused with a :class:`~durable_sse.errors.ConfigError` (:func:`compile_drop_pattern`),
and only the first :data:`MAX_NOTICE_BYTES` of a comment are scanned.

RE2's ``\\b``, ``\\w``, ``\\d`` and ``\\s`` are ASCII-only (Python's are Unicode), and case
folding is Unicode. Notices are English text, so the defaults decide as before on ASCII
text; ``bench/drops.py`` measures the worst case at the cap.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence
from typing import Any

import re2

from durable_sse.errors import ConfigError

logger = logging.getLogger(__name__)

MAX_NOTICE_BYTES = 4096
"""Only this many leading bytes (UTF-8) of a comment are scanned for a drop notice (and
read as a keep-alive): a notice says what it is in its first words, and the cap bounds the
work per comment (RE2 is linear, so at most a few patterns x 4 KiB)."""
MAX_COUNT_DIGITS = 18
"""A count of dropped events with more significant digits than this is not believed:
:func:`dropped_count` says None (unknown), so ``int()`` never sees thousands of digits."""

_NOUN = r"(?:events?|messages?|updates?|notifications?)"
_VERB_PAST = r"(?:dropped|discarded|skipped|lost|missed|evicted|purged)"
_VERB = (
    r"(?:drop(?:ping|ped|s)?|discard(?:ing|ed|s)?|skip(?:ping|ped|s)?|los(?:ing|t)|missed|"
    r"evict(?:ing|ed))"
)
# Verbs that, next to "backpressure", only mean discarding (not "lost connection").
_DISCARD_VERB = r"(?:drop(?:ping|ped|s)?|discard(?:ing|ed|s)?|skip(?:ping|ped|s)?|evict(?:ing|ed))"
# Words allowed between a verb and its noun ("dropped 12 old events"); a closed list so
# "lost connection, resending events" does not read as a drop.
_FILLER = (
    r"(?:[1-9][\d,_]*|\d[\d,_]*[1-9][\d,_]*|some|several|many|the|your|old(?:est)?|"
    r"pending|queued|buffered|recent|stale|of|up|to|about|approx(?:imately)?|~)"
)
# What may stand right before the noun of "<noun> dropped" so that it is not "no <noun>",
# "0 <noun>" or "zero <noun>": the same decision as the lookbehinds
# (?<!\bno\s)(?<!\b0\s)(?<!zero\s), which RE2 lacks, written as the characters allowed to
# precede. The search only needs *some* position to match, so consuming them is harmless.
_NOT_NEGATED = (
    r"(?:^|[^\w\s]"  # the start, or punctuation right before the noun
    r"|(?:^|[^o0])\s"  # a space after anything but "o" or "0"
    r"|\w0\s"  # "10 events" is a number ending in 0, not the word "0"
    r"|\wno\s"  # "piano events"
    r"|(?:^|[^nr])o\s"  # "go events"
    r"|(?:^|[^e])ro\s"  # "pro events"
    r"|(?:^|[^z])ero\s)"  # "hero events", but not "zero events"
)

DEFAULT_DROP_PATTERNS: tuple[str, ...] = (
    # "dropping events", "dropped 12 events", "discarded 37 old events", "missed events"
    rf"\b{_VERB}\W+(?:{_FILLER}\W+){{0,3}}{_NOUN}\b",
    # "events dropped", "12 events were dropped", "messages have been discarded", not
    # "no events dropped"
    rf"{_NOT_NEGATED}\b{_NOUN}\b\W{{0,3}}(?:\(\d+\)\W*)?"
    rf"(?:(?:were|was|have\s+been|has\s+been|are\s+being|is\s+being|being|got)\s+)?{_VERB_PAST}\b",
    # "slow consumer", "slow client detected"
    r"\bslow\s+(?:consumer|client|subscriber|reader|receiver)\b",
    # "buffer overflow, skipping events", "queue full"
    r"\b(?:buffer|queue|backlog)\s+(?:overflow(?:ed)?|overrun|full|exceeded)\b",
    # a list of ids after the verb: "dropped 100,101,…,139", "skipped ids 7, 8"
    rf"\b{_VERB}\W+(?:ids?\W+)?\d+(?:\s*,[\s,.…]*\d+)+",
    # "dropped 3 (backpressure)", "backpressure: discarding"
    rf"\b{_DISCARD_VERB}\b.*\bback[\s-]?pressure\b|\bback[\s-]?pressure\b.*\b{_DISCARD_VERB}\b",
)
"""Regexes (searched case-insensitively, with RE2) that mark a comment as a drop notice.

They are valid for Python's ``re`` too, but are only ever run on RE2."""


def _options(*, case_sensitive: bool) -> re2.Options:
    options = re2.Options()
    options.case_sensitive = case_sensitive
    options.log_errors = False  # a refused pattern is a ConfigError, not stderr noise
    return options


_IGNORE_CASE = _options(case_sensitive=False)
_EXACT_CASE = _options(case_sensitive=True)


def compile_drop_pattern(pattern: str, *, stream: str | None = None) -> re2._Regexp:
    """Compile one ``drop_notice`` pattern with RE2, case-insensitively, as matching uses it.

    Call it to validate a stream's setting (compiled patterns are cached by RE2's module,
    so the matcher reuses the work).

    Raises:
        ConfigError: RE2 cannot compile the pattern (lookaround, backreferences, ``\\Z``,
            a repeat over 1000, too large a program) or it is not a string; the message
            names the stream (when given), the setting and the pattern.
    """
    where = f"stream {stream!r}: " if stream is not None else ""
    if not isinstance(pattern, str):
        raise ConfigError(
            f"{where}setting 'drop_notice': pattern {pattern!r} must be a string, "
            f"not {type(pattern).__name__}"
        )
    try:
        return re2.compile(pattern, _IGNORE_CASE)
    except re2.error as error:
        reason = error.args[0] if error.args else "not accepted"
        if isinstance(reason, bytes):
            reason = reason.decode("utf-8", "replace")
        hint = " (RE2 writes the end of text as \\z)" if "\\Z" in pattern else ""
    except UnicodeEncodeError:
        reason, hint = "it is not valid Unicode text (a lone surrogate)", ""
    raise ConfigError(
        f"{where}setting 'drop_notice': pattern {pattern!r} cannot be used: {reason}{hint}. "
        "Drop-notice patterns run on RE2, in linear time, which has no lookahead, "
        "lookbehind or backreferences: rewrite the pattern without them"
    )


# Python's \s (str.isspace) as a class, so the keep-alive shape decides as it did with `re`.
_UNICODE_SPACE = (
    r"\t\n\x0b\x0c\r\x1c-\x20\x{85}\x{a0}\x{1680}\x{2000}-\x{200a}\x{2028}\x{2029}"
    r"\x{202f}\x{205f}\x{3000}"
)
_KEEPALIVE_SHAPE = re2.compile(rf"[\p{{Nd}}{_UNICODE_SPACE}:.,\-+/TZtz]*|[.\-_*~]+", _EXACT_CASE)
_KEEPALIVE_WORDS = frozenset(
    {
        "ping",
        "pong",
        "keep-alive",
        "keepalive",
        "keep alive",
        "keep_alive",
        "heartbeat",
        "heart-beat",
        "hb",
        "thump",
        "hi",
        "hello",
        "noop",
        "nop",
        "tick",
        "idle",
        "alive",
        "ok",
    }
)

# The count without a noun ("30 discarded", "dropped 30"). Its number is a plain one or one
# grouped in thousands ("1,024", "1_000_000"), whose first group has at most two digits
# when the groups are commas: "dropped 100,101,102" is the id list of issue #13 (a default
# pattern above), and "123,456" cannot be told from a list of two ids, so it stays unknown.
# Its length is bounded (a little over MAX_COUNT_DIGITS, for leading zeros), so a match
# never spans the whole comment: RE2 then finds the groups of a short match only.
_COUNT_NUMBER = r"(\d{1,2}(?:,\d{3}){1,6}|\d{1,3}(?:_\d{3}){1,6}|\d{1,24})"
# What may come before such a number: the start, an opening bracket, or punctuation and a
# space, so that "event 42 dropped", "#42 dropped", "ids 5-30 dropped", "12:30 dropped",
# "1.5 dropped" and "100,101 dropped" give no count.
_COUNT_BEFORE = r"(?:^\s*|[(\[]\s*|[,;:]\s+|\s-+\s+)"
# What may come after the count and its verb: the end, punctuation that ends the number (not
# "1.5", "2024-05-01" or "100,101"), or a word from a closed list, so that "dropped 30 s",
# "dropped 30 seconds ago" and "dropped 30 clients" give no count.
_COUNT_AFTER = (
    rf"(?:\s*(?:$|[;!?()\[\]]|[,.:](?:\s|$))|\s+-+(?:\s|$)|\s+(?:{_NOUN}|due|for|because|"
    r"since|while|after|during|from|by|on|in|at|to|so|as|and)\b)"
)
_COUNT_AUXILIARY = r"(?:(?:were|was|have\s+been|has\s+been|are\s+being|being)\s+)"

COUNT_PATTERNS: tuple[str, ...] = (
    # "dropped 12 events", "lost 3 old messages"
    rf"\b{_VERB}\s+(\d[\d,_]*)\s+(?:\w+\s+){{0,2}}?{_NOUN}\b",
    # "12 events were dropped", "30 messages discarded"
    rf"\b(\d[\d,_]*)\s+(?:\w+\s+){{0,2}}?{_NOUN}\s+{_COUNT_AUXILIARY}?{_VERB_PAST}\b",
    # "events dropped: 4", "dropped=9"
    rf"\b(?:{_NOUN}\s+)?{_VERB_PAST}\s*[:=]\s*(\d[\d,_]*)",
    # "lagged(3)", "dropped (7)"
    rf"\b(?:{_VERB_PAST}|lagged)\s*\(\s*(\d[\d,_]*)\s*\)",
    # "slow consumer, 30 discarded", "30 were dropped", "1,024 skipped (backpressure)"
    rf"{_COUNT_BEFORE}{_COUNT_NUMBER}\s+{_COUNT_AUXILIARY}?{_VERB_PAST}{_COUNT_AFTER}",
    # "dropped 30", "skipped 1_000 (slow consumer)", "discarded 5 since id 42"
    rf"\b{_VERB_PAST}\s+{_COUNT_NUMBER}{_COUNT_AFTER}",
)
"""Regexes (searched case-insensitively, with RE2) whose group 1 is how many events a drop
notice says were skipped, tried in this order, the first match deciding. The first four are
the original forms (a noun, or ``:``/``=``/``(…)`` after the verb), and decide first as they
always did; the last two read a count with no noun next to it.

Like :data:`DEFAULT_DROP_PATTERNS`, they are valid for Python's ``re`` too, but are only
ever run on RE2."""
_COUNT_COMPILED = tuple(re2.compile(pattern, _IGNORE_CASE) for pattern in COUNT_PATTERNS)


def notice_bytes(comment_text: str) -> bytes:
    """The part of a comment that is scanned: its first :data:`MAX_NOTICE_BYTES`, as UTF-8.

    A lone surrogate (never produced by the decoder) becomes ``?`` instead of raising.
    """
    return comment_text[:MAX_NOTICE_BYTES].encode("utf-8", "replace")[:MAX_NOTICE_BYTES]


def is_keepalive(comment_text: str) -> bool:
    """True for comments that only keep the connection open (empty, ``ping``, timestamps).

    Only the first :data:`MAX_NOTICE_BYTES` characters are looked at.
    """
    text = comment_text[:MAX_NOTICE_BYTES].strip()
    if not text:
        return True
    if text.lower().rstrip("!.") in _KEEPALIVE_WORDS:
        return True
    return _KEEPALIVE_SHAPE.fullmatch(text.encode("utf-8", "replace")) is not None


def dropped_count(text: str) -> int | None:
    """How many events a drop notice says were skipped (``discarded 37 events`` -> 37,
    ``slow consumer, 30 discarded`` -> 30), read with :data:`COUNT_PATTERNS`.

    None when the notice gives no count (an id list such as ``dropped 100,101,102`` is
    none), or one of more than :data:`MAX_COUNT_DIGITS` significant digits.
    """
    return _count(notice_bytes(text))


def _count(scanned: bytes) -> int | None:
    for pattern in _COUNT_COMPILED:
        match = pattern.search(scanned)
        if match is not None:
            digits = match.group(1).replace(b",", b"").replace(b"_", b"").lstrip(b"0")
            if len(digits) > MAX_COUNT_DIGITS:
                return None
            return int(digits) if digits else 0  # RE2's \d is ASCII: int() accepts it
    return None


@functools.lru_cache(maxsize=512)
def _compiled(patterns: tuple[str, ...]) -> tuple[Any, ...]:
    """Compiled once per set of patterns: every connection builds a matcher, and a worker
    reconnects hundreds of streams a second after a restart."""
    return tuple(compile_drop_pattern(pattern) for pattern in patterns)


class DropNoticeMatcher:
    """Decides whether a comment is a drop notice, from a stream's ``drop_notice`` setting.

    Args:
        patterns: regexes searched case-insensitively (RE2 syntax) in the comment text;
            None means :data:`DEFAULT_DROP_PATTERNS`, an empty sequence disables comment
            drop notices.

    Raises:
        ConfigError: a pattern RE2 cannot compile (see :func:`compile_drop_pattern`).
    """

    def __init__(self, patterns: Sequence[str] | None = None) -> None:
        chosen = DEFAULT_DROP_PATTERNS if patterns is None else tuple(patterns)
        self.patterns: tuple[str, ...] = chosen
        self._compiled = _compiled(chosen)

    @property
    def enabled(self) -> bool:
        return bool(self._compiled)

    def matches(self, comment_text: str) -> bool:
        """True when the comment announces dropped events.

        Keep-alives never match, nor does a notice that counts zero dropped events. Time
        is linear in ``min(len(comment_text), MAX_NOTICE_BYTES)`` per pattern.
        """
        if not self._compiled or is_keepalive(comment_text):
            return False
        scanned = notice_bytes(comment_text)
        if not any(pattern.search(scanned) for pattern in self._compiled):
            return False
        # "events dropped: 0" reports that nothing was lost.
        return _count(scanned) != 0
