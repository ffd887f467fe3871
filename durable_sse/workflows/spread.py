"""A new stream's checkpoint schedule, created at its due time in the background.

Workflow code (a durable timer and a task): a thousand streams started at once do not
create a thousand schedules at once (``SCHEDULE_SPREAD`` in :mod:`workflows.routes`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta

from temporalio import workflow
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from durable_sse.workflows.calls import StopRequested
    from durable_sse.workflows.routes import StreamState, schedule_delay

SCHEDULE_TIMER_SUMMARY = "checkpoint schedule due"


class SpreadSchedule:
    """The background creation of one run; ``attempted`` once it has called ``ensure``
    (the run deletes the schedule at its end even if the creation was stopped)."""

    def __init__(self) -> None:
        self._task: asyncio.Task[None] | None = None
        self._timing = False
        self.attempted = False

    def start(
        self, state: StreamState, replay_window: float, ensure: Callable[[], Awaitable[None]]
    ) -> None:
        """Call ``ensure`` at the stream's due time (``schedule_due_at``, chosen now at
        random in the first window unless a run before continue-as-new chose it)."""
        if state.schedule_due_at is None:
            delay = schedule_delay(replay_window, state.schedule_spread, workflow.random().random())
            state.schedule_due_at = (workflow.now() + timedelta(seconds=delay)).isoformat()
        due = datetime.fromisoformat(state.schedule_due_at)

        async def ensure_when_due() -> None:
            remaining = (due - workflow.now()).total_seconds()
            self._timing = True
            try:
                if remaining > 0:
                    await workflow.sleep(remaining, summary=SCHEDULE_TIMER_SUMMARY)
            finally:
                self._timing = False
            self.attempted = True
            try:
                await ensure()
            except StopRequested:
                pass
            except ActivityError as error:  # the next run tries again
                workflow.logger.warning(
                    "could not create the checkpoint schedule: %s", error.cause or error
                )

        self._task = asyncio.create_task(ensure_when_due())

    async def settle(self) -> None:
        """Before the run's end or its continue-as-new: a creation not yet due is dropped
        (its timer cancelled), one under way finishes (or is stopped), so that nothing
        completes during the run's last task and the delete that follows a stop sees what
        was created."""
        task = self._task
        if task is None or task.done():
            return
        if self._timing:
            task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass
