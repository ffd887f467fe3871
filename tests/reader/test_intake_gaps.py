"""One connection's reading without I/O (durable_sse/reader/intake.py): holes in
contiguous ids, repairs, retried attempts, notices at a connection's end, loss windows."""

from __future__ import annotations

import pytest

from durable_sse.contracts import Outcome, Route
from durable_sse.gaps.model import GapKind, GapRecord, GapState
from durable_sse.gaps.transitions import apply_change
from durable_sse.reader.intake import DROP_GRACE, CommitBatch
from durable_sse.sse.decoder import Comment, DecodedEvent
from tests.reader.intake_helpers import (
    NOTICE,
    cut,
    ev,
    events,
    gap,
    ids,
    intake,
    take,
)


def test_a_hole_in_contiguous_ids_over_stored_ids_reads_on() -> None:
    i = intake("0", contiguous_ids=True, floor="100", batch_max_events=10)
    take(i, ev(1), ev(2), ev(6), ev(7))
    assert i.outcome is None and i.drop is None


def test_a_contiguous_first_id_past_the_cursor_over_new_ids_ends_after_a_grace() -> None:
    """Often a history that no longer reaches the cursor: what comes is stored for a
    grace (a stream behind a short history still makes progress), then the repair."""
    i = intake("10", contiguous_ids=True, floor="10", batch_max_events=10)
    take(i, ev(14), ev(15), now=1.0)
    assert i.drop is not None and i.drop.detail == "ids missing after the cursor"
    assert i.outcome is None and i.counts.events_read == 2
    i.poll(1.0 + DROP_GRACE)
    assert i.outcome is Outcome.DROP_SIGNAL
    i.end()
    opened = [c.opened for b in cut(i) for c in b.gap_changes if c.opened]
    assert [(g.start_id, g.end_id, g.announced) for g in opened] == [("10", "14", 3)]


def test_a_notice_and_the_hole_it_announced_make_one_gap() -> None:
    i = intake("0", contiguous_ids=True, floor="0", batch_max_events=10)
    take(i, ev(1), ev(2), NOTICE, ev(6))
    assert i.outcome is Outcome.DROP_SIGNAL
    assert i.drop is not None and i.drop.kind == "comment"
    i.end()
    changes = [c for b in cut(i) for c in b.gap_changes]
    assert [(c.gap_id, c.opened is not None, c.end_id) for c in changes] == [
        ("new1", True, None),
        ("new1", False, "6"),
    ]


def test_a_repair_that_starts_past_its_gap_ends_after_the_grace() -> None:
    i = intake("19", route=Route.LAGGED, floor="40", witness="20", gaps=[gap("a", "20", "30")])
    take(i, ev(25), now=3.0)
    assert i.drop is not None and i.drop.kind == "history_short"
    assert i.outcome is None
    i.poll(3.0 + DROP_GRACE)
    assert i.outcome is Outcome.DROP_SIGNAL
    i.end()
    strikes = [c for b in cut(i) for c in b.gap_changes if c.short_to]
    assert [(c.gap_id, c.short_to) for c in strikes] == [("a", "25")]


def test_a_truncation_header_unlike_the_cursor_loses_what_the_history_no_longer_has() -> None:
    i = intake(
        "19",
        route=Route.LAGGED,
        floor="40",
        gaps=[gap("a", "20", "30")],
        mercure_last_event_id=True,
        contiguous_ids=True,
    )
    i.head(truncation_header="earliest")
    assert i.history_short
    take(i, ev(25), ev(26))
    assert i.outcome is None
    i.end()
    changes = [c for b in cut(i) for c in b.gap_changes]
    assert [(c.gap_id, c.lost_to) for c in changes if c.lost_to] == [("a", "25")]


