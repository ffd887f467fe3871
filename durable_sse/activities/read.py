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
  the client, so Temporal retries it at once elsewhere
  (:class:`durable_sse.activities.handover.HandOver`);
* what retrying cannot fix (a setting, a refusal) is a non-retryable
  ``ApplicationError`` named after the error's class: the stream parks.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import Awaitable, Callable
from dataclasses import asdict
from datetime import UTC, datetime
from secrets import token_hex
from typing import Any

import httpx
from temporalio import activity
from temporalio.exceptions import ApplicationError

from durable_sse.activities.handover import SHUTTING_DOWN, HandOver, moved
from durable_sse.config.secrets import DeclaredSecrets
from durable_sse.config.spec import attempt_timeout
from durable_sse.contracts import Outcome, ReadInput, ReadProgress, ReadResult, Route
from durable_sse.cursor.readers import ReaderLease, reader_expiry
from durable_sse.errors import ConfigError, StoreError, StreamRefusedError
from durable_sse.log.workers import WorkerLeaseLostError
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
        self.hand_over = HandOver(self.connection, successors=reader.successors)
        self.context = contextvars.copy_context()
        """The activity's context: a nudge heartbeats from the worker's listener task."""

    @property
    def moving(self) -> str | None:
        """Why its worker cancels it to go on elsewhere, if it does (set by the pool)."""
        return self.hand_over.moving

    @moving.setter
    def moving(self, why: str | None) -> None:
        self.hand_over.moving = why

    async def run(self) -> ReadResult:
        if self.reader.pool.stale(self.info.current_attempt_scheduled_time):
            # Failed again by the watchdog while this worker was paused, most likely: a
            # retry (at once) goes wherever the stream is not read already.
            raise moved(
                "the attempt reached this worker before its lease was revoked; it goes on "
                "as a retry",
                expected=True,  # after SIGCONT
            )
        task = asyncio.current_task()
        watch = self.hand_over.watch(task) if task is not None else None
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
            raise moved(str(error), expected=True) from None
        except asyncio.CancelledError:
            if not self._ended_by_revocation():
                raise
            # Ended by its own worker while it started (ConnectionPool.lease_revoked):
            # the same answer as a commit the fence refuses.
            raise moved(
                f"worker lease {self.worker_id} was revoked while the connection started",
                expected=True,
            ) from None
        except StoreError as error:
            try:
                lost = await self._lease_lost()
            except asyncio.CancelledError:
                # Its worker, finding the lease revoked meanwhile, ended the connections
                # that run under it (ConnectionPool.lease_revoked): the answer is moot.
                if not self._ended_by_revocation():
                    raise
                lost = True
            if not lost:
                raise
            # The worker that revoked the lease ended this worker's open transactions
            # (log.sessions): one line, like a refused commit, not a traceback each.
            raise moved(
                f"worker lease {self.worker_id} was revoked: {error}", expected=True
            ) from None
        finally:
            if watch is not None:
                watch.cancel()
            await self.hand_over.settle()
        if self.hand_over.handed_over:
            activity.raise_complete_async()  # answered at the hand-over, through the client
        moving = self._moving(result)
        if moving is None or not await self.hand_over.move(moving):
            return result
        activity.raise_complete_async()  # completed above, through the client

    def _lease_revoked(self) -> bool:
        """Whether this worker found the lease this connection runs under revoked: the
        watchdog that revoked it failed the attempt already, so its own end is moot."""
        return self.worker_id is not None and self.worker_id in self.reader.pool.revoked

    async def _lease_lost(self) -> bool:
        """Whether the lease is revoked, as this worker knows or (a commit that failed at
        SIGCONT, before this worker's renewal found out) as the store says."""
        if self.worker_id is None:
            return False
        return await self.reader.pool.lease_lost(self.worker_id, self.reader.stores.workers)

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
        timeout = info.start_to_close_timeout or attempt_timeout(self.input.spec)
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
        if self.hand_over.handed_over:
            return "handed over at its worker's shutdown; its retry reads on another worker"
        return self.moving or _cancel_reason()

    def _heartbeat(self, progress: ReadProgress) -> None:
        if not self.hand_over.handed_over:
            activity.heartbeat(asdict(progress))

    def _interval(self, streaming: bool) -> float:
        return self.reader.heartbeat_interval(streaming=streaming, timeout=self.timeout)

    def nudged(self) -> None:
        """The workflow asked for a cancellation: heartbeat now, so its answer brings it
        (the SDK still spaces heartbeats by its throttle, 0.5 s)."""
        self.context.run(self.connection.heartbeat, force=True)


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
