"""The gap lifecycle (durable_sse/gaps/): plain tests of its pure functions and tracker.

Ids are small integers under ``numeric`` (``natural`` where the order matters); a gap
``(20, 30)`` is the hole strictly after 20 and strictly before 30.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from durable_sse.cursor.fence import choose_start, lagging_cap, lagging_target, oldest_open
from durable_sse.gaps.model import (
    MAX_GAPS_IN_SUMMARY,
    SHORT_READS_TO_LOSE,
    GapChange,
    GapKind,
    GapRecord,
    GapState,
    GapView,
    StreamContext,
    no_resume,
    numeric_span,
    summarize,
)
from durable_sse.gaps.tracker import CONFIRM_IDS, CONFIRM_SECONDS, GapTracker
from durable_sse.gaps.transitions import apply_change, attribute_early_notice, count_missing

ORDER = "numeric"
NOW = "2026-01-01T00:00:00+00:00"
LATER = "2026-01-01T00:05:00+00:00"


def gap(
    gap_id: str = "g",
    start: str | None = "20",
    end: str | None = "30",
    *,
    notice: str | None = None,
    **fields: object,
) -> GapRecord:
    fields.setdefault("seen_at", NOW)
    fields.setdefault("kind", GapKind.COMMENT.value)
    return GapRecord(
        gap_id=gap_id,
        stream="s",
        start_id=start,
        end_id=end,
        notice_id=notice if notice is not None else end,
        **fields,  # type: ignore[arg-type]
    )


class Ids:
    """An in-memory ``gaps.StoredIds``: stored integers, and other gaps' counted ranges."""

    def __init__(self, stored: Iterable[int] = (), counted: Iterable[tuple[str, int, int]] = ()):
        self.stored = set(stored)
        self.counted = list(counted)

    def stored_numbers_between(self, low: int, high: int) -> int:
        return sum(1 for n in self.stored if low < n < high)

    def counted_ranges(self, *, except_gap: str) -> list[tuple[int, int]]:
        return [(low, high) for gap_id, low, high in self.counted if gap_id != except_gap]


def apply(
    record: GapRecord | None,
    change: GapChange,
    *,
    lagging: str | None = None,
    new_rows: int = 0,
    stored: Ids | None = None,
    order: str = ORDER,
) -> GapRecord | None:
    return apply_change(
        record,
        change,
        order=order,
        lagging_id=lagging,
        new_rows=new_rows,
        now=LATER,
        stored=stored,
    )


# -- Gap: bounds ------------------------------------------------------------------------------


def test_a_gap_resumes_after_what_was_re_read() -> None:
    assert gap().resume_from(ORDER) == "20"
    assert gap(reread_to="25").resume_from(ORDER) == "25"
    assert gap(reread_to="9").resume_from("natural") == "20"  # never before the start
    assert gap(start=None).resume_from(ORDER) is None


def test_a_gap_is_bounded_by_its_end_or_else_its_notice() -> None:
    assert gap(end="30", notice="28").bound() == "30"
    assert gap(end=None, notice="28").bound() == "28"
    assert gap(end=None, notice=None).bound() is None


@pytest.mark.parametrize(
    ("event_id", "inside"),
    [("19", False), ("20", False), ("21", True), ("29", True), ("30", False), ("100", False)],
)
def test_a_gap_contains_what_lies_strictly_between_its_bounds(event_id: str, inside: bool) -> None:
    assert gap().contains(event_id, ORDER) is inside


def test_without_an_end_the_notice_id_is_the_last_id_inside() -> None:
    open_ended = gap(end=None, notice="25")
    assert [open_ended.contains(str(n), ORDER) for n in (20, 21, 25, 26)] == [
        False,
        True,
        True,
        False,
    ]
    assert not gap(end=None, notice=None).contains("21", ORDER)
    assert gap(start=None).contains("1", ORDER)  # no start: everything before the end


def test_a_repair_passes_a_gap_at_its_end_or_past_its_notice() -> None:
    assert not gap().passed_by("29", ORDER)
    assert gap().passed_by("30", ORDER)
    assert not gap(end=None, notice="25").passed_by("25", ORDER)
    assert gap(end=None, notice="25").passed_by("26", ORDER)
    assert gap(end=None, notice=None).passed_by("1", ORDER)


def test_bounds_follow_the_id_order() -> None:
    # "10" is older than "9" as text, newer as a number
    assert gap(start="9", end="11").contains("10", "natural")
    assert not gap(start="9", end="11").contains("10", "lexicographic")


# -- apply_change: the merge --------------------------------------------------------------


def test_nothing_to_merge_into_without_a_record_or_an_opening() -> None:
    assert apply(None, GapChange("g", reread_to="25", close=True)) is None


def test_an_opened_gap_keeps_its_start_even_behind_the_lagging_id() -> None:
    """A late notice may open a gap behind the lagging id: its start stays, and the
    lagging id waits (lagging_target) until it is closed."""
    opened = gap(start="20")
    kept = apply(None, GapChange("g", opened=opened), lagging="24")
    assert kept is not None and kept.start_id == "20" and kept.is_open
    assert kept is not opened and opened.start_id == "20"  # copied, not edited
    assert lagging_target("30", [kept], ORDER) == ("20", True, "20")


def test_an_opened_gap_with_no_start_and_no_lagging_id_closes_at_once() -> None:
    counted = apply(None, GapChange("g", opened=gap(start=None, announced=4)))
    assert counted is not None
    assert (counted.state, counted.missing, counted.truncated, counted.closed_at) == (
        GapState.UNRECOVERABLE,
        4,
        True,
        LATER,
    )
    unknown = apply(None, GapChange("g", opened=gap(start=None)))
    assert unknown is not None
    assert (unknown.state, unknown.missing) == (GapState.UNRECOVERABLE, None)
    # a lagging id gives it a start: it stays open to be repaired
    started = apply(None, GapChange("g", opened=gap(start=None)), lagging="5")
    assert started is not None and started.is_open and started.start_id == "5"


def test_an_opening_adds_no_recovered_rows() -> None:
    record = apply(None, GapChange("g", opened=gap(), recovered=True), new_rows=7)
    assert record is not None and record.recovered == 0
    assert apply(record, GapChange("g", recovered=True), new_rows=7).recovered == 7  # type: ignore[union-attr]


def test_recovered_rows_add_up_and_only_when_the_batch_lies_inside() -> None:
    record = gap(recovered=2)
    record = apply(record, GapChange("g", recovered=True), new_rows=3)
    assert record is not None and record.recovered == 5
    record = apply(record, GapChange("g", reread_to="25"), new_rows=9)
    assert record is not None and record.recovered == 5


def test_the_end_is_set_once() -> None:
    record = apply(gap(end=None, notice="25"), GapChange("g", end_id="27"))
    assert record is not None and record.end_id == "27"
    record = apply(record, GapChange("g", end_id="26"))
    assert record is not None and record.end_id == "27"


def test_reread_to_only_moves_forward() -> None:
    record = apply(gap(), GapChange("g", reread_to="25"))
    assert record is not None and record.reread_to == "25"
    assert apply(record, GapChange("g", reread_to="22")).reread_to == "25"  # type: ignore[union-attr]
    assert apply(record, GapChange("g", reread_to="28")).reread_to == "28"  # type: ignore[union-attr]
    # by the id order, not as text
    natural = apply(gap(start="8", end="12", reread_to="9"), GapChange("g", reread_to="10"))
    assert natural is not None and natural.reread_to == "10"


def test_merges_commute_whatever_order_two_attempts_commit_in() -> None:
    changes = [
        GapChange("g", reread_to="23", recovered=True),
        GapChange("g", reread_to="26", recovered=True),
        GapChange("g", end_id="30"),
        GapChange("g", reread_to="21", recovered=True),
    ]
    results = set()
    for order in itertools.permutations(changes):
        record: GapRecord | None = gap(end=None, notice="29")
        for change in order:
            record = apply(record, change, new_rows=1)
        assert record is not None
        results.add((record.reread_to, record.end_id, record.recovered, record.state))
    assert results == {("26", "30", 3, GapState.OPEN)}


