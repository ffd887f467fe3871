"""One execution of the read activity, without I/O: from the start it resolves to the
result it returns.

A :class:`ReadSession` holds what a connection has: the decoder, the
:class:`~durable_sse.reader.intake.Intake` that decides what to persist, where it started,
its first id, the counts of the attempts before it. The read activity drives it with
bytes from a socket (:mod:`durable_sse.reader.connection`); the simulation suite
(``tests/sim``) drives the very same class with a simulated server, a virtual clock and
an in-memory store. So how a connection starts (its cursor, its intake, whether it skips
what is stored), what it takes as it reads and ends, what a commit moves, what a retried
attempt is told and what the workflow gets back is decided here, once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any

from durable_sse.contracts import (
    Outcome,
    ReadCounts,
    ReadInput,
    ReadProgress,
    ReadResult,
    Route,
)
from durable_sse.cursor.readers import ReaderLease
from durable_sse.cursor.resolve import CursorResolver
from durable_sse.cursor.start import ConnectionStart
from durable_sse.errors import StreamError
from durable_sse.ids import is_newer
from durable_sse.log.records import InsertResult, StoredPage
from durable_sse.reader.intake import CommitBatch, Intake
from durable_sse.reader.stored import PAGE_ROWS, StoredAhead
from durable_sse.sse.client import EOF
from durable_sse.sse.decoder import Comment, DecodedEvent, SSEDecoder


@dataclass(frozen=True)
class Committed:
    """What one batch's commit moved (:meth:`ReadSession.committed`)."""

    cursor: str | None
    """The cursor it moved to (None: it did not move)."""
    first: bool
    """The connection started with no cursor and this commit gave it its first id."""
    blind: bool
    """It recorded the loss window of a reconnect that could not resume."""


def _page_rows() -> int | None:
    return PAGE_ROWS


