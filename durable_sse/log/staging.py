"""How a group's rows get into ``sse_events``: staged, COPYed or inserted, in one
transaction the writer (:mod:`durable_sse.log.writer`) holds.

On PostgreSQL a large group is COPYed (binary) into a per-connection temporary table and
moved with one ``INSERT … SELECT … ON CONFLICT DO NOTHING`` (see ``bench/insert_rate.py``),
a small one is one multi-row ``INSERT``; SQLite uses an ``executemany`` of the same
insert. A large group whose ids all sort after what is stored (the live case) is COPYed
straight into ``sse_events`` instead, and written again through staging should it meet a
stored key (``bench/lean_log.py`` measures both). Rows at or before a stream's retention
horizon are left out here (:mod:`durable_sse.log.retention`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from sqlalchemy.engine import Connection

from durable_sse.log.commits import CommitJob
from durable_sse.log.database import Database, driver
from durable_sse.log.reads import newest_row
from durable_sse.log.records import BatchPayload, HorizonDrop
from durable_sse.log.retention import after_horizon
from durable_sse.log.reused import Inserted, keep_reused
from durable_sse.log.rows import (
    EVENT_ID,
    ID_KEY,
    Row,
    event_rows,
    new_rows_per_batch,
    rows_after_horizon,
)
from durable_sse.log.schema import (
    EVENTS_TABLE,
    RETENTION_TABLE,
    STAGING_COLUMNS,
    STAGING_TABLE,
    events_table,
)

EVENT_COLUMNS = STAGING_COLUMNS[1:]
COPY_SQL = f"COPY {STAGING_TABLE} ({', '.join(STAGING_COLUMNS)}) FROM STDIN (FORMAT BINARY)"
MOVE_SQL = (
    f"INSERT INTO {EVENTS_TABLE} ({', '.join(EVENT_COLUMNS)}) "
    f"SELECT {', '.join(EVENT_COLUMNS)} FROM {STAGING_TABLE} ORDER BY pos "
    "ON CONFLICT DO NOTHING"
)
COPY_LOG_SQL = f"COPY {EVENTS_TABLE} ({', '.join(EVENT_COLUMNS)}) FROM STDIN (FORMAT BINARY)"
COPY_TYPES = (
    "int4",  # pos
    "text",  # stream
    "text",  # event_id
    "int4",  # event_ord
    "bytea",  # follower_key
    "bytea",  # id_key
    "text",  # event_type
    "text",  # data
    "bytea",  # data_bytes
    "bytea",  # digest
    "timestamptz",  # received_at
)
"""Binary COPY: a third of text COPY's client time per row (``bench/lean_log.py``)."""
RETURNING = " RETURNING stream, event_id, follower_key"
SQLITE_INSERT_SQL = (
    f"INSERT INTO {EVENTS_TABLE} ({', '.join(EVENT_COLUMNS)}) "
    f"VALUES ({', '.join('?' for _ in EVENT_COLUMNS)}) ON CONFLICT DO NOTHING"
)
HORIZONS_SQL = (
    f"SELECT stream, horizon_key, horizon_id FROM {RETENTION_TABLE} "
    "WHERE horizon_key IS NOT NULL AND "
)
SMALL_BATCH = 64
"""Up to this many rows, one multi-row INSERT beats COPY into the staging table (two
statements more per commit); above it COPY wins (see bench/insert_rate.py)."""


