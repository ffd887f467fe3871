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
* every ``PROGRESS_INTERVAL`` the connection's cursor, counts, gaps and lagging id are
  sent to its workflow (the ``progress`` signal) when anything changed, so the status
  query and the Web UI stay current while a connection lasts (heartbeat details are not
  enough: a workflow cannot read them);
* what retrying cannot fix (a setting, a refusal) is a non-retryable
  ``ApplicationError`` named after the error's class: the stream parks.
"""

from __future__ import annotations

import asyncio
import contextvars
import time
from dataclasses import asdict, replace
from datetime import UTC, datetime, timedelta
from secrets import token_hex
from typing import Any

import httpx
from temporalio import activity
from temporalio.exceptions import ApplicationError

from durable_sse.config.secrets import DeclaredSecrets
from durable_sse.contracts import ConnectionProgress, ReadInput, ReadProgress, ReadResult
from durable_sse.cursor.readers import ReaderLease, reader_expiry
from durable_sse.errors import ConfigError, StoreError, StreamRefusedError
from durable_sse.ops.logs import install_redaction
from durable_sse.ops.nudge import Nudges
from durable_sse.reader.connection import Connection
from durable_sse.reader.keepalive import Heartbeats
from durable_sse.reader.metrics import ReaderMetrics
from durable_sse.reader.session import progress_from_details
from durable_sse.stores import Stores

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
NUDGED_HEARTBEAT_INTERVAL = 4.0
"""Seconds between heartbeats while the worker hears nudges (durable_sse/ops/nudge.py): a
signal's cancellation then comes with the heartbeat its nudge asks for, so the regular
heartbeats only show the attempt is alive. 0.4 of ``READ_HEARTBEAT_TIMEOUT`` (10 s):
one late heartbeat never times a live attempt out. A thousand connections cost 250 calls
a second instead of 500, and a lost nudge leaves a cancellation at most this late."""
PROGRESS_INTERVAL = 20.0
"""Seconds between progress reports to the workflow (only sent when something changed).
A report is checked for whenever the connection wakes (a batch, or at most
``MAX_HEARTBEAT_INTERVAL`` later), so the workflow's view is under 30 s old; each report
costs the workflow's history four events (docs/benchmarks.md)."""
PROGRESS_TIMEOUT = 5.0
"""Seconds one report may take (store reads and the signal); a late one is dropped."""
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
        allowed_hosts: tuple[str, ...] | None = None,
        progress_interval: float = PROGRESS_INTERVAL,
        nudges: Nudges | None = None,
    ) -> None:
        install_redaction()
        self.nudges = nudges
        """Without it (or while it is not subscribed) cancellations wait for heartbeats."""
        self.progress_interval = progress_interval
        self.allowed_hosts = allowed_hosts
        self.http = http
        self.stores = stores
        self.secrets = DeclaredSecrets() if secrets is None else secrets
        self.open_connections = 0

    @activity.defn(name="read_stream")
    async def read_stream(self, input: ReadInput) -> ReadResult:
        self.open_connections += 1
        connection = _ActivityConnection(self, input)
        nudges = self.nudges
        if nudges is not None:
            nudges.start()
            nudges.register(input.spec.name, connection.nudged)
        try:
            return await connection.run()
        finally:
            self.open_connections -= 1
            if nudges is not None:
                nudges.unregister(input.spec.name, connection.nudged)
            await connection.stop_reports()
            await connection.connection.close()

    def heartbeat_interval(self, *, streaming: bool = True) -> float:
        """Seconds between one connection's heartbeats, within the worker's budget.

        Only a connection that is streaming takes the long nudged interval: one still
        resolving its cursor or waiting for a response head keeps the short one, so a
        start-up burst that starves the event loop does not time its attempts out."""
        nudged = streaming and self.nudges is not None and self.nudges.live
        return heartbeat_interval(self.open_connections, nudged=nudged)

    def activities(self) -> list[Any]:
        return [self.read_stream]


MAX_CONNECTIONS_PER_WORKER = int(HEARTBEAT_BUDGET * MAX_HEARTBEAT_INTERVAL)
"""Connections one worker takes (2,500): more could not each heartbeat every
``MAX_HEARTBEAT_INTERVAL`` within the budget. ``worker.py`` sizes its activity slots by it."""


