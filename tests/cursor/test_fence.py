"""The fence (durable_sse/cursor/fence.py): open gaps cap the lagging id, and where a
connection starts. Plain tests of pure functions.
"""

from __future__ import annotations

import pytest

from durable_sse.cursor.fence import choose_start, lagging_cap, lagging_target, oldest_open
from durable_sse.gaps.model import (
    GapRecord,
    GapState,
)
from tests.gaps.helpers import (
    ORDER,
    gap,
    neighbour,
    start,
)


def test_the_lagging_id_is_capped_by_the_oldest_open_resume_point() -> None:
    gaps = [
        gap("a", "50", "60"),
        gap("b", "20", "30", reread_to="27"),
        gap("c", "10", "15", state=GapState.REPAIRED.value),
    ]
    assert lagging_cap(gaps, ORDER) == ("27", True)
    assert lagging_cap([], ORDER) == (None, False)
    assert lagging_cap([gaps[2]], ORDER) == (None, False)
    assert lagging_cap([gaps[0], gap("d", None, "5")], ORDER) == (None, True)
    assert lagging_cap([gap("a", "9", "12"), gap("b", "10", "12")], ORDER) == ("9", True)


@pytest.mark.parametrize(
    ("candidate", "gaps", "expected"),
    [
        ("40", [], ("40", False, None)),
        (None, [], (None, False, None)),
        ("40", [gap("a", "25", "30")], ("25", True, "25")),
        ("25", [gap("a", "25", "30")], ("25", True, "25")),
        ("24", [gap("a", "25", "30")], ("24", True, "25")),
        (None, [gap("a", "25", "30")], (None, True, "25")),  # nothing a window old yet
        ("40", [gap("a", None, "30")], (None, True, None)),
        ("100", [gap("a", "25", "30", reread_to="99")], ("99", True, "99")),
    ],
)
def test_lagging_target(
    candidate: str | None, gaps: list[GapRecord], expected: tuple[str | None, bool, str | None]
) -> None:
    assert lagging_target(candidate, gaps, ORDER) == expected


def test_oldest_open_is_the_oldest_resume_point() -> None:
    a = gap("a", "20", "30", reread_to="28")
    b = gap("b", "25", "40")
    closed = gap("c", "1", "5", state=GapState.UNRECOVERABLE.value)
    assert oldest_open([a, b, closed], ORDER) is b
    assert oldest_open([gap("d", None, "9"), a], ORDER) is a
    assert oldest_open([closed], ORDER) is None
    assert oldest_open([gap("x", "9", "12"), gap("y", "10", "12")], ORDER).gap_id == "x"  # type: ignore[union-attr]


def test_a_repair_starts_one_stored_id_before_the_oldest_resume_point() -> None:
    gaps = [gap("a", "40", "45"), gap("b", "30", "35")]
    assert start(repair=True, lagging="20", gaps=gaps) == ("20", "gap", "30")
    # a resume point between stored ids: the stored id before it
    assert start(repair=True, gaps=[gap("a", "30", "45", reread_to="33")]) == ("30", "gap", "40")
    # nothing stored before it: the resume point itself
    assert start(repair=True, gaps=[gap("a", "10", "15")]) == ("10", "gap", "20")
    assert start(repair=True, gaps=[gap("a", "5", "15")]) == ("5", "gap", "10")


def test_a_repair_with_no_gap_open_starts_one_stored_id_before_the_lagging_id() -> None:
    """A verified reconnect suspects what was read since the lagging id: the lagging id
    is its start, and the witness that the history reaches it."""
    assert start(repair=True, lagging="30") == ("20", "lagging", "30")
    closed = gap("a", "10", "20", state=GapState.REPAIRED.value)
    assert start(repair=True, lagging="30", gaps=[closed]) == ("20", "lagging", "30")
    # nothing stored before it: the lagging id itself
    assert start(repair=True, lagging="10") == ("10", "lagging", "20")
    # with no lagging id either, the caller's chain decides
    assert start(repair=True) == (None, "none", None)


def test_a_live_start_keeps_its_cursor_then_takes_the_lagging_id_then_the_floor() -> None:
    assert start("40", "l1") == ("40", "l1", "50")
    assert start("50", "l2", lagging="30") == ("50", "l2", None)
    assert start(None, "none", lagging="30") == ("30", "lagging", "40")
    assert start(None, "none") == ("50", "floor", None)
    assert start(None, "none", floor=None) == (None, "none", None)
    # a gap is repaired only on the lagged route
    assert start("40", "l1", gaps=[gap("a", "20", "30")]) == ("40", "l1", "50")


def test_the_witness_is_the_stored_id_after_an_old_cursor() -> None:
    assert start("35", "explicit") == ("35", "explicit", "40")
    assert start("60", "explicit") == ("60", "explicit", None)  # newer than the floor
    assert start("5", "explicit") == ("5", "explicit", "10")


def retry_start(cursor: str | None, **options: object) -> tuple[str | None, str, str | None]:
    """``choose_start`` for a retry on the live route over STORED (floor 50)."""
    settings: dict[str, object] = {
        "source": "retry",
        "repair": False,
        "lagging_id": None,
        "floor": "50",
        "open_gaps": [],
        "order": ORDER,
        "neighbour": neighbour,
        "retry": True,
    }
    settings.update(options)
    return choose_start(cursor=cursor, **settings)  # type: ignore[arg-type]


def test_a_retry_at_the_floor_starts_one_stored_id_before_it() -> None:
    """Nothing stored after the floor can show that the history reaches it, and the dead
    attempt may have read past it: one stored id before, the floor is the witness."""
    assert retry_start("50", lagging_id="50") == ("40", "retry", "50")
    assert retry_start(None, lagging_id="50") == ("40", "lagging", "50")
    assert retry_start("40", lagging_id="40") == ("40", "retry", "50")  # a witness
    # the stream's only stored id: nothing before it (the first event cannot show it)
    alone = retry_start("10", floor="10", neighbour=lambda event_id, older: None)
    assert alone == ("10", "retry", None)
    # not a retry: the cursor stands
    assert start("50", "l1") == ("50", "l1", None)


def test_a_live_retry_starts_no_further_back_than_what_was_settled() -> None:
    """A notice the dead attempt read and never recorded is about what it read last: the
    retry starts at the settled id when that is newer than where the attempt began."""
    assert retry_start("10", settled=lambda: "30") == ("30", "retry", "40")
    assert retry_start("40", settled=lambda: "30") == ("40", "retry", "50")  # began after
    assert retry_start("10", settled=lambda: None) == ("10", "retry", "20")  # none settled


def test_a_retry_that_knows_no_start_takes_the_oldest_stored_id_before_the_floor() -> None:
    def oldest() -> str:
        return "10"

    def choose(**options: object) -> tuple[str | None, str, str | None]:
        return choose_start(
            cursor=None,
            source="none",
            floor="50",
            open_gaps=[],
            order=ORDER,
            neighbour=neighbour,
            oldest=oldest,
            **options,  # type: ignore[arg-type]
        )

    assert choose(repair=False, lagging_id=None) == ("10", "oldest", "20")
    assert choose(repair=True, lagging_id=None) == ("10", "oldest", "20")
    assert choose(repair=False, lagging_id="30") == ("30", "lagging", "40")