def test_a_closed_gap_stays_closed() -> None:
    closed = gap(state=GapState.REPAIRED.value, missing=0, closed_at=NOW, end=None, notice="29")
    after = apply(
        closed,
        GapChange("g", reread_to="25", lost_to="28", truncated=True, recovered=True, close=True),
        new_rows=4,
        stored=Ids(),
    )
    assert after is not None
    assert (after.state, after.missing, after.reread_to, after.truncated, after.recovered) == (
        GapState.REPAIRED,
        0,
        None,
        False,
        0,
    )
    assert after.closed_at == NOW
    # ... though a late end bound is still recorded
    ended = apply(closed, GapChange("g", end_id="31"))
    assert ended is not None and ended.end_id == "31" and ended.state == GapState.REPAIRED
    lost = gap(state=GapState.UNRECOVERABLE.value, missing=3)
    again = apply(lost, GapChange("g", close=True), stored=Ids(range(21, 30)))
    assert again is not None and (again.state, again.missing) == (GapState.UNRECOVERABLE, 3)


def test_lost_to_marks_the_gap_truncated_and_moves_the_resume_point() -> None:
    record = apply(gap(reread_to="22"), GapChange("g", lost_to="26"))
    assert record is not None and record.truncated and record.reread_to == "26"
    assert record.is_open
    record = apply(record, GapChange("g", lost_to="24"))
    assert record is not None and record.reread_to == "26"


def test_short_reads_are_strikes_until_enough_in_a_row_lose() -> None:
    record: GapRecord | None = gap()
    for strike in range(1, SHORT_READS_TO_LOSE):
        record = apply(record, GapChange("g", short_to="25"))
        assert record is not None
        assert (record.short_reads, record.truncated, record.reread_to) == (strike, False, None)
    record = apply(record, GapChange("g", short_to="25"))
    assert record is not None
    assert record.truncated and record.reread_to == "25" and record.is_open


def test_a_successful_re_read_resets_the_strikes() -> None:
    record = apply(gap(short_reads=SHORT_READS_TO_LOSE - 1), GapChange("g", reread_to="22"))
    assert record is not None and record.short_reads == 0
    record = apply(record, GapChange("g", short_to="25"))
    assert record is not None
    assert record.short_reads == 1 and not record.truncated and record.reread_to == "22"


def test_a_lone_strike_never_closes_a_gap() -> None:
    """The reader asks to close on its third strike; a store that counted fewer (another
    attempt's repair got through and reset them) keeps the gap open, not repaired."""
    change = GapChange("g", short_to="35", end_id="30", close=True)
    record = apply(gap(short_reads=0), change)
    assert record is not None and record.is_open and record.short_reads == 1
    lost = apply(gap(short_reads=SHORT_READS_TO_LOSE - 1, announced=9), change)
    assert lost is not None
    assert (lost.state, lost.truncated, lost.missing) == (GapState.UNRECOVERABLE, True, 9)


# -- apply_change: counting on close ------------------------------------------------------


def test_close_counts_exactly_with_contiguous_ids() -> None:
    close = GapChange("g", close=True, contiguous=True)
    present = Ids(set(range(21, 30)) - {23, 27})
    record = apply(gap(), close, stored=present)
    assert record is not None
    assert (record.state, record.missing, record.closed_at) == (GapState.UNRECOVERABLE, 2, LATER)
    repaired = apply(gap(truncated=True, announced=50), close, stored=Ids(range(21, 30)))
    assert repaired is not None and (repaired.state, repaired.missing) == (GapState.REPAIRED, 0)


def test_close_does_not_count_twice_what_another_gap_counted() -> None:
    close = GapChange("g", close=True, contiguous=True)
    # 22..24 were counted by gap "h"; 27 is stored; 21, 25, 26, 28, 29 are new losses
    record = apply(gap(), close, stored=Ids({27}, counted=[("h", 21, 25), ("g", 0, 100)]))
    assert record is not None and record.missing == 5


def test_overlapping_gaps_closed_in_turn_count_a_lost_id_once() -> None:
    """21..29 stored but 25; gaps (20, 30) and (22, 28) both hold 25. The first to close
    counts it; the second, seeing the first among the counted ranges, counts nothing of
    its own but is not repaired: 25 is still missing."""
    present = Ids(set(range(21, 30)) - {25})
    first = apply(gap("a", "20", "30"), GapChange("a", close=True, contiguous=True), stored=present)
    assert first is not None and (first.state, first.missing) == (GapState.UNRECOVERABLE, 1)
    present.counted.append(("a", 20, 30))
    second = apply(
        gap("b", "22", "28"), GapChange("b", close=True, contiguous=True), stored=present
    )
    assert second is not None
    assert (second.state, second.missing) == (GapState.UNRECOVERABLE, 0)
    # Nothing missing at all: repaired, whatever other gaps counted around it.
    whole = Ids(range(21, 30), counted=[("a", 20, 30)])
    clean = apply(gap("c", "22", "28"), GapChange("c", close=True, contiguous=True), stored=whole)
    assert clean is not None and (clean.state, clean.missing) == (GapState.REPAIRED, 0)


def test_close_without_an_end_counts_up_to_the_notice_id() -> None:
    close = GapChange("g", close=True, contiguous=True)
    record = apply(gap(end=None, notice="25"), close, stored=Ids({25}))
    assert record is not None and record.missing == 4  # 21..24; the notice id 25 is stored


def test_close_counts_exactly_only_when_the_batch_says_contiguous() -> None:
    record = apply(gap(truncated=True, announced=6), GapChange("g", close=True), stored=Ids())
    assert record is not None and record.missing == 6


@pytest.mark.parametrize(
    ("truncated", "announced", "recovered", "state", "missing"),
    [
        (False, 6, 0, GapState.REPAIRED, 0),
        (False, None, 0, GapState.REPAIRED, 0),
        (True, 6, 2, GapState.UNRECOVERABLE, 4),
        (True, 6, 9, GapState.UNRECOVERABLE, 0),
        (True, None, 3, GapState.UNRECOVERABLE, None),
    ],
)
def test_close_without_contiguous_ids_counts_announced_less_recovered(
    truncated: bool, announced: int | None, recovered: int, state: GapState, missing: int | None
) -> None:
    record = apply(
        gap(truncated=truncated, announced=announced, recovered=recovered),
        GapChange("g", close=True),
    )
    assert record is not None and (record.state, record.missing) == (state, missing)


def test_close_of_a_contiguous_gap_with_text_ids_falls_back_to_the_announcement() -> None:
    record = apply(
        gap(start="a", end="b", truncated=True, announced=2),
        GapChange("g", close=True, contiguous=True),
        stored=Ids(),
    )
    assert record is not None and (record.state, record.missing) == (GapState.UNRECOVERABLE, 2)


def test_recovered_rows_of_the_closing_batch_count_before_the_loss() -> None:
    change = GapChange("g", recovered=True, close=True, lost_to="29")
    record = apply(gap(announced=5, recovered=1), change, new_rows=2)
    assert record is not None
    assert (record.state, record.recovered, record.missing) == (GapState.UNRECOVERABLE, 3, 2)