def heartbeat_interval(open_connections: int, *, nudged: bool = False) -> float:
    """Seconds between one connection's heartbeats when the worker holds
    ``open_connections``: ``NUDGED_HEARTBEAT_INTERVAL`` while nudges reach the worker
    (cancellations do not wait for heartbeats), else short for prompt cancellations,
    stretched to stay within ``HEARTBEAT_BUDGET``, never past ``MAX_HEARTBEAT_INTERVAL``."""
    if nudged:
        return NUDGED_HEARTBEAT_INTERVAL
    stretched = max(HEARTBEAT_INTERVAL, open_connections / HEARTBEAT_BUDGET)
    return min(stretched, MAX_HEARTBEAT_INTERVAL)


class _ActivityConnection:
    """One execution of ``read_stream``: a :class:`Connection` and what Temporal adds."""

    def __init__(self, reader: StreamReader, input: ReadInput) -> None:
        self.reader = reader
        self.input = input
        info = activity.info()
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
            allowed_hosts=reader.allowed_hosts,
            metrics=ReaderMetrics(activity.metric_meter(), input.spec.name),
            log=activity.logger,
            cancel_reason=_cancel_reason,
        )
        self.next_report = time.monotonic() + reader.progress_interval
        self.reporting: asyncio.Task[None] | None = None
        self.reported: ConnectionProgress | None = None
        """The last report the workflow got (its ``at`` left out)."""
        self.context = contextvars.copy_context()
        """The activity's context: a nudge heartbeats from the worker's listener task."""

    async def run(self) -> ReadResult:
        try:
            return await self.connection.run()
        except ConfigError as error:
            raise ApplicationError(str(error), type="ConfigError", non_retryable=True) from None
        except StreamRefusedError as error:
            raise ApplicationError(
                str(error), type="StreamRefusedError", non_retryable=True
            ) from None

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
        )

    def _interval(self, streaming: bool) -> float:
        return self.reader.heartbeat_interval(streaming=streaming)

    def nudged(self) -> None:
        """The workflow asked for a cancellation: heartbeat now, so its answer brings it
        (the SDK still spaces heartbeats by its throttle, 0.5 s)."""
        self.context.run(self.connection.heartbeat, force=True)

    # -- progress reports ----------------------------------------------------------

    def _due(self) -> None:
        """Checked at every heartbeat check: heartbeats may be ``NUDGED_HEARTBEAT_INTERVAL``
        apart, reports are due every ``progress_interval``."""
        now = time.monotonic()
        if now >= self.next_report and self.reporting is None:
            self.next_report = now + self.reader.progress_interval
            self.reporting = asyncio.create_task(self._report())

    async def _report(self) -> None:
        """Tell the workflow what this connection has done, if anything changed.

        A view, never the truth: a report that fails or comes late is dropped (logged),
        and the next one says it all again.
        """
        connection = self.connection
        stream, order = self.input.spec.name, self.input.spec.id_order
        report = ConnectionProgress(
            connection=self.input.connection,
            cursor=connection.session.started.cursor,
            counts=connection.session.counts(),
            commit_lag=connection.commit_lag,
        )
        try:
            async with asyncio.timeout(PROGRESS_TIMEOUT):
                await connection.move_hold()
                try:
                    stores = self.reader.stores
                    report.gaps = await stores.gap_store.gap_summary(stream, order)
                    checkpoint = await stores.checkpoints.get_checkpoint(stream)
                    report.lagging_id = checkpoint.lagging_id if checkpoint else None
                except StoreError as error:
                    activity.logger.debug("stream %s: report without gaps: %s", stream, error)
                    report.gaps = None
                if report == self.reported:
                    return
                info = activity.info()
                if info.workflow_id is None:  # a standalone activity: no workflow to tell
                    return
                handle = activity.client().get_workflow_handle(
                    info.workflow_id, run_id=info.workflow_run_id
                )
                sent = replace(report, at=datetime.now(UTC).isoformat())
                await handle.signal("progress", sent)
                self.reported = report
        except RuntimeError as error:  # no client: an activity run outside a worker (tests)
            activity.logger.debug("stream %s: progress not reported: %s", stream, error)
        except Exception as error:  # noqa: BLE001 - a view: dropped, the next one retries
            activity.logger.info("stream %s: progress not reported: %s", stream, error)
        finally:
            self.reporting = None

    async def stop_reports(self) -> None:
        """The connection ended: its result says it all, a late report would be ignored."""
        task = self.reporting
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
