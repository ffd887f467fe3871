"""Event id order: the one definition every store and the Redis script share.

An id order maps an id to a *sort key* (bytes); ids compare as their keys compare
bytewise. The same encoding is implemented in Lua inside the Redis cursor script and
stored in the event log's ``id_key`` column, so Python, Redis and SQL (``ORDER BY
id_key``) always agree on which id is newest.

* ``numeric``: ids that are ASCII digit strings order by value (``999`` < ``1000``;
  leading zeros ignored). Any other id sorts before every number.
* ``lexicographic``: UTF-8 bytes (ULIDs, zero-padded ids).
* ``natural``: digit runs compare as numbers, text runs as bytes, a digit run before
  text at the same position (``1700000000:9`` < ``1700000000:10``, ``171-9`` < ``171-10``).

Digit runs are encoded as ``<marker><4-digit length><digits without leading zeros>``;
a run longer than 9999 significant digits is treated as text.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from enum import StrEnum


class IdOrder(StrEnum):
    NUMERIC = "numeric"
    LEXICOGRAPHIC = "lexicographic"
    NATURAL = "natural"


MAX_DIGIT_RUN = 9999
_DIGIT_SPLIT = re.compile(r"([0-9]+)")


def _digit_run(run: str) -> bytes | None:
    significant = run.lstrip("0")
    if len(significant) > MAX_DIGIT_RUN:
        return None
    return b"%04d%s" % (len(significant), significant.encode("ascii"))


MAX_CONTIGUOUS_DIGITS = 40
"""Longest id (in characters, leading zeros included) read as a number for
``contiguous_ids``: 128-bit counters need 39 digits; ``int()`` refuses over 4,300."""


def contiguous_number(event_id: str) -> int | None:
    """The number a ``contiguous_ids`` stream's id stands for, or None if it is not one.

    Only plain ASCII digit strings of at most :data:`MAX_CONTIGUOUS_DIGITS` characters are
    numbers: ``"²".isdigit()`` and ``"١٢".isdigit()`` are true but such ids are no counter
    (and ``int("²")`` raises), nor are ``"+1"``, ``" 1"`` or ``"1_000"`` (which ``int()``
    would accept). Never raises; the caller counts and logs the ids it got None for.
    """
    if not event_id or len(event_id) > MAX_CONTIGUOUS_DIGITS:
        return None
    if not (event_id.isascii() and event_id.isdigit()):
        return None
    return int(event_id)


def is_successor(event_id: str, previous: str) -> bool:
    """Whether ``event_id`` is the number right after ``previous`` (both plain ASCII digit
    strings, as :func:`contiguous_number` reads them): in the ``numeric`` order no id can
    lie between the two."""
    low, high = contiguous_number(previous), contiguous_number(event_id)
    return low is not None and high is not None and high == low + 1


def sort_key(event_id: str, order: IdOrder | str) -> bytes:
    """The bytes whose bytewise order is the id order."""
    return key_function(order)(event_id)


def key_function(order: IdOrder | str) -> Callable[[str], bytes]:
    """``sort_key`` for one order, looked up once: a reader keys every event it reads."""
    try:
        return _KEY_FUNCTIONS[order]
    except KeyError:
        raise ValueError(f"{order!r} is not a valid IdOrder") from None


def _lexicographic_key(event_id: str) -> bytes:
    return event_id.encode("utf-8")


def _numeric_key(event_id: str) -> bytes:
    # isdigit() and isascii() together are exactly "ASCII digits only", without a regex.
    if event_id.isdigit() and event_id.isascii():
        significant = event_id.lstrip("0")
        if len(significant) <= MAX_DIGIT_RUN:
            return b"\x01%04d%s" % (len(significant), significant.encode("ascii"))
    return b"\x00" + event_id.encode("utf-8")


def _natural_key(event_id: str) -> bytes:
    # One split (text, digits, text, …) rather than a match object per run: this runs
    # for every event stored, and halves the time of the finditer loop.
    parts: list[bytes] = []
    for index, part in enumerate(_DIGIT_SPLIT.split(event_id)):
        if index % 2:
            run = _digit_run(part)
            parts.append(b"\x00" + run if run is not None else part.encode("ascii"))
        elif part:
            parts.append(part.encode("utf-8"))
    return b"".join(parts)


_KEY_FUNCTIONS: dict[str, Callable[[str], bytes]] = {
    IdOrder.LEXICOGRAPHIC: _lexicographic_key,
    IdOrder.NUMERIC: _numeric_key,
    IdOrder.NATURAL: _natural_key,
}
"""Keyed by the order's text: an ``IdOrder`` hashes and compares as its value."""


def compare_ids(a: str, b: str, order: IdOrder | str) -> int:
    """-1, 0 or 1 as ``a`` is older than, level with or newer than ``b``.

    Counters (ASCII digits) compare without building keys: every event passes through
    here, and under every order two counters compare by their significant digits'
    length, then their digits (under ``lexicographic`` as text), as their keys do.
    """
    if a.isdigit() and b.isdigit() and a.isascii() and b.isascii():
        if order == "lexicographic":
            return (a > b) - (a < b)
        sig_a, sig_b = a.lstrip("0"), b.lstrip("0")
        if len(sig_a) <= MAX_DIGIT_RUN and len(sig_b) <= MAX_DIGIT_RUN:
            left, right = (len(sig_a), sig_a), (len(sig_b), sig_b)
            return (left > right) - (left < right)
    key_a, key_b = sort_key(a, order), sort_key(b, order)
    return (key_a > key_b) - (key_a < key_b)


def is_newer(candidate: str | None, current: str | None, order: IdOrder | str) -> bool:
    """Whether ``candidate`` would move a cursor that stands at ``current`` forward."""
    if candidate is None or candidate == "":
        return False
    if current is None or current == "":
        return True
    return compare_ids(candidate, current, order) > 0


def newest(ids: Iterable[str | None], order: IdOrder | str) -> str | None:
    """The newest non-empty id of ``ids`` under ``order`` (None when there is none)."""
    best: str | None = None
    for event_id in ids:
        if is_newer(event_id, best, order):
            best = event_id
    return best
