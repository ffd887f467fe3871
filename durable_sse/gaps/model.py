"""The gap: where invariant 5 ("the gap is repaired, or counted exactly") lives.

A *gap* is a stretch of a stream's ids in which the server said (a drop notice, a drop
event type, a truncation header) or the ids showed (a hole in contiguous ids) that events
were skipped. Each gap is a durable record (table ``sse_gaps``) from the moment it is
known, written in the same transaction as the batch that first passes the signal, so a
lost activity result, a retry, a crash or a cancel can delay a repair but never forget
one. Its life::

    open ──(a connection re-read it continuously, start to end)──────▶ repaired
      │
      └──(part of it lies beyond the server's history, then read past)──▶ unrecoverable
                                                 (missing: exact, or unknown and said so)

Bounds. The hole lies strictly after ``start_id`` and strictly before ``end_id`` (the
first id read after the signal; while it is unknown, at or before ``notice_id`` as far
as repairs are concerned). A notice does not say where the hole is (a server may
announce late), so ``start_id`` is conservative: the connection's start cursor, or the
id it read one replay window ago if it has read for longer. A notice is assumed to speak
of what the connection was sent within the last replay window; one that comes before the
connection's first event can only be about the ids between the cursor and the first id
after it, and with contiguous ids the store narrows it to those not stored
(:func:`attribute_early_notice`). The lagging id never *moves* past an open gap; a late
notice (the server announced after the repair that skipped it had already been taken as
proof) can open a gap behind it, and then the lagging id waits where it is until that gap
is closed.

Evidence. A connection that sent cursor C *reached* C when the server's first event shows
its history goes back that far (for contiguous ids: the first id is C + 1; else the
first id is not newer than the first id stored after C, the *witness*; a truncation
header says it did not). From there on, while no drop signal of its own has come, it
re-reads continuously: every open gap whose resume point is at or after C moves its
``reread_to`` forward batch by batch and closes once the connection commits past its
end. Repairs resume from ``reread_to``, so a disconnect mid-replay continues the replay.

Counts. With ``contiguous_ids`` a closing gap counts the integers in its range that are
not stored and not already counted by another unrecoverable gap: exact, each lost id in
one gap's ``missing`` only, whether the gaps close in one batch (the store applies a
batch's changes in order, each seeing the records closed before it) or in several. A gap
whose missing ids are all counted already by another (they overlap) is not repaired, its
ids are still missing: it is unrecoverable with ``missing`` 0, so the gap counts as
unrecoverable and its ids count once, in the gap that closed first. Otherwise a gap
opened while reading new ids keeps the count its notice announced, and its loss is the
announced count minus what repairs recovered inside it; a gap whose size nobody stated
is unrecoverable with ``missing`` NULL, reported as such (never as 0).

The package, from the record up: this module holds the types (:class:`GapRecord`,
:class:`GapChange`, the summaries the workflow routes on); the reader asks
:class:`~durable_sse.gaps.tracker.GapTracker` what to write with each batch; the gap store
(:mod:`durable_sse.gaps.store`) applies those changes with
:func:`~durable_sse.gaps.transitions.apply_change` inside the batch's transaction; the
lagging id is capped by :func:`durable_sse.cursor.fence.lagging_cap`. Everything but the
store is pure.
"""

# No `from __future__ import annotations`: Temporal decodes these dataclasses, and
# string annotations make each decode several times dearer (tests/test_payload_types.py).

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol

from durable_sse.ids import IdOrder, compare_ids, contiguous_number, newest

MAX_GAPS_IN_SUMMARY = 20
"""Open gaps the workflow and the status query see by name (the totals count them all)."""
SHORT_READS_TO_LOSE = 3
"""Repairs in a row that must find the history starting past a gap before it is taken
as lost (without a truncation header). One such read can be a drop at the very start of
a connection that nothing announced; three in a row are the history itself."""


class GapState(StrEnum):
    OPEN = "open"
    REPAIRED = "repaired"
    UNRECOVERABLE = "unrecoverable"


class GapKind(StrEnum):
    """What revealed the gap (the drop signal's kind)."""

    COMMENT = "comment"
    EVENT_TYPE = "event_type"
    MERCURE_HEADER = "mercure_header"
    ID_GAP = "id_gap"
    MIGRATED = "migrated"
    """A gap fence left by a schema-1 database, turned into a record at migration."""
    RETRY = "retry"
    """What an attempt that died had read: it may have read a drop notice it never
    recorded, so the span is re-read like a gap. If the history no longer holds it, it is
    reported as unrecoverable of unknown size (exact with contiguous ids): a notice may
    have died with the worker, and loud beats silent."""
    SUSPECTED = "suspected"
    """A reconnect of a stream with ``verify_reconnects``: the server may have skipped
    events and dropped the connection before its notice went out, so what was read since
    the lagging id is re-read like a gap (from the lagging id to the newest stored id).
    Closed on evidence like every gap: repaired when a re-read crosses it (``recovered``
    counts what it brought back), unrecoverable when the history no longer reaches it
    (of unknown size, exact with contiguous ids: loud, though it may have lost nothing)."""
    NO_RESUME = "no_resume"
    """A reconnect that could not resume: no id to send, on a stream that had read
    events (a server that sends no ids). What the server sent while no connection was
    open is lost, and nobody can say how much: recorded unrecoverable of unknown size,
    ending before the first id the reconnect reads, if any (:func:`no_resume`)."""