@pytest.mark.parametrize(
    ("enabled", "cursor", "header"),
    [(True, "19", "19"), (True, "19", None), (True, None, "x"), (False, "19", "x")],
)
def test_a_truncation_header_that_says_nothing(
    enabled: bool, cursor: str | None, header: str | None
) -> None:
    i = intake(cursor, mercure_last_event_id=enabled)
    i.head(truncation_header=header)
    assert not i.history_short


def test_batches_are_cut_where_the_gaps_an_id_would_fill_change() -> None:
    i = intake(
        "19",
        route=Route.LAGGED,
        floor="40",
        witness="20",
        gaps=[gap("a", "20", "30")],
        batch_max_events=10,
    )
    take(i, *events(20, 21, 22, 30, 31))
    i.end()
    batches = cut(i)
    assert [(ids(b), b.recovered) for b in batches] == [
        (["20"], False),
        (["21", "22"], True),
        (["30", "31"], False),
    ]
    assert [[(c.recovered, c.reread_to, c.close) for c in b.gap_changes] for b in batches] == [
        [],
        [(True, "22", False)],
        [(False, None, True)],
    ]
    assert i.committed(batches[1], new_rows=2) and i.counts.recovered == 2


def test_rows_inside_a_gap_this_connection_opened_are_not_recovered_rows() -> None:
    """An id older than the notice, read after it, lies inside the new gap: it was
    never missing as far as that gap is concerned."""
    i = intake("0", floor="0", batch_max_events=10)
    take(i, ev(5), NOTICE, ev(3))
    assert i.outcome is Outcome.DROP_SIGNAL
    i.end()
    before, after = cut(i)
    assert ids(after) == ["3"] and not after.recovered
    assert not any(c.recovered for c in after.gap_changes)
    i.committed(before, new_rows=1)
    i.committed(after, new_rows=1)
    assert i.counts.recovered == 0 and i.ids_out_of_order == 1


def test_a_repair_that_closes_its_gap_is_repaired_in_the_store() -> None:
    """End to end through apply_change: the changes the intake cuts close the record."""
    record: GapRecord | None = gap("a", "20", "30")
    i = intake("19", route=Route.LAGGED, floor="40", witness="20", gaps=[gap("a", "20", "30")])
    take(i, *events(20, 21, 22, 23, 29, 30, 31))
    i.end()
    for batch in cut(i):
        for change in batch.gap_changes:
            record = apply_change(
                record,
                change,
                order="numeric",
                lagging_id="10",
                new_rows=len(batch.records),
                now="2026-01-01T00:01:00+00:00",
            )
    assert record is not None
    assert (record.state, record.missing, record.recovered) == (GapState.REPAIRED, 0, 4)


def test_a_repair_that_closed_every_gap_it_knew_ends_after_the_grace() -> None:
    i = intake(
        "19",
        route=Route.LAGGED,
        floor="40",
        witness="20",
        gaps=[gap("a", "20", "30")],
        batch_max_events=10,
        batch_max_delay=0.5,
    )
    take(i, *events(20, 21, 30, 31), now=2.0)
    i.poll(2.5)  # the batch past the gap's end is cut: the gap closes
    assert any(c.close for b in cut(i) for c in b.gap_changes)
    assert i.next_deadline(2.5) == DROP_GRACE
    i.poll(2.5 + DROP_GRACE / 2)
    assert i.outcome is None
    i.poll(2.5 + DROP_GRACE)
    assert i.outcome is Outcome.ROTATED


