"""StreamWorkflow on the time-skipping test server.

``read_stream`` is a scripted stand-in (same activity name) that plays ReadResults or
keeps "reading" (heartbeating) until the workflow cancels it; the checkpoint activities
(``stream_gaps``, ``resolve_since``) are the real ones on a real Stores (SQLite in
tmp_path), so a scenario can write real gap records that the workflow reads back when a
connection's result is lost. The time-skipping server has no Schedules, so the two
schedule activities are recording stand-ins here (the real ones are tested against the
dev server in test_checkpoint_workflow.py). The real reader is tested end-to-end
elsewhere.

Time skips only while no activity runs, so scenarios space connections with durable
timers (``retry_ms``/``retry_after``) and keep real waits to a few seconds. Clock
differences below are read from the test server's clock (durable timers), never from
the wall.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from temporalio import activity
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowHandle
from temporalio.exceptions import ApplicationError
from temporalio.runtime import MetricBuffer, Runtime, TelemetryConfig
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from durable_sse.activities.attributes import SearchAttributeActivities
from durable_sse.activities.checkpoint import CheckpointActivities
from durable_sse.config.replay import ReplaySignal
from durable_sse.config.spec import StreamSpec
from durable_sse.contracts import (
    RECORDED_GAP,
    DropReport,
    Outcome,
    ReadCounts,
    ReadInput,
    ReadResult,
    Route,
    ScheduleInput,
    StreamRef,
    StreamStatus,
)
from durable_sse.gaps.model import GapChange, GapRecord, GapSummary, GapTotals, GapView
from durable_sse.log.records import EventRecord
from durable_sse.ops.binaries import temporal_test_server
from durable_sse.ops.metrics import WorkflowMetrics
from durable_sse.stores import Stores
from durable_sse.workflows.checkpoint import CheckpointAdvanceWorkflow
from durable_sse.workflows.stream import SCHEDULE_TIMER_SUMMARY, StreamState, StreamWorkflow

POLL_LIMIT = 30.0
"""Safety bound on polling a query (a hang guard, not a timing assertion)."""
SEEN_AT = "2026-01-01T00:00:00+00:00"


@dataclass
class Step:
    """One connection of the script."""

    result: ReadResult | None = None
    """Returned at once (unless ``hold``)."""
    hold: bool = False
    """Keep reading (heartbeating) until cancelled."""
    cancelled: ReadResult | None = None
    """Returned when cancelled while holding (default: a bare CANCELLED result, no gaps)."""
    reraise: bool = False
    """Re-raise the cancellation instead of returning a result (the result is lost)."""
    error: ApplicationError | None = None
    signal: str | None = None
    signal_arg: Any = None
    probe: Callable[[ReadInput], Awaitable[None]] | None = None
    """Runs inside the activity first (inspect or write the stores mid-scenario)."""
    store_gaps: bool = False
    """Fill the returned result's ``gaps`` from the event log, as the real reader does."""


STOP = Step(hold=True, signal="stop")


@dataclass
class Script:
    client: Client
    steps: list[Step]
    event_log: Stores
    inputs: list[ReadInput] = field(default_factory=list)
    times: list[datetime] = field(default_factory=list)
    env: WorkflowEnvironment | None = None
    nudged: list[str] = field(default_factory=list)
    """Streams the workflow nudged after cancelling their reader (``nudge_reader``)."""

    @activity.defn(name="nudge_reader")
    async def nudge_reader(self, input: StreamRef) -> int:
        self.nudged.append(input.name)
        return 1

    @activity.defn(name="read_stream")
    async def read_stream(self, input: ReadInput) -> ReadResult:
        self.inputs.append(input)
        if self.env is not None:
            self.times.append(await self.env.get_current_time())
        step = self.steps.pop(0) if self.steps else STOP
        if step.probe is not None:
            await step.probe(input)
        if step.signal is not None:
            handle = self.client.get_workflow_handle(activity.info().workflow_id)
            if step.signal_arg is None:
                await handle.signal(step.signal)
            else:
                await handle.signal(step.signal, step.signal_arg)
        if step.error is not None:
            raise step.error
        if not step.hold:
            assert step.result is not None
            return await self._finish(step, step.result, input)
        try:
            while True:
                activity.heartbeat()
                await asyncio.sleep(0.1)
        except asyncio.CancelledError:
            if step.reraise:
                raise
            result = step.cancelled or ReadResult(outcome=Outcome.CANCELLED)
            return await self._finish(step, result, input)

    async def _finish(self, step: Step, result: ReadResult, input: ReadInput) -> ReadResult:
        if not step.store_gaps:
            return result
        gaps = await self.event_log.gap_store.gap_summary(input.spec.name, input.spec.id_order)
        return replace(result, gaps=gaps)


@dataclass
class ScheduleStandIn:
    """Records schedule calls (the time-skipping server has no Schedules)."""

    ensured: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    fail_ensure: bool = False
    """Every ``ensure_checkpoint_schedule`` attempt fails (a store that is down for good)."""

    @activity.defn(name="ensure_checkpoint_schedule")
    async def ensure(self, input: ScheduleInput) -> None:
        self.ensured.append(input.spec.name)
        if self.fail_ensure:
            raise RuntimeError("the schedule store is down")

    @activity.defn(name="delete_checkpoint_schedule")
    async def delete(self, input: StreamRef) -> None:
        self.deleted.append(input.name)


@dataclass
class Run:
    status: StreamStatus
    script: Script
    schedules: ScheduleStandIn
    handle: WorkflowHandle
    spec: StreamSpec


@pytest.fixture(scope="module")
def metrics() -> MetricBuffer:
    """Every metric the module's workers record (drained before each test)."""
    return MetricBuffer(1_000_000)


@pytest.fixture(scope="module")
async def env(metrics: MetricBuffer) -> AsyncIterator[WorkflowEnvironment]:
    runtime = Runtime(telemetry=TelemetryConfig(metrics=metrics))
    async with await WorkflowEnvironment.start_time_skipping(
        test_server_existing_path=temporal_test_server(), runtime=runtime
    ) as environment:
        yield environment


@pytest.fixture(autouse=True)
def drain_metrics(metrics: MetricBuffer) -> None:
    metrics.retrieve_updates()


@pytest.fixture
async def event_log(tmp_path: Path) -> AsyncIterator[Stores]:
    log = Stores.open(f"sqlite:///{tmp_path / 'events.db'}")
    await log.create_schema()
    yield log
    await log.close()


def new_spec(**overrides: Any) -> StreamSpec:
    values: dict[str, Any] = {
        "name": f"wf-{uuid.uuid4().hex[:16]}",
        "url": "http://127.0.0.1:9/events",
        "id_order": "numeric",
    }
    values.update(overrides)
    return StreamSpec(**values)


