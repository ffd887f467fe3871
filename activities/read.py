"""The read activity: one execution is one SSE connection.

Temporal glue only. The connection itself (its start, reading, commits and result) is
:class:`durable_sse.reader.connection.Connection`; here it is given what Temporal has
to give, and what it raises is turned into what Temporal understands:

* heartbeats carry the connection's progress (a retried attempt resumes from the dead
  one's start), spaced within the worker's budget (:func:`heartbeat_interval`);
  cancellation (replay/pause/stop signals, worker shutdown) arrives with them, and a
  nudge (:mod:`durable_sse.ops.nudge`) asks for one at once;
* the attempt's registration in ``sse_readers`` expires when nothing the attempt can
  still write needs holding (:meth:`_ActivityConnection.lease`);
* every ``PROGRESS_INTERVAL`` the connection's cursor, counts and commit lag go to Redis
  (``progress:<stream>``, :meth:`RedisCursors.submit_progress`), where ``durable-sse
  status`` reads them: what moves with every batch stays out of the workflow's history,
  which learns it from the connection's result (docs/benchmarks.md, the cost of a
  stream); every ``HOLD_INTERVAL`` the connection's retention hold moves forward, when
  a retention applies to the stream (else its start holds, and nothing is deleted);
* the first commit that stores rows, and any after a pause, wakes the stream's checkpoint
  schedule if it rests (:mod:`durable_sse.cursor.rest`), in the background;
* what retrying cannot fix (a setting, a refusal) is a non-retryable
  ``ApplicationError`` named after the error's class: the stream parks.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, replace
from datetime import UTC, datetime, timedelta
from secrets import token_hex
from typing import Any

import httpx
from temporalio import activity
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError

from durable_sse.config.durations import effective_retention
from durable_sse.config.secrets import DeclaredSecrets
from durable_sse.config.spec import MIN_HEARTBEAT_TIMEOUT
from durable_sse.contracts import (
    CONNECTION_MOVED,
    ConnectionProgress,
    Outcome,
    ReadInput,
    ReadProgress,
    ReadResult,
    Route,
    progress_json,
)
from durable_sse.cursor.readers import ReaderLease, reader_expiry
from durable_sse.cursor.rest import WAKE_RETRY, wake_check_due
from durable_sse.errors import ConfigError, StreamRefusedError
from durable_sse.ops.logs import install_redaction
from durable_sse.ops.nudge import Nudges
from durable_sse.reader.connection import Connection
from durable_sse.reader.credentials import Credentials
from durable_sse.reader.keepalive import Heartbeats
from durable_sse.reader.metrics import ReaderMetrics
from durable_sse.reader.session import progress_from_details
from durable_sse.stores import Stores

logger = logging.getLogger(__name__)

HEARTBEAT_INTERVAL = 0.8
"""Seconds between heartbeats, busy or quiet: cancellation arrives on heartbeats, so a
signal acts within about a second, and a busy stream heartbeats per interval, not per
batch."""
HEARTBEAT_BUDGET = 500.0
"""Heartbeats per second one worker sends at most, all connections together: past
``HEARTBEAT_BUDGET * HEARTBEAT_INTERVAL`` connections (400) the interval stretches, so a
thousand quiet streams cost 500 calls a second (signals act within ~2 s) instead of
flooding the Temporal server. The stretch stops at ``MAX_HEARTBEAT_INTERVAL``: past
``HEARTBEAT_BUDGET * MAX_HEARTBEAT_INTERVAL`` connections (2,500) a worker heartbeats over
budget rather than late."""
MAX_HEARTBEAT_INTERVAL = 5.0
"""Half the read activity's heartbeat timeout (``READ_HEARTBEAT_TIMEOUT``, 10 s, in
workflows/stream.py): however many connections a worker holds, one slow heartbeat call
does not time a live attempt out (Temporal would start a duplicate)."""
NUDGED_SHARE = 0.4
HEARTBEAT_SLACK = 60.0
"""While the worker hears nudges (durable_sse/ops/nudge.py), a connection heartbeats
every ``heartbeat_timeout - HEARTBEAT_SLACK`` seconds, or ``NUDGED_SHARE`` of the timeout
when that is longer (the stream's ``heartbeat_timeout``, 5 minutes by default: every
4 minutes, 15 an hour). A signal's cancellation comes with the heartbeat its nudge asks
for, so the regular heartbeats only show the attempt is alive: a minute (or 60 % of a
short timeout) of slack means a starved event loop never times a live attempt out, and a
lost nudge leaves a cancellation at most one interval late. Heartbeats are a running
stream's main cost in Temporal (docs/benchmarks.md)."""
LONG_TIMEOUT = 100.0
"""A heartbeat timeout from which the nudged interval leaves a full ``HEARTBEAT_SLACK``."""
NUDGED_HEARTBEAT_INTERVAL = 4.0
"""The shortest nudged interval (a heartbeat timeout of 10 s, the shortest allowed)."""
PROGRESS_INTERVAL = 2.0
"""Seconds between writes of a connection's live progress to Redis, when it changed
(checked whenever the connection wakes: a batch, a keep-alive, a heartbeat). Unchanged,
it is written again every ``PROGRESS_REFRESH``, so its ``at`` says the connection lives."""
PROGRESS_REFRESH = 60.0
HOLD_INTERVAL = 20.0
"""Seconds between moves of the connection's retention hold (a database write)."""
HOLD_TIMEOUT = 5.0
"""Seconds one move of the hold may take; a late one is dropped (retention keeps more)."""
WAKE_TIMEOUT = 10.0
"""Bound on one wake of a resting schedule (a flag read, and at most two Temporal calls)."""
ATTEMPT_MARGIN = timedelta(seconds=60)
"""Added to ``max_connection_age + connect_timeout + idle_timeout`` for a connection's
registration when the attempt has no ``start_to_close`` timeout to go by (run outside a
workflow); ``workflows/stream.py`` gives the read activity the same margin."""


