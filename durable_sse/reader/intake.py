"""One connection's reading, without I/O: decoded items in, batches and an outcome out.

The read activity (:mod:`activities.read`) owns the HTTP connection, the clocks, the
event log and the heartbeats; the simulation suite (``tests/sim``) drives this same class
with a simulated server, a virtual clock and an in-memory store. So every decision about
what to persist, what is a drop signal, which gap a batch proves or fills, and when a
connection must end is made here, once.

Batches are cut by count, by bytes, by age (``poll``), before a drop notice (what was
read before it is clean evidence), and where the set of open gaps an id would fill
changes (so a batch's new rows are wholly inside or outside each gap). Each batch carries
the gap changes that must commit with it (:mod:`durable_sse.gaps.tracker`). The cursor moves only
when :meth:`Intake.committed` is told, in commit order.

Ending a connection stops only the reading of new bytes: once :attr:`Intake.outcome` is
set, the reader hands over the rest of what it decoded and what it had read ahead, and
every item is taken as usual (a notice in it opens its own gap, and a drop signal in it
makes the outcome ``DROP_SIGNAL``). An event received and then thrown away would be in
no gap and no count.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from durable_sse.config.spec import StreamSpec
from durable_sse.contracts import RECORDED_GAP, DropReport, Outcome, ReadCounts, Route
from durable_sse.gaps.model import GapChange, GapKind, StreamContext, no_resume
from durable_sse.gaps.tracker import GapTracker
from durable_sse.ids import contiguous_number, is_newer, key_function, newest
from durable_sse.log.keys import FollowerKeys, data_digest
from durable_sse.log.records import EventRecord
from durable_sse.reader.read_marks import ReadMark, ReadMarks
from durable_sse.reader.stored import StoredAhead
from durable_sse.sse.decoder import Comment, DecodedEvent
from durable_sse.sse.drops import DropNoticeMatcher, dropped_count

logger = logging.getLogger(__name__)

DROP_GRACE = 0.25
"""After a drop notice, seconds to wait for the next id: it bounds the hole from above
(servers announce after the skipped range), then the connection ends for the repair."""
MAX_BATCH_BYTES = 4 * 1024 * 1024
"""Event data one batch holds at most: with a few batches in flight per connection this
bounds a connection's memory however large its events are."""
MAX_DETAIL = 200
SKIPPED_PER_ROW = 16
"""A batch of a replay covers up to this many times ``batch_max_events`` events read when
most are skipped as stored: a batch costs a commit however few rows it holds, and a
replay's batches would otherwise wait on commits, not on reading. Its age still cuts it
(``batch_max_delay``), so its cursor moves as often as a live stream's."""


@dataclass
class CommitBatch:
    """Events to commit in one transaction, with the gap changes that go with them."""

    records: list[EventRecord]
    last_id: str | None
    """Newest id read among the records (the cursor moves here once committed)."""
    gap_changes: list[GapChange] = field(default_factory=list)
    recovered: bool = False
    """The records lie inside an open gap: their new rows are recovered rows."""
    skipped: int = 0
    """Events of the batch left out of ``records`` as already stored (duplicates)."""