async def run_stream(
    env: WorkflowEnvironment,
    event_log: Stores,
    steps: list[Step],
    *,
    spec: StreamSpec | None = None,
    state: StreamState | None = None,
    raw_input: dict[str, Any] | None = None,
    raw_args: list[Any] | None = None,
    workflow_id: str | None = None,
    schedules: ScheduleStandIn | None = None,
    during: Callable[[WorkflowHandle], Awaitable[None]] | None = None,
) -> Run:
    """Run a stream workflow over a script until it stops; return its final status."""
    spec = spec or new_spec()
    script = Script(env.client, list(steps), event_log, env=env)
    schedules = schedules or ScheduleStandIn()
    queue = f"tq-{uuid.uuid4().hex}"
    activities = [
        script.read_stream,
        script.nudge_reader,
        schedules.ensure,
        schedules.delete,
        *CheckpointActivities(event_log).activities(),
        *SearchAttributeActivities(env.client).activities(),
    ]
    async with Worker(
        env.client,
        task_queue=queue,
        workflows=[StreamWorkflow, CheckpointAdvanceWorkflow],
        activities=activities,
        # Cancellation reaches an activity with its (throttled) heartbeat; keep it quick.
        max_heartbeat_throttle_interval=timedelta(milliseconds=100),
        default_heartbeat_throttle_interval=timedelta(milliseconds=100),
    ):
        args: list[Any] = [spec] if state is None else [spec, state]
        if raw_input is not None:
            args = [raw_input]  # what `temporal workflow start --input '{…}'` sends
        if raw_args is not None:
            args = raw_args
        handle = await env.client.start_workflow(
            "StreamWorkflow",
            args=args,
            id=workflow_id or f"sse-stream:{spec.name}",
            task_queue=queue,
            result_type=StreamStatus,
        )
        if during is not None:
            await during(handle)
        status = await handle.result()
    return Run(status=status, script=script, schedules=schedules, handle=handle, spec=spec)


async def wait_for(
    handle: WorkflowHandle, predicate: Callable[[StreamStatus], bool]
) -> StreamStatus:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + POLL_LIMIT
    while True:
        status = await handle.query(StreamWorkflow.status)
        if predicate(status):
            return status
        if loop.time() > deadline:
            raise AssertionError(f"status never matched; last: {status}")
        await asyncio.sleep(0.05)


async def details_of(handle: WorkflowHandle) -> str:
    """The Web UI's current details (markdown)."""
    metadata = await handle.query("__temporal_workflow_metadata")
    return str(metadata.current_details)


async def persist(event_log: Stores, stream: str, ids: range, received_at: datetime) -> None:
    records = [
        EventRecord(
            event_id=str(i),
            event_ord=0,
            event_type="message",
            data=f"e{i}",
            received_at=received_at,
        )
        for i in ids
    ]
    await event_log.writer.insert_batch(stream, "numeric", records)


async def write_gaps(event_log: Stores, stream: str, *changes: GapChange) -> None:
    """Commit gap changes alone, the way the reader commits them with a batch."""
    await event_log.writer.committed(
        event_log.writer.submit_batch(stream, "numeric", [], gap_changes=changes)
    )


def opened(stream: str, gap_id: str, *, start: str, notice: str, end: str | None) -> GapChange:
    gap = GapRecord(
        gap_id=gap_id,
        stream=stream,
        kind="comment",
        start_id=start,
        end_id=end,
        notice_id=notice,
        seen_at=datetime.now(UTC).isoformat(),
        detail="dropping events",
    )
    return GapChange(gap_id, opened=gap)


def view(gap_id: str, start: str, *, end: str | None = None, resume: str | None = None) -> GapView:
    return GapView(
        gap_id=gap_id,
        kind="comment",
        start_id=start,
        end_id=end,
        resume_from=resume or start,
        announced=None,
        seen_at=SEEN_AT,
    )


def gaps(*open_gaps: GapView, **totals: int) -> GapSummary:
    """A gap summary as the reader returns it: these gaps open, and these totals."""
    return GapSummary(open=list(open_gaps), totals=GapTotals(open=len(open_gaps), **totals))


def counts(events: int, new: int | None = None) -> ReadCounts:
    return ReadCounts(events_read=events, new_rows=events if new is None else new)


COMMENT = DropReport(kind="comment", detail="dropping events")


def routes(run: Run) -> list[tuple[Route, str | None]]:
    return [(Route(i.route), i.start_id) for i in run.script.inputs]


async def activity_types(handle: WorkflowHandle) -> list[str]:
    """Every activity the run scheduled, in order."""
    history = await handle.fetch_history()
    return [
        event.activity_task_scheduled_event_attributes.activity_type.name
        for event in history.events
        if event.HasField("activity_task_scheduled_event_attributes")
    ]


async def timers(handle: WorkflowHandle, *, schedule: bool = False) -> list[float]:
    """Every durable timer the run started, in seconds: the reconnect timers, or with
    ``schedule`` only the timer of the checkpoint schedule's spread creation."""
    history = await handle.fetch_history()
    return [
        event.timer_started_event_attributes.start_to_fire_timeout.ToTimedelta().total_seconds()
        for event in history.events
        if event.HasField("timer_started_event_attributes")
        and (SCHEDULE_TIMER_SUMMARY.encode() in event.user_metadata.summary.data) == schedule
    ]


async def activity_types_but_nudges(handle: WorkflowHandle) -> list[str]:
    return [name for name in await activity_types(handle) if name != "nudge_reader"]


def metric_total(buffer: MetricBuffer, name: str, stream: str) -> float:
    return sum(
        update.value
        for update in buffer.retrieve_updates()
        if update.metric.name == name and update.attributes.get("stream") == stream
    )


# --- routes: repairs, throttle, replays ---------------------------------------------------


async def test_stop_in_the_first_window_creates_no_schedule_and_nudges_the_reader(
    env: WorkflowEnvironment, event_log: Stores
) -> None:
    run = await run_stream(env, event_log, [])
    assert run.status.state == "stopped"
    assert run.status.counters.connections == 1
    # The schedule is due later in the first replay window (SCHEDULE_SPREAD): a stream
    # stopped before then never had one, and deletes none.
    assert run.schedules.ensured == [] and run.schedules.deleted == []
    assert routes(run) == [(Route.LIVE, None)]
    assert run.script.nudged == [run.spec.name]
    # A fresh stream reads its gaps from the store before its first connection.
    assert await activity_types(run.handle) == [
        "stream_state_attribute_registered",  # once per run: may it set SseStreamState?
        "stream_gaps",
        "read_stream",
        # The stop cancels the reader, then nudges it to notice now. The stop's CANCELLED
        # result carried no gaps, but a stopping workflow reads no more: it ends.
        "nudge_reader",
    ]


async def test_the_schedule_is_created_within_the_first_window_and_deleted_on_stop(
    env: WorkflowEnvironment, event_log: Stores
) -> None:
    spec = new_spec()
    # Back off for an hour: time skips past the schedule's due time meanwhile.
    steps = [Step(result=ReadResult(Outcome.RETRY_LATER, retry_after=3600.0))]
    run = await run_stream(env, event_log, steps, spec=spec)
    assert run.schedules.ensured == [spec.name]
    assert run.schedules.deleted == [spec.name]
    assert await activity_types(run.handle) == [
        "stream_state_attribute_registered",
        "stream_gaps",
        "read_stream",
        "stream_gaps",  # the result carried no gaps
        "ensure_checkpoint_schedule",  # due while the stream backed off
        "read_stream",
        "nudge_reader",
        "delete_checkpoint_schedule",
    ]
    spread = await timers(run.handle, schedule=True)
    assert len(spread) == 1 and 0 <= spread[0] < spec.replay_window


async def test_spread_zero_creates_the_schedule_before_connecting(
    env: WorkflowEnvironment, event_log: Stores
) -> None:
    run = await run_stream(env, event_log, [], state=StreamState(schedule_spread=0.0))
    assert run.schedules.ensured == [run.spec.name]
    assert run.schedules.deleted == [run.spec.name]
    assert await activity_types(run.handle) == [
        "stream_state_attribute_registered",
        "ensure_checkpoint_schedule",
        "stream_gaps",
        "read_stream",
        "nudge_reader",
        "delete_checkpoint_schedule",
    ]


