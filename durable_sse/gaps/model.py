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

Everything here is pure. The reader asks :class:`GapTracker` what to write with each
batch; the stores apply those :class:`GapChange` s with :func:`apply_change` inside the
batch's transaction; the checkpoint is capped by :func:`lagging_cap`; the workflow routes
on :class:`GapSummary`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol

from durable_sse.ids import IdOrder, compare_ids, contiguous_number, newest

MAX_GAPS_IN_SUMMARY = 20
SHORT_READS_TO_LOSE = 3
"""Repairs in a row that must find the history starting past a gap before it is taken
as lost (without a truncation header). One such read can be a drop at the very start of
a connection that nothing announced; three in a row are the history itself."""
"""Open gaps the workflow and the status query see by name (the totals count them all)."""


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
    NO_RESUME = "no_resume"
    """A reconnect that could not resume: no id to send, on a stream that had read
    events (a server that sends no ids). What the server sent while no connection was
    open is lost, and nobody can say how much: recorded unrecoverable of unknown size,
    ending before the first id the reconnect reads, if any (:func:`no_resume`)."""


@dataclass
class Gap:
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
    opened: Gap | None = None
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


def apply_change(
    record: Gap | None,
    change: GapChange,
    *,
    order: IdOrder | str,
    lagging_id: str | None,
    new_rows: int,
    now: str,
    stored: StoredIds | None = None,
) -> Gap | None:
    """The record after ``change``, whatever other writers did first (a merge).

    Every step is monotone, so two attempts of one stream writing at once (ownership
    moving) cannot undo each other: a closed gap stays closed, ``reread_to`` only moves
    forward, ``recovered`` adds the rows this batch newly stored.
    """
    if record is None:
        if change.opened is None:
            return None  # closed and pruned, or never opened: nothing to do
        record = dataclasses.replace(change.opened)
        if record.start_id is None:
            record.start_id = lagging_id  # no cursor, no id read: the last window at most
        if record.start_id is None:
            change = dataclasses.replace(change, truncated=True, close=True)
    else:
        record = dataclasses.replace(record)
    if change.end_id is not None and record.end_id is None:
        record.end_id = change.end_id  # set once, also on a gap closed as it opened
    if not record.is_open:
        return record
    if change.early_floor is not None and stored is not None and change.contiguous:
        if _attribute(record, change.early_floor, stored=stored):
            change = dataclasses.replace(change, close=True)  # nothing of it is missing
    lost_to = change.lost_to
    close = change.close
    if change.short_to is not None:
        if record.short_reads + 1 >= SHORT_READS_TO_LOSE:
            lost_to = newest([lost_to, change.short_to], order)
        else:
            record.short_reads += 1
            # The reader counted this its last strike, the record (reset meanwhile by
            # another attempt's repair) does not: no evidence, another repair must try.
            close = close and lost_to is not None
    if lost_to is not None:
        record.truncated = True
        record.reread_to = newest([record.reread_to, lost_to], order)
    if change.truncated:
        record.truncated = True
    if change.reread_to is not None:
        record.reread_to = newest([record.reread_to, change.reread_to], order)
        record.short_reads = 0  # a repair got through: the history reached it after all
    if change.recovered and change.opened is None:
        record.recovered += new_rows
    if close:
        _close(record, order=order, now=now, stored=stored if change.contiguous else None)
    return record


def _close(record: Gap, *, order: IdOrder | str, now: str, stored: StoredIds | None) -> None:
    record.closed_at = now
    if stored is not None:
        span = numeric_span(record)
        if span is not None:
            counted = stored.counted_ranges(except_gap=record.gap_id)
            missing = count_missing(*span, stored=stored.stored_numbers_between, excluded=counted)
            if not missing and counted:
                # Nothing of its own to count: repaired only if nothing at all is missing
                # (ids another gap counted are still lost; see the module docstring).
                lost = count_missing(*span, stored=stored.stored_numbers_between) > 0
            else:
                lost = missing > 0
            record.missing = missing
            record.state = GapState.UNRECOVERABLE if lost else GapState.REPAIRED
            return
    if not record.truncated:
        record.missing = 0
        record.state = GapState.REPAIRED
        return
    record.state = GapState.UNRECOVERABLE
    if record.announced is None:
        record.missing = None
    else:
        record.missing = max(record.announced - record.recovered, 0)


