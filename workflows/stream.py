"""``StreamWorkflow``: one long-lived workflow per SSE stream.

Each connection is a *new* ``read_stream`` activity execution; when it ends, the pure
decisions in :mod:`workflows.routes` say where the next one resumes (live, lagged, or
an explicit replay cursor) and how long to wait. The activity's retry policy is only for
crashes and infrastructure, never for an ordinary reconnect. Signals (``replay``,
``pause``, ``resume``, ``stop``) cancel the running connection; the reader flushes its
batch and returns, and the workflow acts once it has.

The server can never fail this workflow: refusals park it, ``204`` stops it until
resumed, everything else backs off and reconnects.
"""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.converter import value_to_type
from temporalio.exceptions import ActivityError, ApplicationError, CancelledError

with workflow.unsafe.imports_passed_through():
    from durable_sse.contracts import (
        CheckpointState,
        FenceInput,
        Outcome,
        ReadInput,
        ReadResult,
        ReplaySignal,
        ScheduleInput,
        SinceInput,
        StreamRef,
        StreamStatus,
    )
    from durable_sse.errors import ConfigError
    from durable_sse.legacy_spec import pre_strict_spec
    from durable_sse.metrics import WorkflowMetrics
    from durable_sse.ownership import require_stream_owner
    from durable_sse.spec import StreamSpec, parse_replay_signal, parse_spec
    from workflows.routes import (
        HOLD_PARKED,
        ConnectionPlan,
        StreamState,
        display_state,
        lagged_allowed,
        plan_connection,
        record_result,
        seconds_until_lagged,
    )

__all__ = ["StreamState", "StreamWorkflow"]

NON_RETRYABLE_ERRORS = ["StreamRefusedError", "ConfigError"]
READ_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    maximum_interval=timedelta(seconds=30),
    backoff_coefficient=2.0,
    maximum_attempts=0,
    non_retryable_error_types=NON_RETRYABLE_ERRORS,
)
READ_HEARTBEAT_TIMEOUT = timedelta(seconds=10)
READ_MARGIN = timedelta(seconds=60)
STORE_TIMEOUT = timedelta(seconds=30)
STORE_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    maximum_interval=timedelta(seconds=30),
    maximum_attempts=0,
    non_retryable_error_types=["ConfigError"],
)