def test_a_repair_with_gaps_behind_its_start_ends_once_it_has_nothing_to_re_read() -> None:
    """Issue 33 item 2: a verified reconnect's repair started before its gap (84), its
    suspicion at the lagging id (72). The workflow does not interrupt a repair: once its
    own gap is closed it ends, so that the repair resumes from the suspicion's start,
    instead of reading live for hours with the suspicion open and the lagging id held."""
    i = intake(
        "84",
        route=Route.LAGGED,
        lagging="72",
        floor="98",
        witness="85",
        gaps=[gap("g10", "85", "97")],
        verify=True,
        batch_max_events=50,
        batch_max_delay=0.5,
    )
    take(i, *events(*range(85, 100)), now=2.0)
    i.poll(2.5)
    closed = [c.gap_id for b in cut(i) for c in b.gap_changes if c.close]
    assert closed == ["g10"]  # the suspicion stays open: this connection cannot prove it
    assert i.gaps.stranded()
    i.poll(2.5 + DROP_GRACE)
    assert i.outcome is Outcome.ROTATED  # the workflow resumes the repair at once
    # On the live route the workflow interrupts for the repair when the throttle allows.
    live = intake(
        "84", lagging="72", floor="98", witness="85", known=[], verify=True, batch_max_delay=0.5
    )
    take(live, *events(*range(85, 100)), now=2.0)
    live.poll(2.5)
    live.poll(2.5 + DROP_GRACE)
    assert live.outcome is None


def test_a_retried_attempt_records_what_the_dead_one_read_with_its_first_batch() -> None:
    i = intake("39", route=Route.LIVE, lagging="40", floor="90", witness="40", retried=True)
    assert i.outcome is None  # its own suspicion is no unknown gap
    take(i, *events(40, 50, 60, 70))
    first, then = cut(i)  # 40 lies before the span: a batch of its own
    [opened], [reread] = first.gap_changes, then.gap_changes
    assert opened.opened is not None and opened.opened.kind == GapKind.RETRY.value
    gap = opened.opened
    assert (gap.start_id, gap.end_id, gap.notice_id) == ("40", None, "90")
    # it re-reads the suspected span itself (from its start, the witness): the batch
    # inside it moves its resume point
    assert (reread.gap_id, reread.reread_to, reread.close) == (opened.gap_id, "70", False)


def test_a_live_retry_that_repairs_its_own_suspicion_reads_on() -> None:
    """After a worker dies each of its streams' retries suspects what the dead attempt
    read, and re-reads it. Ending the connection once that suspicion was repaired (as a
    repair ends, so the workflow learns) cost every moved stream a second reconnect in the
    failover's burst; the workflow never knew of the suspicion, and the stream is live."""
    i = intake(
        "39",
        route=Route.LIVE,
        lagging="40",
        floor="90",
        witness="40",
        retried=True,
        batch_max_events=10,
        batch_max_delay=0.5,
    )
    take(i, *events(*range(40, 100)), now=2.0)
    i.poll(2.5)
    closed = [c for b in cut(i) for c in b.gap_changes if c.close]
    assert len(closed) == 1 and not i.gaps.gaps  # the suspicion, repaired
    i.poll(2.5 + DROP_GRACE)
    i.poll(100.0)
    assert i.outcome is None and i.next_deadline(100.0) is None


def test_a_retry_whose_first_row_lies_inside_its_own_span_proves_nothing_of_it() -> None:
    """Where the dead attempt began (40), the first row stored after it (50) is one it may
    have read past a skip it never recorded: no witness. The retry reads on as evidence
    from 50 and ends after the grace, so that a repair from before the span re-reads it."""
    i = intake("40", route=Route.LIVE, floor="90", witness="50", retried=True)
    take(i, *events(50, 60, 70))
    [batch] = cut(i)
    opened, *others = batch.gap_changes
    assert opened.opened is not None and opened.opened.kind == GapKind.RETRY.value
    assert not any(c.reread_to or c.close for c in others)
    i.poll(100.0)
    assert i.outcome is Outcome.DROP_SIGNAL


def apply_all(batches: list[CommitBatch], *, lagging: str | None = None) -> dict[str, GapRecord]:
    """The gap records the batches' changes leave in a store, applied in commit order."""
    records: dict[str, GapRecord] = {}
    for batch in batches:
        for change in batch.gap_changes:
            record = apply_change(
                records.get(change.gap_id),
                change,
                order="numeric",
                lagging_id=lagging,
                new_rows=len(batch.records),
                now="2026-01-01T00:01:00+00:00",
            )
            if record is not None:
                records[change.gap_id] = record
    return records


