"""Retention: how long a stream's events are kept, and which old rows must stay anyway.

Deleting is irreversible, so the decisions are plain functions here and the store only
carries them out (:meth:`durable_sse.log.eventlog.EventLog.apply_retention`):

* **How long.** A stream's own ``retention`` wins; a stream without one takes the
  worker's ``DURABLE_SSE_RETENTION``, raised to the stream's ``replay_window`` if it is
  shorter (a stream's own setting is refused below its window already); with neither,
  nothing is deleted. A stream opts out of a worker-wide setting with a retention of its
  own (``36500d`` is a century).
* **What stays whatever its age** (the *fence*): the lagging id's row and every row at or
  after it, the start row of the oldest open gap and everything after it, and for every
  connection of the stream that is running (``sse_readers``, see :class:`RunningReader`)
  its start cursor and everything after it (moved forward, as it reads, to the id it
  read a replay window ago). The lagged route and every repair start at or after the
  fence, so no connection the workflow makes asks the server for anything older; a
  gap's start row stays so a replay can be attributed to the gap and the gap counted;
  and a connection that started before the lagging id moved (a lagged replay still
  re-reading the last window) finds what it re-reads still stored, and the gaps it opens
  (which start at or after its cursor) after the horizon. The stored id just before the
  fence stays as well: a repair starts one stored id before the gap it repairs, so that
  the first id re-delivered shows whether the server's history still reaches the gap;
  without that row a repair of a gap at the fence would start at the gap itself and take
  the first id stored after it (perhaps the gap's end) for the witness, and call a hole
  the history no longer holds repaired. A stream with no lagging id
  yet keeps every row that carries an id. The fence is read again inside
  every delete transaction, under a lock that gap openings and connection starts take
  too (see :meth:`durable_sse.log.eventlog.EventLog.apply_retention`): a gap committed or a
  connection started while a run goes on holds the very next statement.
* **Deduplication after a delete.** Deleted keys can no longer conflict, so a server
  that re-sends ids older than the fence (one that ignores ``Last-Event-ID``, or an
  explicit ``replay --from-id`` that far back) would have them stored again as new rows,
  after every delete, for as long as its history holds them. The store therefore keeps a
  per-stream *horizon*, the newest id key it has deleted, and the write path drops rows
  whose id sorts at or before it: never stored, never recovered, and counted apart
  (``dropped_by_horizon``, never in ``duplicates``: an id the horizon drops may never
  have been stored, e.g. a non-numeric id under ``numeric``, which sorts before every
  number). Everything the fence protects sorts after the horizon, so no row a repair
  can bring back is ever dropped, and a gap opened later never starts before it
  (:func:`opening_past_horizon`).
* **One order.** Every key (rows, lagging id, horizon) is made under the stream's
  ``id_order`` as recorded in ``sse_checkpoints``; a connection, a checkpoint run or a
  retention run under another order is refused (:func:`check_id_order`), never compared
  across orders.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from durable_sse.config.durations import format_duration
from durable_sse.errors import IdOrderMismatchError
from durable_sse.gaps import Gap, GapChange
from durable_sse.ids import IdOrder, compare_ids, contiguous_number

BATCH_ROWS = 10_000
"""Rows one DELETE statement takes at most: short statements (tens of milliseconds on
PostgreSQL, see docs/benchmarks.md) that never hold the stream's writers back for long."""
MAX_BATCHES = 20
"""Statements one run issues at most (heartbeating between them); a larger backlog is
worked off over the next runs, one replay window apart."""

HELD_BY_LAGGING = "lagging"
HELD_BY_GAP = "gap"
HELD_BY_NO_LAGGING = "no-lagging-id"
HELD_BY_READER = "reader"
READER_MARGIN = timedelta(minutes=2)
"""Added to a running connection's expiry: a timed-out attempt still flushes what it read
(its gaps included) before it returns, and clocks of two workers may differ a little."""


@dataclass(frozen=True)
class Fence:
    """The oldest id that must stay, and why (see the module docstring)."""

    keep_from: str | None
    """Rows with this id or a newer one stay; None with ``ids_deletable`` False: every row
    that carries an id stays."""
    held_by: str
    """``lagging``, ``gap`` (the oldest open gap's start is older than the lagging id),
    or ``no-lagging-id``."""

    @property
    def ids_deletable(self) -> bool:
        return self.keep_from is not None