@dataclass
class GapRecord:
    """One gap record (a row of ``sse_gaps``)."""

    gap_id: str
    stream: str
    kind: str
    start_id: str | None
    """The hole lies strictly after this id (None: before anything stored; unrepairable)."""
    end_id: str | None = None
    """The hole lies strictly before this id: the first id read after the signal."""
    notice_id: str | None = None
    """The newest id read when the signal came: bounds repairs while ``end_id`` is unknown."""
    announced: int | None = None
    """Events the signal said were skipped, when it said so while reading new ids."""
    state: str = GapState.OPEN.value
    reread_to: str | None = None
    """Re-read continuously (or proven lost) up to here: repairs resume after it."""
    truncated: bool = False
    """Part of the gap lies beyond the server's history."""
    short_reads: int = 0
    """Repairs in a row whose first event showed the server's history starts past the
    gap (see :data:`SHORT_READS_TO_LOSE`)."""
    recovered: int = 0
    """Rows stored inside the gap after it was recorded (what repairs brought back)."""
    missing: int | None = None
    """Once closed: events lost for good (0 when repaired; None when nobody can know)."""
    seen_at: str = ""
    """ISO time the signal came."""
    closed_at: str | None = None
    detail: str = ""
    """Short, sanitised description of the signal (never event data)."""

    @property
    def is_open(self) -> bool:
        return self.state == GapState.OPEN

    def resume_from(self, order: IdOrder | str) -> str | None:
        """Where a repair of this gap starts: after what is already re-read."""
        return newest([self.start_id, self.reread_to], order)

    def bound(self) -> str | None:
        """The id a repair must commit (``end_id``), or pass (``notice_id``)."""
        return self.end_id if self.end_id is not None else self.notice_id

    def contains(self, event_id: str, order: IdOrder | str) -> bool:
        """Whether a row with this id fills part of the hole."""
        if self.start_id is not None and compare_ids(event_id, self.start_id, order) <= 0:
            return False
        if self.end_id is not None:
            return compare_ids(event_id, self.end_id, order) < 0
        return self.notice_id is not None and compare_ids(event_id, self.notice_id, order) <= 0

    def passed_by(self, event_id: str, order: IdOrder | str) -> bool:
        """Whether a connection that re-read continuously up to ``event_id`` got past it."""
        if self.end_id is not None:
            return compare_ids(event_id, self.end_id, order) >= 0
        return self.notice_id is None or compare_ids(event_id, self.notice_id, order) > 0


@dataclass
class GapChange:
    """What one batch's transaction does to one gap record (applied by the store)."""

    gap_id: str
    opened: GapRecord | None = None
    """Insert this record (its start raised to the stream's lagging id)."""
    end_id: str | None = None
    """The first id read after the signal (set once)."""
    reread_to: str | None = None
    lost_to: str | None = None
    """The server's history starts after this id: what lies before it in the gap is lost."""
    short_to: str | None = None
    """A repair found the history starting at this id: lost if the repairs before it
    found so too (:data:`SHORT_READS_TO_LOSE` in all), else one strike."""
    truncated: bool = False
    recovered: bool = False
    """The batch lies inside the gap: its new rows are recovered rows of the gap."""
    close: bool = False
    """A connection re-read past the gap's end (or nothing of it is reachable): close it."""
    contiguous: bool = False
    """The stream's ids are contiguous integers: count what is missing exactly."""
    early_floor: str | None = None
    """Set with ``end_id`` when the gap's notice came before the connection's first event
    (contiguous ids): the newest stored id the connection knew of. The store narrows the
    gap to the ids really missing (:func:`attribute_early_notice`)."""


class StoredIds(Protocol):
    """What a store answers so that a closing gap can count exactly."""

    def stored_numbers_between(self, low: int, high: int) -> int:
        """Rows whose id is an integer strictly between ``low`` and ``high``."""
        ...

    def counted_ranges(self, *, except_gap: str) -> list[tuple[int, int]]:
        """``(start, end)`` of the stream's other unrecoverable contiguous gaps."""
        ...