def test_events_that_came_with_a_notice_are_all_taken_though_the_connection_ends() -> None:
    """The issue's sequence: a fresh stream reads, in one write, a notice and events
    1..20. The first id ends the connection; the 19 after it were received and are
    stored, not dropped unseen."""
    i = intake(None, batch_max_events=8)
    take(i, Comment("dropping events (slow consumer)"), *events(*range(1, 21)), now=1.0)
    assert i.outcome is Outcome.DROP_SIGNAL
    i.end()
    batches = cut(i)
    assert [eid for b in batches for eid in ids(b)] == [str(n) for n in range(1, 21)]
    assert i.counts.events_read == 20
    # Nothing stored before the notice and no cursor: a gap no repair can reach, of a
    # size nobody knows, committed with the batch that holds 1 (the first past it).
    first = next(b for b in batches if b.records)
    assert any(c.opened is not None for c in first.gap_changes)
    [record] = apply_all(batches).values()
    assert (record.state, record.start_id, record.end_id, record.missing) == (
        GapState.UNRECOVERABLE,
        None,
        "1",
        None,
    )


def test_a_notice_taken_while_the_connection_ends_opens_a_gap_of_its_own() -> None:
    """Taking what came after the id that ended the connection, a second notice speaks of
    another hole: it gets its own gap, committed with the batch that first passes it."""
    i = intake("0", floor="0", batch_max_events=10)
    take(
        i,
        ev(1),
        NOTICE,
        ev(7),
        ev(8),
        Comment("dropped 2 events (slow consumer)"),
        ev(11),
        ev(12),
        now=1.0,
    )
    assert i.outcome is Outcome.DROP_SIGNAL
    i.end()
    batches = [b for b in cut(i) if b.records or b.gap_changes]
    assert [ids(b) for b in batches] == [["1"], ["7", "8"], ["11", "12"]]
    assert batches[0].gap_changes == []
    first = [c.opened for c in batches[1].gap_changes if c.opened is not None]
    second = [c.opened for c in batches[2].gap_changes if c.opened is not None]
    assert [(g.notice_id, g.announced) for g in first] == [("1", 5)]
    assert [(g.notice_id, g.announced) for g in second] == [("8", 2)]
    records = apply_all(batches)
    assert sorted((g.end_id, g.state) for g in records.values()) == [
        ("11", GapState.OPEN),
        ("7", GapState.OPEN),
    ]
    assert len(i.open_gaps_opened) == 2


def test_two_notices_before_the_next_id_are_one_hole() -> None:
    i = intake("0", floor="0", batch_max_events=10)
    take(i, ev(1), NOTICE, Comment("dropped 9 events"), ev(20), ev(21))
    i.end()
    opened = [c.opened for b in cut(i) for c in b.gap_changes if c.opened is not None]
    assert [(g.notice_id, g.announced) for g in opened] == [("1", 5)]


def test_a_notice_taken_as_a_finished_repair_ends_makes_it_a_drop_signal() -> None:
    i = intake(
        "19",
        route=Route.LAGGED,
        floor="40",
        witness="20",
        gaps=[gap("a", "20", "30")],
        batch_max_events=10,
        batch_max_delay=0.5,
    )
    take(i, *events(20, 21, 30, 31), now=2.0)
    i.poll(2.5)
    i.poll(2.5 + DROP_GRACE)
    assert i.outcome is Outcome.ROTATED  # every gap it knew is closed
    cut(i)
    # What the reader had read ahead by then: a notice, and the id that bounds it.
    take(i, ev(32), NOTICE, ev(40), now=2.6)
    i.end()
    assert i.outcome is Outcome.DROP_SIGNAL
    batches = cut(i)
    assert [eid for b in batches for eid in ids(b)] == ["32", "40"]
    opened = [c.opened for b in batches for c in b.gap_changes if c.opened is not None]
    assert [(g.notice_id, g.end_id) for g in opened] == [("32", "40")]