def test_a_retry_gap_beyond_the_history_is_loud_unless_ids_are_contiguous() -> None:
    """A retry gap is a suspicion (a dead attempt may have read a notice and died with
    it): re-read, it is repaired; beyond the history it is unrecoverable of unknown size,
    since a notice may have died with the worker; contiguous ids count exactly."""
    suspicion = dataclasses.replace(gap(), kind=GapKind.RETRY.value)
    reread = apply(dataclasses.replace(suspicion), GapChange("g", close=True))
    assert reread is not None and (reread.state, reread.missing) == (GapState.REPAIRED, 0)
    closed = apply(dataclasses.replace(suspicion), GapChange("g", lost_to="29", close=True))
    assert closed is not None and (closed.state, closed.missing) == (GapState.UNRECOVERABLE, None)
    counted = apply(
        dataclasses.replace(suspicion),
        GapChange("g", close=True, contiguous=True),
        stored=Ids(range(21, 28)),
    )
    assert counted is not None and (counted.state, counted.missing) == (
        GapState.UNRECOVERABLE,
        2,
    )


def test_numeric_span() -> None:
    assert numeric_span(gap()) == (20, 30)
    assert numeric_span(gap(end=None, notice="25")) == (20, 26)
    assert numeric_span(gap(start=None)) is None
    assert numeric_span(gap(start="x")) is None
    assert numeric_span(gap(end=None, notice=None)) is None
    assert numeric_span(gap(start="20", end="21")) == (20, 21)
    assert numeric_span(gap(start="20", end="20")) is None


# -- count_missing --------------------------------------------------------------------------


def brute_missing(low: int, high: int, stored: set[int], excluded: list[tuple[int, int]]) -> int:
    return sum(
        1
        for n in range(low + 1, high)
        if n not in stored and not any(a < n < b for a, b in excluded)
    )


def test_count_missing_examples() -> None:
    def none_stored(a: int, b: int) -> int:
        return 0

    assert count_missing(20, 30, stored=none_stored) == 9
    assert count_missing(20, 21, stored=none_stored) == 0
    assert count_missing(20, 30, stored=none_stored, excluded=[(19, 31)]) == 0
    assert count_missing(20, 30, stored=none_stored, excluded=[(22, 25)]) == 7
    assert count_missing(20, 30, stored=none_stored, excluded=[(22, 23)]) == 9  # empty
    assert count_missing(20, 30, stored=none_stored, excluded=[(10, 21), (29, 40)]) == 9
    assert count_missing(20, 30, stored=none_stored, excluded=[(10, 22), (28, 40)]) == 7
    assert count_missing(20, 30, stored=Ids({21, 29, 30, 20}).stored_numbers_between) == 7


@settings(max_examples=400, deadline=None)
@given(
    low=st.integers(0, 40),
    size=st.integers(0, 30),
    stored=st.sets(st.integers(-5, 80)),
    excluded=st.lists(
        st.tuples(st.integers(-5, 80), st.integers(1, 30)).map(lambda t: (t[0], t[0] + t[1])),
        max_size=5,
    ),
)
def test_count_missing_matches_brute_force(
    low: int, size: int, stored: set[int], excluded: list[tuple[int, int]]
) -> None:
    high = low + size
    counter = Ids(stored)
    assert count_missing(
        low, high, stored=counter.stored_numbers_between, excluded=excluded
    ) == brute_missing(low, high, stored, excluded)


# -- the lagging id and the repair's start ------------------------------------------------


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


STORED = ["10", "20", "30", "40", "50"]


def neighbour(event_id: str, older: bool) -> str | None:
    """The stored id just before (older) or after ``event_id`` among STORED."""
    value = int(event_id)
    if older:
        before = [i for i in STORED if int(i) < value]
        return before[-1] if before else None
    after = [i for i in STORED if int(i) > value]
    return after[0] if after else None


def start(
    cursor: str | None = None,
    source: str = "none",
    *,
    repair: bool = False,
    lagging: str | None = None,
    floor: str | None = "50",
    gaps: Iterable[GapRecord] = (),
) -> tuple[str | None, str, str | None]:
    return choose_start(
        cursor=cursor,
        source=source,
        repair=repair,
        lagging_id=lagging,
        floor=floor,
        open_gaps=list(gaps),
        order=ORDER,
        neighbour=neighbour,
    )


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


# -- summarize ------------------------------------------------------------------------------


def test_summarize_counts_every_gap_and_names_the_open_ones_oldest_first() -> None:
    gaps = [
        gap("z", "40", "50", seen_at="2026-01-01T00:02:00+00:00"),
        gap("y", "10", "20", reread_to="15", announced=4),
        gap("r", "1", "5", state=GapState.REPAIRED.value, missing=0, recovered=3),
        gap("u", "5", "9", state=GapState.UNRECOVERABLE.value, missing=3, recovered=1),
        gap("v", "60", "70", state=GapState.UNRECOVERABLE.value, missing=None),
        gap("w", "70", "80", state=GapState.UNRECOVERABLE.value, missing=0, recovered=2),
        gap("a", "90", "95", recovered=1),
    ]
    summary = summarize(gaps, ORDER)
    totals = summary.totals
    assert (totals.open, totals.repaired, totals.unrecoverable) == (3, 1, 3)
    assert (totals.events_unrecoverable, totals.unknown_size, totals.events_recovered) == (3, 1, 7)
    assert summary.open_ids == ["a", "y", "z"]  # by seen_at, then id
    assert summary.open[1] == GapView(
        gap_id="y",
        kind="comment",
        start_id="10",
        end_id="20",
        resume_from="15",
        announced=4,
        seen_at=NOW,
    )


def test_summarize_names_at_most_so_many_open_gaps() -> None:
    gaps = [gap(f"g{n:03d}", str(n * 10), str(n * 10 + 5)) for n in range(30)]
    summary = summarize(gaps, ORDER)
    assert summary.totals.open == 30
    assert summary.open_ids == [f"g{n:03d}" for n in range(MAX_GAPS_IN_SUMMARY)]
    assert summarize([], ORDER).open == [] and summarize([], ORDER).totals.open == 0


# -- GapTracker -----------------------------------------------------------------------------


def tracker(
    cursor: str | None,
    *,
    lagging: str | None = None,
    floor: str | None = None,
    witness: str | None = None,
    gaps: Iterable[GapRecord] = (),
    contiguous: bool = False,
    confirm_ids: int = 0,
) -> GapTracker:
    """A connection's tracker; by default what a batch proves counts at once (these tests
    are about what it proves; how long it is held back is tested apart)."""
    numbers = itertools.count(1)
    return GapTracker(
        stream="s",
        order=ORDER,
        cursor=cursor,
        context=StreamContext(
            lagging_id=lagging,
            floor=floor,
            witness=witness,
            open_gaps=[dataclasses.replace(g) for g in gaps],
        ),
        contiguous=contiguous,
        new_gap_id=lambda: f"new{next(numbers)}",
        now=lambda: NOW,
        confirm_ids=confirm_ids,
    )


def read(t: GapTracker, *ids: int) -> None:
    for n in ids:
        t.id_read(str(n))


def test_a_notice_opens_a_gap_from_the_cursor_to_the_next_id() -> None:
    t = tracker("10", lagging="12", floor="20")
    read(t, 21, 22)
    assert t.batch_changes(last_id="22", segment=frozenset()) == []
    opened = t.drop_signal(GapKind.COMMENT, announced=5, detail="dropped 5 events")
    assert (opened.gap_id, opened.start_id, opened.notice_id, opened.end_id) == (
        "new1",
        "10",
        "22",
        None,
    )
    assert (opened.announced, opened.kind, opened.detail, opened.seen_at) == (
        5,
        "comment",
        "dropped 5 events",
        NOW,
    )
    assert not t.clean and t.opened == ["new1"]
    read(t, 28)
    assert opened.end_id == "28"
    changes = t.batch_changes(last_id="28", segment=frozenset())
    assert [(c.gap_id, c.opened is opened, c.end_id) for c in changes] == [
        ("new1", True, None),
        ("new1", False, "28"),
    ]
    read(t, 29)  # only the first id after the notice is the end
    assert opened.end_id == "28" and t.batch_changes(last_id="29", segment=frozenset()) == []