async def test_drop_signal_repairs_and_a_second_drop_inside_the_interval_is_throttled(
    env: WorkflowEnvironment, event_log: Stores
) -> None:
    observed: list[StreamStatus] = []
    details: list[str] = []

    async def look(_: ReadInput) -> None:
        handle = env.client.get_workflow_handle(f"sse-stream:{spec.name}")
        observed.append(await handle.query(StreamWorkflow.status))
        details.append(await details_of(handle))

    spec = new_spec()  # lagged_reconnect_interval = 60 s
    g1, g2 = view("g1", "4", end="11"), view("g2", "15", end="21")
    steps = [
        Step(
            result=ReadResult(
                Outcome.DROP_SIGNAL,
                last_cursor="10",
                counts=counts(10),
                drop=COMMENT,
                gaps=gaps(g1),
            )
        ),
        # The repair: re-reads g1, which the store now shows repaired.
        Step(
            result=ReadResult(
                Outcome.DROPPED,
                start_cursor="3",
                last_cursor="12",
                counts=counts(9, new=2),
                gaps=gaps(repaired=1),
                retry_ms=58_000,
            )
        ),
        # 58 s after the repair started: a second drop signal, inside the interval.
        Step(
            result=ReadResult(
                Outcome.DROP_SIGNAL,
                last_cursor="20",
                counts=counts(8),
                drop=COMMENT,
                gaps=gaps(g2, repaired=1),
            )
        ),
        # Live, until the interval allows the next lagged reconnect (~2 s real).
        Step(
            hold=True,
            probe=look,
            cancelled=ReadResult(
                Outcome.CANCELLED, last_cursor="26", counts=counts(6), gaps=gaps(g2, repaired=1)
            ),
        ),
        Step(
            result=ReadResult(
                Outcome.DROPPED,
                start_cursor="14",
                last_cursor="30",
                counts=counts(16, new=4),
                gaps=gaps(repaired=2),
            )
        ),
    ]
    run = await run_stream(env, event_log, steps, spec=spec)

    assert [r for r, _ in routes(run)] == [
        Route.LIVE,
        Route.LAGGED,
        Route.LIVE,
        Route.LIVE,  # throttled: the drop signal came 58 s after the last lagged reconnect
        Route.LAGGED,
        Route.LIVE,
    ]
    assert [i.known_gaps for i in run.script.inputs] == [[], ["g1"], [], ["g2"], ["g2"], []]
    times = run.script.times
    assert times[4] - times[1] >= timedelta(seconds=60)  # at most one per interval
    # While throttled the status says a repair is pending, and which gap it is for.
    assert observed[0].repair_pending and observed[0].route == "live"
    assert [g.gap_id for g in observed[0].open_gaps] == ["g2"]
    assert observed[0].counters.gaps_open == 1 and observed[0].counters.gaps_repaired == 1
    assert "repair pending" in details[0] and "open gap after `15` before `21`" in details[0]
    c = run.status.counters
    assert (c.drop_signals, c.lagged_replays, c.explicit_replays) == (2, 2, 0)
    assert (c.gaps_open, c.gaps_repaired, c.gaps_unrecoverable) == (0, 2, 0)
    assert not run.status.repair_pending and run.status.open_gaps == []
    assert run.status.live_cursor == "30"


async def test_a_repair_cut_short_resumes_at_once_and_the_gap_holds_the_checkpoint(
    env: WorkflowEnvironment, event_log: Stores
) -> None:
    """Real gap records: the lagging id stays at the open gap's resume point while the
    repair runs, a disconnect resumes the repair at once (no new lagged reconnect, no
    throttle), and the checkpoint moves on once the gap is closed."""
    spec = new_spec()
    name = spec.name
    now = datetime.now(UTC)
    await persist(event_log, name, range(1, 6), now - timedelta(hours=2))
    await persist(event_log, name, range(6, 8), now - timedelta(minutes=1))
    assert (
        await event_log.checkpoints.advance_lagging(name, "numeric", window=3600, now=now)
    ).lagging_id == "5"
    checkpoints: list[tuple[str | None, bool]] = []

    async def checkpoint() -> None:
        advance = await event_log.checkpoints.advance_lagging(
            name, "numeric", window=0, now=datetime.now(UTC)
        )
        checkpoints.append((advance.lagging_id, advance.held_by_gap))

    async def drop_notice(_: ReadInput) -> None:
        # Read 6, 7; the notice; then 11, 12: the gap lies after 5 and before 11.
        await write_gaps(event_log, name, opened(name, "g1", start="5", notice="7", end="11"))
        await persist(event_log, name, range(11, 13), datetime.now(UTC))

    async def repair_cut(_: ReadInput) -> None:
        await checkpoint()
        await persist(event_log, name, range(8, 9), datetime.now(UTC))
        await write_gaps(event_log, name, GapChange("g1", reread_to="8"))

    async def repair_done(_: ReadInput) -> None:
        await checkpoint()
        await persist(event_log, name, range(9, 11), datetime.now(UTC))
        await write_gaps(event_log, name, GapChange("g1", close=True))

    async def live_again(_: ReadInput) -> None:
        await checkpoint()

    steps = [
        Step(
            probe=drop_notice,
            store_gaps=True,
            result=ReadResult(
                Outcome.DROP_SIGNAL, last_cursor="12", counts=counts(4), drop=COMMENT
            ),
        ),
        Step(
            probe=repair_cut,
            store_gaps=True,
            result=ReadResult(
                Outcome.DROPPED,
                start_cursor="4",
                last_cursor="8",
                counts=counts(4, new=1),
                error="connection reset",
            ),
        ),
        Step(
            probe=repair_done,
            store_gaps=True,
            result=ReadResult(
                Outcome.ROTATED, start_cursor="7", last_cursor="12", counts=counts(5, new=2)
            ),
        ),
        Step(probe=live_again, hold=True, signal="stop"),
    ]
    run = await run_stream(env, event_log, steps, spec=spec)

    assert routes(run) == [
        (Route.LIVE, None),
        (Route.LAGGED, None),
        (Route.LAGGED, None),  # the cut repair resumes on the lagged route, at once
        (Route.LIVE, None),
    ]
    assert [i.known_gaps for i in run.script.inputs] == [[], ["g1"], ["g1"], []]
    assert checkpoints == [("5", True), ("8", True), ("12", False)]
    c = run.status.counters
    assert (c.drop_signals, c.lagged_replays) == (1, 1)  # the resumed repair is not new
    assert (c.gaps_open, c.gaps_repaired, c.gaps_unrecoverable) == (0, 1, 0)
    assert c.events_persisted == 7 and c.failures == 0
    assert run.status.open_gaps == [] and run.status.live_cursor == "12"
    assert run.status.last_error == "connection reset"  # the last error seen stays visible
    (record,) = await event_log.gap_store.gaps(name)
    assert (record.state, record.missing) == ("repaired", 0)


