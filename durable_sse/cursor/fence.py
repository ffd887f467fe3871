"""The fence: what the lagging id may not pass, where repairs start, what retention keeps.

DESIGN's invariant 5 in decisions: the lagging id never passes the oldest open gap
(:func:`lagging_cap`, :func:`lagging_target`); a repair starts one stored id before the
oldest open gap's resume point, so its first event shows whether the history still
reaches the gap (:func:`choose_start`); and retention keeps the lagging id, every open
gap's start and every running connection's start, and everything after them
(:func:`retention_fence`). Plain functions over gap records and ids: the checkpoint and
start stores (:mod:`durable_sse.cursor.checkpoint`, :mod:`durable_sse.cursor.start`) read
their inputs in one transaction and write what these decide.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime

from durable_sse.gaps.model import GapRecord
from durable_sse.ids import IdOrder, compare_ids
from durable_sse.log.retention import (
    HELD_BY_GAP,
    HELD_BY_LAGGING,
    HELD_BY_NO_LAGGING,
    HELD_BY_READER,
    Fence,
)


def lagging_cap(open_gaps: Iterable[GapRecord], order: IdOrder | str) -> tuple[str | None, bool]:
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


def oldest_open(open_gaps: Iterable[GapRecord], order: IdOrder | str) -> GapRecord | None:
    """The open gap a repair must start with (the oldest resume point)."""
    best: GapRecord | None = None
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
    open_gaps: Sequence[GapRecord],
    order: IdOrder | str,
    neighbour: Callable[[str, bool], str | None],
    oldest: Callable[[], str | None] | None = None,
    retry: bool = False,
    settled: Callable[[], str | None] | None = None,
) -> tuple[str | None, str, str | None]:
    """Where a connection starts: ``(cursor, source, witness)``.

    ``repair`` (the lagged route) starts one stored id before the oldest open gap's
    resume point, so the first id re-delivered shows whether the history still reaches
    it; with no gap open one stored id before the lagging id (the start of what a
    verified reconnect suspects), for the same reason. A connection whose caches had no
    cursor takes the lagging id, then the floor. ``neighbour(id, older)`` is the store's
    stored id just before (``older``) or just after ``id``; the witness is the one
    after the cursor, when the cursor is older than the floor. ``oldest`` (given for a
    retry that does not know where the attempt it replaces began) puts the oldest stored
    id before the floor: with no lagging id yet, the stream is younger than one window.
    ``retry`` (an attempt that replaces one that died) at the floor starts one stored id
    before it, so that its first event shows whether the history reaches the floor: the
    dead attempt may have read past it, and nothing stored after it could show that.
    ``settled`` (given for a live retry) is the newest stored id the dead attempt had
    read well past before it died (``log.reads.settled_id``): a drop notice it may have
    read and never recorded is about the ids after that one, so the retry starts there
    at the earliest. Without it a retry re-read a whole window (hundreds of events a
    stream) before storing anything new.
    """
    if repair:
        target = oldest_open(open_gaps, order)
        if target is not None:
            resume = target.resume_from(order)
            assert resume is not None
            cursor, source = neighbour(resume, True) or resume, "gap"
        elif lagging_id:
            # One stored id before it too: a verified reconnect's suspicion starts at the
            # lagging id, and the first row after it lies inside the suspicion, no witness.
            cursor, source = neighbour(lagging_id, True) or lagging_id, "lagging"
    if cursor is None and (not repair or oldest is not None):
        if lagging_id:
            cursor, source = lagging_id, "lagging"
        elif oldest is not None and (first := oldest()):
            cursor, source = first, "oldest"
        elif floor:
            cursor, source = floor, "floor"
    if settled is not None and cursor is not None and (bound := settled()) is not None:
        if compare_ids(bound, cursor, order) > 0:
            cursor = bound
    if retry and not repair and cursor and floor and compare_ids(cursor, floor, order) == 0:
        # Simulation seed 729818868: a retry from the floor (14) met an id the dead
        # attempt had read and never stored was gone from the history, and ids that are
        # not contiguous could not show it (no witness).
        cursor = neighbour(cursor, True) or cursor
    witness = None
    if cursor and floor and compare_ids(cursor, floor, order) < 0:
        witness = neighbour(cursor, False)
    return cursor, source, witness


def lagging_target(
    candidate: str | None, open_gaps: Iterable[GapRecord], order: IdOrder | str
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


def retention_fence(
    lagging_id: str | None,
    open_gaps: Iterable[GapRecord],
    order: IdOrder | str,
    readers: Iterable[str | None] = (),
) -> Fence:
    """The fence: the oldest of the lagging id, the open gaps' start ids and the start
    cursors of the stream's running connections (``readers``: see :func:`live_starts`;
    None for a connection that sent no cursor, which keeps every id)."""
    if lagging_id is None:
        return Fence(None, HELD_BY_NO_LAGGING)
    fence, held_by = lagging_id, HELD_BY_LAGGING
    for gap in open_gaps:
        if not gap.is_open:
            continue
        if gap.start_id is None:
            return Fence(None, HELD_BY_GAP)  # no start to keep from: keep every id
        if compare_ids(gap.start_id, fence, order) < 0:
            fence, held_by = gap.start_id, HELD_BY_GAP
    for start in readers:
        if start is None:
            return Fence(None, HELD_BY_READER)  # it reads from its first id: keep every id
        if compare_ids(start, fence, order) < 0:
            fence, held_by = start, HELD_BY_READER
    return Fence(fence, held_by)


@dataclass(frozen=True)
class RunningReader:
    """A running connection of a stream, as ``sse_readers`` holds it.

    Written as the connection resolves its start cursor, in the same transaction as the
    read that chooses it, and deleted when the connection ends; until then retention
    keeps its ``start_id`` row and everything after it (:func:`retention_fence`). The
    connection moves ``start_id`` forward as it reads (``Intake.retention_hold``: to the
    id it read a replay window ago, the oldest a gap of its own can start at), so a
    connection that lasts ``max_connection_age`` holds retention back by about a window,
    not by its age. A worker that dies leaves its row behind: ``expires_at``
    (:func:`reader_expiry`) ends its hold.
    """

    reader_id: str
    """One per activity attempt: a retry is a reader of its own."""
    start_id: str | None
    """The oldest id it may still need: the cursor it sent, moved forward as it reads
    (None: no cursor and no id read yet, every id stays)."""
    expires_at: datetime


def live_starts(readers: Iterable[RunningReader], now: datetime) -> list[str | None]:
    """The start cursors of the readers that have not expired at ``now``."""
    return [reader.start_id for reader in readers if reader.expires_at > now]