def retention_fence(
    lagging_id: str | None,
    open_gaps: Iterable[Gap],
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


def reader_expiry(
    started: datetime,
    *,
    attempt_timeout: timedelta,
    heartbeat_timeout: timedelta | None = None,
    retry_interval: timedelta | None = None,
) -> datetime:
    """When a running connection's row stops holding retention, should nobody delete it.

    What bounds a connection's life is its attempt's ``start_to_close`` timeout
    (``max_connection_age + connect_timeout + idle_timeout`` and a margin, see
    ``workflows/stream.py``): the SDK cancels an attempt then, even one whose heartbeats
    no longer reach Temporal, and the attempt flushes what it read (the gaps it opens
    included) before it returns, hence :data:`READER_MARGIN`. A worker that dies is
    noticed after ``heartbeat_timeout``, and its retry starts after at most the retry
    policy's longest interval; the retry starts where the dead attempt began, or at the
    lagging id if that moved past it (what lies between is no longer the fence's to
    keep), and registers a row of its own as it starts. So a row that outlives the
    attempt's own timeout by those two and the margin has covered everything that attempt
    can still write, and a crashed worker's row holds retention for one connection's
    life at most (65 minutes with the default settings), never for ever.
    """
    margin = READER_MARGIN
    if heartbeat_timeout is not None:
        margin += heartbeat_timeout
    if retry_interval is not None:
        margin += retry_interval
    return started + attempt_timeout + margin


def row_deletable(
    key: bytes | None, received_at: datetime, *, fence_key: bytes | None, cutoff: datetime
) -> bool:
    """Whether retention deletes a row: received before the cutoff, and with no id (such
    rows are never replayed nor deduplicated) or an id key before the fence's."""
    if received_at >= cutoff:
        return False
    return key is None or (fence_key is not None and key < fence_key)


@dataclass(frozen=True)
class BatchChoice:
    """What one delete statement takes (:func:`choose_deletions`)."""

    last_seq: int | None
    """The last row looked at that is old enough: the statement deletes up to it."""
    doomed: int
    """Rows among those that :func:`row_deletable` lets go."""
    newest_key: bytes | None
    """The newest id key among them: the horizon moves to it."""
    done: bool
    """Nothing more is old enough (or nothing more to look at)."""
    deleted_to: int | None = None
    """The newest ``seq`` among the rows let go (consumers learn of it: ``Truncated``)."""
    held_by_consumers: tuple[str, ...] = ()
    """The consumer groups whose hold stopped the walk (:class:`ConsumerHold`)."""


def choose_deletions(
    rows: Iterable[tuple[int, bytes | None, datetime]],
    *,
    after: int | None,
    fence_key: bytes | None,
    cutoff: datetime,
    limit: int,
    holds: Iterable[ConsumerHold] = (),
) -> BatchChoice:
    """One statement's share: ``rows`` are ``(seq, id key, received at)`` of the next
    ``limit`` rows after ``after`` in ``seq`` order, before the fence row's ``seq``. The
    walk stops at the first row young enough (arrival order is time order to within a
    batch; a row received out of that order merely waits for a later run), and at the
    first row a consumer group still holds (``holds``, read in the same transaction)."""
    holds = list(holds)
    last_seq, doomed, newest_key, young, seen = after, 0, None, False, 0
    deleted_to: int | None = None
    held: tuple[str, ...] = ()
    for seq, key, received_at in rows:
        seen += 1
        if received_at >= cutoff:
            young = True
            break
        if held_by_consumers(holds, seq, received_at):
            held = tuple(hold.group for hold in holds if hold.keeps(seq, received_at))
            young = True
            break
        last_seq = seq
        if row_deletable(key, received_at, fence_key=fence_key, cutoff=cutoff):
            doomed += 1
            deleted_to = seq
            if key is not None and (newest_key is None or key > newest_key):
                newest_key = key
    return BatchChoice(last_seq, doomed, newest_key, young or seen < limit, deleted_to, held)


def after_horizon(key: bytes | None, horizon: bytes | None) -> bool:
    """Whether the write path stores a row: it carries no id, the stream has no horizon,
    or its id key sorts after the horizon (the newest key retention deleted)."""
    return key is None or horizon is None or key > horizon


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


def check_id_order(stream: str, *, stored: str | None, wanted: str) -> None:
    """Refuse to work on a stream under another ``id_order`` than its keys were made with.

    ``stored`` is the order recorded in ``sse_checkpoints`` (None: none recorded yet, the
    stream is new). Raises :class:`~durable_sse.errors.IdOrderMismatchError`, whose
    message names both orders and what to do.
    """
    if stored is None or stored == wanted:
        return
    raise IdOrderMismatchError(
        f"stream {stream!r}: id_order {wanted!r} is not the order its stored events, "
        f"lagging id and retention horizon are keyed by ({stored!r}); compared across the "
        "two orders, new ids would pass for duplicates and retention would delete rows "
        f"that must stay. Stop it and start it with id_order = {stored!r}; to read it "
        f"under {wanted!r} instead, start it under a new name (it begins empty; the events "
        "stored under this name stay as they are)",
        stored=stored,
        wanted=wanted,
    )


@dataclass(frozen=True)
class ConsumerHold:
    """One consumer group's term of the fence (a separate term: the fence above is the
    reader's, this one the consumers' of the log; see :mod:`durable_sse.consume`).

    A group that holds retention keeps every row it has not consumed (``seq`` after its
    position), until the row is older than the group's ``max_hold``: then it goes, and
    the group meets ``Truncated`` (or an error) instead, so one stuck consumer cannot
    fill the disk forever.
    """

    group: str
    position: int
    """The group's position in the stream: rows up to this ``seq`` are consumed."""
    until: datetime | None = None
    """Rows received before this time go all the same (now - ``max_hold``; None: kept
    for as long as the group needs them)."""

    def keeps(self, seq: int, received_at: datetime) -> bool:
        return seq > self.position and (self.until is None or received_at >= self.until)


def held_by_consumers(holds: Iterable[ConsumerHold], seq: int, received_at: datetime) -> bool:
    """Whether a group keeps this row (retention deletes in ``seq`` order and stops at the
    first row kept, like at the first row younger than the cutoff)."""
    return any(hold.keeps(seq, received_at) for hold in holds)


def describe(status: Mapping[str, object] | None) -> str:
    """One line for ``durable-sse status``: ``7d: 1204 deleted, oldest kept …``."""
    if not status or status.get("retention") is None:
        return "-"
    retention = format_duration(float(status["retention"]))  # type: ignore[arg-type]
    text = f"{retention}: {status.get('deleted_rows', 0)} deleted"
    oldest = status.get("oldest_kept_at")
    if oldest:
        text += f", oldest kept {str(oldest)[:19]}Z"
    groups = status.get("held_by_consumers")
    if groups:
        text += f", held by consumers {', '.join(map(str, groups))}"  # type: ignore[call-overload]
    return text