async def test_a_finished_repair_leaves_no_resume_behind(
    env: WorkflowEnvironment, event_log: Stores
) -> None:
    """Only a repair cut short resumes outside the throttle. One that finished (the
    reader ends it once its gaps are closed) leaves nothing to resume: a gap found later
    (here recorded by an attempt that was then refused) is a new lagged reconnect."""
    spec = new_spec(lagged_reconnect_interval=0.01)  # never in the way: counts only
    name = spec.name

    async def suspect_then_refused(_: ReadInput) -> None:
        await write_gaps(event_log, name, opened(name, "g2", start="12", notice="14", end="15"))

    async def repair(_: ReadInput) -> None:
        await write_gaps(event_log, name, GapChange("g2", close=True))

    async def resume_when_parked(handle: WorkflowHandle) -> None:
        await wait_for(handle, lambda s: s.state == "parked" and s.open_gaps)
        await handle.signal(StreamWorkflow.resume)

    refusal = ApplicationError("HTTP 403", type="StreamRefusedError", non_retryable=True)
    steps = [
        Step(
            result=ReadResult(
                Outcome.DROP_SIGNAL,
                last_cursor="10",
                counts=counts(10),
                drop=COMMENT,
                gaps=gaps(view("g1", "3", end="11")),
            )
        ),
        # The repair closed g1 and ended by itself.
        Step(
            result=ReadResult(
                Outcome.ROTATED,
                start_cursor="2",
                last_cursor="12",
                counts=counts(10, new=3),
                gaps=gaps(repaired=1),
            )
        ),
        Step(probe=suspect_then_refused, error=refusal),
        Step(
            probe=repair,
            store_gaps=True,
            result=ReadResult(
                Outcome.DROPPED, start_cursor="11", last_cursor="16", counts=counts(5)
            ),
        ),
    ]
    run = await run_stream(env, event_log, steps, spec=spec, during=resume_when_parked)

    assert [r for r, _ in routes(run)] == [
        Route.LIVE,
        Route.LAGGED,
        Route.LIVE,
        Route.LAGGED,
        Route.LIVE,
    ]
    assert run.script.inputs[3].known_gaps == ["g2"]
    assert run.status.counters.lagged_replays == 2  # g2's repair is a new lagged reconnect


async def test_a_result_lost_to_a_cancel_is_made_good_from_the_store(
    env: WorkflowEnvironment, event_log: Stores
) -> None:
    """The reader recorded a gap, then its result was lost (the cancellation was
    re-raised): the workflow reads ``stream_gaps`` before planning, shows the gap, and
    repairs it on resume."""
    spec = new_spec()
    name = spec.name
    paused: list[StreamStatus] = []

    async def gap_then_lost(_: ReadInput) -> None:
        await write_gaps(event_log, name, opened(name, "g1", start="3", notice="9", end="12"))

    async def repair(_: ReadInput) -> None:
        await write_gaps(event_log, name, GapChange("g1", close=True))

    async def resume_when_paused(handle: WorkflowHandle) -> None:
        # Paused, once the lost result was made good: the gap the store holds is shown.
        paused.append(await wait_for(handle, lambda s: s.state == "paused" and s.open_gaps))
        await handle.signal(StreamWorkflow.resume)

    steps = [
        Step(hold=True, probe=gap_then_lost, signal="pause", reraise=True),
        Step(
            probe=repair,
            store_gaps=True,
            result=ReadResult(
                Outcome.DROPPED, start_cursor="2", last_cursor="12", counts=counts(10, new=2)
            ),
        ),
    ]
    run = await run_stream(env, event_log, steps, spec=spec, during=resume_when_paused)

    status = paused[0]
    assert [g.gap_id for g in status.open_gaps] == ["g1"]
    assert (status.open_gaps[0].start_id, status.open_gaps[0].end_id) == ("3", "12")
    assert status.repair_pending and status.counters.gaps_open == 1
    assert status.last_outcome == "cancelled"
    assert routes(run) == [(Route.LIVE, None), (Route.LAGGED, None), (Route.LIVE, None)]
    assert run.script.inputs[1].known_gaps == ["g1"]
    types = await activity_types_but_nudges(run.handle)
    reads = [i for i, name in enumerate(types) if name == "read_stream"]
    assert types[reads[0] + 1] == "stream_gaps"  # read before the next connection is planned
    c = run.status.counters
    assert (c.drop_signals, c.lagged_replays, c.gaps_repaired, c.gaps_open) == (0, 1, 1, 0)


async def test_a_recorded_gap_the_workflow_did_not_know_starts_the_repair(
    env: WorkflowEnvironment, event_log: Stores
) -> None:
    """A live connection that finds an open gap not in ``known_gaps`` (its result was
    lost earlier) ends with a RECORDED drop: repaired, not counted as a new drop signal."""
    recorded = DropReport(kind=RECORDED_GAP, detail="open gap g7")
    steps = [
        Step(
            result=ReadResult(
                Outcome.DROP_SIGNAL,
                start_cursor="40",
                last_cursor="40",
                drop=recorded,
                gaps=gaps(view("g7", "20", end="31")),
            )
        ),
        Step(
            result=ReadResult(
                Outcome.DROPPED, last_cursor="45", counts=counts(25, new=10), gaps=gaps(repaired=1)
            )
        ),
    ]
    run = await run_stream(env, event_log, steps)
    assert [r for r, _ in routes(run)] == [Route.LIVE, Route.LAGGED, Route.LIVE]
    assert run.script.inputs[1].known_gaps == ["g7"]
    c = run.status.counters
    assert (c.drop_signals, c.lagged_replays, c.gaps_repaired) == (0, 1, 1)


async def test_an_explicit_replay_past_an_open_gap_yields_to_the_repair(
    env: WorkflowEnvironment, event_log: Stores
) -> None:
    """``replay(from_id)`` starting past an open gap does not re-read it, so it does not
    claim the repair: once the interval allows, the repair interrupts it, and the replay
    then resumes from its own progress."""
    spec = new_spec(lagged_reconnect_interval=1.0)
    g1 = view("g1", "3")
    steps = [
        Step(
            result=ReadResult(
                Outcome.DROP_SIGNAL,
                last_cursor="10",
                counts=counts(10),
                drop=COMMENT,
                gaps=gaps(g1),
            )
        ),
        # The repair, interrupted by the replay signal.
        Step(
            hold=True,
            signal="replay",
            signal_arg=ReplaySignal(from_id="8"),
            cancelled=ReadResult(
                Outcome.CANCELLED,
                start_cursor="2",
                last_cursor="5",
                counts=counts(3, new=0),
                gaps=gaps(view("g1", "3", resume="5")),
            ),
        ),
        # The replay from 8, interrupted when the interval allows the repair.
        Step(
            hold=True,
            cancelled=ReadResult(
                Outcome.CANCELLED,
                start_cursor="8",
                last_cursor="9",
                counts=counts(1, new=0),
                gaps=gaps(view("g1", "3", resume="5")),
            ),
        ),
        Step(
            result=ReadResult(
                Outcome.DROPPED,
                start_cursor="4",
                last_cursor="10",
                counts=counts(6, new=2),
                gaps=gaps(repaired=1),
            )
        ),
        Step(
            result=ReadResult(
                Outcome.ROTATED,
                start_cursor="9",
                last_cursor="11",
                counts=counts(2, new=1),
                gaps=gaps(repaired=1),
            )
        ),
    ]
    run = await run_stream(env, event_log, steps, spec=spec)
    assert routes(run) == [
        (Route.LIVE, None),
        (Route.LAGGED, None),
        (Route.EXPLICIT, "8"),
        (Route.LAGGED, None),
        (Route.EXPLICIT, "9"),  # the replay resumes from its progress, up to its target
        (Route.LIVE, None),
    ]
    c = run.status.counters
    assert (c.explicit_replays, c.lagged_replays, c.gaps_repaired) == (1, 2, 1)
    assert run.status.live_cursor == "11" and run.status.open_gaps == []


