"""A group's position rows (``sse_consumers``): registering, claiming under a lease,
counting attempts, moving, parking, dead letters, resets.

The lease (owner, epoch, expiry) says which process consumes a stream of the group now.
A process *claims* a free stream (no owner, or a lease expired) in a short transaction of
its own that also counts the delivery it is about to make; the epoch grows on every
take-over, and a move under an old epoch is refused, so a process that lost its lease
(a zombie) can neither acknowledge nor commit past the new owner.

Attempts are counted before a delivery runs, in a committed transaction, so a crash in
the handler counts too. A delivery that consumes a full batch counts the next one in its
own transaction (the stream has more at once, and this process keeps it), so a busy
stream pays no extra transaction per batch; a stream drained is released.

On PostgreSQL the row is read ``FOR UPDATE SKIP LOCKED``: a process never waits behind
another's transaction on a stream, it takes another stream. SQLite has one writer: a
transaction there writes first (taking the write lock) and then reads.
"""

from __future__ import annotations

import functools
import os
import socket
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql as pg_dialect
from sqlalchemy.dialects import sqlite as sqlite_dialect
from sqlalchemy.engine import Connection

from durable_sse.consume.items import event_row_values, start_position
from durable_sse.consume.model import Event, Gap, GapClosed, Group, Item, Position, describe_item
from durable_sse.consume.schema import (
    CONSUMERS_TABLE,
    consumers_table,
    dead_letters_table,
    groups_table,
)
from durable_sse.log.records import from_db_time

MAX_ERROR_CHARS = 2000


def default_owner() -> str:
    """``host:pid:random``: a process's name in leases, unique per process, readable in
    ``durable-sse consumers``."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


@dataclass
class PositionRow:
    """One row of ``sse_consumers`` as read."""

    group: str
    stream: str
    position: Position
    owner: str | None
    epoch: int
    lease_until: datetime | None
    attempts: int
    attempt_at: tuple[int, int] | None
    narrow_items: int
    last_error: str | None
    parked_at: datetime | None
    parked_reason: str | None
    consumed_at: datetime | None
    consumed_received_at: datetime | None

    def leased(self, now: datetime) -> bool:
        """Whether a live lease is held (by anyone)."""
        return self.owner is not None and self.lease_until is not None and self.lease_until > now


@dataclass
class Claim:
    """A stream this process owns, and the delivery it counted."""

    stream: str
    epoch: int
    position: Position
    attempts: int
    """Deliveries started at ``position``, the one about to run included."""
    narrow_items: int
    """Items still to deliver one at a time (a batch kept failing)."""
    last_error: str | None = None
    since: float = field(default_factory=time.monotonic)
    """When this process took the stream (monotonic): it gives it back now and then."""
    lease_deadline: float = 0.0
    """Monotonic time until which the lease surely holds (taken before the transaction
    that set it; 0: not known). Past it another process may own the stream, so a kept
    stream's lease is checked in the database before it is delivered again."""

    def poison(self, max_attempts: int) -> bool:
        """One item alone failed ``max_attempts`` times: park it or move it aside."""
        return self.narrow_items > 0 and self.attempts > max_attempts


def _insert(connection: Connection) -> Any:
    return (pg_dialect if connection.dialect.name == "postgresql" else sqlite_dialect).insert


def register_group(connection: Connection, group: Group, now: datetime) -> None:
    """Create the group's row, or update its settings (the newest process's win: they
    are what retention and the operators see)."""
    table = groups_table
    values = {
        "start": group.start.describe(),
        "batch_size": group.batch_size,
        "max_attempts": group.max_attempts,
        "on_poison": group.on_poison.value,
        "hold_retention": group.hold_retention,
        "max_hold": group.max_hold,
        "on_max_hold": group.on_max_hold.value,
        "lease": group.lease,
        "updated_at": now,
    }
    statement = _insert(connection)(table).values(name=group.name, created_at=now, **values)
    connection.execute(statement.on_conflict_do_update(index_elements=["name"], set_=values))


