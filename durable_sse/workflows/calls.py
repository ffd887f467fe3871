"""The activities ``StreamWorkflow`` calls, with their timeouts and retry policies.

Workflow code (it schedules activities), apart from the workflow so that the workflow
reads as its decisions: the reader's start and what its end means, the store activities
that a ``stop`` must never wait out, the nudge, the search attribute's check, and the
input's validation.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError, CancelledError

with workflow.unsafe.imports_passed_through():
    from durable_sse.config.replay import ReplaySignal
    from durable_sse.config.spec import StreamSpec, attempt_timeout, parse_spec
    from durable_sse.contracts import (
        STREAM_STATE_ATTRIBUTE,
        Outcome,
        ReadInput,
        ReadResult,
        SinceInput,
        StreamRef,
    )
    from durable_sse.errors import ConfigError
    from durable_sse.workflows.routes import StreamState

NON_RETRYABLE_ERRORS = ["StreamRefusedError", "ConfigError"]
READ_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    maximum_interval=timedelta(seconds=30),
    backoff_coefficient=2.0,
    maximum_attempts=0,
    non_retryable_error_types=NON_RETRYABLE_ERRORS,
)
STORE_TIMEOUT = timedelta(seconds=30)
STORE_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    maximum_interval=timedelta(seconds=30),
    maximum_attempts=0,
    non_retryable_error_types=["ConfigError"],
)
NUDGE_TIMEOUT = timedelta(seconds=10)
NUDGE_RETRY = RetryPolicy(maximum_attempts=1)
"""One try: a nudge only hurries a cancellation the reader's heartbeat also brings."""
ATTRIBUTE_CHECK_TIMEOUT = timedelta(seconds=60)
"""The check answers from the worker's last listing, and a listing is bounded by its own
RPC timeout (``activities.attributes.LISTING_TIMEOUT``): this only covers a worker so busy
starting connections that the check waits to run. At 10 s, 1,000 streams started at once
saw up to 311 checks time out twice, each such stream 21 s late and without the attribute
for its whole run."""
ATTRIBUTE_CHECK_RETRY = RetryPolicy(initial_interval=timedelta(seconds=1), maximum_attempts=2)
"""Two tries, then the run goes without the attribute (a namespace that refuses the
listing): never a hung stream."""


class StopRequested(Exception):
    """``stop`` arrived while the workflow waited on a store: end now."""


def start_read(spec: StreamSpec, read_input: ReadInput) -> workflow.ActivityHandle[ReadResult]:
    """One connection: a ``read_stream`` execution, its retries only for crashes."""
    return workflow.start_activity(
        "read_stream",
        read_input,
        result_type=ReadResult,
        start_to_close_timeout=attempt_timeout(spec),
        heartbeat_timeout=timedelta(seconds=spec.heartbeat_timeout),
        retry_policy=READ_RETRY,
        cancellation_type=workflow.ActivityCancellationType.WAIT_CANCELLATION_COMPLETED,
        summary=f"{read_input.route.value} #{read_input.connection}",
    )


def failed_read(error: ActivityError) -> tuple[ReadResult | None, str | None]:
    """What a reader that failed means: ``(result, refusal message)``. A refusal parks
    the stream (its message), a cancellation re-raised by the reader says nothing (the
    stores do), anything else is a failed attempt to back off from."""
    cause = error.cause
    if isinstance(cause, ApplicationError) and cause.type in NON_RETRYABLE_ERRORS:
        return None, f"{cause.type}: {cause.message}"
    if isinstance(cause, CancelledError):
        return None, None
    workflow.logger.warning("read_stream failed: %s", cause or error)
    return ReadResult(outcome=Outcome.RETRY_LATER, error=str(cause or error)), None