async def test_replay_signal_variants(env: WorkflowEnvironment, event_log: Stores) -> None:
    spec = new_spec()
    now = datetime.now(UTC)
    await persist(event_log, spec.name, range(1, 6), now - timedelta(hours=2))
    await persist(event_log, spec.name, range(6, 11), now - timedelta(minutes=10))
    since = (now - timedelta(hours=1)).isoformat()
    read_ten = ReadResult(Outcome.CANCELLED, last_cursor="10", counts=counts(10), gaps=gaps())

    steps = [
        # replay with no arguments: the lagged route, up to the live cursor
        Step(hold=True, signal="replay", cancelled=read_ten),
        Step(
            result=ReadResult(
                Outcome.DROPPED,
                start_cursor="3",
                last_cursor="10",
                counts=counts(7, new=0),
                gaps=gaps(),
            )
        ),
        # from_id, with a reader that re-raises the cancellation (ActivityError path)
        Step(hold=True, signal="replay", signal_arg=ReplaySignal(from_id="4"), reraise=True),
        Step(
            result=ReadResult(
                Outcome.DROPPED, start_cursor="4", last_cursor="7", counts=counts(3, new=0)
            )
        ),
        Step(
            result=ReadResult(
                Outcome.ROTATED, start_cursor="7", last_cursor="10", counts=counts(3, new=0)
            )
        ),
        # since: resolved to the newest id persisted at or before it
        Step(hold=True, signal="replay", signal_arg=ReplaySignal(since=since)),
        Step(
            result=ReadResult(
                Outcome.DROPPED, start_cursor="5", last_cursor="10", counts=counts(5, new=0)
            )
        ),
    ]
    run = await run_stream(env, event_log, steps, spec=spec)
    assert routes(run) == [
        (Route.LIVE, None),
        (Route.LAGGED, None),
        (Route.LIVE, None),
        (Route.EXPLICIT, "4"),
        (Route.EXPLICIT, "7"),  # a replay cut short resumes from its progress
        (Route.LIVE, None),
        (Route.EXPLICIT, "5"),
        (Route.LIVE, None),
    ]
    c = run.status.counters
    assert (c.lagged_replays, c.explicit_replays, c.drop_signals) == (1, 2, 0)
    assert run.status.open_gaps == [] and run.status.live_cursor == "10"


# --- unrecoverable gaps, status, details ----------------------------------------------------


async def test_unrecoverable_gap_is_counted_and_exported_as_metrics(
    env: WorkflowEnvironment, event_log: Stores, metrics: MetricBuffer
) -> None:
    steps = [
        Step(
            result=ReadResult(
                Outcome.DROP_SIGNAL,
                last_cursor="10",
                counts=counts(10),
                drop=COMMENT,
                gaps=gaps(view("g1", "2", end="11")),
            )
        ),
        # The history no longer reaches the gap: the store closed it, 7 events lost.
        Step(
            result=ReadResult(
                Outcome.DROPPED,
                start_cursor="1",
                last_cursor="15",
                counts=counts(5),
                gaps=gaps(unrecoverable=1, events_unrecoverable=7),
            )
        ),
    ]
    run = await run_stream(env, event_log, steps)
    c = run.status.counters
    assert (c.gaps_unrecoverable, c.events_unrecoverable, c.gaps_open) == (1, 7, 0)
    assert [r for r, _ in routes(run)] == [Route.LIVE, Route.LAGGED, Route.LIVE]
    assert run.status.open_gaps == []
    updates = list(metrics.retrieve_updates())
    by_name = {
        name: sum(
            u.value
            for u in updates
            if u.metric.name == name and u.attributes.get("stream") == run.spec.name
        )
        for name in (
            "durable_sse_gaps_unrecoverable",
            "durable_sse_events_unrecoverable",
            "durable_sse_lagged_replays",
        )
    }
    assert by_name == {
        "durable_sse_gaps_unrecoverable": 1,
        "durable_sse_events_unrecoverable": 7,
        "durable_sse_lagged_replays": 1,
    }


def test_workflow_metrics_export_unrecoverable_gaps() -> None:
    """``gaps_unrecoverable`` is a metric of its own, so alerts can see it."""
    buffer = MetricBuffer(1000)
    runtime = Runtime(telemetry=TelemetryConfig(metrics=buffer))
    recorded = WorkflowMetrics(runtime.metric_meter, "s1")
    recorded.gaps_unrecoverable.add(2)
    recorded.events_unrecoverable.add(9)
    updates = list(buffer.retrieve_updates())
    assert {(u.metric.name, u.attributes["stream"], u.value) for u in updates} == {
        ("durable_sse_gaps_unrecoverable", "s1", 2),
        ("durable_sse_events_unrecoverable", "s1", 9),
    }


async def test_status_shows_open_gaps_counters_and_details(
    env: WorkflowEnvironment, event_log: Stores, metrics: MetricBuffer
) -> None:
    seen: list[tuple[StreamStatus, str]] = []

    async def look_then_stop(handle: WorkflowHandle) -> None:
        status = await wait_for(handle, lambda s: s.route == "lagged" and s.state == "reading")
        seen.append((status, await details_of(handle)))
        await handle.signal(StreamWorkflow.pause)
        # Paused, and the cancelled connection's result folded in.
        status = await wait_for(
            handle, lambda s: s.state == "paused" and s.last_outcome == "cancelled"
        )
        seen.append((status, await details_of(handle)))
        await handle.signal(StreamWorkflow.stop)

    steps = [
        Step(
            result=ReadResult(
                Outcome.DROP_SIGNAL,
                last_cursor="10",
                counts=counts(10),
                drop=COMMENT,
                gaps=gaps(
                    view("g1", "5"),  # its end is not known yet
                    repaired=3,
                    unrecoverable=2,
                    events_unrecoverable=7,
                    unknown_size=1,
                    events_recovered=12,
                ),
            )
        ),
        Step(
            hold=True,
            cancelled=ReadResult(
                Outcome.CANCELLED,
                start_cursor="4",
                last_cursor="8",
                counts=counts(4, new=0),
                gaps=gaps(
                    view("g1", "5", resume="8"),
                    repaired=3,
                    unrecoverable=3,
                    events_unrecoverable=9,
                    unknown_size=1,
                    events_recovered=14,
                ),
            ),
        ),
    ]
    spec = new_spec()
    run = await run_stream(env, event_log, steps, spec=spec, during=look_then_stop)

    (repairing, repairing_details), (paused, paused_details) = seen
    # Repairing: the gap is open, its repair is running (not pending).
    assert [g.gap_id for g in repairing.open_gaps] == ["g1"]
    assert repairing.open_gaps[0].end_id is None and not repairing.repair_pending
    c = repairing.counters
    assert (c.gaps_open, c.gaps_repaired, c.gaps_unrecoverable) == (1, 3, 2)
    assert (c.events_unrecoverable, c.gaps_unknown_size, c.events_recovered) == (7, 1, 12)
    assert "route: lagged · live: `10` · lagging: `-`" in repairing_details
    assert "open gap after `5` before `-`" in repairing_details
    assert "repair resumes after `5`" in repairing_details
    assert "unrecoverable 2 (7 events, 1 of unknown size)" in repairing_details
    assert "None" not in repairing_details
    # Paused with the gap still open: the repair waits.
    assert paused.repair_pending and paused.open_gaps[0].resume_from == "8"
    c = paused.counters
    assert (c.gaps_unrecoverable, c.events_unrecoverable, c.events_recovered) == (3, 9, 14)
    assert "repair pending" in paused_details and "repair resumes after `8`" in paused_details
    assert "None" not in paused_details
    assert run.status.state == "stopped" and run.status.counters.gaps_open == 1
    assert metric_total(metrics, "durable_sse_gaps_unrecoverable", spec.name) == 3


async def test_details_render_none_as_a_dash_before_the_first_connection(
    env: WorkflowEnvironment, event_log: Stores
) -> None:
    seen: list[str] = []

    async def look_then_stop(handle: WorkflowHandle) -> None:
        await wait_for(handle, lambda s: s.state == "reading")
        seen.append(await details_of(handle))
        await handle.signal(StreamWorkflow.stop)

    run = await run_stream(env, event_log, [Step(hold=True)], during=look_then_stop)
    assert f"**{run.spec.name}**: reading" in seen[0]
    assert "route: live · live: `-` · lagging: `-`" in seen[0]
    assert "None" not in seen[0]


