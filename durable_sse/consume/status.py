"""What operators see and do with consumer groups: positions, lag, owners, dead letters,
what holds retention (``durable-sse consumers``), and moving a position
(``durable-sse consumers reset``).

Reading changes nothing. A reset is planned first (a dry run shows the plan) and refused
while a process holds the stream's lease: moving a position under a running consumer
would race its next commit.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from durable_sse.consume import positions
from durable_sse.consume.items import start_position
from durable_sse.consume.model import Group, OnMaxHold, OnPoison, Position, Start
from durable_sse.consume.schema import (
    consumer_tables_exist,
    dead_letters_table,
    groups_table,
)
from durable_sse.errors import ConsumerError
from durable_sse.log.records import from_db_time
from durable_sse.log.schema import events_table

LAG_CAP = 1_000_000
"""Lag in events is counted up to this many (then shown as ``1000000+``)."""


@dataclass
class ConsumerStatus:
    """One group's state in one stream."""

    group: str
    stream: str
    position: int
    """Events up to this ``seq`` are consumed."""
    lag_events: int
    """Events stored after the position (counted up to :data:`LAG_CAP`)."""
    lag_seconds: float
    """Now minus the receive time of the oldest event not consumed (0: caught up)."""
    owner: str | None
    lease_until: datetime | None
    parked_reason: str | None
    last_error: str | None
    attempts: int
    dead_letters: int
    holds_retention: bool
    max_hold: float | None
    consumed_at: datetime | None

    @property
    def state(self) -> str:
        if self.parked_reason:
            return "parked"
        if self.owner is not None:
            return "consuming"
        return "idle" if self.lag_events == 0 else "waiting"


def consumer_statuses(
    connection: Connection, group: str | None = None, *, now: datetime | None = None
) -> list[ConsumerStatus]:
    """Every group's position rows (or one group's), with lag and dead letters."""
    if not consumer_tables_exist(connection):
        return []
    now = now or datetime.now(UTC)
    settings = {
        row.name: row
        for row in connection.execute(sa.select(groups_table))
        if group is None or row.name == group
    }
    dead = dead_letters_table
    dead_counts = {
        (group_name, stream): int(count)
        for group_name, stream, count in connection.execute(
            sa.select(dead.c.group_name, dead.c.stream, sa.func.count().label("count")).group_by(
                dead.c.group_name, dead.c.stream
            )
        )
    }
    statuses = []
    for row in positions.list_rows(connection, group):
        lag = lag_events(connection, row.stream, row.position.seq)
        oldest = _oldest_after(connection, row.stream, row.position.seq) if lag else None
        setting = settings.get(row.group)
        statuses.append(
            ConsumerStatus(
                group=row.group,
                stream=row.stream,
                position=row.position.seq,
                lag_events=lag,
                lag_seconds=max((now - oldest).total_seconds(), 0.0) if oldest else 0.0,
                owner=row.owner if row.leased(now) else None,
                lease_until=row.lease_until if row.leased(now) else None,
                parked_reason=row.parked_reason if row.parked_at else None,
                last_error=row.last_error,
                attempts=row.attempts,
                dead_letters=dead_counts.get((row.group, row.stream), 0),
                holds_retention=bool(setting.hold_retention) if setting else False,
                max_hold=setting.max_hold if setting else None,
                consumed_at=row.consumed_at,
            )
        )
    return statuses


def lag_events(connection: Connection, stream: str, after_seq: int, cap: int = LAG_CAP) -> int:
    """Events stored after ``after_seq``, counted up to ``cap`` (an index range read)."""
    events = events_table
    inner = (
        sa.select(events.c.seq)
        .where(events.c.stream == stream, events.c.seq > after_seq)
        .limit(cap)
        .subquery()
    )
    return int(connection.execute(sa.select(sa.func.count()).select_from(inner)).scalar_one())