def ensure_positions(
    connection: Connection, group: Group, streams: list[str], now: datetime
) -> list[str]:
    """Give the group a position in each stream it has none in yet (at ``group.start``);
    returns the streams that got one."""
    table = consumers_table
    known = {
        row.stream
        for row in connection.execute(
            sa.select(table.c.stream).where(
                table.c.group_name == group.name, table.c.stream.in_(streams)
            )
        )
    }
    created = []
    for stream in streams:
        if stream in known:
            continue
        position = start_position(connection, stream, group.start)
        result = connection.execute(
            _insert(connection)(table)
            .values(
                group_name=group.name,
                stream=stream,
                position_seq=position.seq,
                position_mark=position.mark,
                truncated_to=position.truncated,
                epoch=0,
                attempts=0,
                narrow_items=0,
                updated_at=now,
            )
            .on_conflict_do_nothing(index_elements=["group_name", "stream"])
        )
        if result.rowcount:
            created.append(stream)
    return created


def _row(row: Any) -> PositionRow:
    attempt_at = None
    if row.attempt_seq is not None:
        attempt_at = (int(row.attempt_seq), int(row.attempt_mark or 0))
    return PositionRow(
        group=row.group_name,
        stream=row.stream,
        position=Position(int(row.position_seq), int(row.position_mark), int(row.truncated_to)),
        owner=row.owner,
        epoch=int(row.epoch),
        lease_until=from_db_time(row.lease_until),
        attempts=int(row.attempts),
        attempt_at=attempt_at,
        narrow_items=int(row.narrow_items),
        last_error=row.last_error,
        parked_at=from_db_time(row.parked_at),
        parked_reason=row.parked_reason,
        consumed_at=from_db_time(row.consumed_at),
        consumed_received_at=from_db_time(row.consumed_received_at),
    )


def _key(group: str, stream: str) -> list[Any]:
    table = consumers_table
    return [table.c.group_name == group, table.c.stream == stream]


_COLUMNS = [column.name for column in consumers_table.columns]
_LOCK_SQL = (
    f"SELECT {', '.join(_COLUMNS)} FROM {CONSUMERS_TABLE} WHERE group_name = ? AND stream = ?"
)
_TOUCH_SQL = f"UPDATE {CONSUMERS_TABLE} SET epoch = epoch WHERE group_name = ? AND stream = ?"


def _driver(connection: Connection, sql: str, params: tuple[Any, ...]) -> tuple[list[Any], int]:
    """One statement straight through the driver (rows, rowcount): the per-batch
    statements, where SQLAlchemy's statement building would cost more than the
    round trip. ``sql`` uses ``?``; psycopg gets ``%s``."""
    driver = connection.connection.driver_connection
    assert driver is not None
    if connection.dialect.name == "postgresql":
        with driver.cursor() as cursor:
            cursor.execute(sql.replace("?", "%s"), params)
            rows = cursor.fetchall() if cursor.description else []
            return rows, cursor.rowcount
    cursor = driver.cursor()
    try:
        cursor.execute(sql, params)
        return (cursor.fetchall() if cursor.description else []), cursor.rowcount
    finally:
        cursor.close()


def _bind_time(connection: Connection, moment: datetime | None) -> Any:
    """A time for a driver parameter, stored as SQLAlchemy stores it (SQLite: UTC text
    in its format, so that stored times compare as text)."""
    if moment is None or connection.dialect.name == "postgresql":
        return moment
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")


def _read_time(value: Any) -> datetime | None:
    if isinstance(value, str):
        return datetime.fromisoformat(value).replace(tzinfo=UTC)
    return from_db_time(value)


def lock_row(
    connection: Connection, group: str, stream: str, *, wait: bool = False
) -> PositionRow | None:
    """The row, locked for this transaction; None when another transaction holds it
    (PostgreSQL, unless ``wait``) or it does not exist."""
    sql = _LOCK_SQL
    if connection.dialect.name == "sqlite":
        # Write first: the transaction takes SQLite's write lock before it reads.
        _driver(connection, _TOUCH_SQL, (group, stream))
    else:
        sql += " FOR UPDATE" if wait else " FOR UPDATE SKIP LOCKED"
    rows, _ = _driver(connection, sql, (group, stream))
    if not rows:
        return None
    values = dict(zip(_COLUMNS, rows[0], strict=True))
    for name in ("lease_until", "parked_at", "consumed_at", "consumed_received_at"):
        values[name] = _read_time(values[name])
    return _row(SimpleNamespace(**values))