def attribute_early_notice(
    cursor: int, first_after: int, *, floor: int | None, stored: Callable[[int, int], int]
) -> tuple[int, int]:
    """Where the hole of a notice that came before a connection's first event lies:
    ``(start, missing)`` -- the hole is strictly after ``start`` and strictly before
    ``first_after``, and ``missing`` of its ids are not stored.

    Contiguous ids only. A connection that sent ``cursor`` should have sent ``cursor + 1``,
    ``cursor + 2``, ... next; it sent ``first_after`` first, after the notice. So the notice
    (and a truncated history, if the server said so) speaks of the ids strictly between
    the two, and nothing else: the connection had sent nothing the notice could be about.
    Ids among them already stored (an older connection read them; typical for a replay
    from the lagging id) are not lost. When every id from the cursor up to ``floor`` (the
    newest stored id the connection knew of) is stored, the hole starts at ``floor``: the
    repair starts there and the lagging id is not held behind it. ``stored(low, high)``
    counts stored integers strictly between ``low`` and ``high``.
    """
    start = cursor
    if floor is not None and cursor < floor < first_after:
        if stored(cursor, floor + 1) == floor - cursor:
            start = floor
    if first_after - start <= 1:
        return start, 0
    return start, first_after - start - 1 - stored(start, first_after)


def _attribute(record: Gap, floor: str, *, stored: StoredIds) -> bool:
    """Narrow an early notice's gap to the ids really missing (see
    :func:`attribute_early_notice`); True when none is (the gap closes as repaired)."""
    low = contiguous_number(record.start_id) if record.start_id is not None else None
    high = contiguous_number(record.end_id) if record.end_id is not None else None
    if low is None or high is None or high <= low:
        return False
    start, missing = attribute_early_notice(
        low, high, floor=contiguous_number(floor), stored=stored.stored_numbers_between
    )
    if start != low:
        record.start_id = floor
    record.announced = missing
    return missing == 0


def numeric_span(gap: Gap) -> tuple[int, int] | None:
    """``(start, end)`` as integers, for gaps of contiguous-id streams."""
    if gap.start_id is None:
        return None
    low = contiguous_number(gap.start_id)
    high = contiguous_number(gap.bound()) if gap.bound() is not None else None
    if low is None or high is None:
        return None
    if gap.end_id is None:
        high += 1  # the notice id itself is stored; the hole ends at it
    return (low, high) if high > low else None


def count_missing(
    low: int,
    high: int,
    *,
    stored: Callable[[int, int], int],
    excluded: Iterable[tuple[int, int]] = (),
) -> int:
    """Integers strictly between ``low`` and ``high`` that are neither stored nor inside
    an ``excluded`` (already counted) open interval."""
    pieces = [(low, high)]
    for ex_low, ex_high in sorted(excluded):
        next_pieces = []
        for a, b in pieces:
            # remove the integers strictly between ex_low and ex_high from (a, b)
            if ex_high - 1 <= a or ex_low + 1 >= b:
                next_pieces.append((a, b))
                continue
            if ex_low > a:
                next_pieces.append((a, ex_low + 1))
            if ex_high < b:
                next_pieces.append((ex_high - 1, b))
        pieces = next_pieces
    total = 0
    for a, b in pieces:
        size = b - a - 1
        if size > 0:
            total += size - stored(a, b)
    return total


def lagging_cap(open_gaps: Iterable[Gap], order: IdOrder | str) -> tuple[str | None, bool]:
    """The newest id the lagging id may take, and whether any open gap holds it.

    ``(None, True)``: an open gap with no start holds it where it is.
    """
    cap: str | None = None
    held = False
    for gap in open_gaps:
        if not gap.is_open:
            continue
        resume = gap.resume_from(order)
        if resume is None:
            return None, True
        if not held or compare_ids(resume, cap, order) < 0:  # type: ignore[arg-type]
            cap = resume
        held = True
    return cap, held


def oldest_open(open_gaps: Iterable[Gap], order: IdOrder | str) -> Gap | None:
    """The open gap a repair must start with (the oldest resume point)."""
    best: Gap | None = None
    for gap in open_gaps:
        if not gap.is_open:
            continue
        resume = gap.resume_from(order)
        if resume is None:
            continue
        if best is None or compare_ids(resume, best.resume_from(order) or "", order) < 0:
            best = gap
    return best