def test_a_notice_takes_the_cursor_when_it_is_newer_than_the_lagging_id() -> None:
    t = tracker("15", lagging="12")
    read(t, 16)
    assert t.drop_signal(GapKind.EVENT_TYPE).start_id == "15"


def test_a_notice_about_stored_ids_carries_no_count() -> None:
    """A count is the size of a hole among new ids: a replay's notice may describe
    anything in the server's window, so it counts as unknown."""
    t = tracker("10", floor="50")
    read(t, 11, 12)
    assert t.drop_signal(GapKind.COMMENT, announced=5).announced is None
    fresh = tracker("10", floor="11")
    read(fresh, 11, 12)
    assert fresh.drop_signal(GapKind.COMMENT, announced=5).announced == 5


def test_a_notice_on_a_long_connection_starts_where_it_read_a_window_ago() -> None:
    t = tracker("10", lagging="12", floor="20")
    read(t, 21, 40)
    opened = t.drop_signal(GapKind.COMMENT, read_a_window_ago="30")
    assert opened.start_id == "30"
    older = tracker("35", floor="20").drop_signal(GapKind.COMMENT, read_a_window_ago="30")
    assert older.start_id == "35"  # never before the connection's own cursor


def test_a_notice_before_the_first_id_of_a_cursorless_connection() -> None:
    t = tracker(None, lagging="7")
    opened = t.drop_signal(GapKind.COMMENT, announced=3)
    assert (opened.start_id, opened.notice_id) == ("7", None)
    assert "new1" in t.gaps
    nothing = tracker(None)
    lost = nothing.drop_signal(GapKind.COMMENT, announced=3)
    assert lost.start_id is None and lost.gap_id not in nothing.gaps
    [change] = nothing.pending_changes()
    assert (change.opened is lost, change.close, change.truncated) == (True, True, True)
    record = apply(None, change)
    assert record is not None and (record.state, record.missing) == (GapState.UNRECOVERABLE, 3)


def test_a_clean_repair_re_reads_and_closes_a_gap() -> None:
    open_gap = gap("a", "20", "30")
    t = tracker("10", floor="40", witness="20", gaps=[open_gap])
    assert [t.segment(str(n)) for n in (20, 21, 29, 30)] == [
        frozenset(),
        frozenset({"a"}),
        frozenset({"a"}),
        frozenset(),
    ]
    read(t, 20)
    assert t.covered_from == "10"
    assert t.batch_changes(last_id="20", segment=frozenset()) == []  # not past the resume point
    read(t, 21, 25)
    [change] = t.batch_changes(last_id="25", segment=frozenset({"a"}))
    assert (change.recovered, change.reread_to, change.close) == (True, "25", False)
    assert t.gaps["a"].reread_to == "25"
    read(t, 30, 31)
    [change] = t.batch_changes(last_id="31", segment=frozenset())
    assert (change.recovered, change.close, change.end_id) == (False, True, None)
    assert "a" not in t.gaps
    assert t.batch_changes(last_id="32", segment=frozenset()) == []
    assert t.pending_changes() == []
    # the store closes it as repaired
    record = apply(gap("a", "20", "30"), change)
    assert record is not None and (record.state, record.missing) == (GapState.REPAIRED, 0)


def test_a_repair_past_a_notice_sets_the_gap_end() -> None:
    t = tracker("10", floor="40", witness="20", gaps=[gap("a", "20", None, notice="25")])
    read(t, 20, 25)
    assert [c.reread_to for c in t.batch_changes(last_id="25", segment=frozenset({"a"}))] == ["25"]
    read(t, 26)
    [change] = t.batch_changes(last_id="26", segment=frozenset())
    assert (change.close, change.end_id) == (True, "26")


def test_a_repair_proves_only_gaps_resuming_at_or_after_its_cursor() -> None:
    older = gap("old", "5", "8")
    t = tracker("10", floor="40", witness="20", gaps=[older, gap("a", "20", "30")])
    read(t, 20, 31)
    [change] = t.batch_changes(last_id="31", segment=frozenset())
    assert change.gap_id == "a" and change.close
    assert "old" in t.gaps


def test_a_drop_signal_stops_the_evidence() -> None:
    t = tracker("10", floor="40", witness="20", gaps=[gap("a", "20", "30")])
    read(t, 20, 22)
    assert [c.reread_to for c in t.batch_changes(last_id="22", segment=frozenset({"a"}))] == ["22"]
    t.drop_signal(GapKind.COMMENT)
    read(t, 31)
    changes = t.batch_changes(last_id="31", segment=frozenset())
    assert [(c.gap_id, c.opened is not None, c.end_id, c.close) for c in changes] == [
        ("new1", True, None, False),
        ("new1", False, "31", False),
    ]
    assert t.gaps["a"].reread_to == "22"  # still open, to be resumed from 22


def test_a_connection_without_a_cursor_proves_nothing() -> None:
    t = tracker(None, floor="40", gaps=[gap("a", "20", "30")])
    read(t, 21, 31)
    assert t.covered_from is None
    changes = t.batch_changes(last_id="31", segment=frozenset())
    assert changes == []
    assert "a" in t.gaps


def test_rows_inside_a_gap_are_recovered_even_when_they_prove_nothing() -> None:
    t = tracker("22", floor="40", witness="23", gaps=[gap("a", "20", "30")])
    t.drop_signal(GapKind.COMMENT)  # not clean: no evidence
    read(t, 23)
    changes = t.batch_changes(last_id="23", segment=frozenset({"a"}))
    recovered = [c for c in changes if c.gap_id == "a"]
    assert [(c.recovered, c.reread_to, c.close) for c in recovered] == [(True, None, False)]


# -- GapTracker: the first event --------------------------------------------------------------


def test_first_event_at_or_before_the_witness_reaches_the_cursor() -> None:
    t = tracker("19", floor="40", witness="20", gaps=[gap("a", "20", "30")])
    t.first_event("20")
    assert (t.covered_from, t.short_history, t.first_id) == ("19", False, "20")
    assert t.pending_changes() == []


def test_first_event_past_the_witness_is_a_strike_for_the_gap_being_repaired() -> None:
    t = tracker("19", floor="40", witness="20", gaps=[gap("a", "20", "30")])
    t.first_event("25")
    assert (t.covered_from, t.short_history) == ("25", True)
    assert t.gaps["a"].short_reads == 1
    [strike] = t.pending_changes()
    assert (strike.gap_id, strike.short_to, strike.close, strike.lost_to) == (
        "a",
        "25",
        False,
        None,
    )
    assert t.pending_changes() == []  # given once


def test_a_strike_is_not_written_when_a_drop_signal_came() -> None:
    t = tracker("19", floor="40", witness="20", gaps=[gap("a", "20", "30")])
    t.first_event("25")
    t.drop_signal(GapKind.COMMENT)
    assert [c.short_to for c in t.pending_changes()] == [None]  # the opening only


def test_first_event_past_the_witness_on_the_last_strike_loses_the_skipped_part() -> None:
    short = gap("a", "20", "30", short_reads=SHORT_READS_TO_LOSE - 1)
    t = tracker("19", floor="40", witness="20", gaps=[short])
    t.first_event("25")
    [change] = t.pending_changes()
    assert (change.short_to, change.close, change.lost_to) == ("25", False, None)
    assert t.gaps["a"].reread_to == "25" and t.gaps["a"].truncated
    record = apply(short, change)
    assert record is not None and record.truncated and record.reread_to == "25" and record.is_open
    # past the end: the whole gap is gone
    t = tracker("19", floor="40", witness="20", gaps=[short])
    t.first_event("33")
    [change] = t.pending_changes()
    assert (change.short_to, change.close, change.end_id) == ("33", True, "30")
    assert "a" not in t.gaps
    record = apply(short, change)
    assert record is not None and record.state == GapState.UNRECOVERABLE