class Intake:
    """What one connection read, what it must write, and whether it must end.

    Longer than the house's ~300 lines for a class (and its module than ~500): every
    decision about one connection's items (cutting batches, weighing drop signals, keying
    ids, the gaps a batch proves) reads and moves the same state in reading order; split,
    each part would reach into the others'. The gap bookkeeping it delegates to is its
    own class (:class:`~durable_sse.gaps.tracker.GapTracker`).

    Args:
        spec: the stream's settings.
        route: the connection's route (a live connection ends at once when it finds
            open gaps the workflow did not know of).
        cursor: the id sent to the server (None: live only).
        context: what the store said as the connection started.
        known_gaps: open gaps the workflow knows of (a live connection that finds open
            gaps and knows none of them ends at once: the workflow must learn of them).
        new_gap_id: makes a fresh gap id (random in the activity, seeded in simulations).
        now_iso: the wall-clock time as ISO text (gap records are stamped with it).
        retried: this attempt replaces one that died (see ``GapTracker.suspect``).
        read_before: the stream read events before this connection (the workflow's
            counters, or an attempt that died): with no cursor, the connection is a
            reconnect that cannot resume (:func:`~durable_sse.gaps.model.no_resume`).
        verify: suspect what was read since the lagging id (``verify_reconnects``: a
            server may have skipped events and dropped the connection before its notice);
            see ``GapTracker.verify``.
        verify_from: with ``verify``, where the connection to verify began.
    """

    def __init__(
        self,
        spec: StreamSpec,
        *,
        route: Route,
        cursor: str | None,
        context: StreamContext,
        known_gaps: Iterable[str] = (),
        new_gap_id: Callable[[], str],
        now_iso: Callable[[], str],
        retried: bool = False,
        read_before: bool = False,
        verify: bool = False,
        verify_from: str | None = None,
    ) -> None:
        self.spec = spec
        self.order = spec.id_order
        self.route = Route(route)
        self.start_cursor = cursor
        self.cursor = cursor
        self.context = context
        self.matcher = DropNoticeMatcher(spec.drop_notice)
        self.drop_types = frozenset(spec.drop_event_types)
        self.gaps = GapTracker(
            stream=spec.name,
            order=spec.id_order,
            cursor=cursor,
            context=context,
            contiguous=spec.contiguous_ids,
            new_gap_id=new_gap_id,
            now=now_iso,
        )
        self.counts = ReadCounts()
        self.ready: deque[CommitBatch] = deque()
        """Batches cut and waiting to be submitted, in order."""
        self.outcome: Outcome | None = None
        """Set when the connection must end (a drop signal, a finished repair): stop
        reading new bytes, take what was received, flush."""
        self.drop: DropReport | None = None
        self.ids_not_counters = 0
        self.history_short = False
        self.history_confirmed = False

        self._pending: list[EventRecord] = []
        self._pending_count = 0
        """Events in the pending batch: its records and those skipped as stored."""
        self._pending_skipped = 0
        self._pending_bytes = 0
        self._pending_last: str | None = None
        self._pending_last_key: bytes | None = None
        self._pending_segment: frozenset[str] = frozenset()
        self._pending_since = 0.0
        self._ordinal = 0
        self._followers = FollowerKeys()
        self._carrier_digest: bytes | None = None
        """Digest of the event that carried the id in force on this connection (None: the
        connection began inside an id's run): stored with the event and its followers."""
        self._reuse_warned = False
        self._read_marks = ReadMarks(window=spec.replay_window, ids=self.gaps.confirm_ids)
        """What was read when, as of each batch cut."""
        self._last_read: str | None = None
        self._last_key = b""
        """``sort_key`` of ``_last_read``: each id is keyed once, and ids compare as keys."""
        self._key = key_function(spec.id_order)
        self._last_number: int | None = None
        self._drop_deadline: float | None = None
        """When the connection ends for a drop signal whose end bound has not come."""
        self._notice_open = False
        """A drop notice or drop event came and no id has been read since: a second one
        before that id speaks of the same hole (one gap is enough)."""
        self._repaired_at: float | None = None
        """When to end a connection that closed every gap it knew of."""
        self._now = 0.0
        self.stored: StoredAhead | None = None
        """Keys stored ahead of a replay (set by the reader): such events are counted as
        duplicates and become no record (see :mod:`durable_sse.reader.stored`)."""
        self.cannot_resume = no_resume(cursor, context, read_before=read_before)
        """A reconnect that cannot resume: its loss window is recorded once the stream
        opens (:meth:`head`)."""
        self._no_resume_gap: str | None = None
        self._retry_gap: str | None = None
        """A live retry's suspicion of what its dead attempt read: repairing it is no news
        the workflow must have at once (it never knew of it)."""

        if retried:
            suspicion = self.gaps.suspect(
                "an attempt that read here died; what it read is read again"
            )
            if suspicion is not None and self.route is Route.LIVE:
                self._retry_gap = suspicion.gap_id
        if verify:
            self.gaps.verify(
                "a reconnect of a stream that verifies its reconnects: what was read since "
                "the lagging id is read again",
                since=verify_from,
            )
        known = set(known_gaps)
        unknown = [gap.gap_id for gap in context.open_gaps if gap.gap_id not in known]
        # A workflow that knows one open gap has its repair pending already (it names
        # only the oldest MAX_GAPS_IN_SUMMARY): ending now would only reconnect live, at
        # once and over again, until the lagged-reconnect throttle lets the repair run.
        knows_one = len(unknown) < len(context.open_gaps)
        if self.route is Route.LIVE and unknown and not knows_one:
            self._signal(RECORDED_GAP, f"{len(unknown)} open gap(s) recorded earlier")
            self.outcome = Outcome.DROP_SIGNAL

    # -- what the server sent ----------------------------------------------------------

    def head(self, *, truncation_header: str | None) -> None:
        """The response head: a truncation header unlike the cursor means the server's
        history does not reach it (what lies between is lost); equal to it, that it does.

        A reconnect that cannot resume records its loss window here, when the stream
        opens (a refused or failed attempt ends no window: the next one that opens
        does), with the connection's first batch (or alone, if it reads nothing)."""
        if self.cannot_resume and self._no_resume_gap is None:
            self._no_resume_gap = self.gaps.no_resume().gap_id
            logger.info(
                "stream %s: reconnected with no id to resume from: what the server sent "
                "meanwhile is lost (a gap of kind no_resume, of unknown size)",
                self.spec.name,
            )
        if not self.spec.mercure_last_event_id or truncation_header is None or self.cursor is None:
            return
        if truncation_header == self.cursor:
            self.history_confirmed = True
        else:
            self.history_short = True
            logger.warning(
                "stream %s: the server's history no longer reaches cursor %r",
                self.spec.name,
                self.cursor,
            )

    def take(
        self, items: list[DecodedEvent | Comment], *, received_at: datetime, now: float
    ) -> None:
        """Decoded items, in order; ``now`` is a monotonic clock reading.

        Every item is taken, also once :attr:`outcome` is set: what was received is
        stored; the reader only stops reading more."""
        self._now = now
        for item in items:
            if isinstance(item, Comment):
                self._comment(item.text, now)
            else:
                self._event(item, received_at, now)

    def poll(self, now: float) -> None:
        """Time passed: cut an old pending batch; end after a notice's grace, or a
        finished repair's."""
        self._now = now
        if (
            self._pending_count and now - self._pending_since >= self.spec.batch_max_delay
        ) or self.gaps.proof_due(now):
            self._cut()
        if self._drop_deadline is not None and now >= self._drop_deadline:
            self.outcome = Outcome.DROP_SIGNAL
        elif (
            self.outcome is None
            and self._repaired_at is not None
            and now >= self._repaired_at
            and self.gaps.clean
        ):
            self.outcome = Outcome.ROTATED

    def _closes_quietly(self, change: GapChange) -> bool:
        """Whether closing a gap so is no reason to end the connection: a reconnect's own
        loss window closes as it opens (no repair finished, and a stream that cannot
        resume must not end: each reconnect loses more); a live retry's suspicion that
        its re-read repaired would end every stream a dead worker's successor took over
        a moment after its connection opened, for a second reconnect under the same
        burst (2-4 s more in the failover bench). One that finds a loss is news."""
        if change.gap_id == self._no_resume_gap:
            return True
        lost = change.lost_to is not None or change.short_to is not None or change.truncated
        return change.gap_id == self._retry_gap and not lost

    def next_deadline(self, now: float) -> float | None:
        """Seconds until :meth:`poll` has something to do (None: nothing pending)."""
        deadlines = []
        if self._pending_count:
            deadlines.append(self._pending_since + self.spec.batch_max_delay)
        if self._drop_deadline is not None:
            deadlines.append(self._drop_deadline)
        if self._repaired_at is not None:
            deadlines.append(self._repaired_at)
        proof_at = self.gaps.next_proof_at()
        if proof_at is not None:
            deadlines.append(proof_at)
        return max(min(deadlines) - now, 0.0) if deadlines else None

    def end(self) -> None:
        """The connection is over: cut what is pending, and any gap change left alone."""
        self._cut()
        leftover = self.gaps.pending_changes()
        if leftover:
            self.ready.append(CommitBatch(records=[], last_id=None, gap_changes=leftover))
        if self._drop_deadline is not None and self.outcome in (None, Outcome.ROTATED):
            self.outcome = Outcome.DROP_SIGNAL  # a notice with no id after it

    def ending(self, outcome: Outcome) -> Outcome:
        """What to report for a connection that ended with ``outcome`` (call after
        :meth:`end`): a drop signal among what it took while ending wins over a rotation
        or a plain drop, since the workflow must repair the gap it recorded."""
        if self.outcome is Outcome.DROP_SIGNAL and outcome in (Outcome.ROTATED, Outcome.DROPPED):
            return Outcome.DROP_SIGNAL
        return outcome

    # -- commits -----------------------------------------------------------------------

    def committed(
        self,
        batch: CommitBatch,
        *,
        new_rows: int,
        reused: Sequence[str] = (),
        dropped_by_horizon: int = 0,
    ) -> bool:
        """``batch`` committed (call in submission order); True when the cursor moved.

        ``reused``: ids of the batch that the store holds with other data and kept anyway
        (their rows are in ``new_rows``): counted as ``ids_reused``, never as duplicates,
        and warned of once per connection. ``dropped_by_horizon``: records the store left
        out at the retention horizon (counted apart, never as duplicates).
        """
        self.counts.new_rows += new_rows
        self.counts.duplicates += len(batch.records) - new_rows - dropped_by_horizon + batch.skipped
        self.counts.dropped_by_horizon += dropped_by_horizon
        if self._no_resume_gap is not None and any(
            change.opened is not None and change.gap_id == self._no_resume_gap
            for change in batch.gap_changes
        ):
            self.counts.reconnects_without_cursor += 1
        if batch.recovered:
            self.counts.recovered += new_rows
        moved = batch.last_id is not None and is_newer(batch.last_id, self.cursor, self.order)
        if moved:
            self.cursor = batch.last_id
        if reused:
            self.counts.ids_reused += len(reused)
            if not self._reuse_warned:
                self._reuse_warned = True
                logger.warning(
                    "stream %s: id %r is stored already with other data or type: the server "
                    "seems to have restarted its id counter (or reuses ids). The new event is "
                    "kept beside the old one (counted as ids_reused); the cursor stays at the "
                    "newest id, %r (it never moves back under id_order %r)",
                    self.spec.name,
                    reused[0][:64],
                    self.cursor[:64] if self.cursor else None,
                    self.order,
                )
        return moved

    def retention_hold(self, now: float) -> str | None:
        """The oldest id this connection may still need stored (retention keeps it and
        every newer one while the connection runs; see :mod:`durable_sse.log.retention`).

        Its start cursor (or, with none, its first id), moved forward to the id it read
        one replay window and ``CONFIRM_IDS`` ids ago once it has read for longer (see
        :mod:`durable_sse.reader.read_marks`): it never re-reads what lies
        before the ids it read, and every gap it can still open starts at or after this
        (a notice speaks of the last window, a hole in contiguous ids of what it reads
        now). None: no id read yet and no cursor, keep every id.
        """
        start = self.start_cursor or self.gaps.first_id
        return newest([start, self._read_a_window_ago(now)], self.order)

    @property
    def ids_out_of_order(self) -> int:
        """Ids not newer than the one read before them (counted in ``counts`` too)."""
        return self.counts.ids_out_of_order

    @property
    def pending_events(self) -> int:
        return self._pending_count

    @property
    def last_read(self) -> str | None:
        """The last id read (None: none yet)."""
        return self._last_read

    @property
    def open_gaps_opened(self) -> list[str]:
        """Gaps this connection opened."""
        return list(self.gaps.opened)

    # -- internals ---------------------------------------------------------------------

    def _comment(self, text: str, now: float) -> None:
        if self._notice_open or not text or not self.matcher.matches(text):
            return
        self._notice_open = True
        self._cut()  # what was read before the notice is clean evidence
        self.gaps.drop_signal(
            GapKind.COMMENT,
            announced=dropped_count(text),
            detail=text,
            read_a_window_ago=self._read_a_window_ago(now),
        )
        self._signal(GapKind.COMMENT.value, text)
        self._drop_deadline = now + DROP_GRACE

    def _event(self, event: DecodedEvent, received_at: datetime, now: float) -> None:
        event_id = event.id
        follower: bytes | None = None
        key = None
        if event_id:
            key = self._last_key if event_id == self._last_read else self._key(event_id)
        digest: bytes | None = None
        if not event_id:
            ordinal = None
        elif event.id_field:
            ordinal = self._ordinal = 0
            follower = self._followers.carrier()
            digest = self._carrier_digest = data_digest(event.event, event.data)
        else:
            self._ordinal += 1
            ordinal = self._ordinal
            follower = self._followers.follower(event.event, event.data, ordinal)
            digest = self._carrier_digest
        announces_drop = event.event in self.drop_types and not self._notice_open
        if announces_drop:
            self._notice_open = True
            self._cut()
        segment = self.gaps.segment(event_id) if event_id and self.gaps.gaps else frozenset()
        if self._pending_count and segment != self._pending_segment:
            self._cut()
        if not self._pending_count:
            self._pending_since = now
            self._pending_segment = segment
        self._pending_count += 1
        stored = self.stored
        if stored is not None and follower is not None and stored.has(event_id, follower, digest):
            self._pending_skipped += 1  # stored already: ON CONFLICT would discard it
        else:
            record = EventRecord(
                event_id=event_id,
                event_ord=ordinal,
                event_type=event.event,
                data=event.data,
                received_at=received_at,
                follower_key=follower,
                id_key=key,
                digest=digest,
            )
            self._pending.append(record)
            self._pending_bytes += len(event.data)
        self.counts.events_read += 1
        if key is not None and event.id_field:
            self._new_id(event_id, key, now, announced_here=announces_drop)
        if announces_drop:
            # The drop event is the notice: its own batch records the gap (no cursor may
            # pass it first) and, read after the skip, is no evidence for a repair.
            self.gaps.drop_signal(
                GapKind.EVENT_TYPE,
                detail=f"event type {event.event!r}",
                read_a_window_ago=self._read_a_window_ago(now),
            )
            self._cut()
            self._signal(GapKind.EVENT_TYPE.value, f"event type {event.event!r}")
            self._drop_deadline = now + DROP_GRACE
        elif (
            len(self._pending) >= self.spec.batch_max_events
            or self._pending_count >= self.spec.batch_max_events * SKIPPED_PER_ROW
            or self._pending_bytes >= MAX_BATCH_BYTES
        ):
            self._cut()

    def _new_id(
        self, event_id: str, key: bytes, now: float, *, announced_here: bool = False
    ) -> None:
        """An event carrying an id field: order, contiguity, gap bookkeeping."""
        first = self._last_read is None
        if first:
            self.gaps.first_event(
                event_id,
                history_short=self.history_short,
                history_confirmed=self.history_confirmed,
            )
            if self.gaps.short_history:
                # The replay started past a gap: end after a grace (a late notice would
                # explain it) so that another repair tries again.
                self._signal("history_short", "the replay started past an open gap")
                self._drop_deadline = now + DROP_GRACE
        elif key <= self._last_key:  # not newer than the id read before it
            self.counts.ids_out_of_order += 1
            if self.counts.ids_out_of_order == 1:
                logger.warning(
                    "stream %s: id %r is not newer than %r under id_order %r: check the "
                    "setting (counted as ids_out_of_order)",
                    self.spec.name,
                    event_id[:64],
                    self._last_read[:64] if self._last_read else None,
                    self.order,
                )
        if self.spec.contiguous_ids:
            self._contiguity(event_id, first)
        elif self._last_read is not None:  # not the first id
            if self.gaps.passed_floor(self._last_read, event_id):
                self._signal(GapKind.ID_GAP.value, "the server skipped the newest stored id")
                self.outcome = Outcome.DROP_SIGNAL
        self.gaps.id_read(event_id)
        self._last_read, self._last_key = event_id, key
        if self._pending_last_key is None or key > self._pending_last_key:
            self._pending_last, self._pending_last_key = event_id, key
        if self._notice_open and not announced_here:
            self._notice_open = False
            self.outcome = Outcome.DROP_SIGNAL  # the first id after the notice bounds it

    def _contiguity(self, event_id: str, first: bool) -> None:
        number = contiguous_number(event_id)
        if number is None:
            self.ids_not_counters += 1
            if self.ids_not_counters == 1:
                logger.warning(
                    "stream %s: id %r is not a counter although contiguous_ids is set; "
                    "such ids are not checked for holes",
                    self.spec.name,
                    event_id[:64],
                )
            return
        last = self._last_number
        if not first and last is not None and number > last + 1:
            assert self._last_read is not None
            if self.gaps.jump(self._last_read, event_id):
                self._signal(GapKind.ID_GAP.value, f"{number - last - 1} ids missing")
                self.outcome = Outcome.DROP_SIGNAL
        elif first and not self.gaps.clean and self._drop_deadline is None:
            # Ids missing right after the cursor: often a history that no longer reaches
            # it, which no repair can fix. Store what comes for a grace, then end for the
            # repair, so a stream behind a short history still makes progress.
            self._signal(GapKind.ID_GAP.value, "ids missing after the cursor")
            self._drop_deadline = self._now + DROP_GRACE
        if last is None or number > last:
            self._last_number = number

    def _read_a_window_ago(self, now: float) -> str | None:
        """The newest id this connection had read one replay window and ``CONFIRM_IDS``
        ids ago (None: younger): how far back a notice may speak (:mod:`.read_marks`)."""
        return self._read_marks.reach(now, self.gaps.ids_read)

    def _signal(self, kind: str, detail: str) -> None:
        if self.drop is None:
            self.drop = DropReport(kind=kind, detail=detail[:MAX_DETAIL])

    def _cut(self) -> None:
        """Move the pending events into a batch with the gap changes they carry."""
        if (
            not self._pending_count
            and not self.gaps.has_queued
            and not self.gaps.proof_due(self._now)
        ):
            return
        last_id = self._pending_last
        if last_id is not None:
            self._read_marks.add(ReadMark(self._now, self.gaps.ids_read, last_id))
        changes = self.gaps.batch_changes(
            last_id=last_id, segment=self._pending_segment, now=self._now
        )
        closed = any(c.close and not self._closes_quietly(c) for c in changes)
        if self._repaired_at is None and not self.gaps.gaps and closed:
            # Every gap this connection knew of is closed: end soon, so the workflow
            # (status, metrics, logs) learns now, not at the next rotation; after a grace,
            # since a late notice may still say the repair itself skipped something.
            self._repaired_at = self._now + DROP_GRACE
        elif self._repaired_at is None and self.route is not Route.LIVE and self.gaps.stranded():
            # A repair with nothing left it can re-read, and open gaps behind its start
            # (a suspicion recorded as it began, a gap opened meanwhile): the workflow
            # does not interrupt a repair, so end it; the repair resumes at once from the
            # oldest gap (issue 33: a suspected gap open for minutes, the stream quiet).
            self._repaired_at = self._now + DROP_GRACE
        recovered = bool(self._pending_segment - set(self.gaps.opened))
        self.ready.append(
            CommitBatch(
                records=self._pending,
                last_id=last_id,
                gap_changes=changes,
                recovered=recovered,
                skipped=self._pending_skipped,
            )
        )
        self._pending = []
        self._pending_count = 0
        self._pending_skipped = 0
        self._pending_bytes = 0
        self._pending_last = None
        self._pending_last_key = None
        self._pending_segment = frozenset()
