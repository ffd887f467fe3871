"""A running connection's reports (durable_sse/reader/reports.py) on a fake clock: the
live progress it writes (coalesced, refreshed, written last at its end), the retention
hold it moves only when a retention applies, and the wake of a resting checkpoint
schedule (once after a pause, again only after a failed wake's retry delay). The same
reports against the real stores, through the read activity: test_progress,
test_checkpoint_rest, tests/reader/test_connection.py (the hold)."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace
from typing import Any

from durable_sse.contracts import ReadCounts
from durable_sse.cursor.rest import WAKE_RETRY, wake_check_after
from durable_sse.reader.reports import (
    HOLD_INTERVAL,
    PROGRESS_INTERVAL,
    PROGRESS_REFRESH,
    ConnectionReports,
)

REPLAY_WINDOW = 600.0


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class FakeL2:
    def __init__(self) -> None:
        self.written: list[tuple[str, dict[str, Any]]] = []

    def submit_progress(self, stream: str, value: str) -> None:
        self.written.append((stream, json.loads(value)))


def fake_connection(*, retention: float | None = None, l2: FakeL2 | None = None) -> Any:
    connection = SimpleNamespace(
        spec=SimpleNamespace(retention=retention, replay_window=REPLAY_WINDOW),
        stream="orders",
        stores=SimpleNamespace(l2=l2),
        session=SimpleNamespace(
            started=SimpleNamespace(cursor="5"),
            counts=lambda: ReadCounts(events_read=5),
            intake=object(),
        ),
        commit_lag=0.25,
        credential_views=lambda: [],
        holds=0,
    )

    async def move_hold() -> None:
        connection.holds += 1

    connection.move_hold = move_hold
    return connection


async def test_progress_is_written_when_due_and_changed_and_refreshed_when_not() -> None:
    l2, clock = FakeL2(), Clock()
    connection = fake_connection(l2=l2)
    reports = ConnectionReports(connection, connection_id=3, clock=clock)
    reports.due()
    assert l2.written == []  # not due yet
    clock.now += PROGRESS_INTERVAL
    reports.due()
    [(stream, progress)] = l2.written
    assert stream == "orders"
    assert (progress["connection"], progress["cursor"], progress["commit_lag"]) == (3, "5", 0.25)
    assert progress["at"] is not None
    clock.now += PROGRESS_INTERVAL
    reports.due()
    assert len(l2.written) == 1  # unchanged: not written again
    connection.session.started.cursor = "9"
    clock.now += PROGRESS_INTERVAL
    reports.due()
    assert [p["cursor"] for _, p in l2.written] == ["5", "9"]
    clock.now += PROGRESS_REFRESH
    reports.due()
    assert [p["cursor"] for _, p in l2.written] == ["5", "9", "9"]  # its `at` says it lives
    await reports.stop()
    assert len(l2.written) == 4  # the last progress, changed or not


async def test_without_redis_or_before_its_start_a_connection_writes_no_progress() -> None:
    clock = Clock()
    reports = ConnectionReports(fake_connection(l2=None), connection_id=1, clock=clock)
    clock.now += PROGRESS_INTERVAL
    reports.due()
    await reports.stop()
    l2 = FakeL2()
    connection = fake_connection(l2=l2)
    connection.session.intake = None
    await ConnectionReports(connection, connection_id=1, clock=clock).stop()
    assert l2.written == []


async def test_the_hold_moves_every_interval_only_when_a_retention_applies() -> None:
    for stream_retention, worker_retention, moves in [
        (None, None, False),
        (3600.0, None, True),
        (None, 3600.0, True),
    ]:
        clock = Clock()
        connection = fake_connection(retention=stream_retention)
        reports = ConnectionReports(
            connection, connection_id=1, retention=worker_retention, clock=clock
        )
        assert reports.moves_hold is moves
        reports.due()
        clock.now += HOLD_INTERVAL
        reports.due()
        clock.now += 1
        reports.due()  # not due again yet
        await asyncio.sleep(0)
        assert connection.holds == (1 if moves else 0)
        assert reports.holding is None
        await reports.stop()


async def test_a_resting_schedule_is_woken_after_a_pause_and_retried_after_a_failure() -> None:
    clock, woken = Clock(), []
    failing = True

    async def wake(stream: str) -> bool:
        woken.append(stream)
        if failing:
            raise OSError("Temporal is away")
        return True

    reports = ConnectionReports(
        fake_connection(), connection_id=1, wake_checkpoint=wake, clock=clock
    )
    reports.stored()  # the first commit that stores rows checks
    assert reports.waking is not None
    await asyncio.sleep(0)
    assert woken == ["orders"] and reports.waking is None
    assert reports.wake_retry_at == clock.now + WAKE_RETRY
    clock.now += 1
    reports.stored()  # a busy stream does not check again before the retry
    assert reports.waking is None
    failing = False
    clock.now += WAKE_RETRY
    reports.stored()
    await asyncio.sleep(0)
    assert woken == ["orders"] * 2 and reports.wake_retry_at is None
    clock.now += 1
    reports.stored()  # moving all along: no read of the flag
    assert reports.waking is None
    clock.now += wake_check_after(REPLAY_WINDOW)
    reports.stored()  # after a pause it checks again
    await asyncio.sleep(0)
    assert woken == ["orders"] * 3
    await reports.stop()
