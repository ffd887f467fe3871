"""A gap's record (durable_sse/gaps/model.py, transitions.py): bounds, merges, strikes,
counting what is lost, and the summary. Plain tests of pure functions; ids and gaps are
written as helpers.py says.
"""

from __future__ import annotations

import dataclasses
import itertools
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from durable_sse.cursor.fence import lagging_target
from durable_sse.gaps.model import (
    MAX_GAPS_IN_SUMMARY,
    SHORT_READS_TO_LOSE,
    GapChange,
    GapKind,
    GapRecord,
    GapState,
    GapView,
    numeric_span,
    summarize,
)
from durable_sse.gaps.transitions import apply_change, changes_nothing, count_missing
from tests.gaps.helpers import (
    LATER,
    NOW,
    ORDER,
    Ids,
    apply,
    gap,
)


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


def test_a_change_that_changes_nothing_leaves_every_record_as_it_is() -> None:
    """The store skips such changes unread (``changes_nothing``): for any record and
    change it calls so, ``apply_change`` must agree. Random changes, seed printed."""
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    records = [
        None,
        gap("g", "20", "30"),
        gap("g", "20", None, reread_to="24", recovered=3),
        gap("g", "20", "30", state=GapState.REPAIRED.value, missing=0),
    ]
    skipped = 0
    for _ in range(2000):
        change = GapChange(
            "g",
            end_id=rng.choice([None, "31"]),
            reread_to=rng.choice([None, None, "25"]),
            lost_to=rng.choice([None, None, None, "22"]),
            short_to=rng.choice([None, None, None, "23"]),
            truncated=rng.random() < 0.1,
            recovered=rng.random() < 0.5,
            close=rng.random() < 0.2,
            contiguous=rng.random() < 0.5,
        )
        new_rows = rng.choice([0, 0, 2])
        if not changes_nothing(change, new_rows):
            continue
        skipped += 1
        for record in records:
            after = apply_change(
                record, change, order=ORDER, lagging_id="10", new_rows=new_rows, now="t"
            )
            assert after == record, f"seed {seed}: {change} changed {record}"
    assert skipped > 100, f"seed {seed}: too few changes that change nothing"
