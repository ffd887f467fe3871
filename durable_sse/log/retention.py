"""Retention: how long a stream's events are kept, and which old rows must stay anyway.

Deleting is irreversible, so the decisions are plain functions here and the store only
carries them out (:meth:`durable_sse.log.prune.Prune.apply_retention`):

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
  too (see :meth:`durable_sse.log.prune.Prune.apply_retention`): a gap committed or a
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

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime

from durable_sse.config.durations import format_duration
from durable_sse.errors import IdOrderMismatchError

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