# --- states: refusals, 204, backoff, pause, stop ---------------------------------------------


async def test_no_content_stops_until_resumed(env: WorkflowEnvironment, event_log: Stores) -> None:
    seen: list[StreamStatus] = []

    async def resume_when_stopped(handle: WorkflowHandle) -> None:
        seen.append(await wait_for(handle, lambda s: s.state == "stopped-by-server"))
        await handle.signal(StreamWorkflow.resume)

    steps = [Step(result=ReadResult(Outcome.NO_CONTENT, status_code=204))]
    run = await run_stream(env, event_log, steps, during=resume_when_stopped)
    assert seen[0].last_outcome == "no_content"
    assert len(run.script.inputs) == 2 and run.status.state == "stopped"


async def test_refusal_parks_until_resumed(env: WorkflowEnvironment, event_log: Stores) -> None:
    seen: list[StreamStatus] = []

    async def resume_when_parked(handle: WorkflowHandle) -> None:
        seen.append(await wait_for(handle, lambda s: s.state == "parked"))
        await handle.signal(StreamWorkflow.resume)

    refusal = ApplicationError(
        "HTTP 401 from the server", type="StreamRefusedError", non_retryable=True
    )
    run = await run_stream(env, event_log, [Step(error=refusal)], during=resume_when_parked)
    assert "StreamRefusedError" in (seen[0].last_error or "")
    assert "401" in (seen[0].last_error or "")
    assert len(run.script.inputs) == 2  # no activity retry of a refusal
    assert run.status.state == "stopped"


async def test_an_attempt_failed_by_an_operator_reconnects_instead_of_parking(
    env: WorkflowEnvironment, event_log: Stores
) -> None:
    """``temporal activity fail`` on a read attempt (an operator unsticking a stream)
    fails it non-retryable with no type of ours: the stream reconnects, it does not park."""
    attempt: list[tuple[str, str]] = []

    async def note_attempt(_: ReadInput) -> None:
        info = activity.info()
        attempt.append((info.workflow_run_id, info.activity_id))

    async def fail_it_by_id(handle: WorkflowHandle) -> None:
        await wait_for(handle, lambda s: s.state == "reading" and bool(attempt))
        run_id, activity_id = attempt[0]
        by_id = env.client.get_async_activity_handle(
            workflow_id=handle.id, run_id=run_id, activity_id=activity_id
        )
        # What the CLI sends: its reason, non-retryable, no error type.
        await by_id.fail(ApplicationError("unstuck by an operator", non_retryable=True))
        status = await wait_for(
            handle, lambda s: s.counters.connections >= 2 or s.state == "parked"
        )
        assert status.state != "parked", status.last_error

    run = await run_stream(
        env, event_log, [Step(hold=True, probe=note_attempt)], during=fail_it_by_id
    )
    assert len(run.script.inputs) == 2  # the second connection is the script's STOP
    assert [r for r, _ in routes(run)] == [Route.LIVE, Route.LIVE]
    assert run.status.counters.failures == 1
    assert "unstuck by an operator" in (run.status.last_error or "")
    assert run.status.state == "stopped"


async def test_invalid_spec_parks_and_stop_completes(
    env: WorkflowEnvironment, event_log: Stores
) -> None:
    seen: list[StreamStatus] = []

    async def stop_when_parked(handle: WorkflowHandle) -> None:
        seen.append(await wait_for(handle, lambda s: s.state == "parked"))
        await handle.signal(StreamWorkflow.resume)  # cannot help: still parked
        seen.append(await handle.query(StreamWorkflow.status))
        await handle.signal(StreamWorkflow.stop)

    spec = new_spec(url="ftp://example.com/feed")
    run = await run_stream(env, event_log, [], spec=spec, during=stop_when_parked)
    assert "'url'" in (seen[0].last_error or "")
    assert seen[1].state == "parked"
    assert run.script.inputs == [] and run.schedules.ensured == []
    assert run.status.state == "stopped"


async def test_a_workflow_whose_id_names_another_stream_parks_and_touches_nothing(
    env: WorkflowEnvironment, event_log: Stores
) -> None:
    seen: list[StreamStatus] = []

    async def stop_when_parked(handle: WorkflowHandle) -> None:
        seen.append(await wait_for(handle, lambda s: s.state == "parked"))
        await handle.signal(StreamWorkflow.resume)  # cannot help: still parked
        seen.append(await handle.query(StreamWorkflow.status))
        await handle.signal(StreamWorkflow.stop)

    spec = new_spec()
    other = f"sse-stream:other-{uuid.uuid4().hex[:8]}"
    run = await run_stream(
        env, event_log, [], spec=spec, workflow_id=other, during=stop_when_parked
    )
    assert "is not the owner of stream" in (seen[0].last_error or "")
    assert seen[1].state == "parked"
    assert run.status.state == "stopped"
    # Nothing of the stream was touched: no schedule, no store read; only the namespace's
    # search attributes were listed (to show it parked in Temporal's lists).
    assert await activity_types(run.handle) == ["stream_state_attribute_registered"]
    assert run.script.inputs == [] and run.schedules.ensured == run.schedules.deleted == []
    assert await event_log.checkpoints.get_checkpoint(spec.name) is None


async def test_retry_later_waits_with_backoff(env: WorkflowEnvironment, event_log: Stores) -> None:
    steps = [
        Step(result=ReadResult(Outcome.RETRY_LATER, status_code=429, retry_after=30.0)),
        Step(result=ReadResult(Outcome.RETRY_LATER, status_code=503, error="HTTP 503")),
    ]
    run = await run_stream(env, event_log, steps)
    # The two reconnect timers come first; a third is the bound on deleting the checkpoint
    # schedule at the stop, when the skipped 30 s let the schedule's spread creation fire
    # (its jitter is the run's own: CI met it once).
    first, second = (await timers(run.handle))[:2]
    assert first == pytest.approx(30.0, abs=0.01)  # the server's Retry-After
    assert 1.0 <= second < 2.0  # two failures in a row: half to all of 2 s
    assert run.status.counters.failures == 2
    assert [r for r, _ in routes(run)] == [Route.LIVE, Route.LIVE, Route.LIVE]


