"""The read activity: one execution is one SSE connection.

Temporal glue only. The connection itself (its start, reading, commits and result) is
:class:`durable_sse.reader.connection.Connection`, its reports while it reads (live
progress, retention hold, checkpoint wake) are
:class:`durable_sse.reader.reports.ConnectionReports`, how often it heartbeats is
:mod:`durable_sse.reader.heartbeat_policy`, and the worker's running connections (the
ones its liveness ends or hands over) are :class:`durable_sse.reader.pool.ConnectionPool`;
here it is given what Temporal has to give, and what it raises is turned into what
Temporal understands:

* heartbeats carry the connection's progress (a retried attempt resumes from the dead
  one's start), spaced by the policy for this worker's connection count; cancellation
  (replay/pause/stop signals, worker shutdown) arrives with them, and a nudge
  (:mod:`durable_sse.ops.nudge`) asks for one at once;
* the attempt's registration in ``sse_readers`` expires when nothing the attempt can
  still write needs holding (:meth:`_ActivityConnection.lease`);
* a connection its own worker ends (a hand-over, a shutdown) fails its attempt through
  the client, so Temporal retries it at once elsewhere (:meth:`_ActivityConnection._move`);
* what retrying cannot fix (a setting, a refusal) is a non-retryable
  ``ApplicationError`` named after the error's class: the stream parks.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import Awaitable, Callable
from dataclasses import asdict, replace
from datetime import UTC, datetime, timedelta
from secrets import token_hex
from typing import Any

import httpx
from temporalio import activity
from temporalio.exceptions import ApplicationError, ApplicationErrorCategory
from temporalio.service import RPCError

from durable_sse.config.secrets import DeclaredSecrets
from durable_sse.contracts import (
    CONNECTION_MOVED,
    RETRY_NOW,
    Outcome,
    ReadInput,
    ReadProgress,
    ReadResult,
    Route,
)
from durable_sse.cursor.readers import ReaderLease, reader_expiry
from durable_sse.errors import ConfigError, StoreError, StreamRefusedError
from durable_sse.log.workers import WorkerLeaseLostError, WorkerState
from durable_sse.ops.logs import install_redaction
from durable_sse.ops.nudge import Nudges
from durable_sse.reader.connection import Connection
from durable_sse.reader.credentials import Credentials
from durable_sse.reader.heartbeat_policy import connection_heartbeat_interval
from durable_sse.reader.keepalive import Heartbeats
from durable_sse.reader.metrics import ReaderMetrics
from durable_sse.reader.pool import ConnectionPool
from durable_sse.reader.reports import PROGRESS_INTERVAL, ConnectionReports
from durable_sse.reader.session import progress_from_details
from durable_sse.reader.successors import Successors
from durable_sse.stores import Stores

logger = logging.getLogger(__name__)

SHUTTING_DOWN = "its worker is shutting down: the connection goes on on another worker"
"""Why a connection of a stopping worker moves."""
ATTEMPT_MARGIN = timedelta(seconds=60)
"""Added to ``max_connection_age + connect_timeout + idle_timeout`` for a connection's
registration when the attempt has no ``start_to_close`` timeout to go by (run outside a
workflow); ``workflows/stream.py`` gives the read activity the same margin."""


class ReadActivities:
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
        successors: Successors | None = None,
    ) -> None:
        """``retention``: the worker's (``DURABLE_SSE_RETENTION``), for streams without
        their own: a connection moves its retention hold only when one applies.
        ``wake_checkpoint``: wakes a stream's resting checkpoint schedule
        (``ScheduleActivities.wake``; None: schedules are never woken from here).
        ``worker_lease``: the worker's liveness lease now (``WorkerLiveness.worker_id``;
        None: connections run under no lease, and no watchdog can move them).
        ``successors``: at the worker's shutdown a connection hands its stream over at
        once and reads on until its retry starts elsewhere (None: it ends first)."""
        self.successors = successors
        install_redaction()
        self.worker_lease = worker_lease
        self.pool = ConnectionPool()
        """This worker's running connections: its liveness ends or hands them over."""
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

    @activity.defn(name="read_stream")
    async def read_stream(self, input: ReadInput) -> ReadResult:
        connection = _ActivityConnection(self, input)
        nudges = self.nudges
        if nudges is not None:
            nudges.start()
            nudges.register(input.spec.name, connection.nudged)
        try:
            with self.pool.holding(connection):
                return await connection.run()
        finally:
            if nudges is not None:
                nudges.unregister(input.spec.name, connection.nudged)
            await connection.reports.stop()
            await connection.connection.close()

    def heartbeat_interval(self, *, streaming: bool = True, timeout: float | None = None) -> float:
        """Seconds between one connection's heartbeats, within the worker's budget
        (:func:`durable_sse.reader.heartbeat_policy.connection_heartbeat_interval`)."""
        live = self.nudges is not None and self.nudges.live
        return connection_heartbeat_interval(
            self.pool.open_connections, streaming=streaming, timeout=timeout, nudges_live=live
        )

    def activities(self) -> list[Any]:
        return [self.read_stream]


