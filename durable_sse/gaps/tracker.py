"""One connection's view of its stream's gaps: what it opens, proves and writes with
each batch.

Pure: the reader's intake (:mod:`durable_sse.reader.intake`) drives it in reading order
and puts the :class:`~durable_sse.gaps.model.GapChange` s it asks for into the batches
it submits.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from durable_sse.gaps.model import SHORT_READS_TO_LOSE, GapChange, GapKind, GapRecord, StreamContext
from durable_sse.ids import IdOrder, compare_ids, contiguous_number, is_successor, newest

CONFIRM_IDS = 16
"""Ids a connection must read after a batch, with no drop signal, before that batch is
evidence that it re-read continuously (ids not declared contiguous). A server may
announce a skip late, after more events (a notice is about what it discarded *before*
it): until then, what the batch seems to prove about a gap may be false. Seen in the
field: a repair passed its gap's end, closed it as ``repaired``, and the notice saying
the repair itself had skipped all of the gap's ids came a few events later. A notice's
gap reaches back at least this many ids too (:mod:`durable_sse.reader.read_marks`)."""
CONFIRM_SECONDS = 2.0
"""Or this long since the batch was cut, with no drop signal: a quiet source sends no
more events, and its gaps must still close (a notice later than this is taken as a new
drop)."""


@dataclass
class _Proof:
    """What a batch cut on a clean connection would prove, not yet confirmed."""

    last_id: str
    ids_read: int
    """The connection's count of ids read when the batch was cut."""
    at: float
    """Monotonic seconds when it was cut."""