class StreamReader:
    """Activities that hold SSE connections, built once per worker with its clients."""

    def __init__(
        self,
        *,
        http: httpx.AsyncClient,
        stores: Stores,
        secrets: DeclaredSecrets | None = None,
        credentials: Credentials | None = None,
        allowed_hosts: tuple[str, ...] | None = None,
        progress_interval: float = PROGRESS_INTERVAL,
        nudges: Nudges | None = None,
        retention: float | None = None,
        wake_checkpoint: Callable[[str], Awaitable[bool]] | None = None,
        worker_lease: Callable[[], str | None] | None = None,
    ) -> None:
        """``retention``: the worker's (``DURABLE_SSE_RETENTION``), for streams without
        their own: a connection moves its retention hold only when one applies.
        ``wake_checkpoint``: wakes a stream's resting checkpoint schedule
        (``ScheduleActivities.wake``; None: schedules are never woken from here).
        ``worker_lease``: the worker's liveness lease now (``WorkerLiveness.worker_id``;
        None: connections run under no lease, and no watchdog can move them)."""
        install_redaction()
        self.worker_lease = worker_lease
        self.under_lease: dict[str, set[asyncio.Task[Any]]] = {}
        """The tasks of the connections running under each worker lease."""
        self.running: dict[asyncio.Task[Any], _ActivityConnection] = {}
        self.wake_checkpoint = wake_checkpoint
        self.retention = retention
        self.nudges = nudges
        """Without it (or while it is not subscribed) cancellations wait for heartbeats."""
        self.progress_interval = progress_interval
        self.allowed_hosts = allowed_hosts
        self.http = http
        self.stores = stores
        self.secrets = DeclaredSecrets() if secrets is None else secrets
        self.credentials = credentials
        """Where the secrets' values come from (files, token endpoints), shared by every
        connection (None: the environment only)."""
        self.open_connections = 0

    @activity.defn(name="read_stream")
    async def read_stream(self, input: ReadInput) -> ReadResult:
        self.open_connections += 1
        connection = _ActivityConnection(self, input)
        nudges = self.nudges
        if nudges is not None:
            nudges.start()
            nudges.register(input.spec.name, connection.nudged)
        task, worker_id = asyncio.current_task(), connection.worker_id
        if task is not None:
            self.running[task] = connection
            if worker_id is not None:
                self.under_lease.setdefault(worker_id, set()).add(task)
        try:
            return await connection.run()
        finally:
            if task is not None:
                self.running.pop(task, None)
                if worker_id is not None:
                    self.under_lease.get(worker_id, set()).discard(task)
            self.open_connections -= 1
            if nudges is not None:
                nudges.unregister(input.spec.name, connection.nudged)
            await connection.stop_reports()
            await connection.connection.close()

    def lease_revoked(self, worker_id: str) -> None:
        """This worker's lease was revoked (it was taken for dead): its streams read
        elsewhere and the fence refuses every commit under that lease, so the
        connections still running under it end now rather than at their next batch."""
        tasks = self.under_lease.pop(worker_id, set())
        for task in tasks:
            task.cancel()
        if tasks:
            logger.warning(
                "ended %d connection(s) of revoked worker lease %s", len(tasks), worker_id
            )

    async def hand_over(
        self, count: int, seconds: float, *, before: Callable[[str, str], Awaitable[None]]
    ) -> int:
        """End ``count`` connections cleanly (flush, commit) and let Temporal retry each at
        once from its last cursor, one every ``seconds / count``, so that they go on
        wherever the pool has room. Connections on the live route go first.
        ``before(workflow_id, run_id)`` runs first for each."""
        chosen = sorted(
            (c for c in self.running.items() if c[1].streaming),
            key=lambda item: item[1].input.route != Route.LIVE,
        )[:count]
        pause = seconds / max(len(chosen), 1)
        done = 0
        for task, connection in chosen:
            if task.done():
                continue
            info = connection.info
            if info.workflow_id and info.workflow_run_id:
                await before(info.workflow_id, info.workflow_run_id)
            connection.moving = "handed over to spread the pool's connections over its workers"
            task.cancel()
            done += 1
            await asyncio.sleep(pause)
        return done

    def heartbeat_interval(self, *, streaming: bool = True, timeout: float | None = None) -> float:
        """Seconds between one connection's heartbeats, within the worker's budget.

        A connection still resolving its cursor or waiting for a response head takes the
        long nudged interval only when its timeout leaves ``HEARTBEAT_SLACK`` or more to
        spare: under a short timeout a start-up burst that starves the event loop would
        time its attempts out, under a long one a thousand starting connections must not
        flood the server with heartbeats while it is busiest (issue 25)."""
        roomy = timeout is not None and timeout >= LONG_TIMEOUT
        nudged = (streaming or roomy) and self.nudges is not None and self.nudges.live
        return heartbeat_interval(self.open_connections, nudged=nudged, timeout=timeout)

    def activities(self) -> list[Any]:
        return [self.read_stream]


