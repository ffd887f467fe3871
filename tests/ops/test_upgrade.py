"""Worker Versioning without a server: the version a worker polls as, when a run
continues-as-new, when the new version's workers wake the streams, what the status shows.

The two builds on a real dev server are tests/system/test_versioning.py.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from durable_sse.config.deployment import (
    BUILD_ID_ENV,
    DEPLOYMENT_NAME_ENV,
    DeploymentVersion,
    parse_deployment,
)
from durable_sse.config.settings import Settings
from durable_sse.config.spec import StreamSpec
from durable_sse.contracts import StreamStatus
from durable_sse.errors import ConfigError
from durable_sse.ops.upgrade import Routing, stragglers_query
from durable_sse.workflows.routes import StreamState
from durable_sse.workflows.status import render_details, stream_status
from durable_sse.workflows.upgrade import (
    CONNECTIONS_SPENT,
    HISTORY_FULL,
    RUN_AGED,
    RUN_MAX_AGE,
    TARGET_CHANGED,
    RunBudget,
    bounded_wait,
    continue_reason,
)

V1 = DeploymentVersion("durable-sse", "v1")
START = datetime(2026, 1, 1, tzinfo=UTC)


# --- the version a worker polls as ------------------------------------------------------


def test_both_names_make_a_versioned_worker_and_neither_an_unversioned_one() -> None:
    env = {DEPLOYMENT_NAME_ENV: " durable-sse ", BUILD_ID_ENV: "v1"}
    assert parse_deployment(env) == V1
    assert str(V1) == "durable-sse:v1"  # as Temporal writes TemporalWorkerDeploymentVersion
    assert parse_deployment({}) is None
    assert Settings.from_env(env).deployment == V1
    assert Settings.from_env({}).deployment is None


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({DEPLOYMENT_NAME_ENV: "durable-sse"}, f"{BUILD_ID_ENV} is not: set both"),
        ({BUILD_ID_ENV: "v1"}, f"{DEPLOYMENT_NAME_ENV} is not: set both"),
        ({DEPLOYMENT_NAME_ENV: " ", BUILD_ID_ENV: "v1"}, f"{DEPLOYMENT_NAME_ENV} is set but empty"),
        ({DEPLOYMENT_NAME_ENV: "a.b", BUILD_ID_ENV: "v1"}, "must not contain '.' or ':'"),
        ({DEPLOYMENT_NAME_ENV: "sse", BUILD_ID_ENV: "v 1"}, "without spaces"),
        ({DEPLOYMENT_NAME_ENV: "sse", BUILD_ID_ENV: "x" * 256}, "at most 255 bytes"),
    ],
)
def test_a_bad_or_half_given_pair_is_one_line(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError) as refused:
        Settings.from_env(env)
    assert message in str(refused.value) and "\n" not in str(refused.value)


# --- when a run continues-as-new --------------------------------------------------------


def budget(**overrides: object) -> RunBudget:
    values: dict[str, object] = {
        "target_changed": False,
        "age": 60.0,
        "history_full": False,
        "connections": 3,
        "max_connections": 200,
    }
    values.update(overrides)
    return RunBudget(**values)  # type: ignore[arg-type]


def test_a_run_goes_on_until_a_reason_comes_and_the_new_version_comes_first() -> None:
    assert continue_reason(budget()) is None
    assert continue_reason(budget(age=RUN_MAX_AGE)) == RUN_AGED
    assert continue_reason(budget(history_full=True)) == HISTORY_FULL
    assert continue_reason(budget(connections=200)) == CONNECTIONS_SPENT
    everything = budget(target_changed=True, age=RUN_MAX_AGE, history_full=True, connections=200)
    assert continue_reason(everything) == TARGET_CHANGED


def test_no_idle_wait_outlives_the_day_a_run_may_last() -> None:
    an_hour_in = START + timedelta(hours=1)
    assert bounded_wait(None, START, an_hour_in) == RUN_MAX_AGE - 3600
    assert bounded_wait(30.0, START, an_hour_in) == 30.0
    assert bounded_wait(30.0, START, START + timedelta(seconds=RUN_MAX_AGE - 10)) == 10.0
    assert bounded_wait(None, START, START + timedelta(days=2)) == 0.0


# --- when the new version's workers wake the streams -----------------------------------


def test_a_version_wakes_the_streams_when_it_is_current_or_ramping() -> None:
    assert Routing(current="durable-sse:v1", ramping=None).targets(V1)
    assert not Routing(current="durable-sse:v0", ramping=None).targets(V1)
    assert Routing(current="durable-sse:v0", ramping="durable-sse:v1", ramp_percentage=10).targets(
        V1
    )
    assert not Routing(current="durable-sse:v0", ramping="durable-sse:v1").targets(V1)
    assert not Routing(current=None, ramping=None).targets(V1)


def test_the_stragglers_are_the_running_streams_of_the_queue_on_another_version() -> None:
    query = stragglers_query(V1, "sse-consumer")
    assert "WorkflowType = 'StreamWorkflow'" in query
    assert "ExecutionStatus = 'Running'" in query and "TaskQueue = 'sse-consumer'" in query
    assert "TemporalWorkerDeploymentVersion != 'durable-sse:v1'" in query
    assert "TemporalWorkerDeploymentVersion IS NULL" in query  # started unversioned


# --- what the workflow shows --------------------------------------------------------------


def test_the_status_is_a_copy_and_the_details_render_it() -> None:
    spec = StreamSpec(name="s1", url="http://127.0.0.1:9/e", id_order="numeric")
    state = StreamState(live_cursor="20", paused=True, last_error="boom")
    status = stream_status(
        spec, state, connected=False, waiting=False, repairing=False, running=None
    )
    assert isinstance(status, StreamStatus)
    assert (status.state, status.live_cursor, status.id_order) == ("paused", "20", "numeric")
    status.counters.connections = 99
    assert state.counters.connections == 0
    details = render_details(status, max_retry_delay=300.0)
    assert details.startswith("**s1**: paused")
    assert "live: `20` · lagging: `-`" in details and "last error: boom" in details
