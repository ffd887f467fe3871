"""How a gap record changes: the transitions a batch's transaction applies.

A connection's :class:`~durable_sse.gaps.tracker.GapTracker` says what each batch does
to the gaps it knows (a :class:`~durable_sse.gaps.model.GapChange`); the gap store
applies it with :func:`apply_change` inside the batch's transaction, so a record opens,
narrows, moves its repair point and closes (repaired, or unrecoverable with an exact or
unknown count) only together with the rows that prove it. Plain functions: the store
passes what they must read (:class:`~durable_sse.gaps.model.StoredIds`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable

from durable_sse.gaps.model import (
    SHORT_READS_TO_LOSE,
    GapChange,
    GapRecord,
    GapState,
    StoredIds,
    numeric_span,
)
from durable_sse.ids import IdOrder, compare_ids, contiguous_number, newest


def apply_change(
    record: GapRecord | None,
    change: GapChange,
    *,
    order: IdOrder | str,
    lagging_id: str | None,
    new_rows: int,
    now: str,
    stored: StoredIds | None = None,
) -> GapRecord | None:
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


def changes_nothing(change: GapChange, new_rows: int) -> bool:
    """Whether :func:`apply_change` leaves every record as it is: the batch lies inside a
    gap, stored no new row and proves nothing. The store skips such a change without
    reading the gap; a retry's replay over rows its dead attempt stored is mostly these,
    and gap changes are applied inside the group transaction the next one waits for."""
    return (
        change.opened is None
        and change.end_id is None
        and change.reread_to is None
        and change.lost_to is None
        and change.short_to is None
        and not change.truncated
        and not change.close
        and change.early_floor is None
        and (not change.recovered or new_rows == 0)
    )


def _close(record: GapRecord, *, order: IdOrder | str, now: str, stored: StoredIds | None) -> None:
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


def _attribute(record: GapRecord, floor: str, *, stored: StoredIds) -> bool:
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


def opening_past_horizon(
    change: GapChange, horizon_id: str | None, order: IdOrder | str
) -> GapChange | None:
    """A gap opening as the store records it under a retention horizon.

    A gap never starts before the horizon: what lies at or before it is history that
    retention deleted (stored once, counted in ``deleted_rows``) or that was lost before
    anyone recorded it, and the write path drops every id there, so a repair could never
    bring any of it back nor a count tell it apart. The fence keeps every gap a running
    connection can open after the horizon; only a replay from before the horizon (an
    explicit ``replay --from-id``, a cursor cache older than the deletes) or a connection
    whose row expired can open one behind it. Its start is raised to the horizon (a
    contiguous count it announced is cut to the ids after it); one that lies wholly at or
    before the horizon is not recorded at all (None).
    """
    opened = change.opened
    if opened is None or horizon_id is None or opened.start_id is None:
        return change
    if compare_ids(opened.start_id, horizon_id, order) > 0:
        return change
    bound = opened.bound()
    if bound is not None and compare_ids(bound, horizon_id, order) <= 0:
        return None
    announced = opened.announced
    horizon_number = contiguous_number(horizon_id)
    end_number = contiguous_number(opened.end_id) if opened.end_id is not None else None
    if announced is not None and horizon_number is not None and end_number is not None:
        announced = min(announced, max(end_number - horizon_number - 1, 0))
    raised = dataclasses.replace(opened, start_id=horizon_id, announced=announced)
    return dataclasses.replace(change, opened=raised)
