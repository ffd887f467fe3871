"""Helpers of the event log's tests: records, raw queries, a closed port."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa

from durable_sse.gaps.model import GapChange, GapRecord
from durable_sse.log.keys import FollowerKeys, data_digest
from durable_sse.log.records import EventRecord, InsertResult
from durable_sse.stores import Stores

T0 = datetime(2024, 5, 1, 12, 0, 0, tzinfo=UTC)


def record(
    event_id: str,
    ordinal: int | None = 0,
    *,
    at: datetime = T0,
    data: str = "x",
    follower: bytes | None = None,
) -> EventRecord:
    return EventRecord(
        event_id=event_id,
        event_ord=ordinal,
        event_type="message",
        data=data,
        received_at=at,
        follower_key=follower,
    )


async def query(log: Stores, sql: str, **params: Any) -> list[tuple[Any, ...]]:
    def run() -> list[tuple[Any, ...]]:
        with log.database.engine.connect() as connection:
            return [tuple(row) for row in connection.execute(sa.text(sql), params)]

    return await asyncio.to_thread(run)


async def stored(log: Stores, stream: str) -> list[tuple[Any, ...]]:
    """``(event_id, event_ord, data)`` of a stream in insertion (seq) order."""
    return await query(
        log,
        "SELECT event_id, event_ord, data FROM sse_events WHERE stream = :s ORDER BY seq",
        s=stream,
    )


async def event_ids(log: Stores, stream: str) -> list[str]:
    """The ids of a stream's stored events, in insertion (seq) order."""
    sql = "SELECT event_id FROM sse_events WHERE stream = :s ORDER BY seq"
    return [row[0] for row in await query(log, sql, s=stream)]


async def execute(log: Stores, *statements: str) -> None:
    def run() -> None:
        with log.database.engine.begin() as connection:
            for statement in statements:
                connection.exec_driver_sql(statement)

    await asyncio.to_thread(run)


def generation(
    prefix: str, first: int, last: int, *, followers: tuple[str, ...] = ()
) -> list[EventRecord]:
    """One connection's events, keyed and digested as the intake does: ids first..last
    with data ``<prefix><id>``, each followed by id-less ``followers``."""
    keys = FollowerKeys()
    made = []
    for n in range(first, last + 1):
        data = f"{prefix}{n}"
        digest = data_digest("message", data)
        made.append(
            EventRecord(
                event_id=str(n),
                event_ord=0,
                event_type="message",
                data=data,
                received_at=T0,
                follower_key=keys.carrier(),
                digest=digest,
            )
        )
        for ordinal, text in enumerate(followers, 1):
            made.append(
                EventRecord(
                    event_id=str(n),
                    event_ord=ordinal,
                    event_type="message",
                    data=text,
                    received_at=T0,
                    follower_key=keys.follower("message", text, ordinal),
                    digest=digest,
                )
            )
    return made


def hold_the_lanes(log: Stores, *, taken: int = 0) -> list[Any]:
    """Submit one batch per free lane so that everything submitted next waits, and shares
    the next group transaction (submissions in one step of the event loop)."""
    lanes = 4 if log.database.dialect == "postgresql" else 1
    return [
        log.writer.submit_batch(f"filler-{uuid.uuid4().hex[:8]}", "numeric", [record("1")])
        for _ in range(lanes - taken)
    ]


def gap_opened(
    stream: str,
    gap_id: str,
    start: str | None,
    end: str | None,
    *,
    contiguous: bool = True,
    **fields: Any,
) -> GapChange:
    """A comment gap opened after ``start`` and before ``end`` (noticed at ``start``, seen
    at T0, unless ``fields`` say otherwise)."""
    gap = GapRecord(
        gap_id=gap_id,
        stream=stream,
        kind="comment",
        start_id=start,
        end_id=end,
        notice_id=fields.pop("notice_id", start),
        seen_at=fields.pop("seen_at", T0.isoformat()),
        **fields,
    )
    return GapChange(gap_id, opened=gap, contiguous=contiguous)


async def persist(log: Stores, stream: str, ids: range, received_at: datetime) -> None:
    """Store one event per id in ``ids`` (data ``e<id>``), received at ``received_at``."""
    records = [record(str(i), at=received_at, data=f"e{i}") for i in ids]
    await log.writer.insert_batch(stream, "numeric", records)


async def commit(
    log: Stores, stream: str, events: list[EventRecord], *changes: GapChange
) -> InsertResult:
    return await log.writer.committed(
        log.writer.submit_batch(stream, "numeric", events, gap_changes=changes)
    )


async def refuse_inserts(log: Stores, trigger: str, when: str) -> str:
    """A PostgreSQL trigger that refuses ('refused by the test') every row of
    ``sse_events`` matching ``when`` (SQL on ``NEW``); returns the statement dropping it."""
    await execute(
        log,
        "CREATE OR REPLACE FUNCTION durable_sse_test_refuse() RETURNS trigger "
        "LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'refused by the test'; END $$",
        f"CREATE TRIGGER {trigger} BEFORE INSERT ON sse_events FOR EACH ROW "
        f"WHEN ({when}) EXECUTE FUNCTION durable_sse_test_refuse()",
    )
    return f"DROP TRIGGER {trigger} ON sse_events"


async def query_commit(log: Stores, sql: str) -> None:
    def run() -> None:
        with log.database.engine.begin() as connection:
            connection.execute(sa.text(sql))

    await asyncio.to_thread(run)
