"""One SSE connection, with its I/O: start, read, commit, end.

The decisions are :class:`~durable_sse.reader.session.ReadSession`'s and the commit order
:class:`~durable_sse.reader.pipeline.CommitPipeline`'s; this module and its neighbours are
the I/O around them:

* the start cursor comes from :class:`~durable_sse.cursor.resolve.CursorResolver`
  together with what the store knows of the stream (lagging id, floor, open gaps) in one
  read, which also refuses an ``id_order`` other than the stream's keys were made with
  (the stream parks) and registers the connection in ``sse_readers`` until it ends, so
  retention keeps what it re-reads (:mod:`durable_sse.cursor.readers`);
* the request is built with the secrets resolved here, for the URL's host (files read
  again when they changed, tokens minted: :mod:`~durable_sse.reader.credentials`), and
  opened by :mod:`durable_sse.sse.client`; a 401 reads or mints them again and, when one
  changed, reconnects at once, at most twice (``config.credentials.after_auth_failure``), else the
  stream parks naming them; the body is read by :mod:`~durable_sse.reader.body`, whose
  batches commit through :mod:`~durable_sse.reader.committer` while it reads on (per
  committed batch: L1 -> L2 -> heartbeat; a cursor never points past an uncommitted
  event or a drop signal not yet recorded, invariants 1 and 5);
* a replay from behind the newest stored id fetches the stored keys ahead of it
  (:mod:`~durable_sse.reader.prefetch`) and skips what is stored;
* however the connection ends, what was read is committed before the result is built,
  with the stream's gaps as the store has them then.

Where it runs (the Temporal activity, :mod:`activities.read`) is told through
:class:`~durable_sse.reader.keepalive.Heartbeats`; what retrying cannot fix is raised as a
:class:`~durable_sse.errors.ConfigError` or :class:`~durable_sse.errors.StreamRefusedError`
whose message is final (the stream parks).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from secrets import token_hex
from typing import Any, TypeVar

import httpx

from durable_sse.config.credentials import AuthDecision, after_auth_failure
from durable_sse.config.hosts import host_allowed
from durable_sse.config.secrets import DeclaredSecrets, request_secrets
from durable_sse.contracts import CredentialView, Outcome, ReadInput, ReadProgress, ReadResult
from durable_sse.cursor.readers import ReaderLease
from durable_sse.cursor.resolve import CursorResolver
from durable_sse.errors import (
    BatchRefusedError,
    ConfigError,
    CredentialsRefusedError,
    StoreError,
    StreamRefusedError,
    UnsendableIdError,
)
from durable_sse.reader.body import BodyReader
from durable_sse.reader.committer import Committer
from durable_sse.reader.credentials import Credentials, CredentialUnavailable
from durable_sse.reader.keepalive import Heartbeats, Keepalive
from durable_sse.reader.metrics import ReaderMetrics
from durable_sse.reader.prefetch import StoredPrefetch
from durable_sse.reader.session import ReadSession
from durable_sse.redact import redact_url
from durable_sse.sse.client import Answer, open_stream
from durable_sse.sse.request import request_headers, with_cursor, with_query
from durable_sse.sse.response import REFUSAL_HINTS
from durable_sse.stores import Stores

logger = logging.getLogger(__name__)

Headers = dict[str, str | bytes]
T = TypeVar("T")


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
        credentials: where the secrets' values come from (files, token endpoints; None:
            the environment only).
        metrics: what the connection records (None: nothing).
        log: the logger to use (the activity's carries its context).
        cancel_reason: why a cancellation came, in words (for the log line).
        on_stored: called after each commit that stored new rows and moved the cursor
            (the activity wakes a resting checkpoint schedule from it; a replay of what is
            stored already moves the cursor but stores nothing, and does not count).
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
        credentials: Credentials | None = None,
        metrics: ReaderMetrics | None = None,
        log: logging.Logger | logging.LoggerAdapter[Any] = logger,
        cancel_reason: Callable[[], str] = lambda: "no reason given",
        on_stored: Callable[[], None] | None = None,
    ) -> None:
        self.spec = read_input.spec
        self.stream = read_input.spec.name
        self.order = read_input.spec.id_order
        self.stores = stores
        self.http = http
        self.lease = lease
        self.secrets = DeclaredSecrets() if secrets is None else secrets
        self.allowed_hosts = allowed_hosts
        self.credentials = Credentials() if credentials is None else credentials
        self.sent: dict[str, str] = {}
        """The values of the files' and tokens' secrets of the last request, by variable."""
        self.metrics = metrics
        self.log = log
        self.cancel_reason = cancel_reason
        self.session = session = ReadSession(
            read_input,
            previous=previous,
            retried=retried,
            new_gap_id=_gap_id,
            now_iso=_now_iso,
        )
        self.keepalive = Keepalive(
            heartbeats,
            progress=session.progress,
            started=lambda: session.intake is not None,
        )
        self.committer = Committer(
            session,
            stores,
            self.keepalive,
            metrics=metrics,
            log=log,
            on_stored=on_stored,
            worker_id=lease.worker_id if lease is not None else None,
        )
        self.prefetch = StoredPrefetch(session, stores.reads, log=log)
        self.secret_params = frozenset(self.spec.query_from_env)
        self.hold: str | None = None
        """What the registration holds now (moved forward by :meth:`move_hold`)."""

    @property
    def commit_lag(self) -> float | None:
        """Seconds from the newest committed event's arrival to its commit."""
        return self.committer.commit_lag

    def heartbeat(self, *, force: bool = False) -> None:
        self.keepalive.beat(force=force)

    # -- lifecycle -----------------------------------------------------------------

    async def run(self) -> ReadResult:
        """Connect, read until an outcome, commit what was read: the result."""
        if not host_allowed(self.spec.url, self.allowed_hosts):
            raise ConfigError(
                f"stream {self.stream!r}: setting 'url' names a host that is not in "
                f"SSE_ALLOWED_HOSTS ({self.redact(self.spec.url)})"
            )
        session, waiting = self.session, self.keepalive.waiting
        try:
            start = await waiting(session.resolve(self._resolver(), reader=self.lease))
        except ConfigError as error:  # IdOrderMismatchError: nothing was touched
            self.log.error("stream %s: %s; parked", self.stream, error)
            raise ConfigError(f"{error}; the stream is parked") from None
        self.hold = start.cursor
        if session.begin(start):  # ConfigError: a drop_notice pattern RE2 refuses
            self.prefetch.fetch()
        self.heartbeat(force=True)
        if self.prefetch.task is not None:
            # A replay: its first page of stored keys before its first event, so that it
            # skips what is stored from the start (one indexed query, a few ms).
            await waiting(asyncio.wait([self.prefetch.task]))
        try:
            url, headers = self._request(await self._secret_values())
        except CredentialUnavailable as error:
            return await self._finish(self._retry_later(error))
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
        await self.prefetch.stop()
        await self._release()

    def _resolver(self) -> CursorResolver:
        stores = self.stores
        return CursorResolver(stores.l1, stores.l2, stores.starts)

    def credential_views(self) -> list[CredentialView]:
        """The stream's credentials as ``durable-sse status`` shows them (no values)."""
        spec = self.spec
        names = [*spec.headers_from_env.values(), *spec.query_from_env.values()]
        return self.credentials.views(names)

    async def _secret_values(self) -> dict[str, str]:
        """The values of the stream's secrets that come from files or token endpoints,
        read or minted now, once each variable was checked against the URL's host (a
        secret the worker does not declare for the host is a ConfigError, and nothing is
        read or minted for it). Raises :class:`CredentialUnavailable` to wait and retry."""
        spec = self.spec
        for setting, table in (
            ("headers_from_env", spec.headers_from_env),
            ("query_from_env", spec.query_from_env),
        ):
            self.secrets.check(table, url=spec.url, stream=self.stream, setting=setting)
        variables = [*spec.headers_from_env.values(), *spec.query_from_env.values()]
        self.sent = await self.keepalive.waiting(self.credentials.values(variables))
        return self.sent

    def _retry_later(self, error: CredentialUnavailable) -> Outcome:
        result = self.session.result
        result.retry_after = error.retry_after
        result.error = f"stream {self.stream!r}: {error}"
        self.log.warning("%s; waiting to retry", result.error)
        return Outcome.RETRY_LATER

    def _request(self, values: dict[str, str]) -> tuple[str, Headers]:
        """The URL (cursor and secret parameters in) and headers of the request: secret
        values are resolved here, for this URL's host, before the wire rules see them
        (``values``: those read from files or minted; the others are the environment's)."""
        spec, cursor = self.spec, self.session.start_cursor
        secret = request_secrets(
            self.secrets,
            headers_from_env=spec.headers_from_env,
            query_from_env=spec.query_from_env,
            url=spec.url,
            stream=self.stream,
            values=values,
            header_values=self.credentials.header_values(values),
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

    async def _read_and_commit(self, url: str, headers: Headers) -> ReadResult:
        """Connect, read until an outcome, and commit what was read, whatever ends it.

        A cancellation ends the connection as cancelled, whenever it arrives: while it
        reads, or while a connection that ended on its own flushes (the flush is never
        cut short: what was read is committed before the result)."""
        try:
            outcome = await self._connect_authorized(url, headers)
        except asyncio.CancelledError:
            outcome = Outcome.CANCELLED
        except StreamRefusedError:
            await self._flush()
            self._count_ids_out_of_order()
            raise
        if await self._flush():
            outcome = Outcome.CANCELLED
        if outcome is Outcome.CANCELLED:
            self.log.info(
                "stream %s: connection cancelled (%s) after flushing",
                self.stream,
                self.cancel_reason(),
            )
        return await self._finish(outcome)

    async def _flush(self) -> bool:
        """Commit everything read so far, through any cancellation; True when one arrived
        meanwhile."""
        _, cancelled = await _uncancelled(self.committer.flush())
        return cancelled

    async def _finish(self, outcome: Outcome) -> ReadResult:
        """The result, with the stream's gaps as they are now (read after the flush)."""
        result = self.session.finish(outcome)
        if result.drop is not None and self.metrics is not None:
            self.metrics.drop_signal(result.drop.kind)
        self._count_ids_out_of_order()
        try:
            # A cancellation meanwhile changes nothing: the connection has ended.
            await _uncancelled(self._read_gaps(result))
        except StoreError as error:
            # The gaps are durable; the workflow reads them itself when a result has none.
            self.log.warning("stream %s: cannot read its gaps: %s", self.stream, error)
        return result

    async def _read_gaps(self, result: ReadResult) -> None:
        read = self.stores.gaps_and_checkpoint(self.stream, self.order)
        result.gaps, checkpoint = await self.keepalive.waiting(read)
        result.lagging_id = checkpoint.lagging_id if checkpoint else None

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

    async def _connect_authorized(self, url: str, headers: Headers) -> Outcome:
        """Connect; after a refusal of the credentials, read or mint them again and, when
        one changed, reconnect at once on the same route and cursor (nothing was read), up
        to ``AUTH_RENEWALS`` times; a refusal of unchanged credentials, or one more
        refusal after those renewals, parks the stream."""
        renewals = 0
        while True:
            try:
                return await self._connect(url, headers)
            except CredentialsRefusedError as refused:
                self._auth_failed(refused)
                sent = dict(self.sent)
                try:
                    changed = await self.keepalive.waiting(self.credentials.renew(sent))
                except CredentialUnavailable as error:
                    return self._retry_later(error)
                decision = after_auth_failure(changed=bool(changed), renewals=renewals)
                if decision is AuthDecision.PARK:
                    why = (
                        f"refused again after {renewals} renewal(s)"
                        if changed
                        else "unchanged when read again"
                    )
                    raise self._parked(refused, sent, why) from None
                renewals += 1
                self.log.info(
                    "stream %s: HTTP %d: %s %s; reconnecting at once",
                    self.stream,
                    refused.status_code,
                    ", ".join(changed),
                    "read again" if len(changed) == 1 else "renewed",
                )
            try:
                url, headers = self._request(await self._secret_values())
            except CredentialUnavailable as error:
                return self._retry_later(error)

    def _auth_failed(self, refused: CredentialsRefusedError) -> None:
        if self.metrics is not None:
            self.metrics.auth_failure(refused.status_code)
        self.credentials.refused(self.sent, status_code=refused.status_code, stream=self.stream)

    def _parked(
        self, refused: CredentialsRefusedError, sent: dict[str, str], why: str
    ) -> StreamRefusedError:
        """The refusal that parks the stream, naming its secrets (never their values)."""
        names = list(dict.fromkeys(view.variable for view in self.credential_views()))
        if not names:
            what = REFUSAL_HINTS.get(refused.status_code, "the server refused the request")
        else:
            renewable = [name for name in names if name in sent]
            fixed = [name for name in names if name not in sent]
            parts = []
            if renewable:
                parts.append(f"{', '.join(renewable)} {why}")
            if fixed:
                parts.append(
                    f"{', '.join(fixed)} from the worker's environment (fixed while it runs)"
                )
            what = "the server refused " + "; ".join(parts)
        message = f"{refused}: {what}; the stream is parked until resumed"
        self.log.warning("%s", message)
        return StreamRefusedError(message)

    async def _connect(self, url: str, headers: Headers) -> Outcome:
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
            waiting=self.keepalive.waiting,
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
        body = BodyReader(
            self.session,
            committer=self.committer,
            prefetch=self.prefetch,
            keepalive=self.keepalive,
            log=self.log,
        )
        return await body.read(answer.response)

    # -- the retention hold --------------------------------------------------------

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


async def _uncancelled(work: Awaitable[T]) -> tuple[T, bool]:
    """Await ``work`` to its end even when this task is cancelled meanwhile, and say
    whether it was: the cancellation is taken (``Task.uncancel``) so it strikes no later
    await; the caller ends as cancelled. ``work`` cancelled by itself still raises."""
    task = asyncio.ensure_future(work)
    cancelled = False
    while True:
        try:
            return await asyncio.shield(task), cancelled
        except asyncio.CancelledError:
            if task.cancelled():
                raise
            cancelled = True
            current = asyncio.current_task()
            if current is not None:
                current.uncancel()


def _gap_id() -> str:
    return token_hex(8)


def _now_iso() -> str:
    return datetime.now(UTC).isoformat()