async def test_a_servers_retry_of_years_waits_max_retry_delay_at_most(
    env: WorkflowEnvironment, event_log: Stores, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 24, item 6: the server sends ``retry: 99999999999`` and closes, twice."""
    caplog.set_level(logging.WARNING)
    huge = ReadResult(Outcome.DROPPED, retry_ms=99_999_999_999, error="the server ended the stream")
    shorter = dataclasses.replace(huge, retry_ms=50_000_000)
    default = await run_stream(env, event_log, [Step(result=huge), Step(result=shorter)])
    # Not 99,999,999 s: 5 minutes (a third timer bounds the schedule's deletion at stop).
    assert (await timers(default.handle))[:2] == [300.0, 300.0]
    assert default.status.retry_capped_from_ms == 50_000_000
    warned = [r.getMessage() for r in caplog.records if "retry:" in r.getMessage()]
    assert len(warned) == 1 and "99999999999 ms" in warned[0]  # once per run
    # The bound is the stream's setting; a retry within it is honoured as sent.
    spec = new_spec(max_retry_delay=20.0)
    healthy = dataclasses.replace(huge, retry_ms=1500, last_cursor="3", counts=counts(3))
    steps = [Step(result=huge), Step(result=healthy)]
    bounded = await run_stream(env, event_log, steps, spec=spec)
    assert (await timers(bounded.handle))[:2] == [20.0, 1.5]
    assert bounded.status.retry_capped_from_ms is None


async def test_pause_then_resume_resumes_live(env: WorkflowEnvironment, event_log: Stores) -> None:
    details: list[str] = []

    async def resume_when_paused(handle: WorkflowHandle) -> None:
        await wait_for(handle, lambda s: s.state == "paused")
        details.append(await details_of(handle))
        await handle.signal(StreamWorkflow.resume)

    steps = [
        Step(hold=True, signal="pause", cancelled=ReadResult(Outcome.CANCELLED, last_cursor="3"))
    ]
    run = await run_stream(env, event_log, steps, during=resume_when_paused)
    assert [r for r, _ in routes(run)] == [Route.LIVE, Route.LIVE]
    assert run.status.live_cursor == "3"
    assert f"**{run.spec.name}**: paused" in details[0]  # Web UI current details


@pytest.mark.parametrize("state", ["paused", "parked", "waiting"])
async def test_an_idle_run_continues_as_new_within_a_day(
    env: WorkflowEnvironment, event_log: Stores, state: str
) -> None:
    """No run pins its build forever (workflows/upgrade.py, RUN_MAX_AGE): a paused, parked
    or waiting run starts again after a day, still paused, parked or waiting."""
    steps, shown = STOP_IN_STATE[state]
    # Waiting: the server asks for two days; the wait goes on in the next run.
    if state == "waiting":
        steps = [Step(result=ReadResult(Outcome.RETRY_LATER, retry_after=2 * 86400.0))]

    async def stop_after_a_new_run(handle: WorkflowHandle) -> None:
        first = env.client.get_workflow_handle(handle.id, run_id=handle.first_execution_run_id)
        await wait_for(handle, lambda s: s.state == shown)
        await env.sleep(25 * 3600)  # the test server skips the day
        loop = asyncio.get_running_loop()
        deadline = loop.time() + POLL_LIMIT
        while (await first.describe()).status != WorkflowExecutionStatus.CONTINUED_AS_NEW:
            assert loop.time() < deadline, "the idle run never continued-as-new"
            await asyncio.sleep(0.1)
        latest = env.client.get_workflow_handle(handle.id)
        assert (await wait_for(latest, lambda s: s.state == shown)).state == shown
        await latest.signal(StreamWorkflow.stop)

    run = await run_stream(
        env,
        event_log,
        [*steps],
        state=StreamState(schedule_spread=0.0),
        during=stop_after_a_new_run,
    )
    assert run.status.state == "stopped"
    assert run.status.counters.connections == 1  # the new run did not reconnect


STOP_IN_STATE = {
    "reading": ([Step(hold=True)], "reading"),
    "paused": ([Step(hold=True, signal="pause")], "paused"),
    "parked": (
        [Step(error=ApplicationError("HTTP 410", type="StreamRefusedError", non_retryable=True))],
        "parked",
    ),
    "stopped-by-server": ([Step(result=ReadResult(Outcome.NO_CONTENT, status_code=204))], None),
    "waiting": ([Step(result=ReadResult(Outcome.RETRY_LATER, retry_after=3600.0))], "waiting"),
}


@pytest.mark.parametrize("state", [*STOP_IN_STATE, "store-failing"])
async def test_stop_ends_the_workflow_in_any_state(
    env: WorkflowEnvironment, event_log: Stores, state: str
) -> None:
    """Issue 15: ``stop`` ends a workflow in any state, also while a store activity
    fails for good (it is retried forever, but never past a stop)."""
    schedules = ScheduleStandIn(fail_ensure=state == "store-failing")
    steps, shown = STOP_IN_STATE.get(state, ([], None))
    shown = shown or state

    async def stop_in_state(handle: WorkflowHandle) -> None:
        if state == "store-failing":
            loop = asyncio.get_running_loop()
            deadline = loop.time() + POLL_LIMIT
            while len(schedules.ensured) < 2:  # failed, and retried
                assert loop.time() < deadline, "ensure_checkpoint_schedule never retried"
                await asyncio.sleep(0.05)
            assert (await handle.query(StreamWorkflow.status)).state == "connecting"
        else:
            await wait_for(handle, lambda s: s.state == shown)
        await handle.signal(StreamWorkflow.stop)

    # The schedule is created before the first connection only without the spread.
    failing = state == "store-failing"
    start = StreamState(schedule_spread=0.0) if failing else None
    run = await run_stream(
        env, event_log, steps, state=start, schedules=schedules, during=stop_in_state
    )
    assert run.status.state == "stopped"
    assert (await run.handle.describe()).status == WorkflowExecutionStatus.COMPLETED
    if failing:
        assert run.script.inputs == []  # it never got as far as reading
    else:
        assert len(run.script.inputs) == 1
    # Nothing was ensured (failing, or not due yet in the first window): nothing to delete.
    assert run.schedules.deleted == []


# --- continue-as-new, input, signal payloads --------------------------------------------------


async def test_continue_as_new_keeps_state_and_counters(
    env: WorkflowEnvironment, event_log: Stores
) -> None:
    g1 = view("g1", "1", end="6")
    steps = [
        Step(
            result=ReadResult(
                Outcome.DROP_SIGNAL,
                last_cursor="5",
                counts=counts(5),
                drop=COMMENT,
                gaps=gaps(g1),
            )
        ),
        # The repair, cut short by a disconnect.
        Step(
            result=ReadResult(
                Outcome.DROPPED,
                start_cursor="1",
                last_cursor="3",
                counts=counts(2, new=0),
                gaps=gaps(view("g1", "1", end="6", resume="3")),
            )
        ),
        # --- continue-as-new: the open gap and the cut repair carry over
        Step(
            result=ReadResult(
                Outcome.DROPPED,
                start_cursor="2",
                last_cursor="7",
                counts=counts(4, new=2),
                gaps=gaps(repaired=1, events_recovered=2),
            )
        ),
        Step(
            result=ReadResult(
                Outcome.DROPPED,
                last_cursor="8",
                counts=counts(1),
                gaps=gaps(repaired=1, events_recovered=2),
            )
        ),
        # --- continue-as-new
    ]
    start = StreamState(max_connections_per_run=2, schedule_spread=0.0)
    run = await run_stream(env, event_log, steps, state=start)
    assert routes(run) == [
        (Route.LIVE, None),
        (Route.LAGGED, None),
        (Route.LAGGED, None),  # resumed at once in the new run: not a new lagged reconnect
        (Route.LIVE, None),
        (Route.LIVE, None),
    ]
    assert run.script.inputs[2].known_gaps == ["g1"]
    assert [i.connection for i in run.script.inputs] == [1, 2, 3, 4, 5]
    c = run.status.counters
    assert (c.connections, c.events_persisted, c.events_recovered) == (5, 8, 2)
    assert (c.drop_signals, c.lagged_replays, c.gaps_repaired) == (1, 1, 1)
    assert run.status.live_cursor == "8"
    first = env.client.get_workflow_handle(run.handle.id, run_id=run.handle.first_execution_run_id)
    assert (await first.describe()).status == WorkflowExecutionStatus.CONTINUED_AS_NEW
    assert run.schedules.ensured == [run.spec.name]  # ensured once, not on every run


async def test_plain_json_input_starts_the_stream(
    env: WorkflowEnvironment, event_log: Stores
) -> None:
    spec = new_spec()
    raw = {"name": spec.name, "url": spec.url, "replay_window": "5m", "id_order": "numeric"}
    run = await run_stream(env, event_log, [], spec=spec, raw_input=raw)
    assert run.status.state == "stopped" and run.status.name == spec.name
    assert run.script.inputs[0].spec.replay_window == 300.0
    assert run.script.inputs[0].spec.id_order == "numeric"


async def test_unknown_setting_in_json_input_parks(
    env: WorkflowEnvironment, event_log: Stores
) -> None:
    seen: list[StreamStatus] = []

    async def stop_when_parked(handle: WorkflowHandle) -> None:
        seen.append(await wait_for(handle, lambda s: s.state == "parked"))
        await handle.signal(StreamWorkflow.stop)

    spec = new_spec()
    raw = {"name": spec.name, "url": spec.url, "replay_windw": 5}
    run = await run_stream(env, event_log, [], spec=spec, raw_input=raw, during=stop_when_parked)
    assert "replay_windw" in (seen[0].last_error or "")
    assert run.script.inputs == [] and run.status.state == "stopped"


async def test_replay_since_that_is_not_a_time_is_ignored_loudly(
    env: WorkflowEnvironment, event_log: Stores
) -> None:
    spec = new_spec()

    async def bad_replay(_: ReadInput) -> None:
        handle = env.client.get_workflow_handle(f"sse-stream:{spec.name}")
        await handle.signal("replay", ReplaySignal(since="yesterday"))

    steps = [
        Step(
            result=ReadResult(Outcome.DROPPED, last_cursor="4", counts=counts(4)), probe=bad_replay
        )
    ]
    run = await run_stream(env, event_log, steps, spec=spec)
    assert [r for r, _ in routes(run)] == [Route.LIVE, Route.LIVE]
    assert "yesterday" in (run.status.last_error or "")
    assert (run.status.counters.lagged_replays, run.status.counters.explicit_replays) == (0, 0)


BAD_INPUTS = [
    (
        {"replay_window": "99999999999d"},
        "setting 'replay_window' = '99999999999d': expected a duration between 1s and 30d",
    ),
    ({"replay_window": float("inf")}, "setting 'replay_window' = inf: expected a duration"),
    ({"headers_from_env": "TOKEN"}, "setting 'headers_from_env' = 'TOKEN': expected a table"),
    ({"headers_from_env": {"X": "DATABASE_URL"}}, "'headers_from_env.X' = 'DATABASE_URL'"),
    ({"drop_notice": "dropping"}, "setting 'drop_notice' = 'dropping': expected a list"),
    ({"mercure_last_event_id": "no"}, "'mercure_last_event_id' = 'no': expected true or false"),
    ({"name": None}, "stream (unnamed): setting 'name' is missing"),
]


@pytest.mark.parametrize(("changes", "fragment"), BAD_INPUTS)
@pytest.mark.parametrize("arity", [1, 2])
async def test_bad_json_input_parks_with_one_line_and_stop_ends_it(
    env: WorkflowEnvironment,
    event_log: Stores,
    changes: dict[str, Any],
    fragment: str,
    arity: int,
) -> None:
    """One argument (the plain Temporal CLI) or two (typed parameters applied by the SDK):
    the input is never validated by the data converter, so a bad one parks the stream
    instead of failing workflow tasks forever; nothing runs, and stop ends it."""
    seen: list[StreamStatus] = []

    async def stop_when_parked(handle: WorkflowHandle) -> None:
        seen.append(await wait_for(handle, lambda s: s.state == "parked"))
        await handle.signal(StreamWorkflow.stop)

    spec = new_spec()
    raw = {"name": spec.name, "url": spec.url, **changes}
    raw = {key: value for key, value in raw.items() if value is not None}
    run = await run_stream(
        env,
        event_log,
        [],
        spec=spec,
        raw_args=[raw] if arity == 1 else [raw, None],
        during=stop_when_parked,
    )
    error = seen[0].last_error or ""
    assert error.startswith("workflow input: stream ") and fragment in error
    assert "\n" not in error
    assert run.script.inputs == [] and run.schedules.ensured == [] and run.schedules.deleted == []
    assert run.status.state == "stopped"


BAD_REPLAYS = [
    ({"from_id": ""}, "replay 'from_id' = '': expected a non-empty event id"),
    ({"since": "yesterday"}, "replay 'since' = 'yesterday': expected an ISO 8601 time"),
    ({"since": "2026-05-01T12:00:00"}, "no time zone is assumed"),
    ({"form_id": "3"}, "replay 'form_id' = '3': expected only from_id or since"),
    ({"from_id": 3}, "replay 'from_id' = 3: expected a string"),
    ("yesterday", "replay payload = 'yesterday': expected nothing"),
]


async def test_bad_replay_payloads_are_refused_with_a_reason(
    env: WorkflowEnvironment, event_log: Stores
) -> None:
    spec = new_spec()
    reasons: list[str] = []

    async def send_bad_replays(handle: WorkflowHandle) -> None:
        await wait_for(handle, lambda s: s.state == "reading")
        previous: str | None = None
        for payload, _ in BAD_REPLAYS:  # each refusal reads differently from the last
            await handle.signal("replay", payload)
            status = await wait_for(handle, lambda s, before=previous: s.last_error != before)
            previous = status.last_error
            reasons.append(previous or "")
        await handle.signal(StreamWorkflow.stop)

    run = await run_stream(env, event_log, [Step(hold=True)], spec=spec, during=send_bad_replays)
    for reason, (_, fragment) in zip(reasons, BAD_REPLAYS, strict=True):
        assert reason.startswith(f"replay ignored: stream '{spec.name}': "), reason
        assert fragment in reason and "\n" not in reason
    assert routes(run) == [(Route.LIVE, None)]  # no replay started
    assert (run.status.counters.lagged_replays, run.status.counters.explicit_replays) == (0, 0)


# --- history budget -----------------------------------------------------------------------


async def test_a_connection_that_fills_the_runs_history_is_cut_to_continue_as_new(
    env: WorkflowEnvironment, event_log: Stores
) -> None:
    async def report_until_continued(handle: WorkflowHandle) -> None:
        await wait_for(handle, lambda s: s.state == "reading")
        latest = env.client.get_workflow_handle(handle.id)
        first = env.client.get_workflow_handle(handle.id, run_id=handle.first_execution_run_id)
        number = 0
        while len((await first.fetch_history()).events) < 60:
            number += 1
            await latest.signal(StreamWorkflow.retention, None)  # display only: a task each
        # The signals stop: the run continues-as-new.
        # (Polled by describe: the test server may time a query out while the new run's
        # first task is being handed over.)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + POLL_LIMIT
        while (await first.describe()).status != WorkflowExecutionStatus.CONTINUED_AS_NEW:
            assert loop.time() < deadline, "the run never continued-as-new"
            await asyncio.sleep(0.1)

    cancelled = ReadResult(Outcome.CANCELLED, last_cursor="3", counts=counts(3))
    run = await run_stream(
        env,
        event_log,
        [Step(hold=True, cancelled=cancelled), STOP],
        state=StreamState(max_history_events=60),
        during=report_until_continued,
    )
    assert routes(run) == [(Route.LIVE, None), (Route.LIVE, None)]
    assert [i.connection for i in run.script.inputs] == [1, 2]
    first = env.client.get_workflow_handle(run.handle.id, run_id=run.handle.first_execution_run_id)
    history = await first.fetch_history()
    # Cut at the budget, not long after: the cancel, the flushed result, a gap read and
    # the continue-as-new, and the signals that were on their way (a signal costs four
    # events, itself and a workflow task; on a loaded machine up to five more land
    # between the cut and the continue-as-new: CI saw 90 and 91 here).
    assert len(history.events) < 60 + 50
    assert run.status.counters.events_persisted == 3 and run.status.live_cursor == "3"