async def store(
    activity: str,
    arg: object,
    *,
    stopped: Callable[[], bool] | None,
    result_type: type | None = None,
) -> Any:
    """A store activity, retried until it succeeds, but never past a ``stop`` (when
    ``stopped`` is given): a store that fails for good (or a setting it refuses) must not
    keep the stream alive."""
    task = workflow.start_activity(
        activity,
        arg,
        result_type=result_type,
        start_to_close_timeout=STORE_TIMEOUT,
        retry_policy=STORE_RETRY,
    )
    if stopped is not None:
        await workflow.wait_condition(lambda: task.done() or stopped())
        if not task.done():
            task.cancel()
            raise StopRequested()
    return await task


async def resolve_since(state: StreamState, ref: StreamRef, *, stopped: Callable[[], bool]) -> None:
    """Turn a pending ``replay`` with ``since`` into one from the id stored then (None:
    nothing stored that early, the lagged route); a ``since`` the store refuses is
    dropped with its reason in ``last_error``."""
    signal = state.pending_replay
    if signal is None or signal.since is None or signal.from_id is not None:
        return
    try:
        from_id = await store(
            "resolve_since",
            SinceInput(stream=ref, since=signal.since),
            stopped=stopped,
            result_type=str,
        )
    except ActivityError as error:
        state.pending_replay = None
        state.last_error = f"replay since {signal.since!r} ignored: {error.cause or error}"
        workflow.logger.warning(state.last_error)
        return
    if from_id is None:
        workflow.logger.warning(
            "replay since %s: nothing persisted that early, taking the lagged route",
            signal.since,
        )
    state.pending_replay = ReplaySignal(from_id=from_id)


async def delete_schedule(ref: StreamRef) -> None:
    """Delete the stream's checkpoint schedule at its end; a failure is logged."""
    try:
        await asyncio.wait_for(
            store("delete_checkpoint_schedule", ref, stopped=None),
            timeout=STORE_TIMEOUT.total_seconds(),
        )
    except (ActivityError, TimeoutError) as error:
        workflow.logger.warning("could not delete the checkpoint schedule: %s", error)


def nudge_reader(ref: StreamRef) -> asyncio.Task[None]:
    """Make the cancellation just requested reach the reader now rather than at its
    next heartbeat (durable_sse/ops/nudge.py). Scheduled after the cancellation, in the
    same workflow task, so the server knows of it when the reader heartbeats. Not
    awaited here: a nudge that fails only leaves the cancellation to that heartbeat; a
    run awaits it before its last task, a continue-as-new or its end (its completion
    arriving during that task would have the server refuse the task, ``UnhandledCommand``).
    """

    async def nudge() -> None:
        try:
            await workflow.execute_activity(
                "nudge_reader",
                ref,
                result_type=int,
                schedule_to_close_timeout=NUDGE_TIMEOUT,
                retry_policy=NUDGE_RETRY,
            )
        except ActivityError as error:
            workflow.logger.debug("nudge not delivered: %s", error.cause or error)

    return asyncio.create_task(nudge())


async def attribute_registered() -> bool:
    """Whether the namespace has ``SseStreamState``: asked once per run."""
    try:
        return bool(
            await workflow.execute_activity(
                "stream_state_attribute_registered",
                result_type=bool,
                start_to_close_timeout=ATTRIBUTE_CHECK_TIMEOUT,
                retry_policy=ATTRIBUTE_CHECK_RETRY,
            )
        )
    except ActivityError as error:
        workflow.logger.warning(
            "%s is not set: cannot tell whether it is registered (%s)",
            STREAM_STATE_ATTRIBUTE,
            error.cause or error,
        )
        return False


def coerce_spec(spec: object) -> tuple[StreamSpec, ConfigError | None]:
    """The validated spec, or a placeholder and the one-line reason to park with.

    The input arrives raw (``spec`` is typed ``Any``): a dict from the plain Temporal
    CLI, from a client or from continue-as-new. ``parse_spec`` is its only validator and
    runs here, in workflow code, because a data converter that raised on a bad input
    would fail the workflow task forever instead of parking the stream.
    """
    try:
        return parse_spec(spec, source="workflow input"), None
    except ConfigError as error:
        name = spec.get("name") if isinstance(spec, dict) else None
        placeholder = StreamSpec(name=name if isinstance(name, str) else "?", url="")
        return placeholder, error