def numeric_span(gap: GapRecord) -> tuple[int, int] | None:
    """``(start, end)`` as integers, for gaps of contiguous-id streams."""
    if gap.start_id is None:
        return _placed_before_end(gap)
    low = contiguous_number(gap.start_id)
    bound = gap.bound()
    high = contiguous_number(bound) if bound is not None else None
    if low is None or high is None:
        return None
    if gap.end_id is None:
        high += 1  # the notice id itself is stored; the hole ends at it
    return (low, high) if high > low else None


def _placed_before_end(gap: GapRecord) -> tuple[int, int] | None:
    """Where a gap with no start lies once it is counted: a notice before the first event
    of a connection with no cursor and no lagging id closes as it opens, counted as
    announced; its end (the first id after the notice) comes after. With contiguous ids
    the skipped ids are the ones right before that end, and a later gap over them must
    not count them again (seed 279561886 of the simulation counted two ids twice)."""
    if gap.is_open or gap.end_id is None or not gap.missing:
        return None
    end = contiguous_number(gap.end_id)
    return None if end is None else (end - gap.missing - 1, end)


# -- what the workflow and the status query see ---------------------------------------


@dataclass
class GapView:
    """An open gap as the workflow, the status query and the Web UI show it."""

    gap_id: str
    kind: str
    start_id: str | None
    end_id: str | None
    resume_from: str | None
    announced: int | None
    seen_at: str


@dataclass
class GapTotals:
    open: int = 0
    repaired: int = 0
    unrecoverable: int = 0
    events_unrecoverable: int = 0
    """Sum of the exact counts of unrecoverable gaps."""
    unknown_size: int = 0
    """Unrecoverable gaps whose size nobody can know (no count announced, ids not
    contiguous): their events are *not* in ``events_unrecoverable``."""
    events_recovered: int = 0
    suspicions: int = 0
    """Gaps of kind ``suspected`` recorded (``verify_reconnects``), open or closed."""
    suspicions_closed: int = 0
    """Of those, closed (repaired, or unrecoverable because the history no longer held
    them)."""
    suspicions_recovered: int = 0
    """Events re-reading the suspicions stored that were missing: what silent skips a
    notice never announced cost before ``verify_reconnects`` brought them back."""


@dataclass
class GapSummary:
    """A stream's gaps, read from the store: the open ones by name, all by count."""

    open: list[GapView] = field(default_factory=list)
    totals: GapTotals = field(default_factory=GapTotals)

    @property
    def open_ids(self) -> list[str]:
        return [gap.gap_id for gap in self.open]


def summarize(gaps: Sequence[GapRecord], order: IdOrder | str) -> GapSummary:
    """The summary of a stream's gap records."""
    totals = GapTotals()
    open_gaps = []
    for gap in gaps:
        totals.events_recovered += gap.recovered
        if gap.kind == GapKind.SUSPECTED:
            totals.suspicions += 1
            totals.suspicions_closed += 0 if gap.is_open else 1
            totals.suspicions_recovered += gap.recovered
        if gap.is_open:
            totals.open += 1
            open_gaps.append(gap)
        elif gap.state == GapState.REPAIRED:
            totals.repaired += 1
        else:
            totals.unrecoverable += 1
            if gap.missing is None:
                totals.unknown_size += 1
            else:
                totals.events_unrecoverable += gap.missing
    open_gaps.sort(key=lambda gap: (gap.seen_at, gap.gap_id))
    views = [
        GapView(
            gap_id=gap.gap_id,
            kind=gap.kind,
            start_id=gap.start_id,
            end_id=gap.end_id,
            resume_from=gap.resume_from(order),
            announced=gap.announced,
            seen_at=gap.seen_at,
        )
        for gap in open_gaps[:MAX_GAPS_IN_SUMMARY]
    ]
    return GapSummary(open=views, totals=totals)


# -- one connection's view: what it opens, proves and writes with each batch ----------


@dataclass
class StreamContext:
    """What a connection learns about its stream from the store as it connects."""

    lagging_id: str | None = None
    floor: str | None = None
    """Newest stored id when the connection started (None: nothing stored)."""
    witness: str | None = None
    """First stored id after the cursor sent (None: nothing stored after it)."""
    open_gaps: list[GapRecord] = field(default_factory=list)
    has_rows: bool = False
    """The stream has stored rows, with ids or without (the floor says which carry one)."""


def no_resume(cursor: str | None, context: StreamContext, *, read_before: bool) -> bool:
    """Whether a connection is a reconnect that cannot resume, a loss window: it has no
    id to send, and the stream has read events before (rows are stored, or earlier
    connections or a dead attempt read some: ``read_before``). A stream's very first
    connection is not one: nothing was sent to it before."""
    return cursor is None and (context.has_rows or read_before)