def test_a_last_strike_after_a_drop_signal_is_not_taken() -> None:
    short = gap("a", "20", "30", short_reads=SHORT_READS_TO_LOSE - 1)
    t = tracker("19", floor="40", witness="20", gaps=[short])
    t.drop_signal(GapKind.COMMENT)
    t.first_event("25")
    assert [c.gap_id for c in t.pending_changes()] == ["new1"]
    assert t.gaps["a"].reread_to is None


def test_first_event_with_no_witness_is_evidence_from_itself_on() -> None:
    """Nothing stored after the cursor can show the history reached it, nor that it did
    not: no evidence before the first id, and no strike either (a connection from the
    newest stored id must not count against a gap it cannot check)."""
    t = tracker("45", floor="40", gaps=[gap("a", "50", "55")])
    t.first_event("60")
    assert (t.covered_from, t.short_history) == ("60", False)
    assert t.pending_changes() == []
    older = tracker("45", floor="40", gaps=[gap("a", "20", "30")])
    older.first_event("60")
    assert (older.covered_from, older.short_history) == ("60", False)


def test_a_confirmed_cursor_is_reached_whatever_the_witness() -> None:
    t = tracker("19", floor="40", witness="20", gaps=[gap("a", "20", "30")])
    t.first_event("25", history_confirmed=True)
    assert (t.covered_from, t.short_history) == ("19", False)
    assert t.pending_changes() == []


def test_a_contiguous_first_id_right_after_the_cursor_reaches_it() -> None:
    t = tracker("19", floor="40", gaps=[gap("a", "20", "30")], contiguous=True)
    t.first_event("20")
    assert (t.covered_from, t.short_history, t.clean) == ("19", False, True)


def test_a_contiguous_jump_at_the_start_is_a_strike() -> None:
    t = tracker("19", floor="40", gaps=[gap("a", "20", "30")], contiguous=True)
    t.first_event("25")
    assert (t.covered_from, t.short_history, t.clean, t.opened) == ("25", True, True, [])
    assert [c.short_to for c in t.pending_changes()] == ["25"]


def test_a_contiguous_jump_at_the_start_over_new_ids_opens_a_gap() -> None:
    t = tracker("19", floor="22", gaps=[gap("a", "20", "30")], contiguous=True)
    t.first_event("25")
    assert not t.clean and t.opened == ["new1"]
    opened = t.gaps["new1"]
    assert (opened.start_id, opened.end_id, opened.notice_id, opened.announced, opened.kind) == (
        "22",
        "25",
        "22",
        2,
        "id_gap",
    )
    # the connection is no longer evidence: the strike is not written
    assert [c.gap_id for c in t.pending_changes()] == ["new1"]


def test_mercure_short_history_loses_the_skipped_part_at_once() -> None:
    t = tracker("19", floor="22", gaps=[gap("a", "20", "30")], contiguous=True)
    t.first_event("25", history_short=True)
    assert t.covered_from == "25" and t.clean
    changes = t.pending_changes()
    lose, opened = changes
    assert (lose.gap_id, lose.lost_to, lose.short_to, lose.close) == ("a", "25", None, False)
    assert t.gaps["a"].reread_to == "25"
    assert opened.opened is not None and (opened.close, opened.truncated) == (True, True)
    assert (opened.opened.start_id, opened.opened.end_id, opened.opened.kind) == (
        "22",
        "25",
        "mercure_header",
    )
    assert "new1" not in t.gaps  # closed as it opened: nothing to repair
    record = apply(None, opened, stored=Ids())
    assert record is not None and (record.state, record.missing) == (GapState.UNRECOVERABLE, 2)
    record = apply(None, dataclasses.replace(opened, contiguous=False))
    assert record is not None and record.missing == 2  # the count of ids skipped


def test_mercure_short_history_past_the_gap_closes_it() -> None:
    t = tracker("19", floor="40", gaps=[gap("a", "20", "30")])
    t.first_event("35", history_short=True)
    [lose] = t.pending_changes()
    assert (lose.lost_to, lose.close, lose.end_id) == ("35", True, "30")
    record = apply(gap("a", "20", "30", announced=4, recovered=1), lose)
    assert record is not None and (record.state, record.missing) == (GapState.UNRECOVERABLE, 3)


# -- a notice before a connection's first event (contiguous ids) -----------------------------


def stored_in(ids: Iterable[int]):  # noqa: ANN201 - the store's counting callable
    present = set(ids)
    return lambda low, high: sum(1 for n in present if low < n < high)


def test_an_early_notice_on_a_replay_starts_at_the_newest_stored_id() -> None:
    """Chaos scenario 6's timing: a replay from the lagging id 100 (everything up to the
    newest stored id 400 is stored) takes a drop notice first thing, then sends 541: the
    hole is 401..540, 140 ids, not the 440 between the cursor and 541."""
    assert attribute_early_notice(100, 541, floor=400, stored=stored_in(range(1, 401))) == (
        400,
        140,
    )


def test_an_early_notice_keeps_the_cursor_when_stored_ids_are_missing_below_the_floor() -> None:
    # 150 is not stored: its loss belongs to this hole as far as anyone can tell
    present = set(range(1, 401)) - {150}
    assert attribute_early_notice(100, 541, floor=400, stored=stored_in(present)) == (100, 141)


def test_an_early_notice_counts_only_ids_not_stored() -> None:
    # a zombie attempt stored 500..509 meanwhile: not missing
    present = set(range(1, 401)) | set(range(500, 510))
    assert attribute_early_notice(100, 541, floor=400, stored=stored_in(present)) == (400, 130)


def test_an_early_notice_over_stored_ids_only_misses_nothing() -> None:
    assert attribute_early_notice(100, 301, floor=400, stored=stored_in(range(1, 401))) == (
        100,
        0,
    )
    assert attribute_early_notice(400, 401, floor=400, stored=stored_in(range(1, 401))) == (
        400,
        0,
    )


def test_an_early_notice_on_a_live_resume_counts_from_the_cursor() -> None:
    assert attribute_early_notice(400, 411, floor=400, stored=stored_in(range(1, 401))) == (
        400,
        10,
    )
    assert attribute_early_notice(5, 11, floor=None, stored=stored_in(())) == (5, 5)


@settings(max_examples=200, deadline=None)
@given(
    cursor=st.integers(0, 40),
    width=st.integers(1, 40),
    floor=st.none() | st.integers(0, 80),
    present=st.sets(st.integers(0, 90)),
)
def test_an_early_notice_never_leaves_a_missing_id_out(
    cursor: int, width: int, floor: int | None, present: set[int]
) -> None:
    """Whatever is stored, every id between the cursor and the first id after the notice
    that is not stored lies in the narrowed hole, and the count is exactly those ids."""
    first_after = cursor + width
    start, missing = attribute_early_notice(
        cursor, first_after, floor=floor, stored=stored_in(present)
    )
    absent = {n for n in range(cursor + 1, first_after) if n not in present}
    assert cursor <= start < first_after
    assert all(n > start for n in absent)
    assert missing == len(absent)


def test_the_tracker_marks_the_end_of_an_early_notice_for_attribution() -> None:
    t = tracker("100", lagging="100", floor="400", contiguous=True)
    opened = t.drop_signal(GapKind.COMMENT, announced=400)
    assert opened.announced is None  # about a replay's ids: no count taken from the text
    read(t, 541)
    [opening, end] = t.batch_changes(last_id="541", segment=frozenset())
    assert opening.opened is opened
    assert (end.end_id, end.early_floor, end.contiguous) == ("541", "400", True)
    record = apply(apply(None, opening), end, stored=Ids(range(1, 401)))
    assert record is not None and record.is_open
    assert (record.start_id, record.end_id, record.announced) == ("400", "541", 140)
    assert record.resume_from(ORDER) == "400"  # the repair and the lagging id start there