def _oldest_after(connection: Connection, stream: str, after_seq: int) -> datetime | None:
    events = events_table
    value = connection.execute(
        sa.select(events.c.received_at)
        .where(events.c.stream == stream, events.c.seq > after_seq)
        .order_by(events.c.seq)
        .limit(1)
    ).scalar_one_or_none()
    return from_db_time(value)


def load_group(connection: Connection, name: str, streams: tuple[str, ...] | None = None) -> Group:
    """A group as registered (the settings its consumers last ran with)."""
    row = connection.execute(sa.select(groups_table).where(groups_table.c.name == name)).first()
    if row is None:
        raise ConsumerError(f"no consumer group named {name!r}")
    return Group(
        name=row.name,
        streams=streams,
        start=Start.parse(row.start),
        batch_size=int(row.batch_size),
        max_attempts=int(row.max_attempts),
        on_poison=OnPoison(row.on_poison),
        hold_retention=bool(row.hold_retention),
        max_hold=row.max_hold,
        on_max_hold=OnMaxHold(row.on_max_hold),
        lease=float(row.lease),
    )


@dataclass
class ResetPlan:
    """Where a reset moves a group in a stream."""

    group: str
    stream: str
    current: Position
    target: Position
    events_between: int
    """Events between the two positions: delivered again (back) or skipped (forward)."""

    @property
    def backwards(self) -> bool:
        return self.target.seq < self.current.seq

    def describe(self) -> str:
        verb = "delivered again" if self.backwards else "skipped"
        if self.target.seq == self.current.seq:
            return f"{self.group}/{self.stream}: stays at seq {self.current.seq} (unparked)"
        return (
            f"{self.group}/{self.stream}: seq {self.current.seq} -> {self.target.seq} "
            f"({self.events_between} events {verb})"
        )


def plan_reset(
    connection: Connection, group: str, streams: list[str] | None, start: Start
) -> list[ResetPlan]:
    """The moves a reset to ``start`` makes (nothing changes)."""
    rows = positions.list_rows(connection, group)
    if not rows:
        raise ConsumerError(f"consumer group {group!r} has no position in any stream")
    if streams:
        known = {row.stream for row in rows}
        unknown = [stream for stream in streams if stream not in known]
        if unknown:
            raise ConsumerError(f"consumer group {group!r} has no position in {unknown[0]!r}")
        rows = [row for row in rows if row.stream in streams]
    plans = []
    for row in rows:
        target = start_position(connection, row.stream, start)
        # Truncations the group already heard of stay heard of.
        target = Position(target.seq, target.mark, max(target.truncated, row.position.truncated))
        low, high = sorted((row.position.seq, target.seq))
        between = _count_between(connection, row.stream, low, high)
        plans.append(ResetPlan(group, row.stream, row.position, target, between))
    return plans


def _count_between(connection: Connection, stream: str, low: int, high: int) -> int:
    if low == high:
        return 0
    events = events_table
    return int(
        connection.execute(
            sa.select(sa.func.count()).where(
                events.c.stream == stream, events.c.seq > low, events.c.seq <= high
            )
        ).scalar_one()
    )


def apply_reset(connection: Connection, plans: list[ResetPlan], *, now: datetime) -> None:
    """Carry the plans out in the caller's transaction; refused (nothing moves) when a
    process holds a lease on any of the streams."""
    for plan in plans:
        row = positions.lock_row(connection, plan.group, plan.stream, wait=True)
        if row is None:
            raise ConsumerError(f"{plan.group}/{plan.stream}: no position row")
        if row.leased(now):
            raise ConsumerError(
                f"{plan.group}/{plan.stream} is being consumed by {row.owner} (lease until "
                f"{row.lease_until:%H:%M:%S}Z): stop that consumer first, then reset"
            )
        if row.position != plan.current:
            raise ConsumerError(
                f"{plan.group}/{plan.stream} moved since the plan was made (now seq "
                f"{row.position.seq}): plan again"
            )
        positions.reset(connection, plan.group, plan.stream, plan.target, now)
