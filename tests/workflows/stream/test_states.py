"""StreamWorkflow's states: refusals, 204, backoff, a server's retry, pause, stop, an idle
run's continue-as-new. See helpers.py.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import uuid

import pytest
from temporalio import activity
from temporalio.client import WorkflowExecutionStatus, WorkflowHandle
from temporalio.exceptions import ApplicationError
from temporalio.testing import WorkflowEnvironment

from durable_sse.contracts import (
    Outcome,
    ReadInput,
    ReadResult,
    Route,
    StreamStatus,
)
from durable_sse.stores import Stores
from durable_sse.workflows.stream import StreamState, StreamWorkflow
from tests.workflows.stream.helpers import (
    POLL_LIMIT,
    ScheduleStandIn,
    Step,
    activity_types,
    counts,
    details_of,
    new_spec,
    on_state,
    read_until_cancelled,
    routes,
    run_stream,
    timers,
    wait_for,
)


async def test_no_content_stops_until_resumed(env: WorkflowEnvironment, event_log: Stores) -> None:
    seen: list[StreamStatus] = []
    resume_when_stopped = on_state("stopped-by-server", seen, "resume")
    steps = [Step(result=ReadResult(Outcome.NO_CONTENT, status_code=204))]
    run = await run_stream(env, event_log, steps, during=resume_when_stopped)
    assert seen[0].last_outcome == "no_content"
    assert len(run.script.inputs) == 2 and run.status.state == "stopped"


async def test_refusal_parks_until_resumed(env: WorkflowEnvironment, event_log: Stores) -> None:
    seen: list[StreamStatus] = []
    resume_when_parked = on_state("parked", seen, "resume")
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
    stop_when_parked = on_state("parked", seen, "resume", "stop")  # the resume cannot help
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
    stop_when_parked = on_state("parked", seen, "resume", "stop")  # the resume cannot help
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

    steps = [read_until_cancelled("3", signal="pause")]
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
