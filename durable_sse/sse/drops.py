"""Recognise drop notices among SSE comments.

Some servers announce, in a comment line, that they are discarding events for a slow
consumer (``: dropping events``). Such a notice means a hole to repair, so it must be
told apart from the keep-alive comments that servers send all the time (``:``,
``: ping``, ``:thump``), which must never count as a drop. The default patterns are
deliberately conservative: a false drop costs one throttled replay, a keep-alive that
matched would cost one on every ping.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence

logger = logging.getLogger(__name__)

_NOUN = r"(?:events?|messages?|updates?|notifications?)"
_VERB_PAST = r"(?:dropped|discarded|skipped|lost|missed|evicted|purged)"
_VERB = (
    r"(?:drop(?:ping|ped|s)?|discard(?:ing|ed|s)?|skip(?:ping|ped|s)?|los(?:ing|t)|missed|"
    r"evict(?:ing|ed))"
)
# Words allowed between a verb and its noun ("dropped 12 old events"); a closed list so
# "lost connection, resending events" does not read as a drop.
_FILLER = (
    r"(?:[1-9][\d,_]*|\d[\d,_]*[1-9][\d,_]*|some|several|many|the|your|old(?:est)?|"
    r"pending|queued|buffered|recent|stale|of|up|to|about|approx(?:imately)?|~)"
)

DEFAULT_DROP_PATTERNS: tuple[str, ...] = (
    # "dropping events", "dropped 12 events", "discarded 37 old events", "missed events"
    rf"\b{_VERB}\W+(?:{_FILLER}\W+){{0,3}}{_NOUN}\b",
    # "events dropped", "12 events were dropped", "messages have been discarded"
    rf"(?<!\bno\s)(?<!\b0\s)(?<!zero\s)\b{_NOUN}\b\W{{0,3}}(?:\(\d+\)\W*)?"
    rf"(?:(?:were|was|have\s+been|has\s+been|are\s+being|is\s+being|being|got)\s+)?{_VERB_PAST}\b",
    # "slow consumer", "slow client detected"
    r"\bslow\s+(?:consumer|client|subscriber|reader|receiver)\b",
    # "buffer overflow, skipping events", "queue full"
    r"\b(?:buffer|queue|backlog)\s+(?:overflow(?:ed)?|overrun|full|exceeded)\b",
)
"""Regexes (searched case-insensitively) that mark a comment as a drop notice."""

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
_KEEPALIVE_SHAPE = re.compile(r"[\d\s:.,\-+/TZtz]*|[.\-_*~]+")

_COUNT_PATTERNS = (
    re.compile(rf"\b{_VERB}\s+(\d[\d,_]*)\s+(?:\w+\s+){{0,2}}?{_NOUN}\b", re.IGNORECASE),
    re.compile(
        rf"\b(\d[\d,_]*)\s+(?:\w+\s+){{0,2}}?{_NOUN}\s+"
        rf"(?:(?:were|was|have\s+been|has\s+been|are\s+being|being)\s+)?{_VERB_PAST}\b",
        re.IGNORECASE,
    ),
    re.compile(rf"\b(?:{_NOUN}\s+)?{_VERB_PAST}\s*[:=]\s*(\d[\d,_]*)", re.IGNORECASE),
    re.compile(rf"\b(?:{_VERB_PAST}|lagged)\s*\(\s*(\d[\d,_]*)\s*\)", re.IGNORECASE),
)


def is_keepalive(comment_text: str) -> bool:
    """True for comments that only keep the connection open (empty, ``ping``, timestamps)."""
    text = comment_text.strip()
    if not text:
        return True
    if text.lower().rstrip("!.") in _KEEPALIVE_WORDS:
        return True
    return _KEEPALIVE_SHAPE.fullmatch(text) is not None


def dropped_count(text: str) -> int | None:
    """How many events a drop notice says were skipped (``discarded 37 events`` -> 37)."""
    for pattern in _COUNT_PATTERNS:
        match = pattern.search(text)
        if match is not None:
            return int(match.group(1).replace(",", "").replace("_", ""))
    return None


class DropNoticeMatcher:
    """Decides whether a comment is a drop notice, from a stream's ``drop_notice`` setting.

    Args:
        patterns: regexes searched case-insensitively in the comment text; None means
            :data:`DEFAULT_DROP_PATTERNS`, an empty sequence disables comment drop notices.
    """

    def __init__(self, patterns: Sequence[str] | None = None) -> None:
        chosen = DEFAULT_DROP_PATTERNS if patterns is None else tuple(patterns)
        self.patterns: tuple[str, ...] = chosen
        self._compiled = tuple(re.compile(pattern, re.IGNORECASE) for pattern in chosen)

    @property
    def enabled(self) -> bool:
        return bool(self._compiled)

    def matches(self, comment_text: str) -> bool:
        """True when the comment announces dropped events.

        Keep-alives never match, nor does a notice that counts zero dropped events.
        """
        if not self._compiled or is_keepalive(comment_text):
            return False
        if not any(pattern.search(comment_text) for pattern in self._compiled):
            return False
        # "events dropped: 0" reports that nothing was lost.
        return dropped_count(comment_text) != 0