def read_row(connection: Connection, group: str, stream: str) -> PositionRow | None:
    row = connection.execute(sa.select(consumers_table).where(*_key(group, stream))).first()
    return None if row is None else _row(row)


@dataclass
class Refused:
    """Why a stream could not be claimed."""

    parked: bool = False
    until: datetime | None = None
    """Another process's lease runs until then (None: its transaction holds the row, or
    the row is missing)."""


def claim(
    connection: Connection,
    group: Group,
    stream: str,
    owner: str,
    now: datetime,
) -> Claim | Refused:
    """Take (or keep) the stream for ``owner`` and count the delivery about to start.

    Refused: another process holds it (its transaction, or a live lease), or the stream
    is parked. Commit before delivering: the count must survive a crash.
    """
    row = lock_row(connection, group.name, stream)
    if row is None:
        return Refused()
    if row.parked_at is not None:
        return Refused(parked=True)
    if row.owner not in (None, owner) and row.leased(now):
        return Refused(until=row.lease_until)
    keep = row.owner == owner and row.leased(now)
    epoch = row.epoch if keep else row.epoch + 1
    at = (row.position.seq, row.position.mark)
    attempts = row.attempts + 1 if row.attempt_at == at else 1
    narrow = row.narrow_items
    if narrow == 0 and attempts > group.max_attempts:
        # The batch failed max_attempts times: from here on one item at a time, each
        # with max_attempts of its own, until past what the batch held.
        narrow, attempts = group.batch_size, 1
    connection.execute(
        sa.update(consumers_table)
        .where(*_key(group.name, stream))
        .values(
            owner=owner,
            epoch=epoch,
            lease_until=now + timedelta(seconds=group.lease),
            attempts=attempts,
            attempt_seq=at[0],
            attempt_mark=at[1],
            narrow_items=narrow,
            updated_at=now,
        )
    )
    return Claim(stream, epoch, row.position, attempts, narrow, row.last_error)


def move(
    connection: Connection,
    group: Group,
    stream: str,
    *,
    owner: str,
    epoch: int,
    end: Position,
    items: int,
    keep: bool,
    narrow_items: int,
    now: datetime,
    newest_received_at: datetime | None,
    check_lease: bool = False,
) -> bool:
    """Move the position to ``end`` under ``owner``'s lease of ``epoch``; False (nothing
    moved) when the lease is no longer this owner's (or, with ``check_lease``, expired).

    ``keep``: the owner keeps the stream (renews the lease), and the next delivery is
    counted here, so a busy stream costs one transaction per batch. (Should the process
    die before that delivery starts, it counts all the same: one attempt too many, never
    one too few.) Otherwise the lease is released: the next delivery is claimed and
    counted afresh, by whichever process of the group gets there first.
    """
    bind = functools.partial(_bind_time, connection)
    sets = [
        "position_seq = ?",
        "position_mark = ?",
        "truncated_to = ?",
        "narrow_items = ?",
        "last_error = NULL",
        "consumed_at = ?",
        "updated_at = ?",
        "consumed_received_at = COALESCE(?, consumed_received_at)",
    ]
    params: list[Any] = [
        end.seq,
        end.mark,
        end.truncated,
        max(narrow_items - items, 0) if narrow_items else 0,
        bind(now),
        bind(now),
        bind(newest_received_at),
    ]
    if keep:
        sets += ["lease_until = ?", "attempts = 1", "attempt_seq = ?", "attempt_mark = ?"]
        params += [bind(now + timedelta(seconds=group.lease)), end.seq, end.mark]
    else:
        sets += ["owner = NULL", "lease_until = NULL", "attempts = 0", "attempt_seq = NULL"]
    where = "group_name = ? AND stream = ? AND owner = ? AND epoch = ?"
    params += [group.name, stream, owner, epoch]
    if check_lease:
        where += " AND lease_until >= ?"
        params.append(bind(now))
    _, count = _driver(
        connection, f"UPDATE {CONSUMERS_TABLE} SET {', '.join(sets)} WHERE {where}", tuple(params)
    )
    return count == 1


