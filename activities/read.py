"""The read activity: one execution is one SSE connection.

Events enter the system here, so this module is both exact and fast:

* bytes are read ahead by a pump task into a bounded queue, and up to
  ``MAX_BATCHES_IN_FLIGHT`` batches are being committed while the next is parsed, so
  parsing and the database overlap and memory stays bounded;
* per batch: commit -> L1 -> L2 (coalesced, non-blocking) -> heartbeat, batches
  committing in the order they were read (group commit, ``durable_sse.commits``); a
  cursor never points past an uncommitted event (invariant 1);
* the connection ends with an :class:`Outcome` the workflow routes on; only refusals
  that retrying cannot fix are raised (non-retryable ``ApplicationError``);
* cancellation (replay/pause/stop signals, worker shutdown) flushes what was read, then
  returns ``CANCELLED``.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Awaitable
from dataclasses import asdict
from datetime import UTC, datetime
from typing import Any, TypeVar

import httpx
from temporalio import activity
from temporalio.exceptions import ApplicationError

from durable_sse.commits import CommitJob
from durable_sse.contracts import DropKind, Outcome, ReadInput, ReadProgress, ReadResult, Route
from durable_sse.errors import ConfigError, LineTooLongError, StreamRefusedError
from durable_sse.eventlog import EventLog, EventRecord
from durable_sse.http import (
    REFUSAL_HINTS,
    StatusPolicy,
    describe_error,
    host_allowed,
    parse_retry_after,
    query_secrets,
    redact_url,
    request_headers,
    same_origin,
    status_policy,
    with_cursor,
    with_query,
)
from durable_sse.ids import compare_ids, is_newer
from durable_sse.l1 import LocalCursors
from durable_sse.l2 import RedisCursors
from durable_sse.logs import install_redaction
from durable_sse.metrics import ReaderMetrics
from durable_sse.resolve import CursorResolver
from durable_sse.secrets import DeclaredSecrets
from durable_sse.sse.content_type import is_event_stream
from durable_sse.sse.decoder import Comment, Event, SSEDecoder
from durable_sse.sse.drops import DropNoticeMatcher, dropped_count

HEARTBEAT_INTERVAL = 0.8
"""Seconds between heartbeats, busy or quiet: cancellation arrives on heartbeats, so a
signal acts within about a second, and a busy stream heartbeats per interval, not per
batch."""
HEARTBEAT_BUDGET = 500.0
"""Heartbeats per second one worker sends at most, all connections together: past
``HEARTBEAT_BUDGET * HEARTBEAT_INTERVAL`` connections (400) the interval stretches, so a
thousand quiet streams cost 500 calls a second (signals act within ~2 s) instead of
flooding the Temporal server."""
LAGGING_FRESH_FOR = 1.0
"""Seconds the lagging id read when a connection starts stays fresh enough for the
status it is returned for (it moves once per replay window)."""
MAX_BATCHES_IN_FLIGHT = 3
"""Batches of one connection committing at once (they commit in order): the next batch
is written while the previous one commits."""
MAX_REDIRECTS = 5
READ_AHEAD_CHUNKS = 64
"""Chunks (up to 64 KiB each) read ahead while a batch commits: bounds memory."""
MAX_DETAIL = 200
DROP_GRACE = 0.25
"""After a drop notice, seconds to wait for the next event: it bounds the hole from above
(servers announce after the skipped range), so the fence lies past the gap."""

_EOF = object()
T = TypeVar("T")


class StreamReader:
    """Activities that hold SSE connections, built once per worker with its clients."""

    def __init__(
        self,
        *,
        http: httpx.AsyncClient,
        event_log: EventLog,
        l1: LocalCursors,
        l2: RedisCursors,
        secrets: DeclaredSecrets | None = None,
        allowed_hosts: tuple[str, ...] | None = None,
    ) -> None:
        install_redaction()
        self.allowed_hosts = allowed_hosts
        self.http = http
        self.event_log = event_log
        self.l1 = l1
        self.l2 = l2
        self.resolver = CursorResolver(l1, l2, event_log)
        self.secrets = DeclaredSecrets() if secrets is None else secrets
        self.open_connections = 0

    @activity.defn(name="read_stream")
    async def read_stream(self, input: ReadInput) -> ReadResult:
        self.open_connections += 1
        try:
            return await _Connection(self, input).run()
        finally:
            self.open_connections -= 1

    def heartbeat_interval(self) -> float:
        """Seconds between one connection's heartbeats, within the worker's budget."""
        return max(HEARTBEAT_INTERVAL, self.open_connections / HEARTBEAT_BUDGET)

    def activities(self) -> list[Any]:
        return [self.read_stream]


def _last_progress() -> ReadProgress | None:
    """Heartbeat details of the previous attempt: a hint, the stores are the truth."""
    details = activity.info().heartbeat_details
    if not details:
        return None
    value = details[0]
    if isinstance(value, ReadProgress):
        return value
    if isinstance(value, dict):
        return ReadProgress(**{k: v for k, v in value.items() if k in ReadProgress.__annotations__})
    return None


class _Connection:
    """State of one connection: the pending batch, the cursor, and the counts."""

    def __init__(self, reader: StreamReader, input: ReadInput) -> None:
        self.reader = reader
        self.input = input
        self.spec = input.spec
        self.stream = input.spec.name
        self.order = input.spec.id_order
        self.matcher = DropNoticeMatcher(self.spec.drop_notice)
        self.drop_types = frozenset(self.spec.drop_event_types)
        self.decoder = SSEDecoder(max_line_bytes=self.spec.max_line_bytes)
        self.secret_params = frozenset(self.spec.query_from_env)

        self.cursor: str | None = None
        self.pending: list[EventRecord] = []
        self.pending_last_id: str | None = None
        self.pending_since = 0.0
        self.pending_before_fence: bool | None = None
        self.inflight: deque[asyncio.Task[None]] = deque()
        self.last_job: CommitJob | None = None
        self.ordinal = 0
        self.last_number: int | None = None

        self.metrics = ReaderMetrics(activity.metric_meter(), self.stream)
        self.fence = input.fence_id
        self.drop_deadline: float | None = None
        self.result = ReadResult(outcome=Outcome.DROPPED)
        self.last_heartbeat = 0.0

    # -- lifecycle -----------------------------------------------------------------

    async def run(self) -> ReadResult:
        progress = _last_progress()
        await self._resolve_start(progress)
        if progress is not None:
            # A retried attempt keeps counting from where the last one heartbeated.
            self.result.events_read = progress.events_read
            self.result.new_rows = progress.new_rows
            self.result.duplicates = progress.duplicates
        if not host_allowed(self.spec.url, self.reader.allowed_hosts):
            raise ApplicationError(
                f"stream {self.stream!r}: setting 'url' names a host that is not in "
                f"SSE_ALLOWED_HOSTS ({self._redact(self.spec.url)})",
                type="ConfigError",
                non_retryable=True,
            )
        try:
            headers = request_headers(
                cursor=self.cursor,
                cursor_param=self.spec.cursor_param,
                headers_from_env=self.spec.headers_from_env,
                secrets=self.reader.secrets,
                url=self.spec.url,
                stream=self.stream,
            )
            secrets = query_secrets(
                self.spec.query_from_env, self.reader.secrets, url=self.spec.url, stream=self.stream
            )
        except ConfigError as error:
            raise ApplicationError(str(error), type="ConfigError", non_retryable=True) from None
        url = with_query(with_cursor(self.spec.url, self.spec.cursor_param, self.cursor), secrets)
        # The lagging id (for the workflow's status only) is read while connecting, off
        # the reconnect path; a connection that outlives LAGGING_FRESH_FOR reads it again
        # while its last batch commits.
        lagging = asyncio.ensure_future(self.reader.event_log.get_checkpoint(self.stream))
        lagging_read_at = time.monotonic()
        try:
            try:
                outcome = await self._connect(url, headers)
            except asyncio.CancelledError:
                await self._flush()
                activity.logger.info(
                    "stream %s: connection cancelled (%s) after flushing",
                    self.stream,
                    _cancel_reason(),
                )
                return self._finish(Outcome.CANCELLED)
            except StreamRefusedError as error:
                raise ApplicationError(
                    str(error), type="StreamRefusedError", non_retryable=True
                ) from None
            if time.monotonic() - lagging_read_at > LAGGING_FRESH_FOR:
                _discard(lagging)
                lagging = asyncio.ensure_future(self.reader.event_log.get_checkpoint(self.stream))
            await self._flush()
            state = await lagging
        finally:
            _discard(lagging)
        self.result.lagging_id = state.lagging_id if state else None
        return self._finish(outcome)

    async def _resolve_start(self, progress: ReadProgress | None) -> None:
        heartbeat = progress.cursor if progress else None
        route = Route(self.input.route)
        if route is Route.EXPLICIT:
            self.cursor, source = self.input.start_id, "explicit"
            if is_newer(heartbeat, self.cursor, self.order):
                self.cursor, source = heartbeat, "heartbeat"
        else:
            resolve = (
                self.reader.resolver.resolve_lagged_cursor
                if route is Route.LAGGED
                else self.reader.resolver.resolve_cursor
            )
            resolved = await resolve(self.stream, self.order, heartbeat=heartbeat)
            self.cursor, source = resolved.cursor, resolved.source
        self.result.start_cursor = self.cursor
        self.result.cursor_source = source
        if self.cursor:
            self.decoder.last_event_id = self.cursor
            if self.spec.contiguous_ids and self.cursor.isdigit():
                self.last_number = int(self.cursor)

    def _redact(self, url: str) -> str:
        return redact_url(url, self.secret_params)

    def _finish(self, outcome: Outcome) -> ReadResult:
        self.result.outcome = outcome
        self.result.last_cursor = self.cursor
        self.result.retry_ms = self.decoder.retry
        return self.result

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
        """Await while heartbeating: a server may take up to ``idle_timeout`` to answer,
        longer than the heartbeat timeout, and a silent attempt would be timed out and
        retried by Temporal while it is still connecting."""
        task = asyncio.ensure_future(awaitable)
        try:
            while True:
                self._heartbeat()
                done, _ = await asyncio.wait([task], timeout=self.reader.heartbeat_interval())
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
        mercure = response.headers.get("mercure-last-event-id")
        if (
            self.spec.mercure_last_event_id
            and mercure is not None
            and self.cursor is not None
            and mercure != self.cursor
        ):
            if Route(self.input.route) is Route.LIVE:
                self.result.drop_kind = DropKind.MERCURE_HEADER
                self.result.drop_detail = "Mercure-Last-Event-ID differs from the cursor sent"
                self.result.drop_position = self.cursor
                return Outcome.DROP_SIGNAL
            self.result.history_truncated = True
            activity.logger.warning(
                "stream %s: the server's history no longer reaches cursor %s",
                self.stream,
                self.cursor,
            )
        return await self._read(response)

    # -- reading -------------------------------------------------------------------

    async def _read(self, response: httpx.Response) -> Outcome:
        queue: asyncio.Queue[object] = asyncio.Queue(READ_AHEAD_CHUNKS)
        pump = asyncio.create_task(_pump(response, queue))
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
                if self.drop_deadline is not None and time.monotonic() >= self.drop_deadline:
                    return Outcome.DROP_SIGNAL
                if item is None:
                    if self.pending and time.monotonic() - self.pending_since >= (
                        self.spec.batch_max_delay
                    ):
                        await self._submit()
                    self._heartbeat()
                    if time.monotonic() >= rotate_at or self.result.passed_fence:
                        return Outcome.ROTATED
                    continue
                if item is _EOF:
                    outcome = self._take(self.decoder.close())
                    if outcome is not None:
                        return outcome
                    self.result.error = "the server ended the stream"
                    return self._ended()
                if isinstance(item, BaseException):
                    self.result.error = _read_error(item, self.spec.idle_timeout)
                    return self._ended()
                try:
                    items = self.decoder.feed(item)  # type: ignore[arg-type]
                except LineTooLongError as error:
                    self.result.error = str(error)
                    activity.logger.warning("stream %s: %s", self.stream, error)
                    return Outcome.DROPPED
                outcome = self._take(items)
                if outcome is not None:
                    return outcome
                if len(self.pending) >= self.spec.batch_max_events:
                    await self._submit()
                if self.result.passed_fence:
                    # The replay re-read past the gap: end here so the workflow clears the
                    # fence now (it only learns outcomes when a connection ends).
                    return Outcome.ROTATED
        finally:
            pump.cancel()

    def _ended(self) -> Outcome:
        """The connection ended by itself: a drop notice seen before still counts."""
        return Outcome.DROP_SIGNAL if self.drop_deadline is not None else Outcome.DROPPED

    def _wait_budget(self, rotate_at: float) -> float:
        now = time.monotonic()
        budget = min(self.reader.heartbeat_interval(), rotate_at - now)
        if self.drop_deadline is not None:
            budget = min(budget, self.drop_deadline - now)
        if self.pending:
            budget = min(budget, self.pending_since + self.spec.batch_max_delay - now)
        return max(budget, 0.0)

    def _take(self, items: list[Event | Comment]) -> Outcome | None:
        """Add decoded items to the pending batch; an Outcome when a drop signal ends it."""
        if not items:
            return None
        received_at = datetime.now(UTC)
        for item in items:
            if isinstance(item, Comment):
                if self.drop_deadline is None and item.text and self.matcher.matches(item.text):
                    self._drop(DropKind.COMMENT, item.text, dropped_count(item.text))
                    self.drop_deadline = time.monotonic() + DROP_GRACE
                continue
            signal = self._add(item, received_at)
            if signal is not None:
                return signal
        return None

    def _add(self, event: Event, received_at: datetime) -> Outcome | None:
        event_id = event.id
        if not event_id:
            ordinal = None
        elif event.id_field:
            ordinal = self.ordinal = 0
        else:
            self.ordinal += 1
            ordinal = self.ordinal
        if event_id and self.fence is not None and not self.result.passed_fence:
            before = compare_ids(event_id, self.fence, self.order) <= 0
            if (
                self.pending
                and self.pending_before_fence is not None
                and (before != self.pending_before_fence)
            ):
                # Split the batch at the fence so recovered rows are counted exactly.
                self._submit_nowait()
            self.pending_before_fence = before
        if not self.pending:
            self.pending_since = time.monotonic()
        self.pending.append(
            EventRecord(
                event_id=event_id,
                event_ord=ordinal,
                event_type=event.event,
                data=event.data,
                received_at=received_at,
            )
        )
        if event_id:
            self.pending_last_id = event_id
            if self.result.first_id is None:
                self.result.first_id = event_id
        self.result.events_read += 1
        if self.drop_deadline is not None and event_id:
            return Outcome.DROP_SIGNAL  # the first event after the notice bounds the hole
        if event.event in self.drop_types:
            self._drop(DropKind.EVENT_TYPE, f"event type {event.event!r}", None)
            return Outcome.DROP_SIGNAL
        if self.spec.contiguous_ids and event.id_field and event_id.isdigit():
            number = int(event_id)
            if self.last_number is not None and number > self.last_number + 1:
                missing = number - self.last_number - 1
                self.last_number = number
                if Route(self.input.route) is Route.LIVE:
                    self._drop(DropKind.ID_GAP, f"{missing} ids missing", missing)
                    return Outcome.DROP_SIGNAL
                self._truncated(missing)
            elif self.last_number is None or number > self.last_number:
                self.last_number = number
        return None

    def _truncated(self, missing: int) -> None:
        self.result.history_truncated = True
        self.result.dropped_estimate = (self.result.dropped_estimate or 0) + missing
        activity.logger.warning(
            "stream %s: %d ids are missing from the server's replay: unrecoverable",
            self.stream,
            missing,
        )

    def _drop(self, kind: DropKind, detail: str, estimate: int | None) -> None:
        self.result.drop_kind = kind
        self.result.drop_detail = detail[:MAX_DETAIL]
        self.result.dropped_estimate = estimate
        self.metrics.drop_signal(kind.value)
        activity.logger.info("stream %s: drop signal (%s): %s", self.stream, kind, detail[:80])

    # -- persisting ----------------------------------------------------------------

    def _submit_nowait(self) -> None:
        """Queue the pending batch for commit now; it commits after the ones before it."""
        batch, last_id, before = self.pending, self.pending_last_id, self.pending_before_fence
        self.pending, self.pending_last_id = [], None
        job = self.reader.event_log.submit_batch(
            self.stream, self.order, batch, after=self.last_job
        )
        self.last_job = job
        previous = self.inflight[-1] if self.inflight else None
        self.inflight.append(
            asyncio.create_task(self._persist(previous, job, batch, last_id, before))
        )

    async def _submit(self) -> None:
        """Queue the pending batch, first waiting while too many batches are committing."""
        while self.inflight and self.inflight[0].done():
            self.inflight.popleft().result()  # raises if that batch failed
        if len(self.inflight) >= MAX_BATCHES_IN_FLIGHT:
            await asyncio.shield(self.inflight.popleft())
        self._submit_nowait()

    async def _flush(self) -> None:
        """Commit everything read so far; called before any outcome is returned."""
        if self.pending:
            self._submit_nowait()
        if self.inflight:
            last = self.inflight[-1]
            self.inflight.clear()
            await last  # each batch's task waits for the one before it
        if self.result.drop_kind is not None and self.result.drop_position is None:
            self.result.drop_position = self.cursor
        # No closing heartbeat: the result carries the cursor, and a heartbeat in flight
        # would hold the completion back by one more call to the server.

    async def _persist(
        self,
        previous: asyncio.Task[None] | None,
        job: CommitJob,
        batch: list[EventRecord],
        last_id: str | None,
        before_fence: bool | None,
    ) -> None:
        started = time.monotonic()
        try:
            inserted = await self.reader.event_log.committed(job)
        finally:
            if previous is not None:
                await previous  # cursors move in commit order, so only ever forward
        self.metrics.batch_persist.record(time.monotonic() - started)
        self.metrics.events_persisted.add(inserted.new_rows)
        self.metrics.duplicates.add(inserted.duplicates)
        self.metrics.cursor_lag.set((datetime.now(UTC) - batch[-1].received_at).total_seconds())
        self.result.new_rows += inserted.new_rows
        self.result.duplicates += inserted.duplicates
        if before_fence:
            self.result.recovered_rows += inserted.new_rows
            self.metrics.events_recovered.add(inserted.new_rows)
        if last_id is not None and is_newer(last_id, self.cursor, self.order):
            self.cursor = last_id
            self.reader.l1.advance(self.stream, last_id, self.order)
            self.reader.l2.submit(self.stream, last_id, self.order)
        if (
            self.fence is not None
            and not self.result.passed_fence
            and self.cursor is not None
            and compare_ids(self.cursor, self.fence, self.order) >= 0
        ):
            self.result.passed_fence = True
        self._heartbeat()

    def _heartbeat(self) -> None:
        now = time.monotonic()
        if now - self.last_heartbeat < self.reader.heartbeat_interval():
            return
        self.last_heartbeat = now
        progress = ReadProgress(
            cursor=self.cursor,
            events_read=self.result.events_read,
            new_rows=self.result.new_rows,
            duplicates=self.result.duplicates,
        )
        activity.heartbeat(asdict(progress))


async def _pump(response: httpx.Response, queue: asyncio.Queue[object]) -> None:
    """Read bytes ahead of the parser; ends the queue with _EOF or the error."""
    try:
        async for chunk in response.aiter_bytes():
            await queue.put(chunk)
        await queue.put(_EOF)
    except asyncio.CancelledError:
        raise
    except Exception as error:  # noqa: BLE001 - every read error ends the connection
        await queue.put(error)


def _discard(task: asyncio.Future[Any]) -> None:
    """Drop a side task: cancel it if it still runs, and never leave its error unread."""
    if not task.done():
        task.cancel()
    task.add_done_callback(lambda done: done.cancelled() or done.exception())


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