def choose_start(
    *,
    cursor: str | None,
    source: str,
    repair: bool,
    lagging_id: str | None,
    floor: str | None,
    open_gaps: Sequence[Gap],
    order: IdOrder | str,
    neighbour: Callable[[str, bool], str | None],
    oldest: Callable[[], str | None] | None = None,
) -> tuple[str | None, str, str | None]:
    """Where a connection starts: ``(cursor, source, witness)``.

    ``repair`` (the lagged route) starts one stored id before the oldest open gap's
    resume point, so the first id re-delivered shows whether the history still reaches
    it; with no gap open it starts at the lagging id. A connection whose caches had no
    cursor takes the lagging id, then the floor. ``neighbour(id, older)`` is the store's
    stored id just before (``older``) or just after ``id``; the witness is the one
    after the cursor, when the cursor is older than the floor. ``oldest`` (given for a
    retry that does not know where the attempt it replaces began) puts the oldest stored
    id before the floor: with no lagging id yet, the stream is younger than one window.
    """
    if repair:
        target = oldest_open(open_gaps, order)
        if target is not None:
            resume = target.resume_from(order)
            assert resume is not None
            cursor, source = neighbour(resume, True) or resume, "gap"
        elif lagging_id:
            cursor, source = lagging_id, "lagging"
    if cursor is None and (not repair or oldest is not None):
        if lagging_id:
            cursor, source = lagging_id, "lagging"
        elif oldest is not None and (first := oldest()):
            cursor, source = first, "oldest"
        elif floor:
            cursor, source = floor, "floor"
    witness = None
    if cursor and floor and compare_ids(cursor, floor, order) < 0:
        witness = neighbour(cursor, False)
    return cursor, source, witness


def lagging_target(
    candidate: str | None, open_gaps: Iterable[Gap], order: IdOrder | str
) -> tuple[str | None, bool, str | None]:
    """Where the lagging id may move: ``(target, held by a gap, cap)``.

    ``candidate`` is the newest id received a replay window ago; an open gap caps it at
    its resume point (a gap with no start holds it where it is: target None).
    """
    cap, held = lagging_cap(open_gaps, order)
    if not held:
        return candidate, False, None
    if cap is None or candidate is None:
        return None, True, cap  # nothing a window old yet, or a gap with no start
    if compare_ids(candidate, cap, order) > 0:
        return cap, True, cap
    return candidate, True, cap


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


@dataclass
class GapSummary:
    """A stream's gaps, read from the store: the open ones by name, all by count."""

    open: list[GapView] = field(default_factory=list)
    totals: GapTotals = field(default_factory=GapTotals)

    @property
    def open_ids(self) -> list[str]:
        return [gap.gap_id for gap in self.open]


def summarize(gaps: Sequence[Gap], order: IdOrder | str) -> GapSummary:
    """The summary of a stream's gap records."""
    totals = GapTotals()
    open_gaps = []
    for gap in gaps:
        totals.events_recovered += gap.recovered
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
    open_gaps: list[Gap] = field(default_factory=list)
    has_rows: bool = False
    """The stream has stored rows, with ids or without (the floor says which carry one)."""


def no_resume(cursor: str | None, context: StreamContext, *, read_before: bool) -> bool:
    """Whether a connection is a reconnect that cannot resume, a loss window: it has no
    id to send, and the stream has read events before (rows are stored, or earlier
    connections or a dead attempt read some: ``read_before``). A stream's very first
    connection is not one: nothing was sent to it before."""
    return cursor is None and (context.has_rows or read_before)


