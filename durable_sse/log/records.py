"""What the event log takes and gives back: plain row types, no driver.

The reader builds an :class:`EventRecord` per event and the simulation builds them too,
so this module imports nothing that talks to a database: making a record must not pull
sqlalchemy or psycopg into code that does no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from durable_sse.ids import IdOrder


@dataclass(slots=True)
class EventRecord:
    """One event as the reader hands it over for persisting; never changed once made.

    Not frozen: a frozen dataclass costs more than twice as much to build, and the
    reader builds one per event.
    """

    event_id: str
    """The id in force ("" when none: such events are never deduplicated)."""
    event_ord: int | None
    """0 for the event carrying the id, 1, 2, … for id-less followers; None when no id."""
    event_type: str
    data: str
    received_at: datetime
    """Tz-aware; stored as UTC."""
    follower_key: bytes | None = None
    """What tells an id-less follower apart (``durable_sse.log.keys.FollowerKeys``, which
    counts identical followers on the connection); None: derived from type and data."""
    id_key: bytes | None = None
    """``sort_key(event_id, order)`` when the reader computed it already (None: computed
    here); the stream's id order is the only one a batch is written with."""
    digest: bytes | None = None
    """``data_digest`` of the event that carried the id (this one's own for a carrier, its
    carrier's for a follower; None: computed here for a carrier, unknown for a follower):
    what tells a reused id from a re-sent event (:mod:`durable_sse.log.keys`)."""


@dataclass(frozen=True)
class BatchPayload:
    """What the writer needs for one batch: its rows, and the gap changes it carries.

    ``gap_changes`` are opaque to the log: the writer hands them to the hook that shares
    the batch's transaction (the gap store's, see :mod:`durable_sse.stores`), which is
    how a batch's gap records become durable with its rows without the log importing
    the gap.
    """

    order: IdOrder
    events: Sequence[EventRecord]
    gap_changes: Sequence[object] = ()
    worker_id: str | None = None
    """The worker lease the batch is written under: it commits only while that lease is
    not revoked (the fence, :mod:`durable_sse.log.workers`). None: no lease to check."""


@dataclass(frozen=True)
class StoredEvent:
    """One event as stored, its data exact (see :meth:`durable_sse.log.reads.Reads.events`)."""

    seq: int
    event_id: str
    event_ord: int | None
    event_type: str
    data: str
    received_at: datetime


StoredKey = tuple[str, bytes]
"""``(event_id, follower_key)``: the event log's key within a stream."""


@dataclass(frozen=True)
class StoredPage:
    """Stored keys of one id range, in id order, as one query read them: what a replay
    need not write again (:mod:`durable_sse.reader.stored`)."""

    keys: list[StoredKey]
    full: bool
    """The query hit its limit: more may be stored after the last key."""
    digests: list[bytes | None] | None = None
    """Each key's row's digest, in the same order (None: all unknown)."""

    @property
    def last_id(self) -> str | None:
        return self.keys[-1][0] if self.keys else None

    @property
    def first_id(self) -> str | None:
        return self.keys[0][0] if self.keys else None


@dataclass(frozen=True)
class HorizonDrop:
    """What the write path left out of one batch because of the retention horizon."""

    count: int
    first_id: str
    """The first id it dropped (for the log line)."""
    horizon_id: str | None
    """The horizon: the newest id retention deleted."""


@dataclass(frozen=True)
class InsertResult:
    new_rows: int
    duplicates: int
    """Events of the batch that were already stored (or repeated within the batch)."""
    reused: tuple[str, ...] = ()
    """Ids of the batch's events that carried an id stored with another type or data (a
    server that restarted its counter): kept under an extended key, so counted in
    ``new_rows``, never in ``duplicates``."""
    dropped_by_horizon: int = 0
    """Events of the batch whose id sorts at or before the stream's retention horizon:
    neither stored nor duplicates (they may never have been stored; see
    :mod:`durable_sse.log.retention`)."""
    dropped_id: str | None = None
    """The first id the horizon dropped."""
    horizon_id: str | None = None
    """The horizon they were dropped at."""


@dataclass(frozen=True)
class RetentionState:
    """What retention has done to a stream, as the store has it now."""

    deleted_rows: int = 0
    """Rows deleted since the stream's first retention run."""
    horizon_id: str | None = None
    """The newest id deleted: rows re-sent at or before it are dropped as duplicates."""
    oldest_kept_id: str | None = None
    """Id of the oldest row still stored (in arrival order; "" for a row with no id)."""
    oldest_kept_at: datetime | None = None


@dataclass(frozen=True)
class RetentionRun:
    """One :meth:`durable_sse.log.prune.Prune.apply_retention`."""

    deleted: int
    batches: int
    complete: bool
    """Nothing more was old enough (False: ``max_batches`` ran out; the next run goes on)."""
    held_by: str
    keep_from: str | None
    """The fence: this id and newer ones stay whatever their age."""
    longest_statement: float
    """Seconds of the longest statement of the run (a select or a delete)."""
    state: RetentionState
    held_by_consumers: tuple[str, ...] = ()
    """Consumer groups that kept rows this run would have deleted (``ConsumerHold``)."""


def to_utc(moment: datetime) -> datetime:
    """A tz-aware UTC datetime. Naive input is taken as UTC (the house convention):
    refusing it would wedge a stream or a schedule on a caller's slip."""
    if moment.tzinfo is None or moment.utcoffset() is None:
        return moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC)


def from_db_time(moment: datetime | None) -> datetime | None:
    """Datetimes read back: SQLite returns them naive (stored as UTC), PostgreSQL aware."""
    if moment is None:
        return None
    if moment.tzinfo is None:
        return moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC)