def test_an_early_notice_over_stored_ids_closes_as_repaired() -> None:
    t = tracker("100", floor="400", contiguous=True)
    t.drop_signal(GapKind.COMMENT)
    read(t, 301)
    opening, end = t.batch_changes(last_id="301", segment=frozenset())
    record = apply(apply(None, opening), end, stored=Ids(range(1, 401)))
    assert record is not None and (record.state, record.missing) == (GapState.REPAIRED, 0)


def test_an_early_notice_is_attributed_after_a_truncation_header_too() -> None:
    t = tracker("100", floor="400", contiguous=True)
    t.drop_signal(GapKind.COMMENT)
    t.first_event("541", history_short=True)
    read(t, 541)
    changes = t.pending_changes()
    assert [c.opened is not None for c in changes] == [True, False]  # no header gap too
    record = apply(apply(None, changes[0]), changes[1], stored=Ids(range(1, 401)))
    assert record is not None and (record.start_id, record.announced) == ("400", 140)


def test_a_notice_after_the_first_event_or_without_contiguous_ids_is_not_attributed() -> None:
    late = tracker("100", floor="400", contiguous=True)
    read(late, 101)
    late.drop_signal(GapKind.COMMENT)
    read(late, 541)
    assert all(c.early_floor is None for c in late.pending_changes())
    plain = tracker("100", floor="400")
    plain.drop_signal(GapKind.COMMENT)
    read(plain, 541)
    assert all(c.early_floor is None for c in plain.pending_changes())
    unattributed = apply(
        gap("g", "100", "541"), GapChange("g", end_id="541", early_floor="400", contiguous=True)
    )
    assert unattributed is not None and unattributed.start_id == "100"  # no store: as it was


# -- GapTracker: holes in contiguous ids mid-connection ---------------------------------------


def test_a_jump_over_new_ids_opens_a_gap_and_ends_the_connection() -> None:
    t = tracker("40", floor="40", contiguous=True)
    read(t, 41, 42)
    assert t.jump("42", "46") is True
    assert not t.clean
    opened = t.gaps["new1"]
    assert (opened.start_id, opened.end_id, opened.announced, opened.detail) == (
        "42",
        "46",
        3,
        "3 ids skipped",
    )
    [change] = t.batch_changes(last_id="46", segment=frozenset())
    assert change.opened is opened and not change.close


def test_a_jump_that_straddles_the_floor_opens_a_gap_over_the_new_part_only() -> None:
    t = tracker("40", floor="44", contiguous=True)
    read(t, 41, 42)
    assert t.jump("42", "47") is True
    opened = t.gaps["new1"]
    assert (opened.start_id, opened.end_id, opened.announced) == ("44", "47", 2)


def test_a_jump_over_stored_ids_is_harmless() -> None:
    t = tracker("40", floor="50", contiguous=True)
    read(t, 41, 42)
    assert t.jump("42", "46") is False
    assert t.clean and t.opened == [] and t.pending_changes() == []


def test_a_jump_through_an_open_gap_ends_the_connection_without_a_new_record() -> None:
    t = tracker("55", floor="80", witness="56", gaps=[gap("a", "60", "70")], contiguous=True)
    read(t, 56, 57, 58, 59, 60, 61)
    assert t.jump("61", "65") is True
    assert not t.clean and t.opened == [] and "a" in t.gaps
    read(t, 65, 75)
    changes = t.batch_changes(last_id="75", segment=frozenset())
    assert [c for c in changes if c.close or c.reread_to] == []


def test_a_jump_next_to_an_open_gap_is_not_through_it() -> None:
    t = tracker("55", floor="80", witness="56", gaps=[gap("a", "60", "70")], contiguous=True)
    read(t, 56, 70, 71)
    assert t.jump("71", "75") is False  # stored ids after the gap
    assert t.jump("56", "60") is False  # stored ids before it
    assert t.clean


# -- GapTracker: edges ------------------------------------------------------------------------


def test_a_repair_from_the_resume_point_itself_is_this_connection_s_to_repair() -> None:
    """Nothing stored before the gap: the repair sends its resume point as the cursor."""
    t = tracker("20", floor="40", witness="21", gaps=[gap("a", "20", "30")])
    t.first_event("25")
    assert t.short_history and [c.short_to for c in t.pending_changes()] == ["25"]
    contiguous = tracker("20", floor="40", gaps=[gap("a", "20", "30")], contiguous=True)
    contiguous.first_event("21")
    assert (contiguous.covered_from, contiguous.short_history) == ("20", False)
    assert contiguous.pending_changes() == []


def test_a_first_event_at_the_resume_point_still_reaches_the_gap() -> None:
    """Past the witness (stored ids before the gap were skipped) but not past the gap."""
    t = tracker("10", floor="40", witness="15", gaps=[gap("a", "20", "30")])
    t.first_event("20")
    assert (t.covered_from, t.short_history) == ("20", False)
    assert t.pending_changes() == []
    read(t, 21, 30)
    [change] = t.batch_changes(last_id="30", segment=frozenset())
    assert change.close  # re-read from 20, its start


def test_a_gap_this_connection_opened_is_not_its_to_repair() -> None:
    t = tracker("19", floor="40", gaps=[gap("a", "20", "30")])
    opened = t.drop_signal(GapKind.COMMENT)  # before the first event
    t.first_event("25", history_short=True)
    changes = t.pending_changes()
    assert [(c.gap_id, c.lost_to) for c in changes] == [(opened.gap_id, None), ("a", "25")]
    assert opened.gap_id in t.gaps


def test_a_contiguous_stream_with_a_text_cursor_falls_back_to_the_witness() -> None:
    t = tracker("x", floor="40", witness="20", contiguous=True)
    t.first_event("25")
    assert (t.covered_from, t.clean, t.opened) == ("25", True, [])


def test_a_short_history_of_text_ids_opens_no_empty_gap() -> None:
    at_floor = tracker("x05", floor="x20")
    at_floor.first_event("x20", history_short=True)
    assert at_floor.pending_changes() == []
    past = tracker("x05", floor="x20")
    past.first_event("x30", history_short=True)
    [opened] = past.pending_changes()
    assert opened.opened is not None and opened.close
    assert (opened.opened.start_id, opened.opened.end_id, opened.opened.announced) == (
        "x20",
        "x30",
        None,
    )
    # a counter after text ids (numeric order puts text first): counted as unknown
    mixed = tracker("x05", floor="x06")
    mixed.first_event("30", history_short=True)
    [opened] = mixed.pending_changes()
    assert opened.opened is not None and opened.opened.announced is None


def test_a_jump_that_ends_right_after_the_floor_is_no_hole() -> None:
    t = tracker("40", floor="45", contiguous=True)
    read(t, 41, 42)
    assert t.jump("42", "46") is False  # 43..45 are stored
    assert t.clean and t.opened == []


def test_a_jump_from_a_gap_s_end_is_not_through_it() -> None:
    t = tracker("55", floor="80", witness="56", gaps=[gap("a", "60", "70")], contiguous=True)
    read(t, 56, 70)
    assert t.jump("70", "74") is False
    assert t.clean


def test_a_retried_attempt_suspects_what_the_dead_one_read() -> None:
    t = tracker("40", lagging="30", floor="90")
    suspicion = t.suspect("an attempt died")
    assert suspicion is not None
    # Through the floor and one id past it (a late notice may be about the next ids).
    assert (suspicion.kind, suspicion.start_id, suspicion.end_id, suspicion.notice_id) == (
        "retry",
        "40",
        None,
        "90",
    )
    assert suspicion.gap_id in t.gaps and t.opened == []  # this connection may prove it
    [change] = t.pending_changes()
    assert change.opened is suspicion and not change.close
    # nothing stored past its start: nothing to suspect
    assert tracker("90", floor="90").suspect("x") is None
    assert tracker(None, floor="90").suspect("x") is None
    assert tracker(None, lagging="30", floor="90").suspect("x") is not None