class ReadSession:
    """One connection's state, from its start to its result.

    Args:
        read_input: the activity's input.
        previous: heartbeat details of the attempt before (None: the first attempt, or
            none reached Temporal); a hint, the stores are the truth.
        retried: this is not the activity's first attempt.
        new_gap_id: makes a gap id (random in the activity, seeded in the simulation).
        now_iso: the wall clock as ISO text (the simulation's is virtual).
    """

    def __init__(
        self,
        read_input: ReadInput,
        *,
        previous: ReadProgress | None = None,
        retried: bool = False,
        new_gap_id: Callable[[], str],
        now_iso: Callable[[], str],
    ) -> None:
        self.input = read_input
        self.spec = read_input.spec
        self.stream = read_input.spec.name
        self.order = read_input.spec.id_order
        self.route = Route(read_input.route)
        self.retried = retried
        self.previous = previous
        self.carried = previous.counts if previous is not None else ReadCounts()
        """Counts of earlier attempts (a retried attempt keeps counting)."""
        self._new_gap_id = new_gap_id
        self._now_iso = now_iso
        self.decoder = SSEDecoder(
            max_line_bytes=self.spec.max_line_bytes,
            max_event_bytes=self.spec.max_event_bytes,
            max_id_bytes=self.spec.max_id_bytes,
        )
        self.result = ReadResult(outcome=Outcome.DROPPED)
        self.intake: Intake | None = None
        self.start_cursor: str | None = None
        self.first_id: str | None = None
        self.body_done = False
        """Nothing more to take from the body: its end, a read error, or bytes the
        decoder refused (after which it is not fed again)."""

    # -- the start -----------------------------------------------------------------

    @property
    def replaces_a_death(self) -> bool:
        """Whether this attempt replaces one that may have read what it never committed
        (a retry, but not of a hand-over)."""
        return self.retried and not (self.previous is not None and self.previous.handed_over)

    async def resolve(
        self, resolver: CursorResolver, *, reader: ReaderLease | None = None
    ) -> ConnectionStart:
        """Where this connection starts, from the cursor chains of its route (a retried
        attempt starts where the one that died started); registers ``reader``."""
        return await resolver.resolve(
            self.stream,
            self.order,
            self.route,
            explicit=self.input.start_id,
            retry_of=self.previous,
            retried=self.retried,
            reader=reader,
        )

    def begin(
        self, start: ConnectionStart, *, page_rows: Callable[[], int | None] = _page_rows
    ) -> bool:
        """Start from ``start``; True when the connection replays from behind the newest
        stored id and fetches the stored keys ahead of it (:meth:`stored_fetch_due`), so
        that it skips what is stored.

        ``page_rows``: asked only for such a replay, how many keys a page holds (None:
        skip nothing, write everything and let ``ON CONFLICT`` absorb it; the simulation
        tries both).

        Raises :class:`~durable_sse.errors.ConfigError` for a ``drop_notice`` pattern
        RE2 refuses.
        """
        self.start_cursor = start.cursor
        self.result.start_cursor = start.cursor
        self.result.cursor_source = start.source
        self.intake = Intake(
            self.spec,
            route=self.route,
            cursor=start.cursor,
            context=start.context,
            known_gaps=self.input.known_gaps,
            new_gap_id=self._new_gap_id,
            now_iso=self._now_iso,
            retried=self.replaces_a_death,
            read_before=self.input.events_read_before > 0 or self.carried.events_read > 0,
            verify=self.input.verify,
            verify_from=self.input.verify_from,
        )
        if start.cursor:
            self.decoder.last_event_id = start.cursor
        floor = start.context.floor
        if start.cursor and is_newer(floor, start.cursor, self.order):
            # A replay below the newest stored id: skip what is stored (reader.stored).
            rows = page_rows()
            if rows is not None:
                self.intake.stored = StoredAhead(self.order, start=start.cursor, page_rows=rows)
                return True
        return False

    @property
    def started(self) -> Intake:
        """The intake, once :meth:`begin` made it."""
        assert self.intake is not None, "begin() first"
        return self.intake

    def head(self, *, truncation_header: str | None) -> None:
        """The response head arrived (see :meth:`Intake.head`)."""
        self.started.head(truncation_header=truncation_header)

    # -- reading -------------------------------------------------------------------

    def feed(
        self, chunk: bytes, *, received_at: datetime, now: float
    ) -> list[DecodedEvent | Comment]:
        """Decode a chunk and take what it completes; returns the items taken.

        A line, event or id the decoder refuses ends the body: what the chunk completed
        before it is taken (the cursor stays before the bad event, so the next connection
        meets it again), then the decoder's error is raised.
        """
        try:
            items = self.decoder.feed(chunk)
        except StreamError as error:
            self.body_done = True
            before: list[DecodedEvent | Comment] = getattr(error, "items", None) or []
            self.started.take(before, received_at=received_at, now=now)
            raise
        self.started.take(items, received_at=received_at, now=now)
        return items

    def close_body(self, *, received_at: datetime, now: float) -> None:
        """The server ended the body: take what the decoder still held."""
        self.body_done = True
        self.started.take(self.decoder.close(), received_at=received_at, now=now)

    def take_read_ahead(
        self, chunks: Iterable[Any], *, received_at: datetime, now: float
    ) -> StreamError | None:
        """The connection is ending and reads no more: take every chunk already read from
        the socket (bytes, then :data:`EOF` or the read error that ended the body).

        Synchronous, so that a cancellation cannot cut it short. A chunk the decoder
        refuses ends it there (returned): what the chunk completed before the refused
        line or event is kept, and the cursor stays before it.
        """
        if self.body_done:
            return None
        self.body_done = True
        intake = self.started
        for item in chunks:
            if item is EOF:
                intake.take(self.decoder.close(), received_at=received_at, now=now)
                break
            if isinstance(item, BaseException):
                break
            try:
                items = self.decoder.feed(item)
            except StreamError as error:
                before = getattr(error, "items", None) or []
                intake.take(before, received_at=received_at, now=now)
                return error
            intake.take(items, received_at=received_at, now=now)
        return None

    def stop(self) -> None:
        """Reading is over (however it ended): cut what is pending, and any gap change
        left alone, into batches for the flush."""
        self.started.end()

    def ended(self) -> Outcome:
        """The connection ended by itself: a drop notice seen before still counts."""
        intake = self.started
        intake.end()
        return intake.outcome or Outcome.DROPPED

    # -- stored keys ahead of a replay ---------------------------------------------

    def stored_fetch_due(self) -> str | None:
        """The id after which the next page of stored keys is wanted now (None: none is
        due); the caller fetches it and hands it to :meth:`stored_page`."""
        intake = self.started
        stored = intake.stored
        if stored is None:
            return None
        after = stored.next_fetch(intake.last_read)
        if after is not None:
            stored.fetching = True
        return after

    def stored_page(self, page: StoredPage | None) -> None:
        """A page of stored keys arrived (None: the fetch failed or was cancelled; an
        optimisation only, everything is written from here on)."""
        stored = self.started.stored
        if stored is None:
            return
        if page is None:
            stored.give_up()
        else:
            stored.add(page)

    @property
    def page_rows(self) -> int:
        stored = self.started.stored
        return stored.page_rows if stored is not None else PAGE_ROWS

    # -- commits -------------------------------------------------------------------

    def committed(self, batch: CommitBatch, inserted: InsertResult) -> Committed:
        """``batch`` committed (in submission order): what moved."""
        intake = self.started
        first = self.first_id is None and self.start_cursor is None
        blind = intake.counts.reconnects_without_cursor
        moved = intake.committed(
            batch,
            new_rows=inserted.new_rows,
            reused=inserted.reused,
            dropped_by_horizon=inserted.dropped_by_horizon,
        )
        cursor = intake.cursor if moved else None
        first_now = False
        if cursor is not None and first:
            # A retry of a connection with no cursor starts from its first id.
            self.first_id = (batch.records[0].event_id if batch.records else "") or cursor
            first_now = True
        return Committed(
            cursor=cursor,
            first=first_now,
            blind=intake.counts.reconnects_without_cursor > blind,
        )

    # -- what others are told -------------------------------------------------------

    def progress(self) -> ReadProgress:
        """Heartbeat details: where a retry of this attempt starts, and its counts."""
        intake = self.intake
        if intake is None:
            # Still resolving the start: keep the dead attempt's start for the next retry.
            return self.previous or ReadProgress(counts=self.carried)
        return ReadProgress(
            cursor=intake.cursor,
            start_cursor=self.start_cursor,
            first_id=self.first_id,
            counts=self.counts(),
        )

    def counts(self) -> ReadCounts:
        """This execution's counts, earlier attempts included."""
        return added(self.carried, self.started.counts)

    def finish(self, outcome: Outcome) -> ReadResult:
        """The result for a connection that ended with ``outcome`` (after the flush):
        a drop signal taken while ending wins over a rotation or a plain drop. The
        stream's gaps and lagging id are the caller's to add (read from the store)."""
        intake = self.started
        result = self.result
        result.outcome = intake.ending(outcome)
        result.last_cursor = intake.cursor
        result.retry_ms = self.decoder.retry
        result.drop = intake.drop
        result.counts = self.counts()
        return result


def added(a: ReadCounts, b: ReadCounts) -> ReadCounts:
    return ReadCounts(**{f.name: getattr(a, f.name) + getattr(b, f.name) for f in fields(b)})


def progress_from_details(details: Any) -> ReadProgress | None:
    """Heartbeat details as a retried attempt receives them (a dataclass, or the dict it
    was sent as): only the counts this version knows. The attempt that died may have run
    on a worker of another version (a rolling deploy), and a retry must not fail on it."""
    if isinstance(details, ReadProgress):
        return details
    if not isinstance(details, dict):
        return None
    counts = details.get("counts")
    if not isinstance(counts, dict):
        counts = {}
    known = {f.name: counts[f.name] for f in fields(ReadCounts) if f.name in counts}
    return ReadProgress(
        cursor=details.get("cursor"),
        start_cursor=details.get("start_cursor"),
        first_id=details.get("first_id"),
        counts=ReadCounts(**known),
        handed_over=details.get("handed_over") is True,
    )
