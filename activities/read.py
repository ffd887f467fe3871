"""The read activity: one execution is one SSE connection.

This module is the I/O around :class:`~durable_sse.reader.intake.Intake`, which makes every
decision about what a connection read (batches, drop signals, gaps, when to end):

* the start cursor comes from :class:`~durable_sse.cursor.resolve.CursorResolver` together with
  what the store knows of the stream (lagging id, floor, open gaps) in one read, which
  also refuses an ``id_order`` other than the stream's keys were made with (the stream
  parks) and registers the connection in ``sse_readers`` until it ends, so retention
  keeps what it re-reads (:mod:`durable_sse.log.retention`);
* bytes are read ahead by a pump task into a bounded queue, decoded, and handed to the
  intake; up to ``MAX_BATCHES_IN_FLIGHT`` batches commit while the next is parsed, in the
  order they were read (group commit, ``durable_sse.log.commits``), each with its gap changes
  in its own transaction;
* per committed batch: L1 -> L2 (coalesced, non-blocking) -> heartbeat; a cursor never
  points past an uncommitted event or a drop signal not yet recorded (invariants 1, 5);
* the connection ends with an :class:`Outcome` the workflow routes on, and the stream's
  gap summary read at the end; only refusals that retrying cannot fix are raised
  (non-retryable ``ApplicationError``);
* cancellation (replay/pause/stop signals, worker shutdown) flushes what was read, then
  returns ``CANCELLED``;
* every ``PROGRESS_INTERVAL`` it reads the stream's gaps and lagging id and, when anything
  changed, reports them with its cursor and counts to its workflow (the ``progress``
  signal), so the status query and the Web UI stay current while a connection lasts.
  Heartbeat details are not enough: a workflow cannot read them.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import time
from collections import deque
from collections.abc import Awaitable
from dataclasses import asdict, fields, replace
from datetime import UTC, datetime, timedelta
from secrets import token_hex
from typing import Any, TypeVar

import httpx
from temporalio import activity
from temporalio.exceptions import ApplicationError

from durable_sse.config.hosts import host_allowed
from durable_sse.config.secrets import DeclaredSecrets, request_secrets
from durable_sse.contracts import (
    ConnectionProgress,
    Outcome,
    ReadCounts,
    ReadInput,
    ReadProgress,
    ReadResult,
    Route,
)
from durable_sse.cursor.resolve import CursorResolver
from durable_sse.errors import (
    BatchRefusedError,
    ConfigError,
    LineTooLongError,
    StoreError,
    StreamError,
    StreamRefusedError,
    UnsendableIdError,
)
from durable_sse.ids import is_newer
from durable_sse.log.commits import CommitJob
from durable_sse.log.eventlog import ConnectionStart, InsertResult, ReaderLease
from durable_sse.log.retention import reader_expiry
from durable_sse.ops.logs import install_redaction
from durable_sse.ops.metrics import ReaderMetrics
from durable_sse.ops.nudge import Nudges
from durable_sse.reader.intake import Batch, Intake
from durable_sse.reader.stored import StoredAhead, StoredPage
from durable_sse.redact import redact_url
from durable_sse.sse.content_type import is_event_stream
from durable_sse.sse.decoder import SSEDecoder
from durable_sse.sse.request import request_headers, same_origin, with_cursor, with_query
from durable_sse.sse.response import (
    REFUSAL_HINTS,
    StatusPolicy,
    describe_error,
    parse_retry_after,
    status_policy,
    truncation_header,
)
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
MAX_BATCHES_IN_FLIGHT = 3
"""Batches of one connection committing at once (they commit in order): the next batch
is written while the previous one commits."""
MAX_REDIRECTS = 5
READ_AHEAD_CHUNKS = 64
"""Chunks (up to 64 KiB each) read ahead while a batch commits: bounds memory."""
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

_EOF = object()
T = TypeVar("T")


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
        self.resolver = CursorResolver(stores.l1, stores.l2, stores.starts)
        self.secrets = DeclaredSecrets() if secrets is None else secrets
        self.open_connections = 0

    @activity.defn(name="read_stream")
    async def read_stream(self, input: ReadInput) -> ReadResult:
        self.open_connections += 1
        connection = _Connection(self, input)
        nudges = self.nudges
        if nudges is not None:
            nudges.start()
            nudges.register(connection.stream, connection.nudged)
        try:
            return await connection.run()
        finally:
            self.open_connections -= 1
            if nudges is not None:
                nudges.unregister(connection.stream, connection.nudged)
            await connection.stop_reports()
            await connection.stop_fetching_stored()
            await connection.release()

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


def _last_progress() -> ReadProgress | None:
    """Heartbeat details of the previous attempt: a hint, the stores are the truth."""
    details = activity.info().heartbeat_details
    if not details:
        return None
    value = details[0]
    if isinstance(value, ReadProgress):
        return value
    if isinstance(value, dict):
        counts = value.get("counts")
        if not isinstance(counts, dict):
            counts = {}
        # Only the counts this version knows: the attempt that died may have run on a
        # worker of another version (a rolling deploy), and a retry must not fail on it.
        known = {f.name: counts[f.name] for f in fields(ReadCounts) if f.name in counts}
        return ReadProgress(
            cursor=value.get("cursor"),
            start_cursor=value.get("start_cursor"),
            first_id=value.get("first_id"),
            counts=ReadCounts(**known),
        )
    return None


def _gap_id() -> str:
    return token_hex(8)


def _now_iso() -> str:
    return datetime.now(UTC).isoformat()


class _Connection:
    """One connection: the HTTP exchange, the intake, the commits in flight."""

    def __init__(self, reader: StreamReader, input: ReadInput) -> None:
        self.reader = reader
        self.input = input
        self.spec = input.spec
        self.stream = input.spec.name
        self.order = input.spec.id_order
        self.route = Route(input.route)
        self.decoder = SSEDecoder(
            max_line_bytes=self.spec.max_line_bytes,
            max_event_bytes=self.spec.max_event_bytes,
            max_id_bytes=self.spec.max_id_bytes,
        )
        self.secret_params = frozenset(self.spec.query_from_env)
        self.metrics = ReaderMetrics(activity.metric_meter(), self.stream)
        self.result = ReadResult(outcome=Outcome.DROPPED)
        self.intake: Intake | None = None
        self.start_cursor: str | None = None
        self.first_id: str | None = None
        self.inflight: deque[asyncio.Task[None]] = deque()
        self.last_job: CommitJob | None = None
        self.last_heartbeat = time.monotonic()
        self.streaming = False
        """The response head arrived and events are being read."""
        self.body_done = False
        """Nothing more to take from the body: its end, a read error, or bytes the
        decoder refused (after which it is not fed again)."""
        self.previous: ReadProgress | None = None
        """Heartbeat details of the attempt before (sent again until this one starts)."""
        self.carried = ReadCounts()
        """Counts of earlier attempts (a retried attempt keeps counting)."""
        self.commit_lag: float | None = None
        self.next_report = time.monotonic() + reader.progress_interval
        self.reporting: asyncio.Task[None] | None = None
        self.reported: ConnectionProgress | None = None
        """The last report the workflow got (its ``at`` left out)."""
        self.context = contextvars.copy_context()
        """The activity's context: a nudge heartbeats from the worker's listener task."""
        self.fetching_stored: asyncio.Task[StoredPage] | None = None
        self.lease: ReaderLease | None = None
        """This attempt's registration in ``sse_readers`` (retention keeps its start)."""
        self.horizon_logged = False
        """An id dropped at the retention horizon was logged (once per connection)."""
        self.hold: str | None = None
        """What the registration holds now (moved forward with the reports)."""

    # -- lifecycle -----------------------------------------------------------------

    async def run(self) -> ReadResult:
        progress = self.previous = _last_progress()
        if progress is not None:
            self.carried = progress.counts
        if not host_allowed(self.spec.url, self.reader.allowed_hosts):
            raise ApplicationError(
                f"stream {self.stream!r}: setting 'url' names a host that is not in "
                f"SSE_ALLOWED_HOSTS ({self._redact(self.spec.url)})",
                type="ConfigError",
                non_retryable=True,
            )
        self.lease = self._lease()
        try:
            start = await self._heartbeating(
                self.reader.resolver.resolve(
                    self.stream,
                    self.order,
                    self.route,
                    explicit=self.input.start_id,
                    retry_of=progress,
                    retried=activity.info().attempt > 1,
                    reader=self.lease,
                )
            )
        except ConfigError as error:  # IdOrderMismatchError: nothing was touched
            activity.logger.error("stream %s: %s; parked", self.stream, error)
            raise ApplicationError(
                f"{error}; the stream is parked", type="ConfigError", non_retryable=True
            ) from None
        self._begin(start)
        intake = self.intake
        assert intake is not None
        if self.fetching_stored is not None:
            # A replay: its first page of stored keys before its first event, so that it
            # skips what is stored from the start (one indexed query, a few ms).
            await self._heartbeating(asyncio.wait([self.fetching_stored]))
        try:
            secrets_ = request_secrets(
                self.reader.secrets,
                headers_from_env=self.spec.headers_from_env,
                query_from_env=self.spec.query_from_env,
                url=self.spec.url,
                stream=self.stream,
            )
            headers = request_headers(
                cursor=self.start_cursor,
                cursor_param=self.spec.cursor_param,
                secret_headers=secrets_.headers,
                stream=self.stream,
            )
            url = with_query(
                with_cursor(
                    self.spec.url, self.spec.cursor_param, self.start_cursor, stream=self.stream
                ),
                secrets_.query,
            )
        except ConfigError as error:
            raise ApplicationError(str(error), type="ConfigError", non_retryable=True) from None
        except UnsendableIdError as error:
            raise ApplicationError(
                f"{error}; the stream is parked until resumed",
                type="StreamRefusedError",
                non_retryable=True,
            ) from None
        if intake.outcome is not None:
            # Open gaps the workflow did not know of: end now so the repair can start.
            return await self._finish(intake.outcome)
        try:
            return await self._read_and_commit(url, headers)
        except BatchRefusedError as error:
            # Nothing from the refused batch on was stored and the cursor stands before
            # it: parked, the status says why, and `resume` reads it all again.
            activity.logger.warning("stream %s: %s; parked", self.stream, error)
            # The batches after it fail with it (each waits for the one before it).
            await asyncio.gather(*self.inflight, return_exceptions=True)
            self.inflight.clear()
            raise ApplicationError(
                f"{error}; the stream is parked until resumed",
                type="StreamRefusedError",
                non_retryable=True,
            ) from None

    async def _read_and_commit(self, url: str, headers: dict[str, str]) -> ReadResult:
        """Connect, read until an outcome, and commit what was read, whatever ends it."""
        try:
            outcome = await self._connect(url, headers)
        except asyncio.CancelledError:
            await self._flush()
            activity.logger.info(
                "stream %s: connection cancelled (%s) after flushing",
                self.stream,
                _cancel_reason(),
            )
            return await self._finish(Outcome.CANCELLED)
        except StreamRefusedError as error:
            await self._flush()
            self._count_ids_out_of_order()
            raise ApplicationError(
                str(error), type="StreamRefusedError", non_retryable=True
            ) from None
        await self._flush()
        assert self.intake is not None
        return await self._finish(self.intake.ending(outcome))

    def _begin(self, start: ConnectionStart) -> None:
        self.start_cursor = self.hold = start.cursor
        self.result.start_cursor = start.cursor
        self.result.cursor_source = start.source
        try:
            self.intake = Intake(
                self.spec,
                route=self.route,
                cursor=start.cursor,
                context=start.context,
                known_gaps=self.input.known_gaps,
                new_gap_id=_gap_id,
                now_iso=_now_iso,
                retried=activity.info().attempt > 1,
                read_before=self.input.events_read_before > 0 or self.carried.events_read > 0,
            )
        except ConfigError as error:  # a drop_notice pattern RE2 refuses
            raise ApplicationError(str(error), type="ConfigError", non_retryable=True) from None
        if start.cursor:
            self.decoder.last_event_id = start.cursor
        floor = start.context.floor
        if start.cursor and is_newer(floor, start.cursor, self.order):
            # A replay below the newest stored id: skip what is stored (durable_sse.reader.stored).
            self.intake.stored = StoredAhead(self.order, start=start.cursor)
            self._fetch_stored()
        self._heartbeat(force=True)

    def _redact(self, url: str) -> str:
        return redact_url(url, self.secret_params)

    def _lease(self) -> ReaderLease:
        """This attempt's registration: its own id (a retry registers anew) and an expiry
        past anything the attempt can still write (see ``retention.reader_expiry``)."""
        info = activity.info()
        spec = self.spec
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

    async def release(self) -> None:
        """The connection ended: its start no longer holds retention. A failure only
        delays deletes until the registration expires."""
        lease = self.lease
        if lease is None:
            return
        try:
            await self.reader.stores.starts.release_reader(self.stream, lease.reader_id)
        except StoreError as error:
            activity.logger.warning(
                "stream %s: the connection's registration stays until %s (retention keeps "
                "its start until then): %s",
                self.stream,
                lease.expires_at.isoformat(),
                error,
            )

    async def _finish(self, outcome: Outcome) -> ReadResult:
        """The result, with the stream's gaps as they are now (read after the flush)."""
        intake = self.intake
        assert intake is not None
        result = self.result
        result.outcome = outcome
        result.last_cursor = intake.cursor
        result.retry_ms = self.decoder.retry
        result.drop = intake.drop
        if intake.drop is not None:
            self.metrics.drop_signal(intake.drop.kind)
        result.counts = _added(self.carried, intake.counts)
        self._count_ids_out_of_order()
        try:
            result.gaps = await self._heartbeating(
                self.reader.stores.gap_store.gap_summary(self.stream, self.order)
            )
            checkpoint = await self._heartbeating(
                self.reader.stores.checkpoints.get_checkpoint(self.stream)
            )
            result.lagging_id = checkpoint.lagging_id if checkpoint else None
        except StoreError as error:
            # The gaps are durable; the workflow reads them itself when a result has none.
            activity.logger.warning("stream %s: cannot read its gaps: %s", self.stream, error)
        return result

    def _count_ids_out_of_order(self) -> None:
        assert self.intake is not None
        if self.intake.ids_out_of_order:
            self.metrics.ids_out_of_order.add(self.intake.ids_out_of_order)

    # -- HTTP ----------------------------------------------------------------------

    async def _connect(self, url: str, headers: dict[str, str]) -> Outcome:
        timeout = httpx.Timeout(
            connect=self.spec.connect_timeout,
            read=self.spec.idle_timeout,
            write=self.spec.connect_timeout,
            pool=self.spec.connect_timeout,
        )
        for _ in range(MAX_REDIRECTS + 1):
            request = self.reader.http.build_request("GET", url, headers=headers, timeout=timeout)
            try:
                response = await self._heartbeating(self.reader.http.send(request, stream=True))
            except httpx.TransportError as error:
                self.result.error = (
                    f"cannot connect to {self._redact(url)}: {describe_error(error)}"
                )
                return Outcome.RETRY_LATER
            try:
                policy = status_policy(response.status_code)
                if policy is StatusPolicy.REDIRECT:
                    target = str(response.url.join(response.headers.get("location", "")))
                    if not same_origin(target, url):
                        raise StreamRefusedError(
                            f"stream {self.stream!r}: {self._redact(url)} redirects to another "
                            f"origin ({self._redact(target)}); cross-origin redirects are never "
                            "followed"
                        )
                    url = target
                    continue
                return await self._handle_response(response, policy, url)
            finally:
                await response.aclose()
        raise StreamRefusedError(f"stream {self.stream!r}: more than {MAX_REDIRECTS} redirects")

    async def _heartbeating(self, awaitable: Awaitable[T]) -> T:
        """Await while heartbeating: a server may take up to ``idle_timeout`` to answer
        and a database may stall on a lock, longer than the heartbeat timeout, and a
        silent attempt would be timed out and retried by Temporal while it still works
        (two attempts writing at once). Cancelling the wait cancels ``awaitable``."""
        task = asyncio.ensure_future(awaitable)
        try:
            while True:
                self._heartbeat()
                done, _ = await asyncio.wait([task], timeout=self._heartbeat_interval())
                if done:
                    return task.result()
        finally:
            if not task.done():
                task.cancel()
                await asyncio.wait([task])

    async def _handle_response(
        self, response: httpx.Response, policy: StatusPolicy, url: str
    ) -> Outcome:
        code = response.status_code
        self.result.status_code = code
        if policy is StatusPolicy.STOP:
            return Outcome.NO_CONTENT
        if policy is StatusPolicy.RETRY_LATER:
            self.result.retry_after = parse_retry_after(response.headers.get("retry-after"))
            self.result.error = f"HTTP {code} from {self._redact(url)}"
            return Outcome.RETRY_LATER
        if policy is StatusPolicy.REFUSED:
            hint = REFUSAL_HINTS.get(code, "the server refused the request")
            raise StreamRefusedError(
                f"stream {self.stream!r}: HTTP {code} from {self._redact(url)}: {hint}; "
                "the stream is parked until resumed"
            )
        content_type = response.headers.get("content-type")
        if not is_event_stream(content_type):
            raise StreamRefusedError(
                f"stream {self.stream!r}: {self._redact(url)} answered with content type "
                f"{content_type!r}, not text/event-stream; the stream is parked until resumed"
            )
        assert self.intake is not None
        self.intake.head(truncation_header=truncation_header(response.headers))
        return await self._read(response)

    # -- reading -------------------------------------------------------------------

    async def _read(self, response: httpx.Response) -> Outcome:
        """Read until an outcome; then stop reading new bytes and take what was read.

        However the connection ends (a drop signal, a finished repair, its age, a
        cancellation), the chunks already read from the socket are decoded and taken
        before the flush (:meth:`_take_read_ahead`): an event received is stored, or it
        lies in a recorded gap, never dropped unseen. Only what ends the body itself (its
        end, a read error, a line or event the decoder refuses) leaves nothing to take.
        """
        intake = self.intake
        assert intake is not None
        queue: asyncio.Queue[object] = asyncio.Queue(READ_AHEAD_CHUNKS)
        held: list[bytes] = []
        pump = asyncio.create_task(_pump(response, queue, held))
        self.streaming = True
        rotate_at = time.monotonic() + self.spec.max_connection_age
        try:
            while True:
                try:
                    item = queue.get_nowait()
                except asyncio.QueueEmpty:
                    # Not asyncio.wait_for: on Python 3.11 it returns the item and swallows
                    # a cancellation that lands as queue.get() completes, so a busy stream
                    # could ignore replay/pause/stop and worker shutdown (chaos scenarios 4
                    # and 5). asyncio.timeout re-raises the cancellation.
                    try:
                        async with asyncio.timeout(self._wait_budget(rotate_at)):
                            item = await queue.get()
                    except TimeoutError:
                        item = None
                now = time.monotonic()
                if item is None:
                    intake.poll(now)
                    await self._submit_ready()
                    self._heartbeat()
                    if intake.outcome is not None:
                        return self._stop_reading(pump, queue, held, intake.outcome)
                    if now >= rotate_at:
                        return self._stop_reading(pump, queue, held, Outcome.ROTATED)
                    continue
                if item is _EOF:
                    self.body_done = True
                    intake.take(self.decoder.close(), received_at=datetime.now(UTC), now=now)
                    self.result.error = "the server ended the stream"
                    return self._ended()
                if isinstance(item, BaseException):
                    self.body_done = True
                    self.result.error = _read_error(item, self.spec.idle_timeout)
                    return self._ended()
                try:
                    items = self.decoder.feed(item)  # type: ignore[arg-type]
                except LineTooLongError as error:
                    # What the chunk completed before the long line is kept; the cursor
                    # stays before the event that holds it, and the reconnect resumes there.
                    self.body_done = True
                    intake.take(error.items, received_at=datetime.now(UTC), now=now)
                    self.result.error = str(error)
                    activity.logger.warning("stream %s: %s", self.stream, error)
                    return self._ended()
                except StreamError as error:
                    # An event or id over its limit: keep what came before it (the cursor
                    # stays before the bad event), then park with the setting named.
                    self.body_done = True
                    before = getattr(error, "items", None) or []
                    intake.take(before, received_at=datetime.now(UTC), now=now)
                    activity.logger.warning("stream %s: %s", self.stream, error)
                    raise StreamRefusedError(
                        f"{error}; the stream is parked until resumed"
                    ) from None
                intake.take(items, received_at=datetime.now(UTC), now=now)
                if intake.stored is not None:
                    self._fetch_stored()
                    if intake.stored.fetching:
                        # Reading chunk after chunk from the queue never yields to the
                        # event loop: let the page being fetched land before it is needed.
                        await asyncio.sleep(0)
                intake.poll(now)
                await self._submit_ready()
                if intake.outcome is not None:
                    return self._stop_reading(pump, queue, held, intake.outcome)
        except asyncio.CancelledError:
            # A signal or the worker's shutdown: what was read is taken, then flushed.
            self._stop_reading(pump, queue, held, Outcome.CANCELLED)
            raise
        finally:
            pump.cancel()

    def _stop_reading(
        self,
        pump: asyncio.Task[None],
        queue: asyncio.Queue[object],
        held: list[bytes],
        outcome: Outcome,
    ) -> Outcome:
        """Read no more bytes, take what was read (:meth:`_take_read_ahead`); ``outcome``."""
        pump.cancel()
        self._take_read_ahead(queue, held)
        return outcome

    def _take_read_ahead(self, queue: asyncio.Queue[object], held: list[bytes]) -> None:
        """The connection is ending and reads no more: take every chunk already read from
        the socket, those queued and the one the pump held for a full queue.

        Synchronous, so that a cancellation cannot cut it short; bounded by the queue
        (``READ_AHEAD_CHUNKS``). A chunk the decoder refuses ends it there: what the chunk
        completed before the refused line or event is kept, and the cursor stays before
        it (the next connection meets it again).
        """
        if self.body_done:
            return
        self.body_done = True
        chunks: list[object] = []
        while not queue.empty():
            chunks.append(queue.get_nowait())
        chunks.extend(held)
        held.clear()
        intake = self.intake
        assert intake is not None
        now = time.monotonic()
        received_at = datetime.now(UTC)
        read_before = intake.counts.events_read
        for item in chunks:
            if item is _EOF:
                intake.take(self.decoder.close(), received_at=received_at, now=now)
                break
            if isinstance(item, BaseException):
                break
            try:
                items = self.decoder.feed(item)  # type: ignore[arg-type]
            except StreamError as error:
                intake.take(getattr(error, "items", None) or [], received_at=received_at, now=now)
                activity.logger.warning(
                    "stream %s: %s (read ahead as the connection ended)", self.stream, error
                )
                break
            intake.take(items, received_at=received_at, now=now)
        if chunks:
            activity.logger.debug(
                "stream %s: %d chunk(s) read ahead taken as the connection ended (%d events)",
                self.stream,
                len(chunks),
                intake.counts.events_read - read_before,
            )

    def _ended(self) -> Outcome:
        """The connection ended by itself: a drop notice seen before still counts."""
        assert self.intake is not None
        self.intake.end()
        return self.intake.outcome or Outcome.DROPPED

    def _wait_budget(self, rotate_at: float) -> float:
        now = time.monotonic()
        budget = min(self._heartbeat_interval(), rotate_at - now)
        assert self.intake is not None
        deadline = self.intake.next_deadline(now)
        if deadline is not None:
            budget = min(budget, deadline)
        return max(budget, 0.0)

    # -- stored keys ahead of a replay ---------------------------------------------

    def _fetch_stored(self) -> None:
        """Fetch the next page of stored keys in the background, if one is due."""
        intake = self.intake
        assert intake is not None and intake.stored is not None
        stored = intake.stored
        after = stored.next_fetch(intake.last_read)
        if after is None:
            return
        stored.fetching = True
        task = asyncio.create_task(
            self.reader.stores.reads.stored_keys(
                self.stream, self.order, after=after, limit=stored.page_rows
            )
        )
        task.add_done_callback(functools.partial(self._stored_fetched, stored))
        self.fetching_stored = task

    def _stored_fetched(self, stored: StoredAhead, task: asyncio.Task[StoredPage]) -> None:
        if task.cancelled():
            stored.give_up()
        elif (error := task.exception()) is not None:
            # An optimisation only: everything is written (ON CONFLICT) from here on.
            activity.logger.info("stream %s: stored keys not read: %s", self.stream, error)
            stored.give_up()
        else:
            stored.add(task.result())

    async def stop_fetching_stored(self) -> None:
        task = self.fetching_stored
        if task is not None and not task.done():
            task.cancel()
            await asyncio.wait([task])

    # -- persisting ----------------------------------------------------------------

    async def _submit_ready(self) -> None:
        """Submit the batches the intake cut, first waiting while too many commit."""
        assert self.intake is not None
        while self.intake.ready:
            while self.inflight and self.inflight[0].done():
                self.inflight.popleft().result()  # raises if that batch failed
            if len(self.inflight) >= MAX_BATCHES_IN_FLIGHT:
                await self._heartbeating(asyncio.shield(self.inflight.popleft()))
            self._submit_nowait(self.intake.ready.popleft())

    def _submit_nowait(self, batch: Batch) -> None:
        """Queue a batch for commit now; it commits after the ones before it."""
        previous = self.inflight[-1] if self.inflight else None
        if not batch.records and not batch.gap_changes:
            # Nothing to write (a replay's stored events, skipped): its cursor moves once
            # the batches before it committed, with no transaction of its own.
            self.inflight.append(asyncio.create_task(self._persist(previous, None, batch)))
            return
        job = self.reader.stores.writer.submit_batch(
            self.stream,
            self.order,
            batch.records,
            after=self.last_job,
            gap_changes=batch.gap_changes,
        )
        self.last_job = job
        self.inflight.append(asyncio.create_task(self._persist(previous, job, batch)))

    async def _flush(self) -> None:
        """Commit everything read so far; called before any outcome is returned."""
        assert self.intake is not None
        self.intake.end()
        while self.intake.ready:
            self._submit_nowait(self.intake.ready.popleft())
        if self.inflight:
            last = self.inflight[-1]
            self.inflight.clear()
            # Each batch's task waits for the one before it. No closing heartbeat unless
            # the commit is slow: the result carries the cursor, and a heartbeat in flight
            # would hold the completion back by one more call to the server.
            await self._heartbeating(last)

    async def _persist(
        self, previous: asyncio.Task[None] | None, job: CommitJob | None, batch: Batch
    ) -> None:
        started = time.monotonic()
        try:
            if job is None:
                inserted = InsertResult(new_rows=0, duplicates=0)
            else:
                inserted = await self.reader.stores.writer.committed(job)
        finally:
            if previous is not None:
                await previous  # cursors move in commit order, so only ever forward
        assert self.intake is not None
        if job is not None:
            self.metrics.batch_persist.record(time.monotonic() - started)
        self.metrics.events_persisted.add(inserted.new_rows)
        self.metrics.duplicates.add(inserted.duplicates + batch.skipped)
        if inserted.reused:
            self.metrics.ids_reused.add(len(inserted.reused))
        if inserted.dropped_by_horizon:
            self._dropped_by_horizon(inserted)
        if batch.recovered:
            self.metrics.events_recovered.add(inserted.new_rows)
        if batch.records:
            lag = (datetime.now(UTC) - batch.records[-1].received_at).total_seconds()
            self.metrics.cursor_lag.set(lag)
            self.commit_lag = round(lag, 2)
        first = self.first_id is None and self.start_cursor is None
        blind = self.intake.counts.reconnects_without_cursor
        moved = self.intake.committed(
            batch,
            new_rows=inserted.new_rows,
            reused=inserted.reused,
            dropped_by_horizon=inserted.dropped_by_horizon,
        )
        if self.intake.counts.reconnects_without_cursor > blind:
            self.metrics.reconnects_without_cursor.add(1)
        if moved:
            cursor = self.intake.cursor
            assert cursor is not None
            self.reader.stores.l1.advance(self.stream, cursor, self.order)
            self.reader.stores.l2.submit(self.stream, cursor, self.order)
            if first:
                # A retry of a connection with no cursor starts from its first id.
                self.first_id = (batch.records[0].event_id if batch.records else "") or cursor
        self._heartbeat(force=first and self.first_id is not None)

    def _dropped_by_horizon(self, inserted: InsertResult) -> None:
        """Counted (``dropped_by_horizon``) and exported; logged once per connection."""
        self.metrics.dropped_by_horizon.add(inserted.dropped_by_horizon)
        if self.horizon_logged:
            return
        self.horizon_logged = True
        activity.logger.warning(
            "stream %s: id %r sorts at or before the retention horizon %r (the newest id "
            "retention deleted) under id_order %r: not stored, counted as "
            "dropped_by_horizon (this connection logs it once)",
            self.stream,
            (inserted.dropped_id or "")[:64],
            (inserted.horizon_id or "")[:64],
            self.order,
        )

    def _heartbeat(self, *, force: bool = False) -> None:
        now = time.monotonic()
        intake = self.intake
        # Checked on every call, not only when a heartbeat goes out: heartbeats may be
        # ``NUDGED_HEARTBEAT_INTERVAL`` apart, reports are due every ``progress_interval``.
        if intake is not None and now >= self.next_report and self.reporting is None:
            self.next_report = now + self.reader.progress_interval
            self.reporting = asyncio.create_task(self._report())
        if not force and now - self.last_heartbeat < self._heartbeat_interval():
            return
        self.last_heartbeat = now
        if intake is None:
            # Still resolving the start: keep the dead attempt's start for the next retry.
            progress = self.previous or ReadProgress(counts=self.carried)
        else:
            progress = ReadProgress(
                cursor=intake.cursor,
                start_cursor=self.start_cursor,
                first_id=self.first_id,
                counts=_added(self.carried, intake.counts),
            )
        activity.heartbeat(asdict(progress))

    def _heartbeat_interval(self) -> float:
        return self.reader.heartbeat_interval(streaming=self.streaming)

    def nudged(self) -> None:
        """The workflow asked for a cancellation: heartbeat now, so its answer brings it
        (the SDK still spaces heartbeats by its throttle, 0.5 s)."""
        self.context.run(self._heartbeat, force=True)

    # -- progress reports ----------------------------------------------------------

    async def _report(self) -> None:
        """Tell the workflow what this connection has done, if anything changed.

        A view, never the truth: a report that fails or comes late is dropped (logged),
        and the next one says it all again.
        """
        intake = self.intake
        assert intake is not None
        report = ConnectionProgress(
            connection=self.input.connection,
            cursor=intake.cursor,
            counts=_added(self.carried, intake.counts),
            commit_lag=self.commit_lag,
        )
        try:
            async with asyncio.timeout(PROGRESS_TIMEOUT):
                await self._move_hold()
                try:
                    report.gaps = await self.reader.stores.gap_store.gap_summary(
                        self.stream, self.order
                    )
                    checkpoint = await self.reader.stores.checkpoints.get_checkpoint(self.stream)
                    report.lagging_id = checkpoint.lagging_id if checkpoint else None
                except StoreError as error:
                    activity.logger.debug("stream %s: report without gaps: %s", self.stream, error)
                    report.gaps = None
                if report == self.reported:
                    return
                info = activity.info()
                handle = activity.client().get_workflow_handle(
                    info.workflow_id, run_id=info.workflow_run_id
                )
                sent = replace(report, at=_now_iso())
                await handle.signal("progress", sent)
                self.reported = report
        except RuntimeError as error:  # no client: an activity run outside a worker (tests)
            activity.logger.debug("stream %s: progress not reported: %s", self.stream, error)
        except Exception as error:  # noqa: BLE001 - a view: dropped, the next one retries
            activity.logger.info("stream %s: progress not reported: %s", self.stream, error)
        finally:
            self.reporting = None

    async def _move_hold(self) -> None:
        """Let retention have what this connection no longer needs (``Intake.
        retention_hold``): it read past it a replay window ago. Skipped on a store error
        (the hold stays older: retention keeps more, a while longer)."""
        intake, lease = self.intake, self.lease
        assert intake is not None
        if lease is None:
            return
        hold = intake.retention_hold(time.monotonic())
        if hold is None or hold == self.hold:
            return
        try:
            await self.reader.stores.starts.move_reader(self.stream, lease.reader_id, hold)
        except StoreError as error:
            activity.logger.debug("stream %s: retention hold not moved: %s", self.stream, error)
            return
        self.hold = hold

    async def stop_reports(self) -> None:
        """The connection ended: its result says it all, a late report would be ignored."""
        task = self.reporting
        if task is not None and not task.done():
            task.cancel()
            await asyncio.wait([task])


def _added(a: ReadCounts, b: ReadCounts) -> ReadCounts:
    return ReadCounts(**{f.name: getattr(a, f.name) + getattr(b, f.name) for f in fields(b)})


async def _pump(response: httpx.Response, queue: asyncio.Queue[object], held: list[bytes]) -> None:
    """Read bytes ahead of the parser; ends the queue with _EOF or the error.

    ``held`` holds the chunk read from the socket while it waits for room in a full
    queue: a pump cancelled there leaves it in ``held`` (``Queue.put`` adds nothing once
    cancelled), and the reader takes it after the queued ones."""
    try:
        async for chunk in response.aiter_bytes():
            held.append(chunk)
            await queue.put(chunk)
            held.pop()
        await queue.put(_EOF)
    except asyncio.CancelledError:
        raise
    except Exception as error:  # noqa: BLE001 - every read error ends the connection
        await queue.put(error)


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


def _read_error(error: BaseException, idle_timeout: float) -> str:
    if isinstance(error, httpx.ReadTimeout):
        return f"idle timeout: no bytes for {idle_timeout:g} s"
    return f"connection lost: {describe_error(error)}"