@workflow.defn
class StreamWorkflow:
    @workflow.init
    def __init__(self, spec: Any, state: StreamState | None = None) -> None:
        self._spec, self._spec_error = _coerce_spec(spec)
        if isinstance(state, dict):
            state = value_to_type(StreamState, state)
        self._fresh = state is None
        self._state = state if state is not None else StreamState()
        self._connected = False
        self._waiting = False
        self._invalid = False

    @workflow.run
    async def run(self, spec: Any, state: StreamState | None = None) -> StreamStatus:
        s = self._state
        spec = self._spec
        try:
            if self._spec_error is not None:
                raise self._spec_error
            require_stream_owner(workflow.info().workflow_id, spec.name)
        except ConfigError as error:
            self._invalid = True
            s.hold = HOLD_PARKED
            s.last_error = str(error)
            workflow.logger.warning("stream spec is invalid, parked: %s", error)
            self._publish()
            await workflow.wait_condition(lambda: s.stop_requested)
            return await self._finish(delete_schedule=False)

        if not s.schedule_ensured:
            await self._store("ensure_checkpoint_schedule", ScheduleInput(spec=spec))
            s.schedule_ensured = True
        await self._refresh_checkpoint(adopt_fence=self._fresh)

        run_connections = 0
        while True:
            self._publish()
            if s.stop_requested:
                break
            if s.paused or s.hold is not None:
                await workflow.wait_condition(
                    lambda: s.stop_requested or not (s.paused or s.hold is not None)
                )
                continue
            if await self._wait_for_reconnect():
                continue
            if (
                run_connections >= s.max_connections_per_run
                or workflow.info().is_continue_as_new_suggested()
            ):
                await workflow.wait_condition(workflow.all_handlers_finished)
                workflow.logger.info(
                    "continuing as new after %d connections", s.counters.connections
                )
                workflow.continue_as_new(args=[spec, s])
            await self._resolve_since()
            plan = plan_connection(
                s,
                now=workflow.now(),
                interval=spec.lagged_reconnect_interval,
                id_order=spec.id_order,
            )
            if plan.replay_started:
                workflow.logger.info(
                    "replay started: route %s from %r, fence %r",
                    plan.route.value,
                    plan.start_id,
                    s.fence_id,
                )
            if plan.persist_fence is not None:
                await self._set_fence(plan.persist_fence)
            run_connections += 1
            await self._connection(plan)

        return await self._finish(delete_schedule=True)

    # --- signals and query -------------------------------------------------------------

    @workflow.signal
    def replay(self, signal: Any = None) -> None:
        """Re-read: nothing = lagged route; ``from_id`` or ``since`` = from there.

        The payload arrives raw and is validated here: a bad one is refused with its
        reason in ``last_error``, never dropped unseen by the data converter.
        """
        try:
            request = parse_replay_signal(signal, stream=self._spec.name)
        except ConfigError as error:
            self._state.last_error = f"replay ignored: {error}"
            workflow.logger.warning(self._state.last_error)
            self._publish()
            return
        self._state.pending_replay = request
        workflow.logger.info("replay requested: %s", self._state.pending_replay)
        self._publish()

    @workflow.signal
    def pause(self) -> None:
        self._state.paused = True
        self._publish()

    @workflow.signal
    def resume(self) -> None:
        s = self._state
        if self._invalid:
            workflow.logger.warning("resume ignored: the stream spec is invalid (%s)", s.last_error)
            return
        s.paused = False
        s.hold = None
        s.failures = 0
        s.next_reconnect_at = None
        self._publish()

    @workflow.signal
    def stop(self) -> None:
        self._state.stop_requested = True
        self._publish()

    @workflow.query
    def status(self) -> StreamStatus:
        s = self._state
        return StreamStatus(
            name=self._spec.name,
            state=display_state(s, connected=self._connected, waiting=self._waiting),
            route=s.route,
            live_cursor=s.live_cursor,
            lagging_id=s.lagging_id,
            fence_id=s.fence_id,
            counters=s.counters,
            last_outcome=s.last_outcome,
            last_error=s.last_error,
            next_reconnect_at=s.next_reconnect_at,
            pending_lagged=s.pending_lagged,
        )

    # --- one connection ----------------------------------------------------------------

    async def _connection(self, plan: ConnectionPlan) -> None:
        """Run one ``read_stream`` execution and fold its outcome into the state."""
        spec, s = self._spec, self._state
        s.route = plan.route.value
        s.counters.connections += 1
        metrics = WorkflowMetrics(workflow.metric_meter(), spec.name)
        metrics.reconnect(plan.route.value)
        if plan.replay_started:
            metrics.lagged_replays.add(1)
        unrecoverable_before = s.counters.events_unrecoverable
        read_input = ReadInput(
            spec=spec,
            route=plan.route,
            start_id=plan.start_id,
            fence_id=plan.fence_id if plan.replay else None,
            connection=s.counters.connections,
        )
        started = workflow.now()
        result, refused = await self._read(read_input)
        duration = (workflow.now() - started).total_seconds()
        decision = record_result(
            s,
            plan,
            result,
            id_order=spec.id_order,
            jitter=workflow.random().random(),
            duration=duration,
            refused=refused,
        )
        if refused is not None:
            workflow.logger.warning("stream refused, parked until resumed: %s", refused)
        elif result is not None and result.outcome == Outcome.NO_CONTENT:
            workflow.logger.info("server answered 204: stopped until resumed")
        if s.counters.events_unrecoverable > unrecoverable_before:
            metrics.events_unrecoverable.add(s.counters.events_unrecoverable - unrecoverable_before)
        if decision.unrecoverable:
            workflow.logger.warning(
                "UNRECOVERABLE GAP on stream %s: the replay cannot reach back before the "
                "fence %r (start cursor %r); about %s events lost (%d gaps so far)",
                spec.name,
                decision.clear_fence,
                result.start_cursor if result else None,
                s.counters.events_unrecoverable,
                s.counters.gaps_unrecoverable,
            )
        if decision.clear_fence is not None:
            await self._store(
                "clear_fence",
                FenceInput(stream=self._ref(), fence_id=decision.clear_fence),
                result_type=bool,
            )
            if decision.replay_finished and not decision.unrecoverable:
                workflow.logger.info(
                    "replay passed the fence %r: gap repaired", decision.clear_fence
                )
        if decision.persist_fence is not None:
            await self._set_fence(decision.persist_fence)
        if decision.clear_fence is not None:
            await self._refresh_checkpoint(adopt_fence=False)
        if decision.delay > 0:
            s.next_reconnect_at = (workflow.now() + timedelta(seconds=decision.delay)).isoformat()

    async def _read(self, read_input: ReadInput) -> tuple[ReadResult | None, str | None]:
        """Run the reader until it ends or a signal/throttle timer needs it cancelled.

        A cancelled reader flushes and *returns* a CANCELLED result (the handle resolves
        with it); one that re-raises the cancellation surfaces as an ActivityError whose
        cause is CancelledError. Returns ``(result, refusal message)``.
        """
        spec, s = self._spec, self._state
        handle = workflow.start_activity(
            "read_stream",
            read_input,
            result_type=ReadResult,
            start_to_close_timeout=timedelta(
                seconds=spec.max_connection_age + spec.connect_timeout + spec.idle_timeout
            )
            + READ_MARGIN,
            heartbeat_timeout=READ_HEARTBEAT_TIMEOUT,
            retry_policy=READ_RETRY,
            cancellation_type=workflow.ActivityCancellationType.WAIT_CANCELLATION_COMPLETED,
            summary=f"{read_input.route.value} #{read_input.connection}",
        )
        self._connected = True
        self._publish()
        cancelled = False
        try:
            while not handle.done():
                if self._should_interrupt():
                    handle.cancel()
                    cancelled = True
                    break
                wait = seconds_until_lagged(s, workflow.now(), spec.lagged_reconnect_interval)
                try:
                    await workflow.wait_condition(
                        lambda: handle.done() or self._should_interrupt(), timeout=wait
                    )
                except TimeoutError:
                    pass
            try:
                return await handle, None
            except ActivityError as error:
                cause = error.cause
                if isinstance(cause, ApplicationError) and (
                    cause.non_retryable or cause.type in NON_RETRYABLE_ERRORS
                ):
                    return None, f"{cause.type}: {cause.message}"
                if isinstance(cause, CancelledError):
                    return None, None
                workflow.logger.warning("read_stream failed: %s", cause or error)
                failed = ReadResult(outcome=Outcome.RETRY_LATER, error=str(cause or error))
                return failed, None
            except asyncio.CancelledError:
                if not cancelled:
                    raise
                # Cancelled in the same activation the result arrived: the result is lost
                # to us, but it was committed; the stores know the cursor.
                return None, None
        finally:
            self._connected = False

    def _should_interrupt(self) -> bool:
        s = self._state
        if s.stop_requested or s.paused or s.pending_replay is not None:
            return True
        return s.pending_lagged and lagged_allowed(
            s, workflow.now(), self._spec.lagged_reconnect_interval
        )

    # --- waiting, fences, checkpoint ---------------------------------------------------

    async def _wait_for_reconnect(self) -> bool:
        """Wait out ``next_reconnect_at``; True when the loop must re-check (a signal)."""
        s = self._state
        if s.next_reconnect_at is None:
            return False
        remaining = (datetime.fromisoformat(s.next_reconnect_at) - workflow.now()).total_seconds()
        if remaining > 0:
            self._waiting = True
            self._publish()
            try:
                await workflow.wait_condition(
                    lambda: s.stop_requested or s.paused or s.hold is not None,
                    timeout=remaining,
                )
                return True
            except TimeoutError:
                pass
            finally:
                self._waiting = False
        s.next_reconnect_at = None
        return False

    async def _resolve_since(self) -> None:
        s = self._state
        signal = s.pending_replay
        if signal is None or signal.since is None or signal.from_id is not None:
            return
        try:
            from_id = await self._store(
                "resolve_since",
                SinceInput(stream=self._ref(), since=signal.since),
                result_type=str,
            )
        except ActivityError as error:
            s.pending_replay = None
            s.last_error = f"replay since {signal.since!r} ignored: {error.cause or error}"
            workflow.logger.warning(s.last_error)
            return
        if from_id is None:
            workflow.logger.warning(
                "replay since %s: nothing persisted that early, taking the lagged route",
                signal.since,
            )
        s.pending_replay = ReplaySignal(from_id=from_id)

    async def _set_fence(self, fence_id: str) -> None:
        fence = await self._store(
            "set_fence", FenceInput(stream=self._ref(), fence_id=fence_id), result_type=str
        )
        if fence is not None:
            self._state.fence_id = fence
        workflow.logger.info("gap fence set at %r", self._state.fence_id)

    async def _refresh_checkpoint(self, *, adopt_fence: bool) -> None:
        """Learn the lagging id; on a fresh start, adopt a fence left by an earlier run."""
        s = self._state
        checkpoint = await self._store("get_checkpoint", self._ref(), result_type=CheckpointState)
        if checkpoint is None:
            return
        s.lagging_id = checkpoint.lagging_id
        if adopt_fence and checkpoint.fence_id is not None and s.fence_id is None:
            workflow.logger.warning(
                "an unrepaired gap fence %r was left by an earlier run: replaying",
                checkpoint.fence_id,
            )
            s.fence_id = checkpoint.fence_id
            s.pending_lagged = True

    async def _finish(self, *, delete_schedule: bool) -> StreamStatus:
        if delete_schedule:
            await self._store("delete_checkpoint_schedule", self._ref())
        await workflow.wait_condition(workflow.all_handlers_finished)
        self._publish()
        workflow.logger.info("stream stopped")
        return self.status()

    async def _store(self, activity: str, arg: object, *, result_type: type | None = None) -> Any:
        return await workflow.execute_activity(
            activity,
            arg,
            result_type=result_type,
            start_to_close_timeout=STORE_TIMEOUT,
            retry_policy=STORE_RETRY,
        )

    def _ref(self) -> StreamRef:
        return StreamRef(name=self._spec.name, id_order=self._spec.id_order)

    def _publish(self) -> None:
        """Current details for the Web UI (markdown)."""
        status = self.status()
        c = status.counters
        lines = [
            f"**{status.name}**: {status.state}",
            f"route: {status.route or '-'} · live: `{status.live_cursor}` · "
            f"lagging: `{status.lagging_id}` · fence: `{status.fence_id}`",
            f"connections {c.connections} · persisted {c.events_persisted} · "
            f"drop signals {c.drop_signals} · replays {c.lagged_replays} · "
            f"recovered {c.events_recovered} · unrecoverable gaps {c.gaps_unrecoverable}",
        ]
        if status.pending_lagged:
            lines.append("lagged reconnect pending (throttled)")
        if status.next_reconnect_at:
            lines.append(f"next reconnect: {status.next_reconnect_at}")
        if status.last_error:
            lines.append(f"last error: {status.last_error}")
        workflow.set_current_details("\n\n".join(lines))


STRICT_SPEC_PATCH = "strict-spec"


def _coerce_spec(spec: object) -> tuple[StreamSpec, ConfigError | None]:
    """The validated spec, or a placeholder and the one-line reason to park with.

    The input arrives raw (``spec`` is typed ``Any``): a dict from the plain Temporal
    CLI, from a client or from continue-as-new. ``parse_spec`` is its only validator and
    runs here, in workflow code, because a data converter that raised on a bad input
    would fail the workflow task forever instead of parking the stream.
    """
    try:
        return parse_spec(spec, source="workflow input"), None
    except ConfigError as error:
        if not workflow.patched(STRICT_SPEC_PATCH):
            # Replaying a run started before strict validation: decide as it did.
            try:
                return pre_strict_spec(spec), None
            except ConfigError:
                pass
        name = spec.get("name") if isinstance(spec, dict) else None
        placeholder = StreamSpec(name=name if isinstance(name, str) else "?", url="")
        return placeholder, error
