"""StreamWorkflow's scenarios on the time-skipping test server: the script, the stand-ins, the run.

``read_stream`` is a scripted stand-in (same activity name) that plays ReadResults or
keeps "reading" (heartbeating) until the workflow cancels it; the checkpoint activities
(``stream_gaps``, ``resolve_since``) are the real ones on a real Stores (SQLite in
tmp_path), so a scenario can write real gap records that the workflow reads back when a
connection's result is lost. The time-skipping server has no Schedules, so the two
schedule activities are recording stand-ins here (the real ones are tested against the
dev server in tests/workflows/test_checkpoint_workflow.py). The real reader is tested
end-to-end elsewhere.

Time skips only while no activity runs, so scenarios space connections with durable
timers (``retry_ms``/``retry_after``) and keep real waits to a few seconds. Clock
differences below are read from the test server's clock (durable timers), never from
the wall.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from functools import partial
from typing import Any

from temporalio import activity
from temporalio.client import Client, WorkflowHandle
from temporalio.exceptions import ApplicationError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from durable_sse.activities.attributes import SearchAttributeActivities
from durable_sse.activities.checkpoint import CheckpointActivities
from durable_sse.config.spec import StreamSpec
from durable_sse.contracts import (
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
from durable_sse.gaps.model import GapSummary, GapTotals, GapView
from durable_sse.stores import Stores
from durable_sse.workflows.checkpoint import CheckpointAdvanceWorkflow
from durable_sse.workflows.stream import SCHEDULE_TIMER_SUMMARY, StreamState, StreamWorkflow
from tests.workflows import route_helpers

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
    nudge_seconds: float = 0.0
    """How long each nudge takes (real time)."""

    @activity.defn(name="nudge_reader")
    async def nudge_reader(self, input: StreamRef) -> int:
        self.nudged.append(input.name)
        await asyncio.sleep(self.nudge_seconds)
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
    nudge_seconds: float = 0.0,
) -> Run:
    """Run a stream workflow over a script until it stops; return its final status."""
    spec = spec or new_spec()
    script = Script(env.client, list(steps), event_log, env=env, nudge_seconds=nudge_seconds)
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


def on_state(
    state: str, seen: list[StreamStatus], *signals: str
) -> Callable[[WorkflowHandle], Awaitable[None]]:
    """A ``during`` for ``run_stream``: wait until the status says ``state`` and keep it in
    ``seen``, then send ``signals`` in turn, keeping the status after each but the last."""

    async def during(handle: WorkflowHandle) -> None:
        seen.append(await wait_for(handle, lambda s: s.state == state))
        for index, name in enumerate(signals):
            await handle.signal(name)
            if index < len(signals) - 1:
                seen.append(await handle.query(StreamWorkflow.status))

    return during


async def details_of(handle: WorkflowHandle) -> str:
    """The Web UI's current details (markdown)."""
    metadata = await handle.query("__temporal_workflow_metadata")
    return str(metadata.current_details)


def view(gap_id: str, start: str, *, end: str | None = None, resume: str | None = None) -> GapView:
    return route_helpers.view(gap_id, start, end, resume, seen_at=SEEN_AT)


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


def drop_signal(last_cursor: str, read: ReadCounts, summary: GapSummary) -> Step:
    """A connection that ends on a drop notice (the comment) at ``last_cursor``, having read
    ``read``, with the store's gap summary ``summary``."""
    return Step(
        result=ReadResult(
            Outcome.DROP_SIGNAL,
            last_cursor=last_cursor,
            counts=read,
            drop=COMMENT,
            gaps=summary,
        )
    )


def connection(
    outcome: Outcome,
    last_cursor: str | None,
    read: ReadCounts | None = None,
    summary: GapSummary | None = None,
    *,
    start: str | None = None,
    error: str | None = None,
    retry_ms: int | None = None,
    **step: Any,
) -> Step:
    """A connection from ``start`` that ends with ``outcome`` at ``last_cursor``, having
    read ``read``, with the store's gap summary ``summary``; ``step`` adds to the step (a
    probe, ``store_gaps``, a signal). A CANCELLED one keeps reading until the workflow
    cancels it."""
    result = ReadResult(
        outcome,
        start_cursor=start,
        last_cursor=last_cursor,
        counts=read or ReadCounts(),
        gaps=summary,
        error=error,
        retry_ms=retry_ms,
    )
    if outcome is Outcome.CANCELLED:
        return Step(hold=True, cancelled=result, **step)
    return Step(result=result, **step)


dropped = partial(connection, Outcome.DROPPED)
"""A connection that the server ends (a disconnect)."""
rotated = partial(connection, Outcome.ROTATED)
"""A connection that the reader ends by itself (a rotation, a repair whose gaps closed)."""
read_until_cancelled = partial(connection, Outcome.CANCELLED)
"""A connection that keeps reading until the workflow cancels it."""