def test_a_retried_attempt_that_re_reads_continuously_clears_the_suspicion() -> None:
    """From one stored id before the span (its start is the witness) the retry's continuous
    read proves it."""
    t = tracker("39", lagging="40", floor="90", witness="40")
    suspicion = t.suspect("an attempt died")
    assert suspicion is not None and suspicion.start_id == "40"
    read(t, 40, 50, 60, 90, 91)
    changes = t.batch_changes(last_id="91", segment=frozenset())
    assert [(c.gap_id, c.opened is not None, c.close) for c in changes] == [
        (suspicion.gap_id, True, False),
        (suspicion.gap_id, False, True),
    ]


def test_a_retry_from_its_span_s_start_has_no_witness_inside_the_span() -> None:
    """Simulation seed 708179435: a retry from 40 (where the dead attempt began) met 44
    first, the first row stored after 40, and took it for a witness. The dead attempt may
    have skipped ids before it with a notice it never wrote, and the history may have lost
    them since (41..43 were gone): the span is a hole like any gap. Evidence from the
    first id on, a strike for the span; the next repair starts one stored id before it."""
    t = tracker("40", floor="90", witness="44")
    suspicion = t.suspect("an attempt died")
    assert suspicion is not None and suspicion.start_id == "40"
    read(t, 44, 60, 90, 91)
    assert t.covered_from == "44" and t.short_history
    changes = t.batch_changes(last_id="91", segment=frozenset())
    assert not any(c.close for c in changes)
    assert [c.short_to for c in t.pending_changes()] == ["44"]


# -- verify_reconnects: a reconnect suspects what was read since the lagging id ---------------


def test_a_verified_reconnect_suspects_what_was_read_since_the_lagging_id() -> None:
    t = tracker("90", lagging="30", floor="90")
    suspicion = t.verify("a reconnect")
    assert suspicion is not None
    assert (suspicion.kind, suspicion.start_id, suspicion.end_id, suspicion.notice_id) == (
        "suspected",
        "30",
        "90",
        "90",
    )
    assert suspicion.gap_id in t.gaps and t.opened == []  # a re-read from 30 may prove it
    [change] = t.pending_changes()
    assert change.opened is suspicion and not change.close
    # No lagging id yet, or nothing stored after it: nothing to suspect.
    assert tracker("90", floor="90").verify("x") is None
    assert tracker("30", lagging="30", floor="30").verify("x") is None


def test_a_suspicion_starts_where_an_open_one_ends() -> None:
    older = gap("s1", "30", "70", kind=GapKind.SUSPECTED.value)
    t = tracker("90", lagging="30", floor="90", gaps=[older])
    suspicion = t.verify("again")
    assert suspicion is not None and (suspicion.start_id, suspicion.notice_id) == ("70", "90")
    # Everything read since is suspected already: no second record.
    covered = gap("s1", "30", "90", kind=GapKind.SUSPECTED.value)
    assert tracker("90", lagging="30", floor="90", gaps=[covered]).verify("x") is None


def test_a_re_read_from_the_lagging_id_clears_the_suspicion() -> None:
    """The repair starts one stored id before the lagging id, the suspicion's start."""
    t = tracker("29", lagging="30", floor="90", witness="30")
    suspicion = t.verify("a reconnect")
    assert suspicion is not None
    read(t, 30, 31, 60, 90)  # through the newest stored id: nothing newer is needed
    changes = t.batch_changes(last_id="90", segment=frozenset())
    assert [(c.gap_id, c.opened is not None, c.close) for c in changes] == [
        (suspicion.gap_id, True, False),
        (suspicion.gap_id, False, True),
    ]
    # From the lagging id itself, the first row after it lies inside the suspicion: no
    # witness, a strike.
    t = tracker("30", lagging="30", floor="90", witness="31")
    t.verify("a reconnect")
    read(t, 31, 60, 90)
    assert t.covered_from == "31" and t.short_history


def test_suspicions_are_summed_apart_in_the_totals() -> None:
    records = [
        gap("s1", "30", None, notice="70", kind=GapKind.SUSPECTED.value, recovered=4),
        gap(
            "s2",
            "70",
            None,
            notice="90",
            kind=GapKind.SUSPECTED.value,
            state=GapState.REPAIRED.value,
            recovered=3,
        ),
        gap("g", "90", "95", recovered=5, state=GapState.REPAIRED.value),
    ]
    totals = summarize(records, ORDER).totals
    assert (totals.suspicions, totals.suspicions_closed, totals.suspicions_recovered) == (2, 1, 7)
    assert totals.events_recovered == 12 and totals.open == 1


# -- a reconnect that cannot resume (issue 24, item 8) ---------------------------------------


def test_a_reconnect_with_no_id_to_send_on_a_stream_that_read_events_cannot_resume() -> None:
    nothing = StreamContext()
    idless_rows = StreamContext(has_rows=True)
    with_ids = StreamContext(floor="7", has_rows=True)
    assert not no_resume(None, nothing, read_before=False)  # the stream's first connection
    assert no_resume(None, idless_rows, read_before=False)  # rows of an earlier connection
    assert no_resume(None, nothing, read_before=True)  # read, then nothing stored (yet)
    assert not no_resume("7", with_ids, read_before=True)  # a cursor: it resumes
    assert not no_resume("7", nothing, read_before=True)


def test_a_no_resume_gap_is_lost_of_unknown_size_and_ends_at_the_first_id() -> None:
    tracker = GapTracker(
        stream="s",
        order="numeric",
        cursor=None,
        context=StreamContext(has_rows=True),
        contiguous=True,
        new_gap_id=lambda: "blind",
        now=lambda: "2026-01-01T00:00:00+00:00",
    )
    tracker.no_resume()
    tracker.id_read("40")
    opened, ended = tracker.batch_changes(last_id="40", segment=frozenset())
    assert opened.opened is not None and opened.opened.kind == GapKind.NO_RESUME
    assert (opened.close, opened.truncated) == (True, True)
    assert tracker.gaps == {} and tracker.clean  # nothing to repair, no evidence lost
    record = None
    for change in (opened, ended):
        record = apply_change(record, change, order="numeric", lagging_id=None, new_rows=1, now="t")
    assert record is not None
    assert (record.state, record.start_id, record.end_id, record.missing) == (
        GapState.UNRECOVERABLE,
        None,
        "40",
        None,
    )
    assert summarize([record], "numeric").totals.unknown_size == 1


# -- issue 33: evidence held back until a late notice could have come; stranded repairs ----


def test_a_repair_is_evidence_only_once_it_read_on_past_the_batch() -> None:
    """Issue 33 item 3: a repair passed its gap's end and closed it as ``repaired``; the
    notice saying the repair itself had skipped the gap's ids came a few events later.
    Without contiguous ids, what a batch proves waits for CONFIRM_IDS more ids."""
    t = tracker(
        "10", floor="40", witness="20", gaps=[gap("a", "20", "30")], confirm_ids=CONFIRM_IDS
    )
    read(t, *range(20, 32))
    changes = t.batch_changes(last_id="31", segment=frozenset(), now=0.0)
    assert not any(c.close or c.reread_to for c in changes)  # read past the end, not yet proof
    assert "a" in t.gaps and not t.proof_due(0.5)
    read(t, *range(32, 30 + CONFIRM_IDS))  # 15 ids after 30, the gap's end
    assert not any(c.close for c in t.batch_changes(last_id="45", segment=frozenset(), now=0.5))
    read(t, 30 + CONFIRM_IDS)  # the 16th
    [change] = t.batch_changes(last_id="46", segment=frozenset(), now=0.6)
    assert (change.gap_id, change.close, change.end_id) == ("a", True, None)
    assert "a" not in t.gaps


