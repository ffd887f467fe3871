"""``StreamWorkflow``: one long-lived workflow per SSE stream.

Each connection is a *new* ``read_stream`` activity execution; when it ends, the pure
decisions in :mod:`workflows.routes` say where the next one resumes (live, the lagged
repair of an open gap, or an explicit replay cursor) and how long to wait. The gaps are
durable records the reader writes; this workflow only routes on their summary. The
activity's retry policy is only for crashes and infrastructure, never for an ordinary
reconnect. Signals (``replay``, ``pause``, ``resume``, ``stop``) cancel the running
connection; the reader flushes its batch and returns, and the workflow acts once it has.

What goes through this workflow's history is what changes the stream's course: state,
route, gaps (every gap a connection finds ends that connection, so its result brings it)
and errors. Cursors and counts, which move with every batch, arrive when a connection ends
(``counted_at``); while one runs, the reader writes them to Redis (``progress:<stream>``)
and ``durable-sse status`` folds them in (:mod:`durable_sse.ops.live`), so a stream that
runs all day pays no history for them (docs/benchmarks.md gives the cost per stream-hour).
The ``progress`` signal of earlier readers is still accepted, display only.

The server can never fail this workflow: refusals park it, ``204`` stops it until
resumed, everything else backs off and reconnects.
"""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy, SearchAttributeKey
from temporalio.converter import value_to_type
from temporalio.exceptions import ActivityError, ApplicationError, CancelledError

with workflow.unsafe.imports_passed_through():
    # Every module whose dataclasses cross the workflow boundary is passed through by
    # name: the converter resolves their type hints in the sandbox's module table.
    import durable_sse.gaps.model  # noqa: F401 - GapSummary/GapView inside ReadResult, StreamGaps
    from durable_sse.config.durations import format_duration
    from durable_sse.config.replay import ReplaySignal, parse_replay_signal
    from durable_sse.config.spec import StreamSpec, parse_spec
    from durable_sse.contracts import (
        STREAM_STATE_ATTRIBUTE,
        ConnectionProgress,
        Outcome,
        ReadInput,
        ReadResult,
        RetentionStatus,
        ScheduleInput,
        SinceInput,
        StreamGaps,
        StreamRef,
        StreamStatus,
    )
    from durable_sse.errors import ConfigError
    from durable_sse.ops.metrics import WorkflowMetrics
    from durable_sse.ownership import require_stream_owner
    from workflows.routes import (
        HOLD_PARKED,
        ConnectionPlan,
        StreamState,
        attribute_state,
        display_state,
        fold_gaps,
        live_view,
        plan_connection,
        record_result,
        schedule_delay,
        seconds_until_repair,
        should_interrupt,
    )

__all__ = ["StreamState", "StreamWorkflow"]

STREAM_STATE = SearchAttributeKey.for_keyword(STREAM_STATE_ATTRIBUTE)
STATE_ATTRIBUTE_PATCH = "sse-stream-state-attribute"
"""Runs started before the search attribute existed replay without its check and upserts."""
SCHEDULE_SPREAD_PATCH = "sse-schedule-spread"
"""Runs started before the spread created their checkpoint schedule before connecting."""
SCHEDULE_TIMER_SUMMARY = "checkpoint schedule due"
READ_NUDGE_PATCH = "sse-read-nudge"
"""Runs started before nudges cancelled their reader without one."""
RETRY_BOUND_PATCH = "sse-max-retry-delay"
"""Runs started before ``max_retry_delay`` honoured any ``retry:`` (a timer that long)."""
NUDGE_TIMEOUT = timedelta(seconds=10)
NUDGE_RETRY = RetryPolicy(maximum_attempts=1)
"""One try: a nudge only hurries a cancellation the reader's heartbeat also brings."""
ATTRIBUTE_CHECK_TIMEOUT = timedelta(seconds=10)
ATTRIBUTE_CHECK_RETRY = RetryPolicy(initial_interval=timedelta(seconds=1), maximum_attempts=2)
"""Two tries, then the run goes without the attribute (a worker of an older version that
lacks the activity, a namespace that refuses the listing): never a hung stream."""