class GapTracker:
    """What one connection knows, proves and opens about its stream's gaps.

    The reader calls, in reading order: :meth:`first_event` for the first id read,
    :meth:`drop_signal` for a notice (after submitting what was read before it),
    :meth:`id_read` for every id, :meth:`jump` for a hole in contiguous ids, and
    :meth:`batch_changes` for every batch it submits (the changes go into that batch's
    transaction). Batches must not straddle :meth:`segment` boundaries, so the new rows
    of a batch are wholly inside or outside each gap.
    """

    def __init__(
        self,
        *,
        stream: str,
        order: IdOrder | str,
        cursor: str | None,
        context: StreamContext,
        contiguous: bool,
        new_gap_id: Callable[[], str],
        now: Callable[[], str],
    ) -> None:
        self.stream = stream
        self.order = IdOrder(order)
        self.cursor = cursor
        self.context = context
        self.contiguous = contiguous
        self._new_gap_id = new_gap_id
        self._now = now
        self.gaps: dict[str, Gap] = {g.gap_id: g for g in context.open_gaps if g.is_open}
        self.covered_from: str | None = None
        """Re-read continuously from here (None: this connection proves nothing)."""
        self.clean = True
        """No drop signal of this connection so far: its batches are evidence."""
        self.short_history = False
        """The first event suggested a short history for a gap being repaired (a
        strike): the connection should end soon so that another repair tries again."""
        self._strikes: list[GapChange] = []
        self.first_id: str | None = None
        self.last_id: str | None = None
        self.opened: list[str] = []
        self._queued: list[GapChange] = []
        self._awaiting_end: Gap | None = None
        self._first_seen = False
        self._early_notice: str | None = None
        """The gap of a notice that came before the connection's first event."""

    # -- reading --------------------------------------------------------------------

    def first_event(
        self, event_id: str, *, history_short: bool = False, history_confirmed: bool = False
    ) -> None:
        """The first id read: did the server's history reach the cursor sent?

        The connection is evidence from the cursor on only when that is *shown*: the ids
        are contiguous and the first is the cursor's successor, the server confirmed the
        cursor (``history_confirmed``), or the first id is not newer than the first id
        stored after the cursor (the witness). Otherwise it is evidence from its first
        id on, and the gaps it set out to repair that lie before that id get a strike.

        Args:
            history_short: the server said its history does not reach the cursor (a
                ``Mercure-Last-Event-ID`` unlike it).
            history_confirmed: the server said it resumed at the cursor (that header,
                equal to it).
        """
        self._first_seen = True
        self.first_id = event_id
        cursor = self.cursor
        if cursor is None:
            return
        if history_short:
            self.covered_from = event_id
            self._lose_covered(cursor, event_id, definite=True)
            self._open_skipped(
                cursor, event_id, kind=GapKind.MERCURE_HEADER, lost=True, at_start=True
            )
            return
        if self.contiguous:
            low, high = contiguous_number(cursor), contiguous_number(event_id)
            if low is not None and high is not None:
                if high <= low + 1:
                    self.covered_from = cursor
                    return
                # The history starts after the cursor, or this connection dropped ids
                # at its start: gaps being repaired get a strike; ids never stored in
                # between get a gap of their own.
                self.covered_from = event_id
                self._lose_covered(cursor, event_id, definite=False)
                self._open_skipped(cursor, event_id, kind=GapKind.ID_GAP, lost=False, at_start=True)
                return
        witness = self.context.witness
        reached = history_confirmed or (
            witness is not None and compare_ids(event_id, witness, self.order) <= 0
        )
        if reached:
            self.covered_from = cursor
            return
        # Evidence from here on only. The server skipped ids stored after the cursor: its
        # history may be shorter (a strike for the gaps this connection set out to
        # repair). Nothing stored after the cursor to compare with: nothing is shown
        # either way, and an unrepaired gap waits for a repair that starts before it.
        self.covered_from = event_id
        if witness is not None:
            self._lose_covered(cursor, event_id, definite=False)

    def id_read(self, event_id: str) -> None:
        """Every id read, in order (the first after a notice is the hole's end)."""
        if not self._first_seen:
            self.first_event(event_id)
        if self._awaiting_end is not None:
            gap = self._awaiting_end
            if gap.end_id is None:
                gap.end_id = event_id
                change = GapChange(gap.gap_id, end_id=event_id)
                if gap.gap_id == self._early_notice and self.contiguous:
                    # The notice came before any event: it speaks of the ids between the
                    # cursor and this one only. The store narrows it to what is missing.
                    change.contiguous = True
                    change.early_floor = self.context.floor or gap.start_id
                self._queued.append(change)
            self._awaiting_end = None
        self.last_id = event_id

    def suspect(self, detail: str) -> Gap | None:
        """This attempt replaces one that died: record what that one read (from this
        connection's cursor to the newest stored id) as a gap to re-read, so that a
        drop notice it read and never wrote is repaired even if this attempt is cut short
        too. This connection's own continuous read can close it."""
        start = newest([self.cursor, self.context.lagging_id], self.order)
        bound = self.context.floor
        if start is None or bound is None or compare_ids(bound, start, self.order) <= 0:
            return None
        # Through the newest stored id (what the dead attempt committed) and one id past
        # it: a late notice it read may be about the ids right after, which a history
        # cut short could take before anyone reads them.
        gap = self._open(
            GapKind.RETRY, start=start, end=None, notice=bound, announced=None, detail=detail
        )
        self.opened.remove(gap.gap_id)  # not this connection's own drop: it may prove it
        return gap

    def no_resume(self) -> Gap:
        """This connection reconnects with no id to resume from (see :func:`no_resume`):
        record the loss window as lost, of unknown size; the first id it reads, if any,
        is the window's end."""
        gap = self._open(
            GapKind.NO_RESUME,
            start=None,
            end=None,
            notice=None,
            announced=None,
            detail="reconnected with no id to resume from: what the server sent meanwhile is lost",
            lost=True,
        )
        if self._awaiting_end is None and not self._first_seen:
            self._awaiting_end = gap
        return gap

    def jump(self, last_id: str, event_id: str) -> bool:
        """A hole in contiguous ids between ``last_id`` and ``event_id``, mid-connection.

        Returns True when it is a drop signal: it opened a gap over ids that are new or
        part of an open gap. A hole among ids already stored (history the server no
        longer has) is harmless and ignored.
        """
        return self._open_skipped(last_id, event_id, kind=GapKind.ID_GAP, lost=False)

    def drop_signal(
        self,
        kind: GapKind,
        *,
        announced: int | None = None,
        detail: str = "",
        read_a_window_ago: str | None = None,
    ) -> Gap:
        """A notice or drop event: open a gap now; its end is the next id read.

        Its start is the connection's cursor (or first id), or, on a connection that has
        been reading for longer than a replay window, ``read_a_window_ago``: the id it
        read one window ago (a notice speaks of what the server sent lately; that holds
        for a replay of old ids as for the live tail).
        """
        self.clean = False
        notice = self.last_id if self.last_id is not None else self.cursor
        start = newest([self.cursor or self.first_id, read_a_window_ago], self.order)
        if start is None:
            start = self.context.lagging_id  # nothing read yet: the last window at most
        fresh = notice is None or self._is_fresh(notice)
        gap = self._open(
            kind,
            start=start,
            end=None,
            notice=notice,
            announced=announced if fresh else None,
            detail=detail,
        )
        self._awaiting_end = gap
        if not self._first_seen and self.cursor is not None and start == self.cursor:
            self._early_notice = gap.gap_id
        return gap

    # -- writing --------------------------------------------------------------------

    def segment(self, event_id: str) -> frozenset[str]:
        """The gaps a row with this id would fill (batches are cut where this changes)."""
        if not self.gaps:
            return frozenset()
        return frozenset(g.gap_id for g in self.gaps.values() if g.contains(event_id, self.order))

    def batch_changes(self, *, last_id: str | None, segment: frozenset[str]) -> list[GapChange]:
        """The gap changes to commit with the batch just cut (its newest id ``last_id``)."""
        changes, self._queued = self._queued, []
        for gap in list(self.gaps.values()):
            change = GapChange(gap.gap_id, contiguous=self.contiguous)
            touched = False
            if gap.gap_id in segment and gap.gap_id not in self.opened:
                change.recovered = touched = True
            if self._covers(gap) and last_id is not None:
                if gap.passed_by(last_id, self.order):
                    if gap.end_id is None:
                        change.end_id = gap.end_id = last_id
                    change.close = touched = True
                    del self.gaps[gap.gap_id]
                elif compare_ids(last_id, gap.resume_from(self.order) or last_id, self.order) > 0:
                    change.reread_to = gap.reread_to = last_id
                    touched = True
            if touched:
                changes.append(change)
        return changes

    @property
    def has_queued(self) -> bool:
        return bool(self._queued)

    def pending_changes(self) -> list[GapChange]:
        """Changes not yet given to a batch (the connection is ending: commit them alone),
        with the strikes of a connection that saw no drop signal of its own."""
        changes, self._queued = self._queued, []
        if self.clean:
            changes.extend(self._strikes)
        self._strikes = []
        return changes

    # -- internals ------------------------------------------------------------------

    def _covers(self, gap: Gap) -> bool:
        if not self.clean or self.covered_from is None or gap.gap_id in self.opened:
            return False
        resume = gap.resume_from(self.order)
        return resume is not None and compare_ids(resume, self.covered_from, self.order) >= 0

    def _is_fresh(self, event_id: str) -> bool:
        """Whether the connection reads new ids here (at or past the newest stored)."""
        floor = self.context.floor
        return floor is None or compare_ids(event_id, floor, self.order) >= 0

    def _lose_covered(self, cursor: str, first_id: str, *, definite: bool) -> None:
        """The history seems to start at ``first_id``: gaps this connection set out to
        repair (resume point at or after the cursor) lose what lies before it, when the
        server said so (``definite``) or a repair before this one saw the same; else it
        is one strike, and :attr:`short_history` asks for another repair."""
        for gap in list(self.gaps.values()):
            resume = gap.resume_from(self.order)
            if gap.gap_id in self.opened or resume is None:
                continue
            if compare_ids(resume, cursor, self.order) < 0:
                continue  # not this connection's to repair
            if compare_ids(first_id, resume, self.order) <= 0:
                continue  # the history still reaches it
            if not definite and gap.short_reads + 1 < SHORT_READS_TO_LOSE:
                # A strike, written only if the connection ends with no drop signal of
                # its own (a late notice would explain the skip).
                gap.short_reads += 1
                self.short_history = True
                self._strikes.append(GapChange(gap.gap_id, short_to=first_id))
                continue
            if not definite and not self.clean:
                continue  # a drop announced before the first event explains the skip
            change = GapChange(gap.gap_id, contiguous=self.contiguous)
            if definite:
                change.lost_to = first_id
            else:
                change.short_to = first_id
            gap.reread_to = first_id
            gap.truncated = True
            if gap.passed_by(first_id, self.order):
                change.close = True
                change.end_id = gap.end_id or first_id
                del self.gaps[gap.gap_id]
            self._queued.append(change)

    def _open_skipped(
        self, low: str, high: str, *, kind: GapKind, lost: bool, at_start: bool = False
    ) -> bool:
        """The server skipped the ids strictly between ``low`` and ``high``.

        Ids never stored (past the floor) get a gap of their own; ``lost``: the server
        cannot deliver them, so it is closed at once. Ids inside an open gap this
        connection was re-reading mean the repair did not get through: no new record
        (that gap stays open), but the connection is no longer evidence and must end.
        Ids already stored are harmless. ``at_start``: the skip is the connection's first
        event, which :meth:`_lose_covered` already weighed for the gaps it passes.
        Returns True when the connection must end.
        """
        floor = self.context.floor
        if any(self._holds(gap_id, low, high) for gap_id in self.opened):
            self.clean = False
            return True  # the skip a notice of this connection announced: already recorded
        through_gap = not at_start and any(
            self._overlaps(gap, low, high) for gap in self.gaps.values()
        )
        if through_gap:
            self.clean = False
        new_part = floor is None or compare_ids(high, floor, self.order) > 0
        if not new_part:
            return through_gap
        fresh_low = low if floor is None else newest([low, floor], self.order)
        assert fresh_low is not None
        announced = None
        low_number, high_number = contiguous_number(fresh_low), contiguous_number(high)
        if low_number is not None and high_number is not None:
            announced = high_number - low_number - 1
            if announced <= 0:
                return through_gap
        self._open(
            kind,
            start=fresh_low,
            end=high,
            notice=fresh_low,
            announced=announced,
            detail=f"{announced if announced is not None else 'some'} ids skipped",
            lost=lost,
        )
        if lost:
            return through_gap  # nothing to repair: counted now, the stream reads on
        self.clean = False
        return True

    def _holds(self, gap_id: str, low: str, high: str) -> bool:
        """Whether a gap this connection opened already spans ``(low, high)``."""
        gap = self.gaps.get(gap_id) or self._awaiting_end
        if gap is None or gap.gap_id != gap_id or gap.start_id is None:
            return False
        if compare_ids(gap.start_id, low, self.order) > 0:
            return False
        bound = gap.end_id
        return bound is None or compare_ids(bound, high, self.order) >= 0

    def _overlaps(self, gap: Gap, low: str, high: str) -> bool:
        resume, bound = gap.resume_from(self.order), gap.bound()
        if resume is not None and compare_ids(high, resume, self.order) <= 0:
            return False
        return bound is None or compare_ids(low, bound, self.order) < 0

    def _open(
        self,
        kind: GapKind,
        *,
        start: str | None,
        end: str | None,
        notice: str | None,
        announced: int | None,
        detail: str,
        lost: bool = False,
    ) -> Gap:
        gap = Gap(
            gap_id=self._new_gap_id(),
            stream=self.stream,
            kind=kind.value,
            start_id=start,
            end_id=end,
            notice_id=notice,
            announced=announced,
            seen_at=self._now(),
            detail=detail[:200],
            truncated=lost,
        )
        change = GapChange(gap.gap_id, opened=gap, contiguous=self.contiguous)
        if lost or start is None:
            change.truncated = change.close = True
        else:
            self.gaps[gap.gap_id] = gap
        self.opened.append(gap.gap_id)
        self._queued.append(change)
        return gap