def test_a_late_notice_drops_the_evidence_held_back() -> None:
    """The notice comes after the batch that passed the gap's end: the gap stays open (its
    repair resumes where the evidence held), never ``repaired`` with its ids missing."""
    t = tracker(
        "10", floor="40", witness="20", gaps=[gap("a", "20", "30")], confirm_ids=CONFIRM_IDS
    )
    read(t, *range(20, 32))
    t.batch_changes(last_id="31", segment=frozenset(), now=0.0)
    t.drop_signal(GapKind.COMMENT, announced=5, detail="dropped 5 events")
    read(t, *range(32, 60))
    changes = t.batch_changes(last_id="59", segment=frozenset(), now=CONFIRM_SECONDS * 2)
    assert not any(c.gap_id == "a" and (c.close or c.reread_to) for c in changes)
    assert "a" in t.gaps and not t.proof_due(CONFIRM_SECONDS * 3)
    assert t.next_proof_at() is None


def test_a_quiet_source_confirms_the_evidence_by_time() -> None:
    """No more events come: the gap still closes, CONFIRM_SECONDS after the batch."""
    t = tracker(
        "10", floor="40", witness="20", gaps=[gap("a", "20", "30")], confirm_ids=CONFIRM_IDS
    )
    read(t, *range(20, 32))
    assert t.batch_changes(last_id="31", segment=frozenset(), now=5.0) == []
    assert t.next_proof_at() == 5.0 + CONFIRM_SECONDS
    assert not t.proof_due(5.0 + CONFIRM_SECONDS / 2)
    assert t.proof_due(5.0 + CONFIRM_SECONDS)
    [change] = t.batch_changes(last_id=None, segment=frozenset(), now=5.0 + CONFIRM_SECONDS)
    assert (change.gap_id, change.close) == ("a", True)
    assert t.next_proof_at() is None


def test_contiguous_ids_are_evidence_at_once() -> None:
    """A skip in contiguous ids shows at the next id, before the batch is cut."""
    t = tracker(
        "19", floor="40", gaps=[gap("a", "20", "30")], contiguous=True, confirm_ids=CONFIRM_IDS
    )
    read(t, *range(20, 32))
    [change] = t.batch_changes(last_id="31", segment=frozenset(), now=0.0)
    assert (change.gap_id, change.close) == ("a", True)


def test_a_repair_left_with_gaps_behind_its_start_is_stranded() -> None:
    """Issue 33 item 2 (seed 1160 of the simulation): a verified reconnect's repair started
    one id before its gap (84), its suspicion starts at the lagging id (72). Once the gap
    it can re-read is closed, reading on proves nothing about the suspicion: stranded."""
    t = tracker("84", lagging="72", floor="98", witness="85", gaps=[gap("g10", "85", "97")])
    suspicion = t.verify("a reconnect")
    assert suspicion is not None and suspicion.start_id == "72"
    assert not t.stranded()  # nothing read yet
    read(t, 85, 86)
    assert not t.stranded()  # still re-reading g10
    read(t, *range(87, 99))
    changes = t.batch_changes(last_id="98", segment=frozenset())
    assert [(c.gap_id, c.close) for c in changes if c.close] == [("g10", True)]
    assert t.stranded()
    # A repair that starts before the suspicion re-reads it: not stranded.
    t = tracker("71", lagging="72", floor="98", witness="72", gaps=[gap("g10", "85", "97")])
    t.verify("a reconnect")
    read(t, 72, 73)
    assert not t.stranded()


def test_a_witness_a_repair_stored_inside_the_hole_does_not_show_the_history_reaches() -> None:
    """Simulation seed 2865: a replay from a gap's start (28) met first 59, the first row
    stored after 28, which a repair had stored inside the gap past a truncation. 59 is no
    witness that the history reaches 28: the first ids of the gap may be gone."""
    holed = gap("a", "28", "69", recovered=2, short_reads=2)
    t = tracker("28", floor="90", witness="59", gaps=[holed])
    read(t, 59)
    assert t.covered_from == "59"  # evidence from its first id on only
    assert t.short_history or t.has_queued  # the third strike: the history starts past it
    # Rows inside the bounds read before the notice are no witness either (the skip the
    # notice announced may lie before them).
    t = tracker("28", floor="90", witness="59", gaps=[gap("a", "28", "69")])
    read(t, 59)
    assert t.covered_from == "59" and t.short_history


def test_a_repair_with_nothing_stored_before_its_gap_has_no_witness() -> None:
    """Simulation seed 708180304: the stream's first connection read 1, 3, 4, then "dropped
    1 events" (2 was skipped); the gap is 1..5 and 1 the oldest stored id, so its repair
    sends 1 itself. The history no longer held 2 and the repair met 3 first, the row stored
    after 1: no witness, since the hole lies between. Evidence from 3 on, and a strike."""
    t = tracker("1", floor="6", witness="3", gaps=[gap("g1", "1", "5", notice="4")])
    read(t, 3, 4, 5, 6)
    assert t.covered_from == "3" and t.short_history
    assert not any(c.close for c in t.batch_changes(last_id="6", segment=frozenset()))
    assert [c.short_to for c in t.pending_changes()] == ["3"]


def test_a_notice_before_any_event_leaves_no_witness_after_its_cursor() -> None:
    """Simulation seed 20781: a notice came before the first event of a connection at 1
    ("dropped 16 events"): the gap starts at 1, its notice at 1, its end unknown. A repair
    from 1 met 13 first, the row stored after 1: the hole lies past the notice, up to an
    end nobody read yet, so 13 is no witness (2..12 were gone)."""
    t = tracker("1", floor="20", witness="13", gaps=[gap("g1", "1", None, notice="1")])
    read(t, 13, 14)
    assert t.covered_from == "13" and t.short_history
    assert [c.short_to for c in t.pending_changes()] == ["13"]


def test_a_repair_from_its_gap_s_start_with_nothing_stored_after_it_gets_a_strike() -> None:
    """Simulation seed 212111628: the gap starts at the stream's only stored id (18), so
    its repair sends 18 and has no witness at all. It met 32 first: nothing shows the
    history reaches 18, and no repair can ever start before it. A strike (three lose the
    hole, counted), where it used to read on with the gap open for good."""
    t = tracker("18", floor="18", gaps=[gap("g1", "18", None, notice="18")])
    read(t, 32, 33)
    assert t.covered_from == "32" and t.short_history
    assert [c.short_to for c in t.pending_changes()] == ["32"]
    # A gap after the cursor, with no witness: it waits for a repair from before it.
    t = tracker("18", floor="18", gaps=[gap("g2", "20", None, notice="20")])
    read(t, 32)
    assert t.covered_from == "32" and not t.short_history


def test_a_hole_outside_the_cursor_to_witness_span_keeps_the_witness() -> None:
    """Only a hole between the cursor and the witness takes the witness away: one wholly
    before the cursor, or one that resumes at the witness or after it, does not."""
    gaps = [gap("before", "5", "10"), gap("a", "20", "30"), gap("later", "50", "60")]
    t = tracker("19", floor="90", witness="20", gaps=gaps)
    read(t, 20)
    assert t.covered_from == "19" and not t.short_history
    # A gap that resumes before the cursor, its hole reaching past it: evidence from the
    # first id on; the gap resuming at the witness is still re-read from its start.
    wide = gap("wide", "5", "25")
    t = tracker("19", floor="90", witness="20", gaps=[wide, gap("a", "20", "30")])
    read(t, 20, *range(21, 31))
    assert t.covered_from == "20"
    closed = [c.gap_id for c in t.batch_changes(last_id="30", segment=frozenset()) if c.close]
    assert closed == ["a"]