MAX_CONNECTIONS_PER_WORKER = int(HEARTBEAT_BUDGET * MAX_HEARTBEAT_INTERVAL)
"""Connections one worker takes (2,500): more could not each heartbeat every
``MAX_HEARTBEAT_INTERVAL`` within the budget. ``worker.py`` sizes its activity slots by it."""


def heartbeat_interval(
    open_connections: int, *, nudged: bool = False, timeout: float | None = None
) -> float:
    """Seconds between one connection's heartbeats when the worker holds
    ``open_connections`` and its heartbeat timeout is ``timeout``: all but
    ``HEARTBEAT_SLACK`` of the timeout while nudges reach the worker (cancellations do not
    wait for heartbeats), else short for prompt cancellations, stretched to stay within
    ``HEARTBEAT_BUDGET``, never past ``MAX_HEARTBEAT_INTERVAL``."""
    if nudged:
        timeout = timeout or MIN_HEARTBEAT_TIMEOUT
        return max(NUDGED_HEARTBEAT_INTERVAL, NUDGED_SHARE * timeout, timeout - HEARTBEAT_SLACK)
    stretched = max(HEARTBEAT_INTERVAL, open_connections / HEARTBEAT_BUDGET)
    return min(stretched, MAX_HEARTBEAT_INTERVAL)