def renew(
    connection: Connection, group: Group, stream: str, *, owner: str, epoch: int, now: datetime
) -> bool:
    """Renew ``owner``'s lease of ``epoch``, expired or not; False when the stream is not
    theirs any more. (An expired lease nobody took over is renewed safely: a take-over
    locks the row and raises the epoch, so it either comes after this, and finds the
    lease live, or before, and this matches nothing.)"""
    table = consumers_table
    result = connection.execute(
        sa.update(table)
        .where(*_key(group.name, stream), table.c.owner == owner, table.c.epoch == epoch)
        .values(lease_until=now + timedelta(seconds=group.lease), updated_at=now)
    )
    return result.rowcount == 1


def release(connection: Connection, group: str, stream: str, *, owner: str, epoch: int) -> None:
    """Give the stream up (nothing to deliver): another process may take it at once."""
    table = consumers_table
    connection.execute(
        sa.update(table)
        .where(*_key(group, stream), table.c.owner == owner, table.c.epoch == epoch)
        .values(owner=None, lease_until=None, attempts=0, attempt_seq=None)
    )


def record_failure(
    connection: Connection, group: str, stream: str, *, owner: str, epoch: int, error: str
) -> None:
    """Keep the handler's error with the row (for status, and a dead letter's reason)."""
    table = consumers_table
    connection.execute(
        sa.update(table)
        .where(*_key(group, stream), table.c.owner == owner, table.c.epoch == epoch)
        .values(last_error=error[:MAX_ERROR_CHARS])
    )


def failure_text(claim: Claim) -> str:
    return claim.last_error or "the handler did not finish (the process ended or hung)"


def park(
    connection: Connection,
    group: str,
    stream: str,
    *,
    epoch: int,
    reason: str,
    now: datetime,
) -> bool:
    """Stop the group on this stream (nothing skipped) until an operator resets it."""
    table = consumers_table
    result = connection.execute(
        sa.update(table)
        .where(*_key(group, stream), table.c.epoch == epoch)
        .values(
            parked_at=now,
            parked_reason=reason[:MAX_ERROR_CHARS],
            owner=None,
            lease_until=None,
            updated_at=now,
        )
    )
    return result.rowcount == 1


def dead_letter(
    connection: Connection,
    group: str,
    stream: str,
    item: Item,
    *,
    error: str,
    attempts: int,
    now: datetime,
) -> None:
    """Keep a poison item in ``sse_dead_letters`` (the caller moves the position past it
    in the same transaction)."""
    values: dict[str, Any] = {}
    if isinstance(item, Event):
        kind, seq = "event", item.seq
        values = event_row_values(item)
    elif isinstance(item, Gap | GapClosed):
        kind, seq = ("gap" if isinstance(item, Gap) else "gap_closed"), item.after_seq
        values = {"event_id": item.gap_id, "data": describe_item(item)}
    else:
        kind, seq = "truncated", item.after_seq
        values = {"data": describe_item(item)}
    connection.execute(
        sa.insert(dead_letters_table).values(
            group_name=group,
            stream=stream,
            seq=seq,
            kind=kind,
            error=error[:MAX_ERROR_CHARS],
            attempts=attempts,
            dead_at=now,
            **values,
        )
    )


def reset(
    connection: Connection, group: str, stream: str, position: Position, now: datetime
) -> None:
    """Put the position at ``position`` (back or forward), unpark, forget attempts."""
    table = consumers_table
    connection.execute(
        sa.update(table)
        .where(*_key(group, stream))
        .values(
            position_seq=position.seq,
            position_mark=position.mark,
            truncated_to=position.truncated,
            attempts=0,
            attempt_seq=None,
            attempt_mark=None,
            narrow_items=0,
            last_error=None,
            parked_at=None,
            parked_reason=None,
            owner=None,
            lease_until=None,
            updated_at=now,
        )
    )


def list_rows(connection: Connection, group: str | None = None) -> list[PositionRow]:
    table = consumers_table
    query = sa.select(table).order_by(table.c.group_name, table.c.stream)
    if group is not None:
        query = query.where(table.c.group_name == group)
    return [_row(row) for row in connection.execute(query)]
