"""A simulated SSE server: integer ids, a history window, and per-connection faults.

It keeps the ground truth the oracle compares against: every id it generated, the
oldest id its history still holds, and, per connection, which ids it skipped and where
it said so. Everything is driven by one seeded ``random.Random``: no clocks, no I/O.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field


@dataclass
class Profile:
    """How one simulated stream behaves and how the consumer is configured for it."""

    contiguous: bool
    """The consumer declares ``contiguous_ids`` (holes in ids are drop signals)."""
    counts: bool
    """Drop notices say how many events they skipped."""
    mercure: bool
    """The server sends ``Mercure-Last-Event-ID`` when its history does not reach the
    cursor, and the consumer honours it."""
    drop_rate: float
    """Chance, per event sent, that the connection skips a run of events."""
    disconnect_rate: float
    """Chance, per chunk read, that the connection is cut (at any byte)."""
    window: int
    """Events the history holds."""
    late_notices: bool
    """Notices may come a few events after the skip."""
    verify: bool = False
    """The consumer declares ``verify_reconnects``: a notice lost with a connection the
    server cut or the workflow cancelled is no excuse (the next connection re-reads from
    the lagging id)."""


@dataclass
class Notice:
    """A skip on one connection: the ids skipped, and after which sent event it was
    announced (``None``: silent, only contiguous ids reveal it)."""

    skipped: list[int]
    announced_after: int | None
    """Index in the connection's ``sent`` list after which the notice was written."""
    read: bool = False
    """The consumer took the notice (one lost with its connection, or arriving after the
    consumer stopped reading, was not)."""
    one_shot: bool = False
    """A one-shot drop (:meth:`SimServer.inject_drop`), announced once it has skipped all."""


@dataclass
class ScriptedDrop:
    """A drop a scripted schedule makes one connection take."""

    connection: int | None
    """Index of the connection (in connect order); None: the first that gets there."""
    first: int
    last: int
    notice_after: int | None
    """Announce after sending this id (None: before the skip)."""


@dataclass
class SimConnection:
    """One connection's byte stream."""

    server: SimServer
    next_id: int
    rng: random.Random
    header: str | None = None
    cursorless: bool = False
    index: int = 0
    """Its place in the server's connect order."""
    sent: list[int] = field(default_factory=list)
    notices: list[Notice] = field(default_factory=list)
    buffer: bytearray = field(default_factory=bytearray)
    closed: bool = False
    announced: list[Notice] = field(default_factory=list)
    """Notices in the order they were written."""
    taken: int = 0
    cut: bool = False
    """The server cut it while it was the workflow's connection (not a presumed-dead
    attempt's): what it skipped with a notice still to come is lost with the notice."""
    ended: bool = False
    """It ended mid-read while it was the workflow's connection: cut, or cancelled by the
    workflow (a repair due, a signal). A notice still to come is lost with it either way
    (a rotation, the reader's own end, is not verified)."""
    verified: tuple[str | None, str | None] | None = None
    """``(lagging id, floor)`` as the next connection started, when ``ended``: the span a
    verification re-reads (``verify_reconnects``)."""
    behind: bool = False
    """Its cursor was older than the newest stored id (a replay), as the reader saw it."""
    cut_due: bool = False
    """It sent the id the script cuts it after (:attr:`SimServer.cut_after`): the reader's
    next step loses the connection, with what was written up to there."""
    _late: list[tuple[int, Notice]] = field(default_factory=list)
    _one_shot: Notice | None = None
    _one_shot_left: int = 0

    def pump(self) -> None:
        """Write what the server has generated since the last pump."""
        server = self.server
        if server.one_shots:
            # Like the real source's one-shots: the next connection to look takes them.
            self._one_shot_left += sum(server.one_shots)
            server.one_shots.clear()
        # A connection that is already streaming keeps its place even when the history
        # drops ids it has yet to send: truncation only shows to the next connection.
        while self.next_id <= server.newest and len(self.buffer) < 4096 and not self.cut_due:
            if self._one_shot_left:
                self._one_shot_skip()
                continue
            scripted = server.scripted_drop(self) if server.script else None
            if scripted is not None:
                if scripted.last > server.newest:
                    break  # skip the whole range at once, when it exists
                self._scripted_skip(scripted)
                if scripted.connection is None:
                    server.script.remove(scripted)  # once, on whichever connection got there
                continue
            if self.rng.random() < server.profile.drop_rate:
                self._skip()
                continue
            self._send(self.next_id)
            if server.cut_after.get(self.index) == self.next_id:
                self.cut_due = True
            self.next_id += 1
        if self.rng.random() < 0.05:
            self._write(b": ping\n\n")

    def read(self, size: int) -> bytes:
        chunk = bytes(self.buffer[:size])
        del self.buffer[:size]
        return chunk

    def notice_taken(self) -> None:
        """The consumer took the next drop notice of this connection (in write order)."""
        if self.taken < len(self.announced):
            notice = self.announced[self.taken]
            self.taken += 1
            notice.read = True
            self.server.delivered.update(notice.skipped)

    def _write(self, data: bytes) -> None:
        self.buffer += data

    def _send(self, event_id: int) -> None:
        self._write(b"id: %d\ndata: d%d\n\n" % (event_id, event_id))
        self.sent.append(event_id)
        for remaining, notice in list(self._late):
            if remaining <= 1:
                self._late.remove((remaining, notice))
                self._announce(notice)
            else:
                self._late[self._late.index((remaining, notice))] = (remaining - 1, notice)

    def _scripted_skip(self, drop: ScriptedDrop) -> None:
        skipped = list(range(drop.first, min(drop.last, self.server.newest) + 1))
        self.next_id = skipped[-1] + 1
        notice = Notice(skipped=skipped, announced_after=None)
        self.notices.append(notice)
        if drop.notice_after is None or drop.notice_after <= skipped[-1]:
            self._announce(notice)
        else:
            self._late.append((drop.notice_after - skipped[-1], notice))

    def _one_shot_skip(self) -> None:
        """Skip what the one-shot drop still owes, as far as ids exist; announce it (with
        its whole size) once it is complete, before the next event, as the real source
        does. A connection that has sent nothing yet announces before its first event."""
        last = min(self.next_id + self._one_shot_left - 1, self.server.newest)
        skipped = list(range(self.next_id, last + 1))
        if self._one_shot is None:
            self._one_shot = Notice(skipped=[], announced_after=None, one_shot=True)
            self.notices.append(self._one_shot)
        self._one_shot.skipped.extend(skipped)
        self._one_shot_left -= len(skipped)
        self.next_id = last + 1
        if not self._one_shot_left:
            self._announce(self._one_shot)
            self._one_shot = None

    def end_one_shot(self) -> None:
        """The faults stop: a one-shot drop still skipping ends here, announced with what
        it skipped (else a drop larger than what the server still generates would eat the
        quiet phase, and a stream with nothing stored would never catch up)."""
        self._one_shot_left = 0
        if self._one_shot is not None:
            self._announce(self._one_shot)
            self._one_shot = None

    def _skip(self) -> None:
        server, rng = self.server, self.rng
        size = rng.randint(1, 6)
        last = min(self.next_id + size - 1, server.newest)
        skipped = list(range(self.next_id, last + 1))
        self.next_id = last + 1
        mode = rng.choice(["before", "after", "after", "silent"])
        if mode == "silent" and not server.profile.contiguous:
            mode = "after"
        notice = Notice(skipped=skipped, announced_after=None)
        self.notices.append(notice)
        if mode == "silent":
            pass  # the next id read reveals it (contiguous ids only)
        elif mode == "before":
            self._announce(notice)
        elif mode == "after":
            delay = rng.randint(0, 3) if server.profile.late_notices else 0
            if delay == 0:
                self._announce(notice)
            else:
                self._late.append((delay, notice))

    def _announce(self, notice: Notice) -> None:
        notice.announced_after = len(self.sent) - 1
        if self.server.profile.counts:
            text = b": dropped %d events (slow consumer)\n" % len(notice.skipped)
        else:
            text = b": dropping events\n"
        self._write(text)
        self.announced.append(notice)