class _ActivityConnection:
    """One execution of ``read_stream``: a :class:`Connection` and what Temporal adds."""

    def __init__(self, reader: StreamReader, input: ReadInput) -> None:
        self.reader = reader
        self.input = input
        self.info = info = activity.info()
        self.timeout = info.heartbeat_timeout.total_seconds() if info.heartbeat_timeout else None
        """The attempt's heartbeat timeout (None: none, outside a workflow)."""
        self.worker_id = reader.worker_lease() if reader.worker_lease is not None else None
        """The worker lease this connection runs and commits under."""
        self.moving: str | None = None
        """Why its worker cancels it to go on elsewhere (a hand-over), if it does."""
        details = info.heartbeat_details
        self.connection = Connection(
            input,
            stores=reader.stores,
            http=reader.http,
            heartbeats=Heartbeats(send=_heartbeat, interval=self._interval, due=self._due),
            lease=self.lease(),
            previous=progress_from_details(details[0]) if details else None,
            retried=info.attempt > 1,
            secrets=reader.secrets,
            credentials=reader.credentials,
            allowed_hosts=reader.allowed_hosts,
            metrics=ReaderMetrics(activity.metric_meter(), input.spec.name),
            log=activity.logger,
            cancel_reason=_cancel_reason,
            on_stored=self._stored,
        )
        now = time.monotonic()
        self.next_progress = now + reader.progress_interval
        self.refresh_at = now
        self.published: ConnectionProgress | None = None
        """The last live progress written (its ``at`` left out)."""
        self.next_hold = now + HOLD_INTERVAL
        spec = input.spec
        retention, _ = effective_retention(spec.retention, reader.retention, spec.replay_window)
        self.moves_hold = retention is not None
        """No retention, nothing deleted: the start's hold is enough, and a thousand
        connections spare the database a write every ``HOLD_INTERVAL`` each. (A worker
        configured otherwise keeps more, never less: the hold only ever moves forward.)"""
        self.holding: asyncio.Task[None] | None = None
        self.last_move: float | None = None
        """When a commit last stored rows (monotonic; None: not yet on this connection)."""
        self.wake_retry_at: float | None = None
        self.waking: asyncio.Task[None] | None = None
        self.context = contextvars.copy_context()
        """The activity's context: a nudge heartbeats from the worker's listener task."""

    async def run(self) -> ReadResult:
        try:
            result = await self.connection.run()
        except ConfigError as error:
            raise ApplicationError(str(error), type="ConfigError", non_retryable=True) from None
        except StreamRefusedError as error:
            raise ApplicationError(
                str(error), type="StreamRefusedError", non_retryable=True
            ) from None
        moving = self._moving(result)
        if moving is None or not await self._move(moving):
            return result
        activity.raise_complete_async()  # completed above, through the client

    async def _move(self, why: str) -> bool:
        """Fail this attempt, flushed and committed, with a retryable error and this
        connection's progress as its last heartbeat details, through the client: Temporal
        retries it at once wherever there is room, with no workflow task in between, and
        the retry resumes from this cursor (nothing read twice, nothing to suspect). A
        heartbeat sent just before raising would race the failure and could be lost.
        False: the attempt could not be failed (it is routed as a cancelled result)."""
        progress = self.connection.session.progress()
        if progress.cursor is not None:
            # Everything read is committed: the retry starts where this one got to, not
            # where it began (as after a death), so it has nothing to re-read or suspect.
            progress = replace(progress, start_cursor=progress.cursor, first_id=None)
        error = ApplicationError(why, type=CONNECTION_MOVED, next_retry_delay=timedelta(0))
        handle = activity.client().get_async_activity_handle(task_token=self.info.task_token)
        try:
            await handle.fail(error, last_heartbeat_details=[asdict(progress)])
        except RPCError as rpc:
            activity.logger.warning("could not hand the connection over: %s", rpc)
            return False
        return True

    def _moving(self, result: ReadResult) -> str | None:
        """Why this connection, cancelled by its own worker, goes on as a retry elsewhere
        (None: it ended for the workflow to route)."""
        if result.outcome != Outcome.CANCELLED:
            return None
        details = activity.cancellation_details()
        if details is not None and details.cancel_requested:
            return None  # the workflow asked for it (a signal): it routes the result
        if self.moving is not None:
            return self.moving
        if activity.is_worker_shutdown():
            return "its worker is shutting down: the connection goes on on another worker"
        return None

    @property
    def streaming(self) -> bool:
        """Whether the connection reads the stream's body (not starting, not ending)."""
        return self.connection.keepalive.streaming

    def lease(self) -> ReaderLease:
        """This attempt's registration: its own id (a retry registers anew) and an expiry
        past anything the attempt can still write (see ``readers.reader_expiry``)."""
        info = activity.info()
        spec = self.input.spec
        timeout = info.start_to_close_timeout or (
            timedelta(seconds=spec.max_connection_age + spec.connect_timeout + spec.idle_timeout)
            + ATTEMPT_MARGIN
        )
        retry = info.retry_policy.maximum_interval if info.retry_policy is not None else None
        return ReaderLease(
            reader_id=f"{info.activity_id}.{info.attempt}.{token_hex(4)}",
            expires_at=reader_expiry(
                datetime.now(UTC),
                attempt_timeout=timeout,
                heartbeat_timeout=info.heartbeat_timeout,
                retry_interval=retry,
            ),
            worker_id=self.worker_id,
            workflow_id=info.workflow_id or None,
            run_id=info.workflow_run_id or None,
            activity_id=info.activity_id,
            attempt=info.attempt,
        )

    def _interval(self, streaming: bool) -> float:
        return self.reader.heartbeat_interval(streaming=streaming, timeout=self.timeout)

    def nudged(self) -> None:
        """The workflow asked for a cancellation: heartbeat now, so its answer brings it
        (the SDK still spaces heartbeats by its throttle, 0.5 s)."""
        self.context.run(self.connection.heartbeat, force=True)

    # -- live progress and the retention hold ---------------------------------------

    def _due(self) -> None:
        """Checked at every heartbeat check (heartbeats may be minutes apart): the live
        progress when it is due and changed, the retention hold every ``HOLD_INTERVAL``."""
        now = time.monotonic()
        if now >= self.next_progress:
            self.next_progress = now + self.reader.progress_interval
            self._publish(now)
        if self.moves_hold and now >= self.next_hold and self.holding is None:
            self.next_hold = now + HOLD_INTERVAL
            self.holding = asyncio.create_task(self._move_hold())

    def _publish(self, now: float) -> None:
        """Write the connection's progress to Redis (non-blocking, coalesced): a view for
        ``durable-sse status``, never the truth, and never in the workflow's history."""
        l2 = self.reader.stores.l2
        if l2 is None:
            return
        session = self.connection.session
        progress = ConnectionProgress(
            connection=self.input.connection,
            cursor=session.started.cursor,
            counts=session.counts(),
            commit_lag=self.connection.commit_lag,
            credentials=self.connection.credential_views(),
        )
        if progress == self.published and now < self.refresh_at:
            return
        self.published = progress
        self.refresh_at = now + PROGRESS_REFRESH
        stamped = replace(progress, at=datetime.now(UTC).isoformat())
        l2.submit_progress(self.input.spec.name, progress_json(stamped))

    # -- a resting checkpoint schedule (durable_sse.cursor.rest) -------------------------

    def _stored(self) -> None:
        """A commit stored new rows: after a pause (or first), make sure the stream's
        checkpoint schedule is not resting, in the background (commits never wait). Only
        commits that store count: a replay of stored events moves the cursor all along,
        and would hide the pause before a newer event."""
        now = time.monotonic()
        due = wake_check_due(
            last_move=self.last_move,
            retry_at=self.wake_retry_at,
            now=now,
            replay_window=self.input.spec.replay_window,
        )
        self.last_move = now
        if due and self.reader.wake_checkpoint is not None and self.waking is None:
            self.wake_retry_at = None
            self.waking = asyncio.create_task(self._wake())

    async def _wake(self) -> None:
        wake, stream = self.reader.wake_checkpoint, self.input.spec.name
        assert wake is not None
        try:
            async with asyncio.timeout(WAKE_TIMEOUT):
                await wake(stream)
        except Exception as error:  # noqa: BLE001 - tried again later, never the stream's end
            self.wake_retry_at = time.monotonic() + WAKE_RETRY
            activity.logger.warning(
                "stream %s: could not check its checkpoint schedule's rest (again in %.0f s): %s",
                stream,
                WAKE_RETRY,
                error,
            )
        finally:
            self.waking = None

    async def _move_hold(self) -> None:
        try:
            async with asyncio.timeout(HOLD_TIMEOUT):
                await self.connection.move_hold()
        except TimeoutError:
            activity.logger.debug(
                "stream %s: retention hold not moved in time", self.input.spec.name
            )
        finally:
            self.holding = None

    async def stop_reports(self) -> None:
        """The connection ended: no hold move outlives it; its last progress is written
        (its result says the rest to the workflow)."""
        if self.connection.session.intake is not None:
            self.published = None
            self._publish(time.monotonic())
        for task in (self.holding, self.waking):
            if task is not None and not task.done():
                task.cancel()
                await asyncio.wait([task])


def _heartbeat(progress: ReadProgress) -> None:
    activity.heartbeat(asdict(progress))


def _cancel_reason() -> str:
    """Why Temporal cancelled the connection, in words (a timeout is not a signal)."""
    details = activity.cancellation_details()
    if details is None:
        return "no reason given"
    reasons = {
        "requested by the workflow": details.cancel_requested,
        "the server no longer knows this attempt (timed out or replaced)": details.not_found,
        "timed out": details.timed_out,
        "worker shutting down": details.worker_shutdown,
        "paused": details.paused,
        "reset": details.reset,
    }
    return ", ".join(reason for reason, is_set in reasons.items() if is_set) or "no reason given"
