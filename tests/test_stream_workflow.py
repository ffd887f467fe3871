"""StreamWorkflow on the time-skipping test server.

``read_stream`` is a scripted stand-in (same activity name) that plays ReadResults or
keeps "reading" (heartbeating) until the workflow cancels it; the checkpoint activities
are the real ones on a real EventLog (SQLite in tmp_path). The time-skipping server has
no Schedules, so the two schedule activities are recording stand-ins here (the real ones
are tested against the dev server in test_checkpoint_workflow.py). The real reader is
tested end-to-end elsewhere.

Time skips only while no activity runs, so scenarios space connections with durable
timers (``retry_ms``/``retry_after``) and keep real waits to a few seconds.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from temporalio import activity
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowHandle
from temporalio.exceptions import ApplicationError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from activities.checkpoint import CheckpointActivities
from durable_sse.binaries import temporal_test_server
from durable_sse.contracts import (
    Outcome,
    ReadInput,
    ReadResult,
    ReplaySignal,
    Route,
    ScheduleInput,
    StreamRef,
    StreamStatus,
)
from durable_sse.eventlog import EventLog, EventRecord
from durable_sse.spec import StreamSpec
from workflows.checkpoint import CheckpointAdvanceWorkflow
from workflows.stream import StreamState, StreamWorkflow

POLL_LIMIT = 30.0
"""Safety bound on polling a query (a hang guard, not a timing assertion)."""


@dataclass
class Step:
    """One connection of the script."""

    result: ReadResult | None = None
    """Returned at once (unless ``hold``)."""
    hold: bool = False
    """Keep reading (heartbeating) until cancelled."""
    cancelled: ReadResult | None = None
    """Returned when cancelled while holding (default: a bare CANCELLED result)."""
    reraise: bool = False
    """Re-raise the cancellation instead of returning a result."""
    error: ApplicationError | None = None
    signal: str | None = None
    signal_arg: Any = None
    probe: Callable[[ReadInput], Awaitable[None]] | None = None
    """Runs inside the activity first (inspect the stores mid-scenario)."""


STOP = Step(hold=True, signal="stop")


@dataclass
class Script:
    client: Client
    steps: list[Step]
    inputs: list[ReadInput] = field(default_factory=list)
    times: list[datetime] = field(default_factory=list)
    env: WorkflowEnvironment | None = None

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
            return step.result
        try:
            while True:
                activity.heartbeat()
                await asyncio.sleep(0.1)
        except asyncio.CancelledError:
            if step.reraise:
                raise
            return step.cancelled or ReadResult(outcome=Outcome.CANCELLED, start_cursor=None)


@dataclass
class ScheduleStandIn:
    """Records schedule calls (the time-skipping server has no Schedules)."""

    ensured: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)

    @activity.defn(name="ensure_checkpoint_schedule")
    async def ensure(self, input: ScheduleInput) -> None:
        self.ensured.append(input.spec.name)

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
async def env() -> AsyncIterator[WorkflowEnvironment]:
    async with await WorkflowEnvironment.start_time_skipping(
        test_server_existing_path=temporal_test_server()
    ) as environment:
        yield environment


@pytest.fixture
async def event_log(tmp_path: Path) -> AsyncIterator[EventLog]:
    log = EventLog(f"sqlite:///{tmp_path / 'events.db'}")
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
    event_log: EventLog,
    steps: list[Step],
    *,
    spec: StreamSpec | None = None,
    state: StreamState | None = None,
    raw_input: dict[str, Any] | None = None,
    raw_args: list[Any] | None = None,
    during: Callable[[WorkflowHandle], Awaitable[None]] | None = None,
) -> Run:
    """Run a stream workflow over a script until it stops; return its final status."""
    spec = spec or new_spec()
    script = Script(env.client, list(steps), env=env)
    schedules = ScheduleStandIn()
    queue = f"tq-{uuid.uuid4().hex}"
    activities = [
        script.read_stream,
        schedules.ensure,
        schedules.delete,
        *CheckpointActivities(event_log).activities(),
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
            id=f"sse-stream:{spec.name}",
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


async def persist(event_log: EventLog, stream: str, ids: range, received_at: datetime) -> None:
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
    await event_log.insert_batch(stream, "numeric", records)


def routes(run: Run) -> list[tuple[Route, str | None]]:
    return [(Route(i.route), i.start_id) for i in run.script.inputs]


# --- scenarios ---------------------------------------------------------------------------


async def test_stop_completes_and_deletes_the_schedule(
    env: WorkflowEnvironment, event_log: EventLog
) -> None:
    run = await run_stream(env, event_log, [])
    assert run.status.state == "stopped"
    assert run.status.counters.connections == 1
    assert run.schedules.ensured == [run.spec.name]
    assert run.schedules.deleted == [run.spec.name]
    assert routes(run) == [(Route.LIVE, None)]


async def test_throttle_defers_the_second_drop_signal_and_then_takes_it(
    env: WorkflowEnvironment, event_log: EventLog
) -> None:
    observed: list[StreamStatus] = []

    async def look(_: ReadInput) -> None:
        handle = env.client.get_workflow_handle(f"sse-stream:{spec.name}")
        observed.append(await handle.query(StreamWorkflow.status))

    spec = new_spec()  # lagged_reconnect_interval = 60 s
    steps = [
        Step(result=ReadResult(Outcome.DROP_SIGNAL, last_cursor="10", drop_position="10")),
        Step(
            result=ReadResult(
                Outcome.DROPPED,
                start_cursor="5",
                last_cursor="12",
                events_read=7,
                passed_fence=True,
                retry_ms=10_000,
            )
        ),
        # 10 s after the first drop signal: a second one, inside the interval.
        Step(result=ReadResult(Outcome.DROP_SIGNAL, last_cursor="20", drop_position="20")),
        Step(result=ReadResult(Outcome.DROPPED, last_cursor="25", events_read=5, retry_ms=48_000)),
        # Live, until the interval allows the deferred lagged reconnect (~2 s real).
        Step(hold=True, probe=look, cancelled=ReadResult(Outcome.CANCELLED, last_cursor="26")),
        Step(
            result=ReadResult(
                Outcome.DROPPED,
                start_cursor="12",
                last_cursor="30",
                events_read=18,
                passed_fence=True,
            )
        ),
    ]
    run = await run_stream(env, event_log, steps, spec=spec)

    assert [r for r, _ in routes(run)] == [
        Route.LIVE,
        Route.LAGGED,
        Route.LIVE,
        Route.LIVE,
        Route.LIVE,
        Route.LAGGED,
        Route.LIVE,
    ]
    times = run.script.times
    assert times[2] - times[1] >= timedelta(seconds=10)
    assert times[5] - times[1] >= timedelta(seconds=60)  # at most one per interval
    assert observed[0].pending_lagged and observed[0].fence_id == "20"
    assert run.script.inputs[5].fence_id == "20"
    c = run.status.counters
    assert (c.drop_signals, c.lagged_replays, c.gaps_unrecoverable) == (2, 2, 0)
    assert not run.status.pending_lagged and run.status.fence_id is None
    assert run.status.live_cursor == "30"


async def test_fence_holds_during_a_replay_and_an_interrupted_replay_resumes(
    env: WorkflowEnvironment, event_log: EventLog
) -> None:
    spec = new_spec()
    now = datetime.now(UTC)
    await persist(event_log, spec.name, range(1, 6), now - timedelta(hours=2))
    await persist(event_log, spec.name, range(6, 11), now - timedelta(minutes=1))
    first = await event_log.advance_lagging(spec.name, "numeric", window=3600, now=now)
    assert first.lagging_id == "5"
    probes: list[tuple[str | None, str | None, bool]] = []

    async def fence_holds(_: ReadInput) -> None:
        checkpoint = await event_log.get_checkpoint(spec.name)
        advance = await event_log.advance_lagging(
            spec.name, "numeric", window=0, now=datetime.now(UTC)
        )
        probes.append(
            (checkpoint.fence_id if checkpoint else None, advance.lagging_id, advance.held_by_fence)
        )

    steps = [
        Step(
            result=ReadResult(
                Outcome.DROP_SIGNAL,
                last_cursor="10",
                drop_position="10",
                events_read=5,
                new_rows=5,
                dropped_estimate=3,
            )
        ),
        Step(
            probe=fence_holds,
            result=ReadResult(
                Outcome.DROPPED, start_cursor="5", last_cursor="7", events_read=2, recovered_rows=2
            ),
        ),
        Step(
            probe=fence_holds,
            result=ReadResult(
                Outcome.ROTATED,
                start_cursor="7",
                last_cursor="12",
                events_read=5,
                new_rows=3,
                recovered_rows=1,
                passed_fence=True,
            ),
        ),
        Step(probe=fence_holds, hold=True, signal="stop"),
    ]
    run = await run_stream(env, event_log, steps, spec=spec)

    assert routes(run) == [
        (Route.LIVE, None),
        (Route.LAGGED, None),
        (Route.EXPLICIT, "7"),  # resumes the replay's progress, not the live cursor "10"
        (Route.LIVE, None),
    ]
    assert [i.fence_id for i in run.script.inputs] == [None, "10", "10", None]
    assert probes[0] == ("10", "5", True)
    assert probes[1] == ("10", "5", True)
    assert probes[2][0] is None and probes[2][1] == "10"  # cleared, so the checkpoint moves
    c = run.status.counters
    assert (c.drop_signals, c.lagged_replays, c.events_recovered) == (1, 1, 3)
    assert c.events_persisted == 8 and c.gaps_unrecoverable == 0
    assert run.status.fence_id is None and run.status.live_cursor == "12"


async def test_unreachable_gap_is_counted_and_the_fence_cleared(
    env: WorkflowEnvironment, event_log: EventLog
) -> None:
    steps = [
        Step(
            result=ReadResult(
                Outcome.DROP_SIGNAL, last_cursor="10", drop_position="10", dropped_estimate=7
            )
        ),
        Step(
            result=ReadResult(Outcome.DROPPED, start_cursor=None, last_cursor="15", events_read=5)
        ),
    ]
    run = await run_stream(env, event_log, steps)
    c = run.status.counters
    assert (c.gaps_unrecoverable, c.events_unrecoverable) == (1, 7)
    checkpoint = await event_log.get_checkpoint(run.spec.name)
    assert checkpoint is not None and checkpoint.fence_id is None
    assert run.status.fence_id is None
    assert [r for r, _ in routes(run)] == [Route.LIVE, Route.LAGGED, Route.LIVE]


async def test_no_content_stops_until_resumed(
    env: WorkflowEnvironment, event_log: EventLog
) -> None:
    seen: list[StreamStatus] = []

    async def resume_when_stopped(handle: WorkflowHandle) -> None:
        seen.append(await wait_for(handle, lambda s: s.state == "stopped-by-server"))
        await handle.signal(StreamWorkflow.resume)

    steps = [Step(result=ReadResult(Outcome.NO_CONTENT, status_code=204))]
    run = await run_stream(env, event_log, steps, during=resume_when_stopped)
    assert seen[0].last_outcome == "no_content"
    assert len(run.script.inputs) == 2 and run.status.state == "stopped"


async def test_refusal_parks_until_resumed(env: WorkflowEnvironment, event_log: EventLog) -> None:
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


async def test_invalid_spec_parks_and_stop_completes(
    env: WorkflowEnvironment, event_log: EventLog
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


async def test_retry_later_waits_with_backoff(
    env: WorkflowEnvironment, event_log: EventLog
) -> None:
    steps = [
        Step(result=ReadResult(Outcome.RETRY_LATER, status_code=429, retry_after=30.0)),
        Step(result=ReadResult(Outcome.RETRY_LATER, status_code=503)),
    ]
    run = await run_stream(env, event_log, steps)
    times = run.script.times
    assert times[1] - times[0] >= timedelta(seconds=30)
    assert times[2] - times[1] >= timedelta(seconds=1)  # two failures: at least half of 2 s
    assert run.status.counters.failures == 2


async def test_replay_signal_variants(env: WorkflowEnvironment, event_log: EventLog) -> None:
    spec = new_spec()
    now = datetime.now(UTC)
    await persist(event_log, spec.name, range(1, 6), now - timedelta(hours=2))
    await persist(event_log, spec.name, range(6, 11), now - timedelta(minutes=10))
    since = (now - timedelta(hours=1)).isoformat()
    read_ten = ReadResult(Outcome.CANCELLED, last_cursor="10", events_read=10, new_rows=10)

    steps = [
        # replay with no arguments: lagged route fenced at the live cursor
        Step(hold=True, signal="replay", cancelled=read_ten),
        Step(
            result=ReadResult(
                Outcome.DROPPED,
                start_cursor="3",
                last_cursor="10",
                events_read=7,
                passed_fence=True,
            )
        ),
        # from_id, with a reader that re-raises the cancellation (ActivityError path)
        Step(hold=True, signal="replay", signal_arg=ReplaySignal(from_id="4"), reraise=True),
        Step(
            result=ReadResult(
                Outcome.ROTATED,
                start_cursor="4",
                last_cursor="10",
                events_read=6,
                passed_fence=True,
            )
        ),
        # since: resolved to the newest id persisted at or before it
        Step(hold=True, signal="replay", signal_arg=ReplaySignal(since=since)),
        Step(
            result=ReadResult(
                Outcome.DROPPED,
                start_cursor="5",
                last_cursor="10",
                events_read=5,
                passed_fence=True,
            )
        ),
    ]
    run = await run_stream(env, event_log, steps, spec=spec)
    assert routes(run) == [
        (Route.LIVE, None),
        (Route.LAGGED, None),
        (Route.LIVE, None),
        (Route.EXPLICIT, "4"),
        (Route.LIVE, None),
        (Route.EXPLICIT, "5"),
        (Route.LIVE, None),
    ]
    assert [i.fence_id for i in run.script.inputs] == [None, "10", None, "10", None, "10", None]
    assert run.status.counters.lagged_replays == 3
    assert run.status.fence_id is None


async def test_pause_then_resume_resumes_live(
    env: WorkflowEnvironment, event_log: EventLog
) -> None:
    details: list[str] = []

    async def resume_when_paused(handle: WorkflowHandle) -> None:
        await wait_for(handle, lambda s: s.state == "paused")
        metadata = await handle.query("__temporal_workflow_metadata")
        details.append(str(metadata.current_details))
        await handle.signal(StreamWorkflow.resume)

    steps = [
        Step(hold=True, signal="pause", cancelled=ReadResult(Outcome.CANCELLED, last_cursor="3"))
    ]
    run = await run_stream(env, event_log, steps, during=resume_when_paused)
    assert [r for r, _ in routes(run)] == [Route.LIVE, Route.LIVE]
    assert run.status.live_cursor == "3"
    assert f"**{run.spec.name}**: paused" in details[0]  # Web UI current details


async def test_continue_as_new_keeps_state_and_counters(
    env: WorkflowEnvironment, event_log: EventLog
) -> None:
    steps = [
        Step(result=ReadResult(Outcome.DROPPED, last_cursor="3", events_read=3, new_rows=3)),
        Step(
            result=ReadResult(
                Outcome.DROP_SIGNAL, last_cursor="5", drop_position="5", events_read=2, new_rows=2
            )
        ),
        # --- continue-as-new: the pending lagged reconnect and the fence carry over
        Step(
            result=ReadResult(
                Outcome.DROPPED, start_cursor="1", last_cursor="4", events_read=3, recovered_rows=2
            )
        ),
        Step(
            result=ReadResult(
                Outcome.DROPPED,
                start_cursor="4",
                last_cursor="6",
                events_read=2,
                new_rows=1,
                passed_fence=True,
            )
        ),
        # --- continue-as-new
    ]
    run = await run_stream(env, event_log, steps, state=StreamState(max_connections_per_run=2))
    assert routes(run) == [
        (Route.LIVE, None),
        (Route.LIVE, None),
        (Route.LAGGED, None),
        (Route.EXPLICIT, "4"),
        (Route.LIVE, None),
    ]
    assert run.script.inputs[3].fence_id == "5"
    assert [i.connection for i in run.script.inputs] == [1, 2, 3, 4, 5]
    c = run.status.counters
    assert (c.connections, c.events_persisted, c.events_recovered) == (5, 6, 2)
    assert (c.drop_signals, c.lagged_replays) == (1, 1)
    assert run.status.live_cursor == "6"
    first = env.client.get_workflow_handle(run.handle.id, run_id=run.handle.first_execution_run_id)
    assert (await first.describe()).status == WorkflowExecutionStatus.CONTINUED_AS_NEW
    assert run.schedules.ensured == [run.spec.name]  # ensured once, not on every run


async def test_plain_json_input_starts_the_stream(
    env: WorkflowEnvironment, event_log: EventLog
) -> None:
    spec = new_spec()
    raw = {"name": spec.name, "url": spec.url, "replay_window": "5m", "id_order": "numeric"}
    run = await run_stream(env, event_log, [], spec=spec, raw_input=raw)
    assert run.status.state == "stopped" and run.status.name == spec.name
    assert run.script.inputs[0].spec.replay_window == 300.0
    assert run.script.inputs[0].spec.id_order == "numeric"


async def test_unknown_setting_in_json_input_parks(
    env: WorkflowEnvironment, event_log: EventLog
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
    env: WorkflowEnvironment, event_log: EventLog
) -> None:
    spec = new_spec()

    async def bad_replay(_: ReadInput) -> None:
        handle = env.client.get_workflow_handle(f"sse-stream:{spec.name}")
        await handle.signal("replay", ReplaySignal(since="yesterday"))

    steps = [
        Step(result=ReadResult(Outcome.DROPPED, last_cursor="4", events_read=4), probe=bad_replay)
    ]
    run = await run_stream(env, event_log, steps, spec=spec)
    assert [r for r, _ in routes(run)] == [Route.LIVE, Route.LIVE]
    assert "yesterday" in (run.status.last_error or "")
    assert run.status.counters.lagged_replays == 0


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
    event_log: EventLog,
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
    env: WorkflowEnvironment, event_log: EventLog
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
    assert run.status.counters.lagged_replays == 0