class SimServer:
    """The stream's history and its ground truth."""

    def __init__(self, rng: random.Random, profile: Profile) -> None:
        self.rng = rng
        self.profile = profile
        self.newest = 0
        self.history_start = 1
        self.connections: list[SimConnection] = []
        self.script: list[ScriptedDrop] = []
        self.cut_after: dict[int, int] = {}
        """Scripted cuts: connection index -> the id it is cut right after sending."""
        self.one_shots: list[int] = []
        """Drops of this many events that the next connection to write takes."""
        self.delivered: set[int] = set()
        """Ids whose drop notice the consumer took: it knows they were skipped. An event
        read but then skipped by the next connection without a word cannot be told apart
        from one never sent, unless the ids are contiguous."""

    def scripted_drop(self, connection: SimConnection) -> ScriptedDrop | None:
        for drop in self.script:
            if drop.first != connection.next_id:
                continue
            if drop.connection is None or drop.connection == connection.index:
                return drop
        return None

    def inject_drop(self, count: int) -> None:
        """A one-shot drop (the real source's ``inject(action="drop")``): the next
        connection to write skips ``count`` events, then says so."""
        self.one_shots.append(count)

    def clear_one_shots(self) -> None:
        """Faults off (as the chaos harness's ``inject(action="clear")``): no one-shot
        drop is pending or skipping any longer."""
        self.one_shots.clear()
        for connection in self.connections:
            connection.end_one_shot()

    def generate(self, count: int) -> None:
        self.newest += count
        self.history_start = max(self.history_start, self.newest - self.profile.window + 1)

    def truncate(self, count: int) -> None:
        """The server loses the oldest ``count`` events of its history (a fault)."""
        self.history_start = min(self.history_start + count, self.newest + 1)

    def connect(self, cursor: str | None, rng: random.Random) -> SimConnection:
        if cursor is None:
            start = self.newest + 1
        else:
            start = int(cursor) + 1
        header = None
        if cursor is not None and start < self.history_start:
            start = self.history_start
            if self.profile.mercure:
                header = "earliest"
        elif cursor is not None and self.profile.mercure:
            header = cursor
        connection = SimConnection(
            server=self,
            next_id=start,
            rng=rng,
            header=header,
            cursorless=cursor is None,
            index=len(self.connections),
        )
        self.connections.append(connection)
        return connection
