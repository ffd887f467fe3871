"""``StreamWorkflow``: one long-lived workflow per SSE stream.

Each connection is a *new* ``read_stream`` activity execution; when it ends, the pure
decisions in :mod:`workflows.routes` say where the next one resumes (live, the lagged
repair of an open gap, or an explicit replay cursor) and how long to wait. The gaps are
durable records the reader writes; this workflow only routes on their summary. The
activity's retry policy is only for crashes and infrastructure, never for an ordinary
reconnect. Signals (``replay``, ``pause``, ``resume``, ``stop``) cancel the running
connection; the reader flushes its batch and returns, and the workflow acts once it has.

What goes through this workflow's history is what changes the stream's course: state,
route, gaps and errors. Cursors and counts arrive when a connection ends; while one runs,
the reader writes them to Redis and ``durable-sse status`` folds them in.

The workflow is Pinned to the Worker Deployment Version it started on: a change of its
code needs no ``workflow.patched`` branch. When the target version changes, the run ends
its connection the way ``pause`` does and continues-as-new onto the new version
(:mod:`workflows.upgrade` says when); an idle run does so at least once a day.

The server can never fail this workflow: refusals park it, ``204`` stops it until
resumed, everything else backs off and reconnects.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import SearchAttributeKey
from temporalio.converter import value_to_type
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    # Every module whose dataclasses cross the workflow boundary is passed through by
    # name: the converter resolves their type hints in the sandbox's module table.
    import durable_sse.gaps.model  # noqa: F401 - GapSummary/GapView inside ReadResult, StreamGaps
    from durable_sse.config.replay import parse_replay_signal
    from durable_sse.contracts import (
        STREAM_STATE_ATTRIBUTE,
        ReadInput,
        ReadResult,
        RetentionStatus,
        ScheduleInput,
        StreamGaps,
        StreamRef,
        StreamStatus,
    )
    from durable_sse.errors import ConfigError
    from durable_sse.ops.metrics import WorkflowMetrics
    from durable_sse.ownership import require_stream_owner
    from durable_sse.workflows import calls
    from durable_sse.workflows.calls import READ_RETRY, StopRequested
    from durable_sse.workflows.reports import (
        log_decision,
        report_suspicions,
        report_unrecoverable,
        suspicions,
    )
    from durable_sse.workflows.routes import (
        HOLD_PARKED,
        ConnectionPlan,
        StreamState,
        attribute_state,
        fold_gaps,
        plan_connection,
        record_result,
        seconds_until_repair,
        should_interrupt,
    )
    from durable_sse.workflows.spread import SCHEDULE_TIMER_SUMMARY, SpreadSchedule
    from durable_sse.workflows.status import render_details, stream_status
    from durable_sse.workflows.upgrade import RunBudget, bounded_wait, continue_reason

__all__ = ["READ_RETRY", "SCHEDULE_TIMER_SUMMARY", "StreamState", "StreamWorkflow"]

STREAM_STATE = SearchAttributeKey.for_keyword(STREAM_STATE_ATTRIBUTE)


@workflow.defn
class StreamWorkflow:
    @workflow.init
    def __init__(self, spec: Any, state: StreamState | None = None) -> None:
        self._input = spec
        """The input as it came (continue-as-new passes an invalid one on unchanged)."""
        self._spec, self._spec_error = calls.coerce_spec(spec)
        if isinstance(state, dict):
            state = value_to_type(StreamState, state)
        self._fresh = state is None
        self._state = state if state is not None else StreamState()
        self._connected = False
        self._waiting = False
        self._repairing = False
        self._invalid = False
        self._running: int | None = None
        """The running connection's number (``ReadInput.connection``)."""
        self._connections = 0
        """Connections made by this run."""
        self._nudges: set[asyncio.Task[None]] = set()
        """Nudges not yet known to be done (awaited before the run's last task)."""
        self._attribute = False
        """The namespace has ``SseStreamState`` registered: upsert it on every change."""
        self._attribute_value: str | None = None
        self._schedule = SpreadSchedule()
        self._retry_cap_logged = False
        """A ``retry:`` over ``max_retry_delay`` was logged in this run (once is enough)."""

    @workflow.run
    async def run(self, spec: Any, state: StreamState | None = None) -> StreamStatus:
        s = self._state
        spec = self._spec
        self._attribute = await calls.attribute_registered()
        if self._attribute:  # continue-as-new carries it over: no upsert unless it changes
            self._attribute_value = workflow.info().typed_search_attributes.get(STREAM_STATE)
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
            while not s.stop_requested:
                await self._continue_if_due()
                await self._idle(lambda: False)
            return await self._finish(delete_schedule=False)

        try:
            if not s.schedule_ensured:
                if s.schedule_spread > 0:
                    self._schedule.start(s, spec.replay_window, self._ensure_schedule)
                else:
                    await self._ensure_schedule()
            if self._fresh:
                s.gaps_stale = True
            await self._loop()
        except StopRequested:
            pass
        return await self._finish(delete_schedule=True)

    async def _loop(self) -> None:
        s = self._state
        while True:
            if s.gaps_stale:
                await self._refresh_gaps()
            self._publish()
            if s.stop_requested:
                return
            await self._continue_if_due()
            if s.paused or s.hold is not None:
                await self._idle(lambda: not (s.paused or s.hold is not None))
                continue
            if await self._wait_for_reconnect():
                continue
            await calls.resolve_since(s, self._ref(), stopped=lambda: s.stop_requested)
            plan = plan_connection(
                s,
                now=workflow.now(),
                interval=self._spec.lagged_reconnect_interval,
                id_order=self._spec.id_order,
            )
            if plan.lagged_started or plan.replay_started:
                workflow.logger.info(
                    "%s started: route %s from %r, %d gap(s) open",
                    "replay" if plan.replay_started else "repair",
                    plan.route.value,
                    plan.start_id,
                    s.counters.gaps_open,
                )
            self._connections += 1
            await self._connection(plan)

    # --- continue-as-new: budgets, the day, a new target version -----------------------

    def _target_changed(self) -> bool:
        return workflow.info().is_target_worker_deployment_version_changed()

    async def _continue_if_due(self) -> None:
        """At a safe point (no connection runs): continue-as-new if the run must."""
        reason = continue_reason(
            RunBudget(
                target_changed=self._target_changed(),
                age=(workflow.now() - workflow.info().start_time).total_seconds(),
                history_full=self._history_full(),
                connections=self._connections,
                max_connections=self._state.max_connections_per_run,
            )
        )
        if reason is None:
            return
        await self._quiesce()
        workflow.logger.info(
            "continuing as new (%s) after %d connections", reason, self._state.counters.connections
        )
        # AUTO_UPGRADE: the next run starts on the target version, not on this one's.
        workflow.continue_as_new(
            args=[self._input if self._invalid else self._spec, self._state],
            initial_versioning_behavior=workflow.ContinueAsNewVersioningBehavior.AUTO_UPGRADE,
        )

    async def _idle(self, done: Callable[[], bool], remaining: float | None = None) -> None:
        """Wait until ``done``, a stop or a new target version, or ``remaining`` seconds,
        at most until the run is a day old (the loop then continues-as-new)."""
        s = self._state
        timeout = bounded_wait(remaining, workflow.info().start_time, workflow.now())
        try:
            await workflow.wait_condition(
                lambda: s.stop_requested or done() or self._target_changed(), timeout=timeout
            )
        except TimeoutError:
            pass

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
    def retention(self, report: Any = None) -> None:
        """What the last checkpoint run's retention step did (display only); a report
        that does not parse is dropped."""
        try:
            self._state.retention = value_to_type(RetentionStatus, report)
        except Exception:  # noqa: BLE001 - a malformed report is dropped, never fatal
            workflow.logger.debug("malformed retention report ignored")
            return
        self._publish()

    @workflow.update
    def upgrade(self) -> bool:
        """A wake-up from the workers of a new current version: the workflow task it
        brings tells the run whether its target version changed (True: it did, and the run
        continues-as-new in the same task). An update, not a signal: one that arrives while
        the run's last task completes waits for the next run instead of making the server
        refuse that task (UnhandledCommand)."""
        return self._target_changed()

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
        return stream_status(
            self._spec,
            self._state,
            connected=self._connected,
            waiting=self._waiting,
            repairing=self._repairing,
            running=self._running,
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
            verify_from=plan.verify_from,
        )
        suspected_before = suspicions(s.counters)
        started = workflow.now()
        self._repairing = plan.repairs
        self._running = read_input.connection
        try:
            result, refused = await self._read(read_input, plan)
        finally:
            self._repairing = False
            self._running = None
        decision = record_result(
            s,
            plan,
            result,
            id_order=spec.id_order,
            jitter=workflow.random().random(),
            duration=(workflow.now() - started).total_seconds(),
            refused=refused,
            max_retry_delay=spec.max_retry_delay,
            verify_reconnects=spec.verify_reconnects,
        )
        s.counted_at = workflow.now().isoformat()
        log_decision(spec, decision, result, refused, warn_retry_cap=not self._retry_cap_logged)
        if decision.retry_capped_from_ms is not None:
            self._retry_cap_logged = True
        if decision.refresh_gaps:
            await self._refresh_gaps(report=True)
        report_unrecoverable(
            spec.name,
            s.counters,
            decision.new_unrecoverable_events,
            decision.new_unrecoverable_gaps,
            no_resume=decision.reconnects_without_cursor,
        )
        report_suspicions(spec.name, s.counters, suspected_before)
        if decision.delay > 0:
            s.next_reconnect_at = (workflow.now() + timedelta(seconds=decision.delay)).isoformat()

    async def _read(
        self, read_input: ReadInput, plan: ConnectionPlan
    ) -> tuple[ReadResult | None, str | None]:
        """Run the reader until it ends or a signal/repair timer needs it cancelled.

        A cancelled reader flushes and *returns* a CANCELLED result (the handle resolves
        with it); one that re-raises the cancellation surfaces as an ActivityError whose
        cause is CancelledError. Returns ``(result, refusal message)``.
        """
        spec, s = self._spec, self._state
        handle = calls.start_read(spec, read_input)
        self._connected = True
        self._publish()
        cancelled = False

        def interrupt() -> bool:
            # Checked on every activation: a connection never grows a run's history past
            # its budget, nor keeps it on a version that is no longer the target.
            return (
                self._history_full()
                or self._target_changed()
                or should_interrupt(
                    s, plan, now=workflow.now(), interval=spec.lagged_reconnect_interval
                )
            )

        try:
            while not handle.done():
                if interrupt():
                    handle.cancel()
                    cancelled = True
                    nudge = calls.nudge_reader(self._ref())
                    self._nudges.add(nudge)
                    nudge.add_done_callback(self._nudges.discard)
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
                return calls.failed_read(error)
            except asyncio.CancelledError:
                if not cancelled:
                    raise
                # Cancelled in the same activation the result arrived: the result is lost
                # to us, but what it did is in the stores (its gaps included): read them.
                return None, None
        finally:
            self._connected = False

    # --- waiting, gaps, the store -----------------------------------------------------

    async def _wait_for_reconnect(self) -> bool:
        """Wait out ``next_reconnect_at``; True when the loop must re-check (a signal, a
        new target version, the run's day)."""
        s = self._state
        if s.next_reconnect_at is None:
            return False
        now = workflow.now()
        remaining = (datetime.fromisoformat(s.next_reconnect_at) - now).total_seconds()
        if remaining <= 0:
            s.next_reconnect_at = None
            return False
        self._waiting = True
        self._publish()
        try:
            await self._idle(lambda: s.paused or s.hold is not None, remaining)
        finally:
            self._waiting = False
        return True

    async def _refresh_gaps(self, *, report: bool = False) -> None:
        """Read the stream's gaps and lagging id from the store (a result did not say);
        ``report``: export and warn of what became unrecoverable meanwhile."""
        s = self._state
        found = await self._store("stream_gaps", self._ref(), result_type=StreamGaps)
        before_events = s.counters.events_unrecoverable
        before_gaps = s.counters.gaps_unrecoverable
        fold_gaps(s, found.gaps)
        s.lagging_id = found.lagging_id
        if report:
            report_unrecoverable(
                self._spec.name,
                s.counters,
                s.counters.events_unrecoverable - before_events,
                s.counters.gaps_unrecoverable - before_gaps,
            )

    async def _ensure_schedule(self) -> None:
        await self._store("ensure_checkpoint_schedule", ScheduleInput(spec=self._spec))
        self._state.schedule_ensured = True

    async def _quiesce(self) -> None:
        """Before the run's last task (continue-as-new or completion): nothing of the run
        may complete while that task does, or the server refuses it (UnhandledCommand) and
        runs it again. So the nudges and the schedule's creation end first (a creation not
        yet due is dropped; a next run starts it again at the same due time), and so do
        the signal handlers."""
        await asyncio.gather(*self._nudges)
        await self._schedule.settle()
        await workflow.wait_condition(workflow.all_handlers_finished)

    async def _finish(self, *, delete_schedule: bool) -> StreamStatus:
        await self._quiesce()
        ensured = self._state.schedule_ensured or self._schedule.attempted
        if delete_schedule and ensured:
            await calls.delete_schedule(self._ref())
        await workflow.wait_condition(workflow.all_handlers_finished)
        self._publish()
        workflow.logger.info("stream stopped")
        return self.status()

    async def _store(self, activity: str, arg: object, *, result_type: type | None = None) -> Any:
        return await calls.store(
            activity, arg, stopped=lambda: self._state.stop_requested, result_type=result_type
        )

    def _history_full(self) -> bool:
        """The server suggests continue-as-new, or the run's budget is spent."""
        info = workflow.info()
        return (
            info.is_continue_as_new_suggested()
            or info.get_current_history_length() >= self._state.max_history_events
        )

    def _ref(self) -> StreamRef:
        return StreamRef(name=self._spec.name, id_order=self._spec.id_order)

    def _publish(self) -> None:
        """Current details for the Web UI (markdown), and ``SseStreamState`` if it moved."""
        status = self.status()
        workflow.set_current_details(
            render_details(status, max_retry_delay=self._spec.max_retry_delay)
        )
        if self._attribute:
            value = attribute_state(status.state)
            if value != self._attribute_value:
                workflow.upsert_search_attributes([STREAM_STATE.value_set(value)])
                self._attribute_value = value