class GapTracker:
    """What one connection knows, proves and opens about its stream's gaps.

    Longer than the house's ~300 lines for a class: its methods share one connection's
    state (the gaps it carries, what it has proven, the changes queued for the next
    batch) and are called by one caller in one order; split, each half would need the
    other's private state.

    The reader calls, in reading order: :meth:`first_event` for the first id read,
    :meth:`drop_signal` for a notice (after submitting what was read before it),
    :meth:`id_read` for every id, :meth:`jump` for a hole in contiguous ids, and
    :meth:`batch_changes` for every batch it submits (the changes go into that batch's
    transaction). Batches must not straddle :meth:`segment` boundaries, so the new rows
    of a batch are wholly inside or outside each gap.
    """

    def __init__(
        self,
        *,
        stream: str,
        order: IdOrder | str,
        cursor: str | None,
        context: StreamContext,
        contiguous: bool,
        new_gap_id: Callable[[], str],
        now: Callable[[], str],
        confirm_ids: int = CONFIRM_IDS,
        confirm_seconds: float = CONFIRM_SECONDS,
    ) -> None:
        self.stream = stream
        self.order = IdOrder(order)
        self.cursor = cursor
        self.context = context
        self.contiguous = contiguous
        self._new_gap_id = new_gap_id
        self._now = now
        self.gaps: dict[str, GapRecord] = {g.gap_id: g for g in context.open_gaps if g.is_open}
        self.covered_from: str | None = None
        """Re-read continuously from here (None: this connection proves nothing)."""
        self.clean = True
        """No drop signal of this connection so far: its batches are evidence."""
        self.short_history = False
        """The first event suggested a short history for a gap being repaired (a
        strike): the connection should end soon so that another repair tries again."""
        self._strikes: list[GapChange] = []
        self.first_id: str | None = None
        self.last_id: str | None = None
        self.opened: list[str] = []
        self._queued: list[GapChange] = []
        self._awaiting_end: GapRecord | None = None
        self._first_seen = False
        self._early_notice: str | None = None
        """The gap of a notice that came before the connection's first event."""
        self.confirm_ids = confirm_ids
        self.confirm_seconds = confirm_seconds
        self._ids_read = 0
        self._newest_read: deque[str] = deque()
        """The newest id read so far, as of each of the last ``confirm_ids`` ids read:
        its head is what reads since have confirmed."""
        self._proofs: deque[_Proof] = deque()
        """Batches cut while clean whose evidence awaits confirmation (see
        :data:`CONFIRM_IDS`); dropped at the first drop signal or at the end."""

    # -- reading --------------------------------------------------------------------

    def first_event(
        self, event_id: str, *, history_short: bool = False, history_confirmed: bool = False
    ) -> None:
        """The first id read: did the server's history reach the cursor sent?

        The connection is evidence from the cursor on only when that is *shown*: the ids
        are contiguous and the first is the cursor's successor, the server confirmed the
        cursor (``history_confirmed``), or the first id is not newer than the first id
        stored after the cursor (the witness). Otherwise it is evidence from its first
        id on, and the gaps it set out to repair that lie before that id get a strike.

        Args:
            history_short: the server said its history does not reach the cursor (a
                ``Mercure-Last-Event-ID`` unlike it).
            history_confirmed: the server said it resumed at the cursor (that header,
                equal to it).
        """
        self._first_seen = True
        self.first_id = event_id
        cursor = self.cursor
        if cursor is None:
            return
        if history_short:
            self.covered_from = event_id
            self._lose_covered(cursor, event_id, definite=True)
            self._open_skipped(
                cursor, event_id, kind=GapKind.MERCURE_HEADER, lost=True, at_start=True
            )
            return
        if self.contiguous:
            low, high = contiguous_number(cursor), contiguous_number(event_id)
            if low is not None and high is not None:
                if high <= low + 1:
                    self.covered_from = cursor
                    return
                # The history starts after the cursor, or this connection dropped ids
                # at its start: gaps being repaired get a strike; ids never stored in
                # between get a gap of their own.
                self.covered_from = event_id
                self._lose_covered(cursor, event_id, definite=False)
                self._open_skipped(cursor, event_id, kind=GapKind.ID_GAP, lost=False, at_start=True)
                return
        if self.order is IdOrder.NUMERIC and is_successor(event_id, cursor):
            # No id sorts between n and n + 1 in the numeric order: the history reaches
            # the cursor, whether or not the stream's ids are contiguous. The witness is
            # not needed, and there may be none: a retry whose dead attempt began at the
            # stream's first stored id has nothing stored before it to start from (each
            # such read was a strike, and three declared a gap lost that was not).
            self.covered_from = cursor
            return
        witness = self.context.witness
        reached = history_confirmed or (
            witness is not None
            and compare_ids(event_id, witness, self.order) <= 0
            and not self._unread_hole_before(cursor, witness)
        )
        if reached:
            self.covered_from = cursor
            return
        # Evidence from here on only. The server skipped ids stored after the cursor: its
        # history may be shorter (a strike for the gaps this connection set out to
        # repair). Nothing stored after the cursor to compare with: nothing is shown
        # either way, and an unrepaired gap waits for a repair that starts before it.
        self.covered_from = event_id
        if witness is not None or self._resumes_at(cursor):
            # (With no witness, a gap that resumes at the cursor itself gets a strike too:
            # nothing is stored before it to start a repair from, so no later repair can
            # show more, and without strikes it would stay open for good. Simulation seed
            # 212111628: a gap at the stream's only stored id, open for ever, quiet.)
            self._lose_covered(cursor, event_id, definite=False)

    def id_read(self, event_id: str) -> None:
        """Every id read, in order (the first after a notice is the hole's end)."""
        if not self._first_seen:
            self.first_event(event_id)
        if self._awaiting_end is not None:
            gap = self._awaiting_end
            if gap.end_id is None:
                gap.end_id = event_id
                change = GapChange(gap.gap_id, end_id=event_id)
                if gap.gap_id == self._early_notice and self.contiguous:
                    # The notice came before any event: it speaks of the ids between the
                    # cursor and this one only. The store narrows it to what is missing.
                    change.contiguous = True
                    change.early_floor = self.context.floor or gap.start_id
                self._queued.append(change)
            self._awaiting_end = None
        self.last_id = event_id
        self._ids_read += 1
        recent = self._newest_read
        newest_so_far = newest([recent[-1] if recent else None, event_id], self.order)
        assert newest_so_far is not None
        recent.append(newest_so_far)
        while len(recent) > self.confirm_ids + 1:
            recent.popleft()

    def suspect(self, detail: str) -> GapRecord | None:
        """This attempt replaces one that died: record what that one read (from this
        connection's cursor to the newest stored id) as a gap to re-read, so that a
        drop notice it read and never wrote is repaired even if this attempt is cut short
        too. This connection's own continuous read can close it."""
        start = newest([self.cursor, self.context.lagging_id], self.order)
        bound = self.context.floor
        if start is None or bound is None:
            return None
        past = compare_ids(bound, start, self.order)
        if past < 0 or (past == 0 and not self._before(start)):
            # Nothing stored after the start, and no stored id before it to show that
            # the history reaches it: nothing this connection could prove.
            return None
        # Through the newest stored id (what the dead attempt committed) and one id past
        # it: a late notice it read may be about the ids right after, which a history
        # cut short could take before anyone reads them.
        gap = self._open(
            GapKind.RETRY, start=start, end=None, notice=bound, announced=None, detail=detail
        )
        self.opened.remove(gap.gap_id)  # not this connection's own drop: it may prove it
        return gap

    def _before(self, event_id: str) -> bool:
        """Whether this connection starts before ``event_id`` (its first event can show
        that the history reaches it)."""
        return self.cursor is not None and compare_ids(self.cursor, event_id, self.order) < 0

    def verify(self, detail: str, *, since: str | None = None) -> GapRecord | None:
        """A reconnect of a stream that verifies its reconnects: record what was read
        since the lagging id (up to the newest stored id) as a suspected gap, to be
        re-read and closed on evidence like any gap (:data:`GapKind.SUSPECTED`).

        A suspicion still open from an earlier reconnect already covers the span up to
        its own end: the new one starts there, so suspicions never overlap. With no
        lagging id yet, the span starts where the connection to verify began (``since``,
        the workflow's record of it) or at this connection's cursor, whichever is older
        (a repair's cursor lies before the gaps it re-reads; a live one's is the newest
        stored id). None when there is nothing to suspect (nothing stored after the start).
        """
        start = self.context.lagging_id
        if start is None:
            # Simulation seed 19597293: a connection cut while it repaired, before the
            # stream had a lagging id, lost a late notice with it; the skip it spoke of
            # lay past every gap's end, and nothing suspected it. Seed 615092678: a live
            # reconnect from 44 met 50 first (45..49 skipped, the notice lost); the
            # reconnect after it started at 52, the newest stored id.
            start = self.cursor
            if since is not None and (start is None or compare_ids(since, start, self.order) < 0):
                start = since
        for gap in self.context.open_gaps:
            if gap.is_open and gap.kind == GapKind.SUSPECTED:
                start = newest([start, gap.bound()], self.order)
        bound = self.context.floor
        if start is None or bound is None or compare_ids(bound, start, self.order) <= 0:
            return None
        # Through the newest stored id, which is its end: a skip the lost notice was about
        # lies before an id the connection read after it (the cursor passed it); a skip
        # after the newest stored id is sent again to the next connection anyway.
        gap = self._open(
            GapKind.SUSPECTED, start=start, end=bound, notice=bound, announced=None, detail=detail
        )
        self.opened.remove(gap.gap_id)  # not this connection's own drop: it may prove it
        return gap

    def no_resume(self) -> GapRecord:
        """This connection reconnects with no id to resume from (see :func:`no_resume`):
        record the loss window as lost, of unknown size; the first id it reads, if any,
        is the window's end."""
        gap = self._open(
            GapKind.NO_RESUME,
            start=None,
            end=None,
            notice=None,
            announced=None,
            detail="reconnected with no id to resume from: what the server sent meanwhile is lost",
            lost=True,
        )
        if self._awaiting_end is None and not self._first_seen:
            self._awaiting_end = gap
        return gap

    def jump(self, last_id: str, event_id: str) -> bool:
        """A hole in contiguous ids between ``last_id`` and ``event_id``, mid-connection.

        Returns True when it is a drop signal: it opened a gap over ids that are new or
        part of an open gap. A hole among ids already stored (history the server no
        longer has) is harmless and ignored.
        """
        return self._open_skipped(last_id, event_id, kind=GapKind.ID_GAP, lost=False)

    def passed_floor(self, last_id: str, event_id: str) -> bool:
        """Ids that are not counters: whether the read went from before the newest stored
        id (the floor when this connection started) to past it without reading it,
        through a gap this connection re-reads. That id is stored, so the server skipped
        it, and what else it skipped beside it cannot be told: the repair did not get
        through, and the connection is no longer evidence (True: it must end).

        Simulation seed 1268022177: a repair read 2, 3 and 4, then 11, passing the
        stored 5, 6, 9 and 10, and closed as repaired a gap whose skipped 7 and 8 it
        never read.
        """
        floor, order = self.context.floor, self.order
        if (
            floor is None
            or compare_ids(last_id, floor, order) >= 0
            or compare_ids(event_id, floor, order) <= 0
        ):
            return False
        if not any(self._overlaps(gap, last_id, event_id) for gap in self.gaps.values()):
            return False
        self.clean = False
        return True

    def drop_signal(
        self,
        kind: GapKind,
        *,
        announced: int | None = None,
        detail: str = "",
        read_a_window_ago: str | None = None,
    ) -> GapRecord:
        """A notice or drop event: open a gap now; its end is the next id read.

        Its start is the connection's cursor (or first id), or, on a connection that has
        read for longer than a replay window and :data:`CONFIRM_IDS` ids,
        ``read_a_window_ago``: the id it read that far back (a notice speaks of what the
        server sent lately, and may come late; that holds for a replay of old ids as for
        the live tail; see :mod:`durable_sse.reader.read_marks`).
        """
        self.clean = False
        notice = self.last_id if self.last_id is not None else self.cursor
        start = newest([self.cursor or self.first_id, read_a_window_ago], self.order)
        if start is None:
            start = self.context.lagging_id  # nothing read yet: the last window at most
        fresh = notice is None or self._is_fresh(notice)
        gap = self._open(
            kind,
            start=start,
            end=None,
            notice=notice,
            announced=announced if fresh else None,
            detail=detail,
        )
        self._awaiting_end = gap
        if not self._first_seen and self.cursor is not None and start == self.cursor:
            self._early_notice = gap.gap_id
        return gap

    # -- writing --------------------------------------------------------------------

    def segment(self, event_id: str) -> frozenset[str]:
        """The gaps a row with this id would fill (batches are cut where this changes)."""
        if not self.gaps:
            return frozenset()
        return frozenset(g.gap_id for g in self.gaps.values() if g.contains(event_id, self.order))

    def batch_changes(
        self, *, last_id: str | None, segment: frozenset[str], now: float = 0.0
    ) -> list[GapChange]:
        """The gap changes to commit with the batch just cut (its newest id ``last_id``,
        cut at ``now``, monotonic seconds).

        What a clean connection read proves about the gaps it re-reads (``reread_to``
        moving, a gap closing) is written only once confirmed (:meth:`_proven`): the
        changes ride on a later batch, whose rows commit after the ones they speak of.
        """
        changes, self._queued = self._queued, []
        if last_id is not None and self.clean and self.covered_from is not None:
            self._proofs.append(_Proof(last_id, self._ids_read, now))
        proven = self._proven(now)
        for gap in list(self.gaps.values()):
            change = GapChange(gap.gap_id, contiguous=self.contiguous)
            touched = False
            if gap.gap_id in segment and gap.gap_id not in self.opened:
                change.recovered = touched = True
            if self._covers(gap) and proven is not None:
                if gap.passed_by(proven, self.order):
                    if gap.end_id is None:
                        change.end_id = gap.end_id = proven
                    change.close = touched = True
                    del self.gaps[gap.gap_id]
                elif compare_ids(proven, gap.resume_from(self.order) or proven, self.order) > 0:
                    change.reread_to = gap.reread_to = proven
                    touched = True
            if touched:
                changes.append(change)
        return changes

    def proof_due(self, now: float) -> bool:
        """Whether evidence held back is confirmed by now (cut a batch to write it)."""
        return self.clean and bool(self._proofs) and self._confirmed(self._proofs[0], now)

    def next_proof_at(self) -> float | None:
        """When the oldest evidence held back is confirmed by time alone (None: none)."""
        if not self.clean or not self._proofs:
            return None
        return self._proofs[0].at + self.confirm_seconds

    def _proven(self, now: float) -> str | None:
        """The newest id up to which this connection's continuous read is confirmed.

        With contiguous ids a skip shows at the next id, before the batch holding it is
        cut: the batch is evidence at once. Otherwise a batch is evidence once the
        connection has read :data:`CONFIRM_IDS` more ids or :data:`CONFIRM_SECONDS`
        passed, still clean: a late notice drops everything held back."""
        if not self.clean:
            self._proofs.clear()
            return None
        proven = None
        while self._proofs and (self.contiguous or self._confirmed(self._proofs[0], now)):
            proven = self._proofs.popleft().last_id
        recent = self._newest_read
        if len(recent) > self.confirm_ids:
            # Read confirm_ids ids since: every batch is cut, the rows are in this batch
            # or an earlier one, whatever the batches' sizes.
            by_ids = recent[0]
            proven = newest([proven, by_ids], self.order)
            while self._proofs and compare_ids(self._proofs[0].last_id, by_ids, self.order) <= 0:
                self._proofs.popleft()
        return proven

    def _confirmed(self, proof: _Proof, now: float) -> bool:
        return (
            self._ids_read - proof.ids_read >= self.confirm_ids
            or now - proof.at >= self.confirm_seconds
        )

    def stranded(self) -> bool:
        """Whether this connection has nothing left to re-read but open gaps lie before
        where it started: a suspicion or a retry's span recorded as it began (they start
        at the lagging id, a repair starts at its oldest gap), or a gap another writer
        opened meanwhile. Reading on proves nothing about them; a repair that starts
        before them does (the workflow resumes the repair at once when this one ends).
        """
        if not self._first_seen or not self.clean or self.cursor is None:
            return False
        if any(self._covers(gap) for gap in self.gaps.values()):
            return False  # still re-reading one
        for gap in self.gaps.values():
            resume = gap.resume_from(self.order)
            if gap.gap_id in self.opened or resume is None:
                continue
            if compare_ids(resume, self.cursor, self.order) < 0:
                return True
        return False

    @property
    def ids_read(self) -> int:
        """Ids this connection has read."""
        return self._ids_read

    @property
    def has_queued(self) -> bool:
        return bool(self._queued)

    def pending_changes(self) -> list[GapChange]:
        """Changes not yet given to a batch (the connection is ending: commit them alone),
        with the strikes of a connection that saw no drop signal of its own."""
        changes, self._queued = self._queued, []
        if self.clean:
            changes.extend(self._strikes)
        self._strikes = []
        return changes

    # -- internals ------------------------------------------------------------------

    def _covers(self, gap: GapRecord) -> bool:
        if not self.clean or self.covered_from is None or gap.gap_id in self.opened:
            return False
        resume = gap.resume_from(self.order)
        return resume is not None and compare_ids(resume, self.covered_from, self.order) >= 0

    def _resumes_at(self, cursor: str) -> bool:
        """Whether an open gap this connection may repair resumes at the cursor itself."""
        for gap in self.gaps.values():
            resume = gap.resume_from(self.order)
            if gap.gap_id in self.opened or resume is None:
                continue
            if compare_ids(resume, cursor, self.order) == 0:
                return True
        return False

    def _unread_hole_before(self, cursor: str, witness: str) -> bool:
        """Whether an open gap's hole, not yet re-read, may lie between the cursor and the
        witness (its resume point before the witness, its end after the cursor or unknown): then
        ids the server skipped may lie there, and a history that now starts at the
        witness looks the same as one that reaches the cursor. The witness shows the
        history reaches the cursor only when nothing may be missing before it: a repair
        starts one stored id before its gap for that, so that the gap's resume point is
        the witness.

        Whatever the gap's kind and whoever stored the rows inside it: rows read before
        a notice (the skip it announced may lie before them), rows a repair stored past a
        truncation (simulation seed 2865), rows a dead attempt read before a notice it
        never recorded (a retry's span). Seen in the simulation (seeds 708180304,
        708179435): a repair from the stream's first id (1, nothing stored before it)
        met 3 first, the row stored after the skipped 2, and closed as ``repaired`` a gap
        whose id 2 the history no longer held; a retry from a gap's start took the first
        row its own span held for a witness, with 41..43 gone; seed 20781: a notice before
        any event, at the cursor, its end not yet known, 2..12 gone.
        """
        for gap in self.gaps.values():
            resume = gap.resume_from(self.order)
            if resume is None or compare_ids(resume, witness, self.order) >= 0:
                continue
            # Its end, not its notice: a notice speaks of ids skipped before the next one
            # read, which may lie past the notice (one before any event: all of them).
            end = gap.end_id
            if end is None or compare_ids(end, cursor, self.order) > 0:
                return True
        return False

    def _is_fresh(self, event_id: str) -> bool:
        """Whether the connection reads new ids here (at or past the newest stored)."""
        floor = self.context.floor
        return floor is None or compare_ids(event_id, floor, self.order) >= 0

    def _lose_covered(self, cursor: str, first_id: str, *, definite: bool) -> None:
        """The history seems to start at ``first_id``: gaps this connection set out to
        repair (resume point at or after the cursor) lose what lies before it, when the
        server said so (``definite``) or a repair before this one saw the same; else it
        is one strike, and :attr:`short_history` asks for another repair."""
        for gap in list(self.gaps.values()):
            resume = gap.resume_from(self.order)
            if gap.gap_id in self.opened or resume is None:
                continue
            if compare_ids(resume, cursor, self.order) < 0:
                continue  # not this connection's to repair
            if compare_ids(first_id, resume, self.order) <= 0:
                continue  # the history still reaches it
            if not definite and gap.short_reads + 1 < SHORT_READS_TO_LOSE:
                # A strike, written only if the connection ends with no drop signal of
                # its own (a late notice would explain the skip).
                gap.short_reads += 1
                self.short_history = True
                self._strikes.append(GapChange(gap.gap_id, short_to=first_id))
                continue
            if not definite and not self.clean:
                continue  # a drop announced before the first event explains the skip
            change = GapChange(gap.gap_id, contiguous=self.contiguous)
            if definite:
                change.lost_to = first_id
            else:
                change.short_to = first_id
            gap.reread_to = first_id
            gap.truncated = True
            if gap.passed_by(first_id, self.order):
                change.close = True
                change.end_id = gap.end_id or first_id
                del self.gaps[gap.gap_id]
            self._queued.append(change)

    def _open_skipped(
        self, low: str, high: str, *, kind: GapKind, lost: bool, at_start: bool = False
    ) -> bool:
        """The server skipped the ids strictly between ``low`` and ``high``.

        Ids never stored (past the floor) get a gap of their own; ``lost``: the server
        cannot deliver them, so it is closed at once. Ids inside an open gap this
        connection was re-reading mean the repair did not get through: no new record
        (that gap stays open), but the connection is no longer evidence and must end.
        Ids already stored are harmless. ``at_start``: the skip is the connection's first
        event, which :meth:`_lose_covered` already weighed for the gaps it passes.
        Returns True when the connection must end.
        """
        floor = self.context.floor
        if any(self._holds(gap_id, low, high) for gap_id in self.opened):
            self.clean = False
            return True  # the skip a notice of this connection announced: already recorded
        through_gap = not at_start and any(
            self._overlaps(gap, low, high) for gap in self.gaps.values()
        )
        if through_gap:
            self.clean = False
        new_part = floor is None or compare_ids(high, floor, self.order) > 0
        if not new_part:
            return through_gap
        fresh_low = low if floor is None else newest([low, floor], self.order)
        assert fresh_low is not None
        announced = None
        low_number, high_number = contiguous_number(fresh_low), contiguous_number(high)
        if low_number is not None and high_number is not None:
            announced = high_number - low_number - 1
            if announced <= 0:
                return through_gap
        self._open(
            kind,
            start=fresh_low,
            end=high,
            notice=fresh_low,
            announced=announced,
            detail=f"{announced if announced is not None else 'some'} ids skipped",
            lost=lost,
        )
        if lost:
            return through_gap  # nothing to repair: counted now, the stream reads on
        self.clean = False
        return True

    def _holds(self, gap_id: str, low: str, high: str) -> bool:
        """Whether a gap this connection opened already spans ``(low, high)``."""
        gap = self.gaps.get(gap_id) or self._awaiting_end
        if gap is None or gap.gap_id != gap_id or gap.start_id is None:
            return False
        if compare_ids(gap.start_id, low, self.order) > 0:
            return False
        bound = gap.end_id
        return bound is None or compare_ids(bound, high, self.order) >= 0

    def _overlaps(self, gap: GapRecord, low: str, high: str) -> bool:
        resume, bound = gap.resume_from(self.order), gap.bound()
        if resume is not None and compare_ids(high, resume, self.order) <= 0:
            return False
        return bound is None or compare_ids(low, bound, self.order) < 0

    def _open(
        self,
        kind: GapKind,
        *,
        start: str | None,
        end: str | None,
        notice: str | None,
        announced: int | None,
        detail: str,
        lost: bool = False,
    ) -> GapRecord:
        gap = GapRecord(
            gap_id=self._new_gap_id(),
            stream=self.stream,
            kind=kind.value,
            start_id=start,
            end_id=end,
            notice_id=notice,
            announced=announced,
            seen_at=self._now(),
            detail=detail[:200],
            truncated=lost,
        )
        change = GapChange(gap.gap_id, opened=gap, contiguous=self.contiguous)
        if lost or start is None:
            change.truncated = change.close = True
        else:
            self.gaps[gap.gap_id] = gap
        self.opened.append(gap.gap_id)
        self._queued.append(change)
        return gap
