"""The consumers' tables: groups, their positions per stream, and dead letters.

Created when missing (like ``sse_retention``), no schema version step: older versions of
durable-sse ignore them, and nothing of the event log depends on them.

* ``sse_consumer_groups``: one row per group, the settings the rest of the system must
  know without the consumer running (retention reads ``hold_retention``/``max_hold``;
  ``durable-sse consumers`` shows them).
* ``sse_consumers``: one row per (group, stream): the position, the lease of the process
  that consumes it (owner, epoch, expiry), the attempts at the current position, and
  why the stream is parked, if it is. The exactly-once handler's transaction locks this
  row and moves it; at least once, an acknowledgement moves it under the lease.
* ``sse_dead_letters``: poison items a group moved aside, with their error.
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

GROUPS_TABLE = "sse_consumer_groups"
CONSUMERS_TABLE = "sse_consumers"
DEAD_LETTERS_TABLE = "sse_dead_letters"

metadata = sa.MetaData()
_time = sa.DateTime(timezone=True)

groups_table = sa.Table(
    GROUPS_TABLE,
    metadata,
    sa.Column("name", sa.String, primary_key=True),
    sa.Column("start", sa.String, nullable=False),
    sa.Column("batch_size", sa.Integer, nullable=False),
    sa.Column("max_attempts", sa.Integer, nullable=False),
    sa.Column("on_poison", sa.String, nullable=False),
    sa.Column("hold_retention", sa.Boolean, nullable=False),
    sa.Column("max_hold", sa.Float, nullable=True),
    sa.Column("on_max_hold", sa.String, nullable=False),
    sa.Column("lease", sa.Float, nullable=False),
    sa.Column("created_at", _time, nullable=False),
    sa.Column("updated_at", _time, nullable=False),
)

consumers_table = sa.Table(
    CONSUMERS_TABLE,
    metadata,
    sa.Column("group_name", sa.String, primary_key=True),
    sa.Column("stream", sa.String, primary_key=True),
    sa.Column("position_seq", sa.BigInteger, nullable=False),
    sa.Column("position_mark", sa.BigInteger, nullable=False),
    sa.Column("truncated_to", sa.BigInteger, nullable=False),
    # the lease: who consumes the stream now, since which take-over, until when
    sa.Column("owner", sa.String, nullable=True),
    sa.Column("epoch", sa.BigInteger, nullable=False),
    sa.Column("lease_until", _time, nullable=True),
    # deliveries started at (attempt_seq, attempt_mark), counted before each one runs
    sa.Column("attempts", sa.Integer, nullable=False),
    sa.Column("attempt_seq", sa.BigInteger, nullable=True),
    sa.Column("attempt_mark", sa.BigInteger, nullable=True),
    sa.Column("narrow_items", sa.Integer, nullable=False),
    sa.Column("last_error", sa.String, nullable=True),
    sa.Column("parked_at", _time, nullable=True),
    sa.Column("parked_reason", sa.String, nullable=True),
    # when the position last moved, and the receive time of the newest event consumed
    # (the lag in seconds, without a read)
    sa.Column("consumed_at", _time, nullable=True),
    sa.Column("consumed_received_at", _time, nullable=True),
    sa.Column("updated_at", _time, nullable=False),
    # retention asks for the holding groups of one stream
    sa.Index("ix_sse_consumers_stream", "stream"),
)

dead_letters_table = sa.Table(
    DEAD_LETTERS_TABLE,
    metadata,
    sa.Column(
        "id",
        sa.BigInteger().with_variant(sa.Integer, "sqlite"),
        primary_key=True,
        autoincrement=True,
    ),
    sa.Column("group_name", sa.String, nullable=False),
    sa.Column("stream", sa.String, nullable=False),
    # the event's seq; for a gap marker or a truncation, the seq it comes after
    sa.Column("seq", sa.BigInteger, nullable=False),
    # event, gap, gap_closed or truncated
    sa.Column("kind", sa.String, nullable=False),
    sa.Column("event_id", sa.String, nullable=True),
    sa.Column("event_type", sa.String, nullable=True),
    sa.Column("data", sa.Text, nullable=True),
    # as in sse_events: the exact data when data cannot hold it (NUL)
    sa.Column("data_bytes", sa.LargeBinary, nullable=True),
    sa.Column("received_at", _time, nullable=True),
    sa.Column("error", sa.Text, nullable=False),
    sa.Column("attempts", sa.Integer, nullable=False),
    sa.Column("dead_at", _time, nullable=False),
    sa.Index("ix_sse_dead_letters_group_stream", "group_name", "stream", "seq"),
)


def create_consumer_schema(engine: Engine) -> None:
    """Create the consumers' tables when missing (safe on every start, concurrently)."""
    for attempt in (1, 2):
        try:
            with engine.begin() as connection:
                create_consumer_tables(connection)
            return
        except (sa.exc.IntegrityError, sa.exc.ProgrammingError, sa.exc.OperationalError):
            if attempt == 2:
                raise  # a lost CREATE TABLE race is retried once, like create_schema


def create_consumer_tables(connection: Connection) -> None:
    metadata.create_all(connection, checkfirst=True)


def consumer_tables_exist(connection: Connection) -> bool:
    return sa.inspect(connection).has_table(CONSUMERS_TABLE)
