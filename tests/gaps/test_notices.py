"""The gap tracker (durable_sse/gaps/tracker.py) on a drop notice, a repair and a
connection's first event, and early notices. Plain tests, no store.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from hypothesis import given, settings
from hypothesis import strategies as st

from durable_sse.gaps.model import (
    SHORT_READS_TO_LOSE,
    GapChange,
    GapKind,
    GapState,
)
from durable_sse.gaps.transitions import attribute_early_notice
from tests.gaps.helpers import (
    NOW,
    ORDER,
    Ids,
    apply,
    gap,
    read,
    tracker,
)


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
