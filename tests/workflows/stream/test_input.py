"""StreamWorkflow's input and payloads: continue-as-new keeps the state, plain JSON input,
bad inputs and replay payloads refused, the history budget. See helpers.py.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from temporalio.client import WorkflowExecutionStatus, WorkflowHandle
from temporalio.testing import WorkflowEnvironment

from durable_sse.config.replay import ReplaySignal
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
    STOP,
    Step,
    counts,
    drop_signal,
    dropped,
    gaps,
    new_spec,
    on_state,
    routes,
    run_stream,
    view,
    wait_for,
)


async def test_continue_as_new_keeps_state_and_counters(
    env: WorkflowEnvironment, event_log: Stores
) -> None:
    g1 = view("g1", "1", end="6")
    steps = [
        drop_signal("5", counts(5), gaps(g1)),
        # The repair, cut short by a disconnect.
        dropped("3", counts(2, new=0), gaps(view("g1", "1", end="6", resume="3")), start="1"),
        # --- continue-as-new: the open gap and the cut repair carry over
        dropped("7", counts(4, new=2), gaps(repaired=1, events_recovered=2), start="2"),
        dropped("8", counts(1), gaps(repaired=1, events_recovered=2)),
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
    stop_when_parked = on_state("parked", seen, "stop")
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

    steps = [dropped("4", counts(4), probe=bad_replay)]
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
    stop_when_parked = on_state("parked", seen, "stop")
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