class RowInserter:
    """Puts a group's rows into the log inside the writer's transaction.

    Keeps, per stream, the newest id key this process saw committed (:attr:`newest`): a
    hint for the optimistic COPY, never the truth (a stale one costs one rolled-back
    attempt, never a row).
    """

    def __init__(self, database: Database) -> None:
        self.dialect = database.dialect
        self.newest: dict[str, bytes | None] = {}
        """Per stream, the newest id key this process saw committed (None: none stored)."""
        self.direct_copies = 0
        """Groups COPYed straight into ``sse_events`` (counted before the commit)."""
        dialect = database.engine.dialect
        time_type = events_table.c.received_at.type.dialect_impl(dialect)
        self._sqlite_time: Callable[[Any], Any] = time_type.bind_processor(dialect) or _identity

    def stage(
        self,
        connection: Connection,
        jobs: list[CommitJob],
        *,
        clean: bool,
        optimistic: bool = False,
        newest: dict[str, bytes] | None = None,
        dropped: list[HorizonDrop | None] | None = None,
    ) -> Callable[[], Inserted]:
        """Prepare the rows (a large set goes into the staging table now); returns the
        call that inserts them into the log and counts each batch's new rows and reused
        ids (:func:`durable_sse.log.reused.keep_reused`).

        On PostgreSQL the whole group is one statement: one ``INSERT`` per batch would
        serialise a round trip per quiet stream behind the previous group's rows.
        ``optimistic``: a large group whose every id sorts after its stream's newest
        stored id (the common live case) cannot conflict, so it is COPYed straight into
        ``sse_events``, every row new; should it meet a stored key after all, the
        unique violation rolls it back and the caller writes it through staging.
        ``newest`` receives each stream's newest id key in the group, ``dropped`` what
        the retention horizon left out of each batch (None: nothing), in job order.
        """
        rows: list[Row] = []
        spans: list[tuple[int, int]] = []
        horizons = self.horizons(connection, jobs)
        # ``pos`` of the next row: unique and increasing across the group whatever the
        # horizon filter leaves out (``seq`` follows it).
        position = 0
        for job in jobs:
            payload = _payload(job)
            order, events = payload.order, payload.events
            start = len(rows)
            batch_rows = event_rows(job.stream, order, events, start=position, clean=clean)
            position += len(events)
            drop = None
            if job.stream in horizons:
                horizon, horizon_id = horizons[job.stream]
                kept = rows_after_horizon(batch_rows, horizon)
                if len(kept) < len(batch_rows):
                    first = next(
                        row[EVENT_ID]
                        for row in batch_rows
                        if not after_horizon(row[ID_KEY], horizon)
                    )
                    drop = HorizonDrop(len(batch_rows) - len(kept), first, horizon_id)
                batch_rows = kept
            if dropped is not None:
                dropped.append(drop)
            rows.extend(batch_rows)
            spans.append((start, len(rows)))
            if newest is not None:
                keys = [row[ID_KEY] for row in rows[start:] if row[ID_KEY] is not None]
                if keys:
                    top = max(keys)
                    if job.stream not in newest or top > newest[job.stream]:
                        newest[job.stream] = top
        if self.dialect != "postgresql":

            def insert_sqlite() -> Inserted:
                counts = [self.insert_sqlite(connection, rows[a:b]) for a, b in spans]
                return counts, keep_reused(self, connection, rows, spans, counts)

            return insert_sqlite
        if not rows:
            return lambda: ([0] * len(spans), None)  # gap changes only
        several = len(spans) > 1  # then count each batch's rows from what was inserted
        staged = False
        if len(rows) <= SMALL_BATCH:
            insert = functools.partial(self.insert_values, connection, rows, several)
        elif optimistic and self.all_new(connection, jobs, rows, spans):
            # Every row new: none can meet a stored key, so no id can be a reused one (a
            # key met after all is a unique violation: the group goes through staging).
            counts = [end - begin for begin, end in spans]

            def copy_into_log() -> Inserted:
                self.copy_rows(connection, COPY_LOG_SQL, rows, skip=1)
                self.direct_copies += 1  # not yet committed: tests read it after
                return counts, None

            return copy_into_log
        else:
            self.copy_rows(connection, COPY_SQL, rows)
            insert = functools.partial(self.move_staged, connection, several)
            staged = True

        def insert_and_count() -> Inserted:
            inserted = insert()
            counts = new_rows_per_batch(inserted, rows, spans) if several else [inserted]
            return counts, keep_reused(self, connection, rows, spans, counts, staged=staged)

        return insert_and_count

    def insert_sqlite(self, connection: Connection, rows: list[Row]) -> int:
        # Plain driver executemany: SQLAlchemy's per-row bind processing would halve the
        # rate; the one conversion needed (datetime -> text) uses SQLAlchemy's own
        # processor, so stored times compare with those bound by SQLAlchemy queries.
        if not rows:
            return 0
        to_text = self._sqlite_time
        params = [(*row[1:-1], to_text(row[-1])) for row in rows]
        result = connection.exec_driver_sql(SQLITE_INSERT_SQL, params)
        return max(result.rowcount, 0)

    def insert_values(self, connection: Connection, rows: list[Row], returning: bool) -> Any:
        """A small set as one ``INSERT ... VALUES ... ON CONFLICT DO NOTHING``.

        Returns the number of new rows, or with ``returning`` the keys of the new rows.
        """
        width = len(EVENT_COLUMNS)
        values = ", ".join(["(" + ", ".join(["%s"] * width) + ")"] * len(rows))
        statement = (
            f"INSERT INTO {EVENTS_TABLE} ({', '.join(EVENT_COLUMNS)}) VALUES {values} "
            f"ON CONFLICT DO NOTHING{RETURNING if returning else ''}"
        )
        params = [value for row in rows for value in row[1:]]
        with driver(connection).cursor() as cursor:
            cursor.execute(statement, params)
            return cursor.fetchall() if returning else max(cursor.rowcount, 0)

    def copy_rows(
        self, connection: Connection, sql: str, rows: list[Row], *, skip: int = 0
    ) -> None:
        with driver(connection).cursor() as cursor, cursor.copy(sql) as copy:
            copy.set_types(list(COPY_TYPES[skip:]))
            if skip:
                for row in rows:
                    copy.write_row(row[skip:])
            else:
                for row in rows:
                    copy.write_row(row)

    def all_new(
        self,
        connection: Connection,
        jobs: list[CommitJob],
        rows: list[Row],
        spans: list[tuple[int, int]],
    ) -> bool:
        """Whether every id of the group sorts after its stream's newest stored id, as
        far as this process knows (a stream it has not written yet is looked up once)."""
        unknown = sorted({job.stream for job in jobs} - self.newest.keys())
        if unknown:
            self.newest.update(self.newest_keys(connection, unknown))
        for job, (start, end) in zip(jobs, spans, strict=True):
            floor = self.newest.get(job.stream)
            if floor is None:
                continue
            for row in rows[start:end]:
                key = row[ID_KEY]
                if key is not None and key <= floor:
                    return False
        return True

    def newest_keys(self, connection: Connection, streams: list[str]) -> dict[str, bytes | None]:
        events = events_table
        found: dict[str, bytes | None] = {}
        for stream in streams:
            key = connection.execute(newest_row(stream, events.c.id_key)).scalar_one_or_none()
            found[stream] = None if key is None else bytes(key)
        return found

    def move_staged(self, connection: Connection, returning: bool) -> Any:
        """``INSERT … SELECT`` the staged rows: the count of new rows, or their keys."""
        with driver(connection).cursor() as cursor:
            cursor.execute(MOVE_SQL + (RETURNING if returning else ""))
            return cursor.fetchall() if returning else max(cursor.rowcount, 0)

    def horizons(
        self, connection: Connection, jobs: list[CommitJob]
    ) -> dict[str, tuple[bytes, str | None]]:
        """Each stream's retention horizon, key and id (streams retention never touched:
        absent).

        On the write path, once per group transaction: plain driver SQL, a fifth of what
        the same query costs through SQLAlchemy (about 50 us on PostgreSQL, see
        ``bench/retention.py``).
        """
        streams = sorted({job.stream for job in jobs if _payload(job).events})
        if not streams:
            return {}
        if self.dialect == "postgresql":
            with driver(connection).cursor() as cursor:
                cursor.execute(HORIZONS_SQL + "stream = ANY(%s)", [streams])
                rows = cursor.fetchall()
        else:
            marks = ", ".join("?" for _ in streams)
            rows = connection.exec_driver_sql(
                HORIZONS_SQL + f"stream IN ({marks})", tuple(streams)
            ).all()
        return {stream: (bytes(key), horizon_id) for stream, key, horizon_id in rows}


def _payload(job: CommitJob) -> BatchPayload:
    payload = job.payload
    assert isinstance(payload, BatchPayload)
    return payload


def _identity(value: Any) -> Any:
    return value