def test_the_outcome_reported_for_an_ending_with_a_drop_signal_in_it() -> None:
    """A notice whose grace had not passed when the connection rotated (or the server
    closed it): the gap is recorded, so the workflow must hear of a drop signal."""
    i = intake("0", floor="0")
    take(i, ev(1), NOTICE)
    assert i.outcome is None
    i.end()
    assert i.ending(Outcome.ROTATED) is Outcome.DROP_SIGNAL
    assert i.ending(Outcome.DROPPED) is Outcome.DROP_SIGNAL
    assert i.ending(Outcome.CANCELLED) is Outcome.CANCELLED
    quiet = intake("0", floor="0")
    take(quiet, ev(1))
    quiet.end()
    assert quiet.ending(Outcome.ROTATED) is Outcome.ROTATED


def idless(*data: str) -> list[DecodedEvent]:
    return [DecodedEvent(data=d) for d in data]


def test_a_reconnect_with_no_id_records_its_loss_window_with_its_first_batch() -> None:
    i = intake(None, has_rows=True, batch_max_events=2)
    assert i.cannot_resume
    i.head(truncation_header=None)
    take(i, *idless("a", "b", "c"))
    i.end()
    batches = cut(i)
    assert [len(b.records) for b in batches] == [2, 1]
    [opened] = batches[0].gap_changes
    assert opened.opened is not None and opened.opened.kind == GapKind.NO_RESUME
    assert (opened.close, opened.truncated, opened.opened.start_id) == (True, True, None)
    assert batches[1].gap_changes == []
    assert i.counts.reconnects_without_cursor == 0  # counted once its gap is committed
    for batch in batches:
        i.committed(batch, new_rows=len(batch.records))
    assert i.counts.reconnects_without_cursor == 1
    assert i.outcome is None and i.drop is None  # nothing to repair: it reads on


def test_a_reconnect_with_no_id_reads_on_after_its_window_is_recorded() -> None:
    """Its gap closes as it opens: that is no finished repair, and ending the connection
    would only lose more (each reconnect of such a stream is a loss window)."""
    i = intake(None, has_rows=True, batch_max_events=1)
    i.head(truncation_header=None)
    for n in range(5):
        take(i, *idless(f"e{n}"), now=float(n))
        i.poll(n + DROP_GRACE)
        cut(i)
    assert i.outcome is None and i.next_deadline(10.0) is None


def test_a_reconnect_with_no_id_that_reads_nothing_records_its_window_alone() -> None:
    i = intake(None, read_before=True)
    i.head(truncation_header=None)
    i.end()
    [batch] = cut(i)
    assert batch.records == [] and [c.opened.kind for c in batch.gap_changes if c.opened] == [
        GapKind.NO_RESUME
    ]
    i.committed(batch, new_rows=0)
    assert i.counts.reconnects_without_cursor == 1


def test_only_an_opened_stream_ends_a_loss_window() -> None:
    """No head, no window closed: a refused or failed attempt records nothing; the next
    one that opens the stream does."""
    i = intake(None, has_rows=True)
    i.end()
    assert cut(i) == []


def test_the_first_connection_and_a_resuming_one_are_no_loss_window() -> None:
    for i in (intake(None), intake("5", floor="5", read_before=True)):
        assert not i.cannot_resume
        i.head(truncation_header=None)
        take(i, *idless("a"))
        i.end()
        assert [c for b in cut(i) for c in b.gap_changes] == []


def test_a_loss_window_ends_before_the_first_id_read() -> None:
    i = intake(None, read_before=True, batch_max_events=10)
    i.head(truncation_header=None)
    take(i, ev(41), ev(42))
    i.end()
    records = apply_all(cut(i))
    [record] = records.values()
    assert (record.kind, record.state, record.start_id, record.end_id, record.missing) == (
        GapKind.NO_RESUME.value,
        GapState.UNRECOVERABLE,
        None,
        "41",
        None,
    )
