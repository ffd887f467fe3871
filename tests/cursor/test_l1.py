from __future__ import annotations

from durable_sse.cursor.l1 import LocalCursors


class FakeClock:
    """A hand-moved monotonic clock, so TTL expiry is exact rather than timed."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_miss_then_forward_only_numeric() -> None:
    cursors = LocalCursors()
    assert cursors.get("s") is None
    assert cursors.advance("s", "999", "numeric") is True
    assert cursors.advance("s", "1000", "numeric") is True
    assert cursors.advance("s", "999", "numeric") is False
    assert cursors.advance("s", "1000", "numeric") is False
    assert cursors.get("s") == "1000"


def test_natural_and_lexicographic_orders() -> None:
    cursors = LocalCursors()
    assert cursors.advance("n", "1700000000-9", "natural") is True
    assert cursors.advance("n", "1700000000-10", "natural") is True
    assert cursors.advance("n", "1700000000-9", "natural") is False
    assert cursors.get("n") == "1700000000-10"
    assert cursors.advance("l", "b", "lexicographic") is True
    assert cursors.advance("l", "a", "lexicographic") is False
    assert cursors.get("l") == "b"


def test_empty_id_never_moves() -> None:
    cursors = LocalCursors()
    assert cursors.advance("s", "", "natural") is False
    assert cursors.get("s") is None
    cursors.advance("s", "5", "natural")
    assert cursors.advance("s", "", "natural") is False
    assert cursors.get("s") == "5"


def test_streams_are_separate() -> None:
    cursors = LocalCursors()
    cursors.advance("a", "10", "numeric")
    assert cursors.get("ab") is None
    assert cursors.get("a#b") is None
    cursors.advance("ab", "3", "numeric")
    assert cursors.get("a") == "10"
    assert cursors.get("ab") == "3"


def test_ttl_expires_and_refused_advance_refreshes() -> None:
    clock = FakeClock()
    cursors = LocalCursors(ttl=30.0, timer=clock)
    cursors.advance("s", "7", "numeric")
    clock.now = 25.0
    # Not newer, but the owner is still persisting: the entry must stay alive.
    assert cursors.advance("s", "6", "numeric") is False
    clock.now = 50.0
    assert cursors.get("s") == "7"
    clock.now = 81.0
    assert cursors.get("s") is None
    assert cursors.advance("s", "1", "numeric") is True


def test_forget_and_maxsize() -> None:
    cursors = LocalCursors(maxsize=2)
    cursors.advance("a", "1", "numeric")
    cursors.advance("b", "1", "numeric")
    cursors.advance("c", "1", "numeric")
    assert len(cursors) == 2
    assert cursors.get("c") == "1"
    cursors.forget("c")
    cursors.forget("never-seen")
    assert cursors.get("c") is None
