"""Retention that knows consumers: the hook the event log's retention asks, inside each
delete's transaction, for what consumer groups still need of a stream.

A group with ``hold_retention`` keeps every row after its position, until the row is
older than the group's ``max_hold`` (then the group meets ``Truncated``, or parks, by its
choice). The worker, which runs retention, passes :func:`retention_holds` to its
``Stores`` (``consumer_holds=``); the event log cannot import this package (it sits
below it), so the term comes in as a hook, like the fence's others.
"""

from __future__ import annotations

from datetime import datetime, timedelta

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from durable_sse.consume.schema import consumer_tables_exist, consumers_table, groups_table
from durable_sse.log.retention import ConsumerHold


def retention_holds(connection: Connection, stream: str, now: datetime) -> list[ConsumerHold]:
    """What the groups that hold retention keep of ``stream`` (read in the caller's
    transaction, so a delete never goes past a position it did not see)."""
    if not consumer_tables_exist(connection):
        return []
    consumers, groups = consumers_table, groups_table
    rows = connection.execute(
        sa.select(consumers.c.group_name, consumers.c.position_seq, groups.c.max_hold)
        .join(groups, groups.c.name == consumers.c.group_name)
        .where(consumers.c.stream == stream, groups.c.hold_retention.is_(True))
    ).all()
    return [
        ConsumerHold(
            group=row.group_name,
            position=int(row.position_seq),
            until=None if row.max_hold is None else now - timedelta(seconds=row.max_hold),
        )
        for row in rows
    ]