class _ActivityConnection:
    """One execution of ``read_stream``: a :class:`Connection` and what Temporal adds."""

    def __init__(self, reader: ReadActivities, input: ReadInput) -> None:
        self.reader = reader
        self.input = input
        self.info = info = activity.info()
        self.timeout = info.heartbeat_timeout.total_seconds() if info.heartbeat_timeout else None
        """The attempt's heartbeat timeout (None: none, outside a workflow)."""
        self.worker_id = reader.worker_lease() if reader.worker_lease is not None else None
        """The worker lease this connection runs and commits under."""
        self.moving: str | None = None
        """Why its worker cancels it to go on elsewhere (a hand-over), if it does."""
        self.handed_over = False
        """Failed through the client while it reads on (make before break): it sends no
        more heartbeats, and whatever it ends with, Temporal has its answer already."""
        self._failing: asyncio.Task[bool] | None = None
        details = info.heartbeat_details
        self.connection = Connection(
            input,
            stores=reader.stores,
            http=reader.http,
            heartbeats=Heartbeats(
                send=self._heartbeat, interval=self._interval, due=lambda: self.reports.due()
            ),
            lease=self.lease(),
            previous=progress_from_details(details[0]) if details else None,
            retried=info.attempt > 1,
            secrets=reader.secrets,
            credentials=reader.credentials,
            allowed_hosts=reader.allowed_hosts,
            metrics=ReaderMetrics(activity.metric_meter(), input.spec.name),
            log=activity.logger,
            cancel_reason=self._why_cancelled,
            on_stored=lambda: self.reports.stored(),
        )
        self.reports = ConnectionReports(
            self.connection,
            connection_id=input.connection,
            progress_interval=reader.progress_interval,
            retention=reader.retention,
            wake_checkpoint=reader.wake_checkpoint,
            log=activity.logger,
        )
        self.context = contextvars.copy_context()
        """The activity's context: a nudge heartbeats from the worker's listener task."""

    async def run(self) -> ReadResult:
        if self.reader.pool.stale(self.info.current_attempt_scheduled_time):
            # Failed again by the watchdog while this worker was paused, most likely: a
            # retry (at once) goes wherever the stream is not read already.
            raise _moved(
                "the attempt reached this worker before its lease was revoked; it goes on "
                "as a retry",
                expected=True,  # after SIGCONT
            )
        task = asyncio.current_task()
        watch = None
        if self.reader.successors is not None and task is not None:
            watch = asyncio.create_task(self._read_on_until_replaced(task))
        try:
            result = await self.connection.run()
        except ConfigError as error:
            raise ApplicationError(str(error), type="ConfigError", non_retryable=True) from None
        except StreamRefusedError as error:
            raise ApplicationError(
                str(error), type="StreamRefusedError", non_retryable=True
            ) from None
        except WorkerLeaseLostError as error:
            # This worker was taken for dead and its streams moved: the watchdog failed
            # this attempt already, most likely, and Temporal ignores this answer. One
            # line in the log, not a traceback per connection.
            raise _moved(str(error), expected=True) from None
        except asyncio.CancelledError:
            if not self._ended_by_revocation():
                raise
            # Ended by its own worker while it started (ConnectionPool.lease_revoked):
            # the same answer as a commit the fence refuses.
            raise _moved(
                f"worker lease {self.worker_id} was revoked while the connection started",
                expected=True,
            ) from None
        except StoreError as error:
            if not await self._lease_lost():
                raise
            # The worker that revoked the lease ended this worker's open transactions
            # (log.sessions): one line, like a refused commit, not a traceback each.
            raise _moved(
                f"worker lease {self.worker_id} was revoked: {error}", expected=True
            ) from None
        finally:
            if watch is not None:
                watch.cancel()
            if self._failing is not None:
                # Ended on its own while the hand-over was being sent: its answer decides.
                self.handed_over = await self._failing
        if self.handed_over:
            activity.raise_complete_async()  # answered at the hand-over, through the client
        moving = self._moving(result)
        if moving is None or not await self._move(moving):
            return result
        activity.raise_complete_async()  # completed above, through the client

    async def _read_on_until_replaced(self, task: asyncio.Task[Any]) -> None:
        """At the worker's shutdown: hand the stream over now, at the committed cursor,
        and read on until the retry has started on another worker
        (:mod:`durable_sse.reader.successors`); then end ``task``. A connection that is
        not reading yet, or with no other worker to take it, ends first and hands over
        after (:meth:`_move`)."""
        successors = self.reader.successors
        assert successors is not None
        await activity.wait_for_worker_shutdown()
        progress = self.connection.session.progress()
        if not self.streaming or progress.cursor is None or not await successors.expected():
            self.moving = SHUTTING_DOWN
            task.cancel()
            return
        self.handed_over = True  # no heartbeat from here on: it would race the failure
        self._failing = asyncio.create_task(self._fail(SHUTTING_DOWN, handed(progress)))
        if not await asyncio.shield(self._failing):
            self._failing = None
            self.handed_over = False
            self.moving = SHUTTING_DOWN
            task.cancel()
            return
        self._failing = None
        activity.logger.info(
            "stream %s handed over at %s: reading on until its retry starts elsewhere",
            self.input.spec.name,
            progress.cursor,
        )
        await successors.wait(self.input.spec.name, self.info.activity_id, self.info.attempt)
        task.cancel()

    async def _move(self, why: str) -> bool:
        """Fail this attempt, flushed and committed, through the client (see :meth:`_fail`),
        so that the retry resumes from this cursor (nothing read twice, nothing to
        suspect). False: the attempt could not be failed (it is routed as a cancelled
        result)."""
        progress = self.connection.session.progress()
        if progress.cursor is not None:
            # Everything read is committed: the retry starts where this one got to, not
            # where it began (as after a death), so it has nothing to re-read or suspect.
            progress = handed(progress)
        return await self._fail(why, progress)

    async def _fail(self, why: str, progress: ReadProgress) -> bool:
        """Fail this attempt with a retryable error and ``progress`` as its last heartbeat
        details, through the client: Temporal retries it at once wherever there is room,
        with no workflow task in between. A heartbeat sent just before would race the
        failure and could be lost."""
        error = _moved(why)
        handle = activity.client().get_async_activity_handle(task_token=self.info.task_token)
        try:
            await handle.fail(error, last_heartbeat_details=[asdict(progress)])
        except RPCError as rpc:
            activity.logger.warning("could not hand the connection over: %s", rpc)
            return False
        return True

    def _lease_revoked(self) -> bool:
        """Whether this worker found the lease this connection runs under revoked: the
        watchdog that revoked it failed the attempt already, so its own end is moot."""
        return self.worker_id is not None and self.worker_id in self.reader.pool.revoked

    async def _lease_lost(self) -> bool:
        """Whether the lease is revoked, as this worker knows or (a commit that failed at
        SIGCONT, before this worker's renewal found out) as the store says."""
        if self._lease_revoked():
            return True
        if self.worker_id is None:
            return False
        try:
            lease = await self.reader.stores.workers.lease(self.worker_id)
        except StoreError:
            return False
        return lease is not None and lease.state == WorkerState.REVOKED

    def _ended_by_revocation(self) -> bool:
        """Whether the cancellation came from this worker's pool, its lease revoked, and
        not from Temporal."""
        return self._lease_revoked() and activity.cancellation_details() is None

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
            return SHUTTING_DOWN
        return None

    @property
    def route(self) -> Route:
        return self.input.route

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

    def _why_cancelled(self) -> str:
        """Why the connection was cancelled, in words: its own worker's reason first."""
        if self.handed_over:
            return "handed over at its worker's shutdown; its retry reads on another worker"
        return self.moving or _cancel_reason()

    def _heartbeat(self, progress: ReadProgress) -> None:
        if not self.handed_over:
            activity.heartbeat(asdict(progress))

    def _interval(self, streaming: bool) -> float:
        return self.reader.heartbeat_interval(streaming=streaming, timeout=self.timeout)

    def nudged(self) -> None:
        """The workflow asked for a cancellation: heartbeat now, so its answer brings it
        (the SDK still spaces heartbeats by its throttle, 0.5 s)."""
        self.context.run(self.connection.heartbeat, force=True)


def handed(progress: ReadProgress) -> ReadProgress:
    """``progress`` as a hand-over's: its retry starts at the committed cursor."""
    return replace(progress, start_cursor=progress.cursor, first_id=None, handed_over=True)


def _moved(why: str, *, expected: bool = False) -> ApplicationError:
    """The failure of an attempt that goes on as a retry elsewhere, at once
    (:data:`CONNECTION_MOVED`). ``expected``: the benign kind, which the SDK logs at debug
    (a paused worker that comes back ends a hundred connections so)."""
    return ApplicationError(
        why,
        type=CONNECTION_MOVED,
        next_retry_delay=RETRY_NOW,
        category=(
            ApplicationErrorCategory.BENIGN if expected else ApplicationErrorCategory.UNSPECIFIED
        ),
    )


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