NON_RETRYABLE_ERRORS = ["StreamRefusedError", "ConfigError"]
READ_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    maximum_interval=timedelta(seconds=30),
    backoff_coefficient=2.0,
    maximum_attempts=0,
    non_retryable_error_types=NON_RETRYABLE_ERRORS,
)
READ_HEARTBEAT_TIMEOUT = timedelta(seconds=10)
"""The read activity's heartbeat timeout of runs from before ``heartbeat_timeout``."""
HEARTBEAT_TIMEOUT_PATCH = "sse-heartbeat-timeout"
"""Runs recorded before the stream's ``heartbeat_timeout`` replay with the 10 s one."""
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
        self._repairing = False
        self._progress: ConnectionProgress | None = None
        """The running connection's last report (display only)."""
        self._running: int | None = None
        """The running connection's number (``ReadInput.connection``)."""
        self._attribute = False
        """The namespace has ``SseStreamState`` registered: upsert it on every change."""
        self._attribute_value: str | None = None
        self._schedule_task: asyncio.Task[None] | None = None
        """The spread creation of the checkpoint schedule, while it is pending."""
        self._schedule_timer = False
        """``_schedule_task`` is still waiting for its time (nothing created yet)."""
        self._schedule_attempted = False
        """A creation was started in this run: delete at the end even if it was stopped."""
        self._retry_cap_logged = False
        """A ``retry:`` over ``max_retry_delay`` was logged in this run (once is enough)."""

    @workflow.run
    async def run(self, spec: Any, state: StreamState | None = None) -> StreamStatus:
        s = self._state
        spec = self._spec
        if workflow.patched(STATE_ATTRIBUTE_PATCH):
            self._attribute = await self._attribute_registered()
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

        try:
            if not s.schedule_ensured:
                if workflow.patched(SCHEDULE_SPREAD_PATCH) and s.schedule_spread > 0:
                    self._spread_schedule(spec)
                else:
                    await self._ensure_schedule(spec)
            if self._fresh:
                s.gaps_stale = True
            await self._loop(spec)
        except _StopRequested:
            pass
        return await self._finish(delete_schedule=True)

    async def _ensure_schedule(self, spec: StreamSpec) -> None:
        await self._store("ensure_checkpoint_schedule", ScheduleInput(spec=spec))
        self._state.schedule_ensured = True

    def _spread_schedule(self, spec: StreamSpec) -> None:
        """Create the checkpoint schedule at its due time (see ``SCHEDULE_SPREAD``), in
        the background; a due time already set (a run before continue-as-new) stands."""
        s = self._state
        if s.schedule_due_at is None:
            jitter = workflow.random().random()
            delay = schedule_delay(spec.replay_window, s.schedule_spread, jitter)
            s.schedule_due_at = (workflow.now() + timedelta(seconds=delay)).isoformat()

        async def ensure_when_due() -> None:
            assert s.schedule_due_at is not None
            due = datetime.fromisoformat(s.schedule_due_at)
            remaining = (due - workflow.now()).total_seconds()
            self._schedule_timer = True
            try:
                if remaining > 0:
                    await workflow.sleep(remaining, summary=SCHEDULE_TIMER_SUMMARY)
            finally:
                self._schedule_timer = False
            self._schedule_attempted = True
            try:
                await self._ensure_schedule(spec)
            except _StopRequested:
                pass
            except ActivityError as error:
                workflow.logger.warning(
                    "could not create the checkpoint schedule: %s", error.cause or error
                )

        self._schedule_task = asyncio.create_task(ensure_when_due())

    async def _settle_schedule(self) -> None:
        """Before the end: a creation not yet due is dropped, one under way finishes
        (or is stopped), so the delete that follows sees what was created."""
        task = self._schedule_task
        if task is None or task.done():
            return
        if self._schedule_timer:
            task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass

    async def _loop(self, spec: StreamSpec) -> None:
        s = self._state
        run_connections = 0
        while True:
            if s.gaps_stale:
                await self._refresh_gaps()
            self._publish()
            if s.stop_requested:
                return
            if s.paused or s.hold is not None:
                await workflow.wait_condition(
                    lambda: s.stop_requested or not (s.paused or s.hold is not None)
                )
                continue
            if await self._wait_for_reconnect():
                continue
            if run_connections >= s.max_connections_per_run or self._history_full():
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
            if plan.lagged_started or plan.replay_started:
                workflow.logger.info(
                    "%s started: route %s from %r, %d gap(s) open",
                    "replay" if plan.replay_started else "repair",
                    plan.route.value,
                    plan.start_id,
                    s.counters.gaps_open,
                )
            run_connections += 1
            await self._connection(plan)

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
    def progress(self, report: Any = None) -> None:
        """The running connection's progress, as readers before the Redis view sent it
        (display only; see the module docstring). A report that does not parse, or that
        comes from a connection no longer running (sent just before it ended), is ignored."""
        try:
            parsed = value_to_type(ConnectionProgress, report)
        except Exception:  # noqa: BLE001 - a malformed report is dropped, never fatal
            workflow.logger.debug("malformed progress report ignored")
            return
        if self._running is None or parsed.connection != self._running:
            return
        self._progress = parsed
        self._publish()

    @workflow.signal
    def retention(self, report: Any = None) -> None:
        """What the last checkpoint run's retention step did (display only); a report
        that does not parse is dropped."""
        try:
            self._state.retention = value_to_type(RetentionStatus, report)
        except Exception:  # noqa: BLE001 - a malformed report is dropped, never fatal
            workflow.logger.debug("malformed retention report ignored")
            return
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
        progress = self._progress if self._running is not None else None
        s = live_view(self._state, progress, id_order=self._spec.id_order)
        return StreamStatus(
            name=self._spec.name,
            state=display_state(s, connected=self._connected, waiting=self._waiting),
            route=s.route,
            live_cursor=s.live_cursor,
            lagging_id=s.lagging_id,
            open_gaps=s.gaps.open,
            counters=s.counters,
            last_outcome=s.last_outcome,
            last_error=s.last_error,
            next_reconnect_at=s.next_reconnect_at,
            repair_pending=s.repair_wanted and not self._repairing,
            progress_at=progress.at if progress is not None else None,
            commit_lag=progress.commit_lag if progress is not None else None,
            retention=s.retention,
            retry_capped_from_ms=s.retry_capped_from_ms,
            id_order=self._spec.id_order,
            connection=self._running,
            counted_at=s.counted_at,
        )

    # --- one connection ----------------------------------------------------------------

    async def _connection(self, plan: ConnectionPlan) -> None:
        """Run one ``read_stream`` execution and fold its outcome into the state."""
        spec, s = self._spec, self._state
        s.route = plan.route.value
        s.counters.connections += 1
        metrics = WorkflowMetrics(workflow.metric_meter(), spec.name)
        metrics.reconnect(plan.route.value)
        if plan.lagged_started:
            metrics.lagged_replays.add(1)
        read_input = ReadInput(
            spec=spec,
            route=plan.route,
            start_id=plan.start_id,
            known_gaps=plan.known_gaps,
            connection=s.counters.connections,
            events_read_before=s.counters.events_read,
            verify=plan.verify,
        )
        c = s.counters
        suspected_before = (c.suspicions, c.suspicions_closed, c.suspicions_recovered)
        started = workflow.now()
        self._repairing = plan.repairs
        self._running = read_input.connection
        try:
            result, refused = await self._read(read_input, plan)
        finally:
            self._repairing = False
            self._running = None
            self._progress = None
        duration = (workflow.now() - started).total_seconds()
        bounded = workflow.patched(RETRY_BOUND_PATCH)
        decision = record_result(
            s,
            plan,
            result,
            id_order=spec.id_order,
            jitter=workflow.random().random(),
            duration=duration,
            refused=refused,
            max_retry_delay=spec.max_retry_delay if bounded else None,
            verify_reconnects=spec.verify_reconnects,
        )
        s.counted_at = workflow.now().isoformat()
        if decision.retry_capped_from_ms is not None and not self._retry_cap_logged:
            self._retry_cap_logged = True
            workflow.logger.warning(
                "the server asks to wait retry: %d ms before reconnecting; the stream "
                "waits max_retry_delay (%s) at most (logged once per run)",
                decision.retry_capped_from_ms,
                format_duration(spec.max_retry_delay),
            )
        if refused is not None:
            workflow.logger.warning("stream refused, parked until resumed: %s", refused)
        elif result is not None and result.outcome == Outcome.NO_CONTENT:
            workflow.logger.info("server answered 204: stopped until resumed")
        if decision.first_without_cursor:
            workflow.logger.warning(
                "stream %s has no ids to resume from: each reconnect loses what the server "
                "sent while no connection was open (recorded as gaps of kind no_resume, of "
                "unknown size; counted in reconnects_without_cursor). Nothing on our side "
                "can resume such a stream: the server must send ids (the SSE id: field). "
                "Warned once per stream.",
                spec.name,
            )
        if decision.refresh_gaps:
            await self._refresh_gaps(decision)
        self._report_unrecoverable(
            decision.new_unrecoverable_events,
            decision.new_unrecoverable_gaps,
            no_resume=decision.reconnects_without_cursor,
        )
        self._report_suspicions(suspected_before)
        if decision.replay_finished:
            workflow.logger.info("requested replay finished")
        if decision.delay > 0:
            s.next_reconnect_at = (workflow.now() + timedelta(seconds=decision.delay)).isoformat()

    def _report_suspicions(self, before: tuple[int, int, int]) -> None:
        """Export what ``verify_reconnects`` suspected, closed and recovered since
        ``before`` (the counters as the connection started)."""
        c = self._state.counters
        now = (c.suspicions, c.suspicions_closed, c.suspicions_recovered)
        if now == before:
            return
        metrics = WorkflowMetrics(workflow.metric_meter(), self._spec.name)
        for counter, new, old in zip(metrics.suspicions, now, before, strict=True):
            if new > old:
                counter.add(new - old)
        if now[2] > before[2]:
            workflow.logger.warning(
                "stream %s: re-reading a reconnect brought back %d events the server had "
                "skipped without a notice that arrived (verify_reconnects)",
                self._spec.name,
                now[2] - before[2],
            )

    def _report_unrecoverable(self, events: int, gaps: int, *, no_resume: int = 0) -> None:
        """Export what became unrecoverable and warn; gaps of a reconnect that could not
        resume (``no_resume``, at most that many of ``gaps``) were warned of once per
        stream, so they alone log no warning."""
        if gaps <= 0 and events <= 0:
            return
        metrics = WorkflowMetrics(workflow.metric_meter(), self._spec.name)
        if events > 0:
            metrics.events_unrecoverable.add(events)
        if gaps > 0:
            metrics.gaps_unrecoverable.add(gaps)
        if events <= 0 and gaps <= no_resume:
            return
        c = self._state.counters
        workflow.logger.warning(
            "UNRECOVERABLE GAP on stream %s: %d more events lost for good beyond the "
            "server's history (%d gaps so far, %d events counted, %d of unknown size)",
            self._spec.name,
            events,
            c.gaps_unrecoverable,
            c.events_unrecoverable,
            c.gaps_unknown_size,
        )

    async def _read(
        self, read_input: ReadInput, plan: ConnectionPlan
    ) -> tuple[ReadResult | None, str | None]:
        """Run the reader until it ends or a signal/repair timer needs it cancelled.

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
            heartbeat_timeout=(
                timedelta(seconds=spec.heartbeat_timeout)
                if workflow.patched(HEARTBEAT_TIMEOUT_PATCH)
                else READ_HEARTBEAT_TIMEOUT
            ),
            retry_policy=READ_RETRY,
            cancellation_type=workflow.ActivityCancellationType.WAIT_CANCELLATION_COMPLETED,
            summary=f"{read_input.route.value} #{read_input.connection}",
        )
        self._connected = True
        self._publish()
        cancelled = False

        def interrupt() -> bool:
            # The history check runs on every activation (each progress report is one):
            # a connection never grows a run's history past its budget.
            return self._history_full() or should_interrupt(
                s, plan, now=workflow.now(), interval=spec.lagged_reconnect_interval
            )

        try:
            while not handle.done():
                if interrupt():
                    handle.cancel()
                    cancelled = True
                    if workflow.patched(READ_NUDGE_PATCH):
                        self._nudge_reader()
                    break
                wait = None
                if not plan.repairs:
                    wait = seconds_until_repair(s, workflow.now(), spec.lagged_reconnect_interval)
                try:
                    await workflow.wait_condition(
                        lambda: handle.done() or interrupt(), timeout=wait
                    )
                except TimeoutError:
                    pass
            try:
                return await handle, None
            except ActivityError as error:
                cause = error.cause
                if isinstance(cause, ApplicationError) and cause.type in NON_RETRYABLE_ERRORS:
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
                # to us, but what it did is in the stores (its gaps included): read them.
                return None, None
        finally:
            self._connected = False

    def _nudge_reader(self) -> None:
        """Make the cancellation just requested reach the reader now rather than at its
        next heartbeat (durable_sse/ops/nudge.py). Scheduled after the cancellation, in the
        same workflow task, so the server knows of it when the reader heartbeats. Not
        awaited: a nudge that fails only leaves the cancellation to that heartbeat."""

        async def nudge() -> None:
            try:
                await workflow.execute_activity(
                    "nudge_reader",
                    self._ref(),
                    result_type=int,
                    schedule_to_close_timeout=NUDGE_TIMEOUT,
                    retry_policy=NUDGE_RETRY,
                )
            except ActivityError as error:
                workflow.logger.debug("nudge not delivered: %s", error.cause or error)

        asyncio.create_task(nudge())

    # --- waiting, gaps, checkpoint -----------------------------------------------------

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

    async def _refresh_gaps(self, decision: object | None = None) -> None:
        """Read the stream's gaps and lagging id from the store (a result did not say)."""
        s = self._state
        found = await self._store("stream_gaps", self._ref(), result_type=StreamGaps)
        before_events = s.counters.events_unrecoverable
        before_gaps = s.counters.gaps_unrecoverable
        fold_gaps(s, found.gaps)
        s.lagging_id = found.lagging_id
        if decision is None:
            return
        self._report_unrecoverable(
            s.counters.events_unrecoverable - before_events,
            s.counters.gaps_unrecoverable - before_gaps,
        )

    async def _finish(self, *, delete_schedule: bool) -> StreamStatus:
        await self._settle_schedule()
        ensured = self._state.schedule_ensured or self._schedule_attempted
        if delete_schedule and ensured:
            try:
                await workflow.wait_condition(workflow.all_handlers_finished)
                await asyncio.wait_for(
                    self._store("delete_checkpoint_schedule", self._ref(), stoppable=False),
                    timeout=STORE_TIMEOUT.total_seconds(),
                )
            except (ActivityError, TimeoutError) as error:
                workflow.logger.warning("could not delete the checkpoint schedule: %s", error)
        await workflow.wait_condition(workflow.all_handlers_finished)
        self._publish()
        workflow.logger.info("stream stopped")
        return self.status()

    async def _store(
        self,
        activity: str,
        arg: object,
        *,
        result_type: type | None = None,
        stoppable: bool = True,
    ) -> Any:
        """A store activity, retried until it succeeds, but never past a ``stop``: a store
        that fails for good (or a setting it refuses) must not keep the stream alive."""
        s = self._state
        task = workflow.start_activity(
            activity,
            arg,
            result_type=result_type,
            start_to_close_timeout=STORE_TIMEOUT,
            retry_policy=STORE_RETRY,
        )
        if stoppable:
            await workflow.wait_condition(lambda: task.done() or s.stop_requested)
            if not task.done():
                task.cancel()
                raise _StopRequested()
        return await task

    def _history_full(self) -> bool:
        """Time to continue-as-new: the server suggests it, or the run's budget is spent."""
        info = workflow.info()
        return (
            info.is_continue_as_new_suggested()
            or info.get_current_history_length() >= self._state.max_history_events
        )

    async def _attribute_registered(self) -> bool:
        """Whether to keep ``SseStreamState`` set: asked once per run."""
        try:
            registered = await workflow.execute_activity(
                "stream_state_attribute_registered",
                result_type=bool,
                start_to_close_timeout=ATTRIBUTE_CHECK_TIMEOUT,
                retry_policy=ATTRIBUTE_CHECK_RETRY,
            )
        except ActivityError as error:
            workflow.logger.warning(
                "%s is not set: cannot tell whether it is registered (%s)",
                STREAM_STATE_ATTRIBUTE,
                error.cause or error,
            )
            return False
        if registered:
            # Continue-as-new carries the attribute over: no upsert unless it changes.
            self._attribute_value = workflow.info().typed_search_attributes.get(STREAM_STATE)
        return bool(registered)

    def _ref(self) -> StreamRef:
        return StreamRef(name=self._spec.name, id_order=self._spec.id_order)

    def _publish(self) -> None:
        """Current details for the Web UI (markdown)."""
        status = self.status()
        c = status.counters
        lines = [
            f"**{status.name}**: {status.state}",
            f"route: {status.route or '-'} · live: `{_shown(status.live_cursor)}` · "
            f"lagging: `{_shown(status.lagging_id)}`",
            f"connections {c.connections} · persisted {c.events_persisted} · "
            f"drop signals {c.drop_signals} · lagged replays {c.lagged_replays} · "
            f"explicit replays {c.explicit_replays} · recovered {c.events_recovered}",
            f"gaps: open {c.gaps_open} · repaired {c.gaps_repaired} · unrecoverable "
            f"{c.gaps_unrecoverable} ({c.events_unrecoverable} events"
            + (f", {c.gaps_unknown_size} of unknown size" if c.gaps_unknown_size else "")
            + ")",
        ]
        for gap in status.open_gaps[:5]:
            lines.append(
                f"open gap after `{_shown(gap.start_id)}` before `{_shown(gap.end_id)}` "
                f"({gap.kind}, seen {gap.seen_at}, repair resumes after "
                f"`{_shown(gap.resume_from)}`)"
            )
        if c.ids_reused:
            lines.append(
                f"ids reused {c.ids_reused}: stored ids sent again with other data (the "
                "server restarted its id counter?), kept beside the earlier events"
            )
        if c.reconnects_without_cursor:
            lines.append(
                f"reconnects without a cursor {c.reconnects_without_cursor} (the server sends "
                "no ids: each lost what was sent meanwhile)"
            )
        if c.suspicions:
            lines.append(
                f"verified reconnects {c.suspicions} (closed {c.suspicions_closed}): "
                f"{c.suspicions_recovered} events the server skipped without a notice that "
                "arrived were read again and stored"
            )
        if status.repair_pending:
            lines.append("repair pending (lagged reconnects are throttled)")
        if status.progress_at is not None:
            lag = "-" if status.commit_lag is None else f"{status.commit_lag:.1f} s"
            lines.append(f"as of {status.progress_at} (connection reports) · commit lag {lag}")
        elif status.counted_at is not None:
            lines.append(
                f"cursors and counts as of {status.counted_at} (the last connection's end; "
                "`durable-sse status` shows them live)"
            )
        r = status.retention
        if r is not None and r.retention is not None:
            lines.append(
                f"retention {format_duration(r.retention)} ({r.source}): deleted "
                f"{r.deleted_rows} · oldest kept `{_shown(r.oldest_kept_id)}` at "
                f"{r.oldest_kept_at or '-'} · kept from `{_shown(r.keep_from)}` ({r.held_by})"
            )
        if c.dropped_by_horizon:
            lines.append(
                f"dropped by the retention horizon {c.dropped_by_horizon} (ids at or before "
                "the newest id retention deleted: not stored)"
            )
        if status.next_reconnect_at:
            lines.append(f"next reconnect: {status.next_reconnect_at}")
        if status.retry_capped_from_ms is not None:
            lines.append(
                f"server's retry: {status.retry_capped_from_ms} ms, cut to "
                f"max_retry_delay ({format_duration(self._spec.max_retry_delay)})"
            )
        if status.last_error:
            lines.append(f"last error: {status.last_error}")
        workflow.set_current_details("\n\n".join(lines))
        if self._attribute:
            value = attribute_state(status.state)
            if value != self._attribute_value:
                workflow.upsert_search_attributes([STREAM_STATE.value_set(value)])
                self._attribute_value = value


class _StopRequested(Exception):
    """``stop`` arrived while the workflow waited on a store: end now."""


def _shown(value: str | None) -> str:
    return "-" if value is None else value


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
        name = spec.get("name") if isinstance(spec, dict) else None
        placeholder = StreamSpec(name=name if isinstance(name, str) else "?", url="")
        return placeholder, error
