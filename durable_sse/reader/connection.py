"""One SSE connection, with its I/O: start, read, commit, end.

The decisions are :class:`~durable_sse.reader.session.ReadSession`'s and the commit
order :class:`~durable_sse.reader.pipeline.CommitPipeline`'s; this module is the I/O
around them:

* the start cursor comes from :class:`~durable_sse.cursor.resolve.CursorResolver`
  together with what the store knows of the stream (lagging id, floor, open gaps) in one
  read, which also refuses an ``id_order`` other than the stream's keys were made with
  (the stream parks) and registers the connection in ``sse_readers`` until it ends, so
  retention keeps what it re-reads (:mod:`durable_sse.cursor.readers`);
* bytes are read ahead by a pump task into a bounded queue (:mod:`durable_sse.sse.client`),
  decoded and handed to the intake; up to ``MAX_BATCHES_IN_FLIGHT`` batches commit while
  the next is parsed, each with its gap changes in its own transaction;
* per committed batch: L1 -> L2 (coalesced, non-blocking) -> heartbeat; a cursor never
  points past an uncommitted event or a drop signal not yet recorded (invariants 1, 5);
* a replay from behind the newest stored id fetches the stored keys ahead of it, a page
  at a time in the background, and skips what is stored (:mod:`durable_sse.reader.stored`);
* however the connection ends (a drop signal, a finished repair, its age, a
  cancellation), what was already read from the socket is taken and committed before the
  result is built, with the stream's gaps as the store has them then.

Where it runs (the Temporal activity, :mod:`activities.read`) is told through
:class:`Heartbeats`; what retrying cannot fix is raised as a
:class:`~durable_sse.errors.ConfigError` or :class:`~durable_sse.errors.StreamRefusedError`
whose message is final (the stream parks).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from secrets import token_hex
from typing import Any, TypeVar

import httpx

from durable_sse.config.hosts import host_allowed
from durable_sse.config.secrets import DeclaredSecrets, request_secrets
from durable_sse.contracts import Outcome, ReadInput, ReadProgress, ReadResult
from durable_sse.cursor.readers import ReaderLease
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
from durable_sse.log.records import StoredPage
from durable_sse.reader.intake import Batch
from durable_sse.reader.metrics import ReaderMetrics
from durable_sse.reader.pipeline import CommitPipeline, Settled
from durable_sse.reader.session import ReadSession
from durable_sse.redact import redact_url
from durable_sse.sse.client import EOF, READ_AHEAD_CHUNKS, Answer, open_stream, pump, read_error
from durable_sse.sse.request import request_headers, with_cursor, with_query
from durable_sse.stores import Stores

logger = logging.getLogger(__name__)

T = TypeVar("T")


def _nothing() -> None:
    return None


@dataclass
class Heartbeats:
    """How a connection shows it is alive where it runs (a Temporal activity heartbeats;
    a connection run outside one need not)."""

    send: Callable[[ReadProgress], None]
    """Send one heartbeat with these details (a retried attempt gets them back)."""
    interval: Callable[[bool], float]
    """Seconds between heartbeats, given whether the connection is streaming yet."""
    due: Callable[[], None] = _nothing
    """Called at every heartbeat check, sent or not (the activity's progress reports)."""


class Connection:
    """One connection of a stream, from its start cursor to its result.

    Args:
        read_input: the activity's input.
        stores: the worker's stores (event log jobs, L1, L2).
        http: the worker's HTTP client.
        heartbeats: where heartbeats go.
        lease: this attempt's registration in ``sse_readers`` (None: not registered).
        previous: heartbeat details of the attempt before (a retry starts from them).
        retried: this is not the first attempt.
        secrets, allowed_hosts: the worker's declared secrets and allowed hosts.
        metrics: what the connection records (None: nothing).
        log: the logger to use (the activity's carries its context).
        cancel_reason: why a cancellation came, in words (for the log line).
    """

    def __init__(
        self,
        read_input: ReadInput,
        *,
        stores: Stores,
        http: httpx.AsyncClient,
        heartbeats: Heartbeats,
        lease: ReaderLease | None = None,
        previous: ReadProgress | None = None,
        retried: bool = False,
        secrets: DeclaredSecrets | None = None,
        allowed_hosts: tuple[str, ...] | None = None,
        metrics: ReaderMetrics | None = None,
        log: logging.Logger | logging.LoggerAdapter[Any] = logger,
        cancel_reason: Callable[[], str] = lambda: "no reason given",
    ) -> None:
        self.input = read_input
        self.spec = read_input.spec
        self.stream = read_input.spec.name
        self.order = read_input.spec.id_order
        self.stores = stores
        self.http = http
        self.heartbeats = heartbeats
        self.lease = lease
        self.secrets = DeclaredSecrets() if secrets is None else secrets
        self.allowed_hosts = allowed_hosts
        self.metrics = metrics
        self.log = log
        self.cancel_reason = cancel_reason
        self.session = ReadSession(
            read_input,
            previous=previous,
            retried=retried,
            new_gap_id=_gap_id,
            now_iso=_now_iso,
        )
        self.pipeline = CommitPipeline(
            self.session,
            stores.writer,
            cursors=[stores.l1.advance, *([stores.l2.submit] if stores.l2 is not None else [])],
            on_settled=self._settled,
        )
        self.secret_params = frozenset(self.spec.query_from_env)
        self.last_heartbeat = time.monotonic()
        self.streaming = False
        """The response head arrived and events are being read."""
        self.commit_lag: float | None = None
        """Seconds from the newest committed event's arrival to its commit."""
        self.fetching_stored: asyncio.Task[StoredPage] | None = None
        self.horizon_logged = False
        """An id dropped at the retention horizon was logged (once per connection)."""
        self.hold: str | None = None
        """What the registration holds now (moved forward by :meth:`move_hold`)."""

    # -- lifecycle -----------------------------------------------------------------

    async def run(self) -> ReadResult:
        """Connect, read until an outcome, commit what was read: the result."""
        if not host_allowed(self.spec.url, self.allowed_hosts):
            raise ConfigError(
                f"stream {self.stream!r}: setting 'url' names a host that is not in "
                f"SSE_ALLOWED_HOSTS ({self.redact(self.spec.url)})"
            )
        session = self.session
        try:
            start = await self.waiting(session.resolve(self._resolver(), reader=self.lease))
        except ConfigError as error:  # IdOrderMismatchError: nothing was touched
            self.log.error("stream %s: %s; parked", self.stream, error)
            raise ConfigError(f"{error}; the stream is parked") from None
        self.hold = start.cursor
        fetch_stored = session.begin(start)  # ConfigError: a drop_notice RE2 refuses
        if fetch_stored:
            self._fetch_stored()
        self.heartbeat(force=True)
        if self.fetching_stored is not None:
            # A replay: its first page of stored keys before its first event, so that it
            # skips what is stored from the start (one indexed query, a few ms).
            await self.waiting(asyncio.wait([self.fetching_stored]))
        url, headers = self._request()
        intake = session.started
        if intake.outcome is not None:
            # Open gaps the workflow did not know of: end now so the repair can start.
            return await self._finish(intake.outcome)
        try:
            return await self._read_and_commit(url, headers)
        except BatchRefusedError as error:
            # Nothing from the refused batch on was stored and the cursor stands before
            # it: parked, the status says why, and `resume` reads it all again.
            self.log.warning("stream %s: %s; parked", self.stream, error)
            raise StreamRefusedError(f"{error}; the stream is parked until resumed") from None

    async def close(self) -> None:
        """After the run, however it ended: no fetch left running, the registration gone."""
        await self._stop_fetching_stored()
        await self._release()

    def _resolver(self) -> CursorResolver:
        stores = self.stores
        return CursorResolver(stores.l1, stores.l2, stores.starts)

    def _request(self) -> tuple[str, dict[str, str | bytes]]:
        """The URL (cursor and secret parameters in) and headers of the request: secret
        values are resolved here, for this URL's host, before the wire rules see them
        (a secret the worker does not declare for the host is a ConfigError)."""
        spec, cursor = self.spec, self.session.start_cursor
        secret = request_secrets(
            self.secrets,
            headers_from_env=spec.headers_from_env,
            query_from_env=spec.query_from_env,
            url=spec.url,
            stream=self.stream,
        )
        try:
            headers = request_headers(
                cursor=cursor,
                cursor_param=spec.cursor_param,
                secret_headers=secret.headers,
                stream=self.stream,
            )
            url = with_query(
                with_cursor(spec.url, spec.cursor_param, cursor, stream=self.stream),
                secret.query,
            )
        except UnsendableIdError as error:
            raise StreamRefusedError(f"{error}; the stream is parked until resumed") from None
        return url, headers

    async def _read_and_commit(self, url: str, headers: dict[str, str | bytes]) -> ReadResult:
        """Connect, read until an outcome, and commit what was read, whatever ends it."""
        try:
            outcome = await self._connect(url, headers)
        except asyncio.CancelledError:
            await self._flush()
            self.log.info(
                "stream %s: connection cancelled (%s) after flushing",
                self.stream,
                self.cancel_reason(),
            )
            return await self._finish(Outcome.CANCELLED)
        except StreamRefusedError:
            await self._flush()
            self._count_ids_out_of_order()
            raise
        await self._flush()
        return await self._finish(outcome)

    async def _finish(self, outcome: Outcome) -> ReadResult:
        """The result, with the stream's gaps as they are now (read after the flush)."""
        result = self.session.finish(outcome)
        if result.drop is not None and self.metrics is not None:
            self.metrics.drop_signal(result.drop.kind)
        self._count_ids_out_of_order()
        try:
            result.gaps = await self.waiting(
                self.stores.gap_store.gap_summary(self.stream, self.order)
            )
            checkpoint = await self.waiting(self.stores.checkpoints.get_checkpoint(self.stream))
            result.lagging_id = checkpoint.lagging_id if checkpoint else None
        except StoreError as error:
            # The gaps are durable; the workflow reads them itself when a result has none.
            self.log.warning("stream %s: cannot read its gaps: %s", self.stream, error)
        return result

    def _count_ids_out_of_order(self) -> None:
        intake = self.session.intake
        if intake is not None and intake.ids_out_of_order and self.metrics is not None:
            self.metrics.ids_out_of_order.add(intake.ids_out_of_order)

    async def _release(self) -> None:
        """The connection ended: its start no longer holds retention. A failure only
        delays deletes until the registration expires."""
        lease = self.lease
        if lease is None:
            return
        try:
            await self.stores.readers.release_reader(self.stream, lease.reader_id)
        except StoreError as error:
            self.log.warning(
                "stream %s: the connection's registration stays until %s (retention keeps "
                "its start until then): %s",
                self.stream,
                lease.expires_at.isoformat(),
                error,
            )

    def redact(self, url: str) -> str:
        return redact_url(url, self.secret_params)

    # -- HTTP ----------------------------------------------------------------------

    async def _connect(self, url: str, headers: dict[str, str | bytes]) -> Outcome:
        timeout = httpx.Timeout(
            connect=self.spec.connect_timeout,
            read=self.spec.idle_timeout,
            write=self.spec.connect_timeout,
            pool=self.spec.connect_timeout,
        )
        async with open_stream(
            self.http,
            url,
            headers,
            timeout=timeout,
            stream=self.stream,
            redact=self.redact,
            waiting=self.waiting,
        ) as answer:
            return await self._answered(answer)

    async def _answered(self, answer: Answer) -> Outcome:
        result = self.session.result
        result.status_code = answer.status_code
        if answer.stop:
            return Outcome.NO_CONTENT
        if answer.retry_later:
            result.retry_after = answer.retry_after
            result.error = answer.error
            return Outcome.RETRY_LATER
        assert answer.response is not None
        self.session.head(truncation_header=answer.truncation_header)
        return await self._read(answer.response)

    async def waiting(self, awaitable: Awaitable[T]) -> T:
        """Await while heartbeating: a server may take up to ``idle_timeout`` to answer
        and a database may stall on a lock, longer than the heartbeat timeout, and a
        silent attempt would be timed out and retried by Temporal while it still works
        (two attempts writing at once). Cancelling the wait cancels ``awaitable``."""
        task = asyncio.ensure_future(awaitable)
        try:
            while True:
                self.heartbeat()
                done, _ = await asyncio.wait([task], timeout=self._heartbeat_interval())
                if done:
                    return task.result()
        finally:
            if not task.done():
                task.cancel()
                await asyncio.wait([task])

    # -- reading -------------------------------------------------------------------

    async def _read(self, response: httpx.Response) -> Outcome:
        """Read until an outcome; then stop reading new bytes and take what was read.

        However the connection ends (a drop signal, a finished repair, its age, a
        cancellation), the chunks already read from the socket are decoded and taken
        before the flush (:meth:`_stop_reading`): an event received is stored, or it lies
        in a recorded gap, never dropped unseen. Only what ends the body itself (its end,
        a read error, a line or event the decoder refuses) leaves nothing to take.
        """
        session = self.session
        intake = session.started
        queue: asyncio.Queue[Any] = asyncio.Queue(READ_AHEAD_CHUNKS)
        held: list[bytes] = []
        pumping = asyncio.create_task(pump(response, queue, held))
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
                    self.heartbeat()
                    if intake.outcome is not None:
                        return self._stop_reading(pumping, queue, held, intake.outcome)
                    if now >= rotate_at:
                        return self._stop_reading(pumping, queue, held, Outcome.ROTATED)
                    continue
                if item is EOF:
                    session.close_body(received_at=datetime.now(UTC), now=now)
                    session.result.error = "the server ended the stream"
                    return session.ended()
                if isinstance(item, BaseException):
                    session.body_done = True
                    session.result.error = read_error(item, self.spec.idle_timeout)
                    return session.ended()
                try:
                    session.feed(item, received_at=datetime.now(UTC), now=now)
                except LineTooLongError as error:
                    # What the chunk completed before the long line is kept; the cursor
                    # stays before the event that holds it, and the reconnect resumes there.
                    session.result.error = str(error)
                    self.log.warning("stream %s: %s", self.stream, error)
                    return session.ended()
                except StreamError as error:
                    # An event or id over its limit: keep what came before it (the cursor
                    # stays before the bad event), then park with the setting named.
                    self.log.warning("stream %s: %s", self.stream, error)
                    raise StreamRefusedError(
                        f"{error}; the stream is parked until resumed"
                    ) from None
                if intake.stored is not None:
                    self._fetch_stored()
                    if intake.stored.fetching:
                        # Reading chunk after chunk from the queue never yields to the
                        # event loop: let the page being fetched land before it is needed.
                        await asyncio.sleep(0)
                intake.poll(now)
                await self._submit_ready()
                if intake.outcome is not None:
                    return self._stop_reading(pumping, queue, held, intake.outcome)
        except asyncio.CancelledError:
            # A signal or the worker's shutdown: what was read is taken, then flushed.
            self._stop_reading(pumping, queue, held, Outcome.CANCELLED)
            raise
        finally:
            pumping.cancel()

    def _stop_reading(
        self,
        pumping: asyncio.Task[None],
        queue: asyncio.Queue[Any],
        held: list[bytes],
        outcome: Outcome,
    ) -> Outcome:
        """Read no more bytes, and take every chunk already read from the socket: those
        queued and the one the pump held for a full queue (bounded by the queue,
        ``READ_AHEAD_CHUNKS``); ``outcome``."""
        pumping.cancel()
        session = self.session
        if session.body_done:
            return outcome
        chunks: list[Any] = []
        while not queue.empty():
            chunks.append(queue.get_nowait())
        chunks.extend(held)
        held.clear()
        read_before = session.started.counts.events_read
        refused = session.take_read_ahead(
            chunks, received_at=datetime.now(UTC), now=time.monotonic()
        )
        if refused is not None:
            self.log.warning(
                "stream %s: %s (read ahead as the connection ended)", self.stream, refused
            )
        if chunks:
            self.log.debug(
                "stream %s: %d chunk(s) read ahead taken as the connection ended (%d events)",
                self.stream,
                len(chunks),
                session.started.counts.events_read - read_before,
            )
        return outcome

    def _wait_budget(self, rotate_at: float) -> float:
        now = time.monotonic()
        budget = min(self._heartbeat_interval(), rotate_at - now)
        deadline = self.session.started.next_deadline(now)
        if deadline is not None:
            budget = min(budget, deadline)
        return max(budget, 0.0)

    # -- stored keys ahead of a replay ---------------------------------------------

    def _fetch_stored(self) -> None:
        """Fetch the next page of stored keys in the background, if one is due."""
        after = self.session.stored_fetch_due()
        if after is None:
            return
        task = asyncio.create_task(
            self.stores.reads.stored_keys(
                self.stream, self.order, after=after, limit=self.session.page_rows
            )
        )
        task.add_done_callback(self._stored_fetched)
        self.fetching_stored = task

    def _stored_fetched(self, task: asyncio.Task[StoredPage]) -> None:
        if task.cancelled():
            self.session.stored_page(None)
        elif (error := task.exception()) is not None:
            # An optimisation only: everything is written (ON CONFLICT) from here on.
            self.log.info("stream %s: stored keys not read: %s", self.stream, error)
            self.session.stored_page(None)
        else:
            self.session.stored_page(task.result())

    async def _stop_fetching_stored(self) -> None:
        task = self.fetching_stored
        if task is not None and not task.done():
            task.cancel()
            await asyncio.wait([task])

    # -- persisting ----------------------------------------------------------------

    async def _submit_ready(self) -> None:
        """Submit the batches the intake cut, first waiting while too many commit."""
        pipeline, ready = self.pipeline, self.session.started.ready
        while ready:
            pipeline.settle()
            pipeline.check()  # a batch that failed fails the connection here
            if pipeline.full:
                await self.waiting(self._settled_oldest())
            self._submit(ready.popleft())

    def _submit(self, batch: Batch) -> None:
        self.pipeline.submit(batch)
        job = self.pipeline.in_flight[-1].job
        if job is not None:
            job.future.add_done_callback(self._landed)

    def _landed(self, future: asyncio.Future[int]) -> None:
        """A commit landed: apply it now (in order), not at the next chunk, so the cursor,
        L1, L2 and the heartbeat follow the commits however quiet the stream. Its failure
        is taken here and raised by the pipeline's ``check`` (for the first that failed)."""
        if not future.cancelled():
            future.exception()
        self.pipeline.settle()

    async def _settled_oldest(self) -> None:
        """Wait until the oldest batch in flight is applied (or one has failed)."""
        pipeline = self.pipeline
        waiting_for = len(pipeline.in_flight)
        while pipeline.in_flight and len(pipeline.in_flight) >= waiting_for:
            if pipeline.failure is not None:
                break
            job = pipeline.oldest_job
            if job is not None and not job.future.done():
                await asyncio.wait([job.future])
            pipeline.settle()
        pipeline.check()

    async def _flush(self) -> None:
        """Commit everything read so far; called before any outcome is returned."""
        self.session.stop()
        intake = self.session.started
        while intake.ready:
            self._submit(intake.ready.popleft())
        # No closing heartbeat unless the commit is slow: the result carries the cursor,
        # and a heartbeat in flight would hold the completion back by one more call.
        await self.waiting(self._drained())

    async def _drained(self) -> None:
        pipeline = self.pipeline
        while pipeline.in_flight and pipeline.failure is None:
            await self._settled_oldest()
        pipeline.check()

    def _settled(self, settled: Settled) -> None:
        """One batch's commit applied: metrics, and a heartbeat when it gave the first id."""
        metrics, inserted, batch = self.metrics, settled.inserted, settled.batch
        if inserted.dropped_by_horizon:
            self._dropped_by_horizon(settled)
        if metrics is not None:
            if settled.seconds is not None:
                metrics.batch_persist.record(settled.seconds)
            metrics.events_persisted.add(inserted.new_rows)
            metrics.duplicates.add(inserted.duplicates + batch.skipped)
            if inserted.reused:
                metrics.ids_reused.add(len(inserted.reused))
            if inserted.dropped_by_horizon:
                metrics.dropped_by_horizon.add(inserted.dropped_by_horizon)
            if batch.recovered:
                metrics.events_recovered.add(inserted.new_rows)
            if settled.moved.blind:
                metrics.reconnects_without_cursor.add(1)
        if batch.records:
            lag = (datetime.now(UTC) - batch.records[-1].received_at).total_seconds()
            if metrics is not None:
                metrics.cursor_lag.set(lag)
            self.commit_lag = round(lag, 2)
        self.heartbeat(force=settled.moved.first)

    def _dropped_by_horizon(self, settled: Settled) -> None:
        """Logged once per connection (counted in the intake and the metric)."""
        if self.horizon_logged:
            return
        self.horizon_logged = True
        inserted = settled.inserted
        self.log.warning(
            "stream %s: id %r sorts at or before the retention horizon %r (the newest id "
            "retention deleted) under id_order %r: not stored, counted as "
            "dropped_by_horizon (this connection logs it once)",
            self.stream,
            (inserted.dropped_id or "")[:64],
            (inserted.horizon_id or "")[:64],
            self.order,
        )

    # -- heartbeats and the retention hold -----------------------------------------

    def heartbeat(self, *, force: bool = False) -> None:
        """Heartbeat if one is due (or ``force``); the due-check runs every time."""
        now = time.monotonic()
        # Checked on every call, not only when a heartbeat goes out: heartbeats may be
        # far apart, progress reports are due on their own interval.
        if self.session.intake is not None:
            self.heartbeats.due()
        if not force and now - self.last_heartbeat < self._heartbeat_interval():
            return
        self.last_heartbeat = now
        self.heartbeats.send(self.session.progress())

    def _heartbeat_interval(self) -> float:
        return self.heartbeats.interval(self.streaming)

    async def move_hold(self) -> None:
        """Let retention have what this connection no longer needs (``Intake.
        retention_hold``): it read past it a replay window ago. Skipped on a store error
        (the hold stays older: retention keeps more, a while longer)."""
        intake, lease = self.session.intake, self.lease
        if intake is None or lease is None:
            return
        hold = intake.retention_hold(time.monotonic())
        if hold is None or hold == self.hold:
            return
        try:
            await self.stores.readers.move_reader(self.stream, lease.reader_id, hold)
        except StoreError as error:
            self.log.debug("stream %s: retention hold not moved: %s", self.stream, error)
            return
        self.hold = hold


def _gap_id() -> str:
    return token_hex(8)


def _now_iso() -> str:
    return datetime.now(UTC).isoformat()
