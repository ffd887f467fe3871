"""What a consumer of the log sees: items, batches, positions, where a group starts, and
the group's settings. Plain values, no driver: the store modules build them.

A stream's *order* is its rows' ``seq`` (arrival order; the writer makes a stream's rows
visible in that order, see ``Writer._order_and_notify``) with the gap markers in
between: a ``Gap`` right after the newest event stored when the gap was recorded, a
``GapClosed`` right after the newest event stored when it closed. A ``Truncated`` comes
first in a batch when retention deleted rows the group had not read.

Items are plain ``slots`` dataclasses, not frozen: a consumer builds one per row, and a
frozen dataclass costs twice as much to build (``EventRecord`` says the same). Treat them
as read-only all the same.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Literal

GROUP_NAME_PATTERN = re.compile(r"[A-Za-z0-9_.-]{1,64}\Z")
MAX_BATCH_SIZE = 10_000


@dataclass(slots=True)
class Event:
    """One stored event, its data exact (NUL included).

    ``(stream, seq)`` identifies it for good: a handler that writes outside the
    consumer's own transaction (at least once) makes its effect idempotent on it.
    """

    stream: str
    seq: int
    event_id: str
    """The id in force ("" when the stream sent none)."""
    event_type: str
    data: str
    received_at: datetime
    event_ord: int | None = None
    """0 for the event carrying its id, 1, 2, … for id-less events after it."""

    @property
    def key(self) -> tuple[str, int]:
        """``(stream, seq)``: what an idempotent handler deduplicates on."""
        return (self.stream, self.seq)


@dataclass(slots=True)
class Gap:
    """The server skipped events here (a drop notice, a hole in contiguous ids, …).

    Comes after every event stored before the gap was recorded. A repair may bring
    the missing events later, as new events (new ``seq``); ``GapClosed`` tells how it
    ended.
    """

    stream: str
    gap_id: str
    kind: str
    """What revealed it: ``comment``, ``event_type``, ``mercure_header``, ``id_gap``,
    ``retry``, ``migrated``, ``no_resume``, ``suspected``."""
    start_id: str | None
    """The hole lies strictly after this id."""
    end_id: str | None
    """…and strictly before this one (None: not known when it was read)."""
    announced: int | None
    """Events the server said it skipped, when it said."""
    seen_at: datetime | None
    detail: str
    after_seq: int
    """The newest ``seq`` of the stream when the gap was recorded."""
    mark: int


@dataclass(slots=True)
class GapClosed:
    """A gap ended: ``repaired`` (every missing event was re-read: they came as events
    after the ``Gap``) or ``unrecoverable`` (``missing`` events are lost for good; None:
    nobody can know how many)."""

    stream: str
    gap_id: str
    state: str
    recovered: int
    """Events the repairs stored inside the gap."""
    missing: int | None
    closed_at: datetime | None
    after_seq: int
    mark: int

    @property
    def lost(self) -> bool:
        """Whether events are lost for good (an unknown count counts as lost)."""
        return self.state != "repaired"


@dataclass(slots=True)
class Truncated:
    """Retention deleted rows of this stream that the group had not read: those with a
    ``seq`` after ``after_seq`` and up to ``through_seq`` that did not reach it (the
    rows in that range that still arrive were kept by the event log's own fence)."""

    stream: str
    after_seq: int
    through_seq: int


Item = Event | Gap | GapClosed | Truncated


@dataclass(frozen=True, order=True, slots=True)
class Position:
    """Where a group is in a stream: every event up to ``seq`` and every gap marker up to
    ``mark`` is consumed, and truncations up to ``truncated`` are reported.

    Two counters, not one: a gap can be recorded after the newest event was consumed
    (by a transaction that stores no row), so its marker needs a place of its own.
    """

    seq: int = 0
    mark: int = 0
    truncated: int = 0


class StartKind(StrEnum):
    EARLIEST = "earliest"
    LATEST = "latest"
    SEQ = "seq"
    TIME = "time"


@dataclass(frozen=True)
class Start:
    """Where a group starts in a stream it has no position in yet.

    ``earliest``: the oldest row kept (rows retention deleted before the group existed
    are no loss of the group's); ``latest``: only what arrives from now on; a ``seq``:
    every row after it; a time: every row received at or after it (arrival order is
    time order to within a batch).
    """

    kind: StartKind = StartKind.EARLIEST
    seq: int | None = None
    time: datetime | None = None

    @classmethod
    def earliest(cls) -> Start:
        return cls(StartKind.EARLIEST)

    @classmethod
    def latest(cls) -> Start:
        return cls(StartKind.LATEST)

    @classmethod
    def after_seq(cls, seq: int) -> Start:
        if seq < 0:
            raise ValueError(f"a start seq is not negative, got {seq}")
        return cls(StartKind.SEQ, seq=seq)

    @classmethod
    def at_time(cls, moment: datetime) -> Start:
        if moment.tzinfo is None or moment.utcoffset() is None:
            raise ValueError("a start time needs a time zone (Z or an offset)")
        return cls(StartKind.TIME, time=moment.astimezone(UTC))

    @classmethod
    def parse(cls, text: str) -> Start:
        """``earliest``, ``latest``, a seq (digits) or an ISO 8601 time with a zone."""
        value = text.strip()
        if value in (StartKind.EARLIEST, StartKind.LATEST):
            return cls(StartKind(value))
        if value.isdigit():
            return cls.after_seq(int(value))
        try:
            moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            raise ValueError(
                f"{text!r}: expected earliest, latest, a seq or an ISO 8601 time with a zone"
            ) from None
        return cls.at_time(moment)

    def describe(self) -> str:
        if self.kind is StartKind.SEQ:
            return str(self.seq)
        if self.kind is StartKind.TIME:
            assert self.time is not None
            return self.time.isoformat().replace("+00:00", "Z")
        return self.kind.value


class OnPoison(StrEnum):
    """What happens to an item the handler keeps failing on (alone, ``max_attempts``
    times after its batch failed ``max_attempts`` times)."""

    PARK = "park"
    """The group stops on that stream (the others go on) until an operator resets it:
    nothing is skipped, the reason is in ``durable-sse consumers`` and a metric."""
    DEAD_LETTER = "dead_letter"
    """The item moves to ``sse_dead_letters`` with its error, and the stream goes on."""


class OnMaxHold(StrEnum):
    """What a group that holds retention meets when rows it had not read were deleted
    all the same, being older than its ``max_hold``."""

    TRUNCATE = "truncate"
    """A ``Truncated`` item, and the group goes on."""
    ERROR = "error"
    """The group parks on that stream, with the truncation as the reason."""


@dataclass(frozen=True)
class Group:
    """A consumer group: a name, the streams it consumes and how.

    Every process that runs the same group shares its streams: a stream is the unit of
    order, one process consumes it at a time, and a crashed process's streams are taken
    over once their lease expires.
    """

    name: str
    streams: tuple[str, ...] | None = None
    """The streams consumed (None: every stream in the log, new ones as they appear)."""
    start: Start = field(default_factory=Start.earliest)
    """Where the group starts in a stream it has no position in yet."""
    batch_size: int = 500
    """Items per batch at most (one transaction each, exactly once)."""
    max_attempts: int = 5
    """Deliveries of a batch before it is narrowed to one item at a time, and of one
    item before it is poison (see :class:`OnPoison`)."""
    on_poison: OnPoison = OnPoison.PARK
    hold_retention: bool = False
    """Retention keeps the rows this group has not consumed (up to ``max_hold``)."""
    max_hold: float | None = None
    """Seconds: rows older than this go even if unread (None: kept while needed)."""
    on_max_hold: OnMaxHold = OnMaxHold.TRUNCATE
    lease: float = 10.0
    """Seconds a process owns a stream without renewing it; then another may take it
    over (and an acknowledgement of the old owner is refused)."""

    def __post_init__(self) -> None:
        if not GROUP_NAME_PATTERN.match(self.name):
            raise ValueError(f"group name {self.name!r}: expected [A-Za-z0-9_.-]{{1,64}}")
        if self.streams is not None:
            if isinstance(self.streams, str):
                raise ValueError("streams: a list of stream names, not one string")
            object.__setattr__(self, "streams", tuple(dict.fromkeys(self.streams)))
        if not 1 <= self.batch_size <= MAX_BATCH_SIZE:
            raise ValueError(f"batch_size: expected 1..{MAX_BATCH_SIZE}, got {self.batch_size}")
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts: expected at least 1, got {self.max_attempts}")
        if self.max_hold is not None and self.max_hold <= 0:
            raise ValueError(f"max_hold: expected seconds > 0, got {self.max_hold}")
        if not self.lease > 0:
            raise ValueError(f"lease: expected seconds > 0, got {self.lease}")
        object.__setattr__(self, "on_poison", OnPoison(self.on_poison))
        object.__setattr__(self, "on_max_hold", OnMaxHold(self.on_max_hold))


@dataclass
class Batch:
    """Consecutive items of one stream, in order.

    Exactly once: given to ``handler(tx, batch)`` inside the transaction that moves the
    group's position past it. At least once: yielded by ``Consumer.batches()``; call
    :meth:`ack` once it is handled (or :meth:`nack` to have it delivered again).
    """

    group: str
    stream: str
    items: list[Item]
    start: Position
    """The position before the batch."""
    end: Position
    """The position once the batch is consumed."""
    attempt: int = 1
    """Deliveries of this batch so far, this one included (> 1: a redelivery)."""
    _settle: Callable[[Batch, BaseException | None], Awaitable[None]] | None = field(
        default=None, repr=False
    )
    settled: Literal["acked", "nacked"] | None = None

    @property
    def events(self) -> list[Event]:
        """The batch's events (without gap markers and truncations)."""
        return [item for item in self.items if isinstance(item, Event)]

    async def ack(self) -> None:
        """At least once: the batch is handled; move the group's position past it.

        Raises :class:`~durable_sse.errors.LeaseLostError` when this process no longer
        owns the stream (its lease expired, another process took it over): the batch is
        delivered again, there or here, and nothing moves.
        """
        if self._settle is None:
            raise RuntimeError("ack() is for at-least-once batches (Consumer.batches())")
        await self._settle(self, None)

    async def nack(self, error: BaseException | str = "nacked") -> None:
        """At least once: the batch failed; deliver it again (after a short backoff).
        Counts as an attempt (see ``Group.max_attempts``)."""
        if self._settle is None:
            raise RuntimeError("nack() is for at-least-once batches (Consumer.batches())")
        await self._settle(self, error if isinstance(error, BaseException) else _Nack(error))


class _Nack(Exception):
    """A nack given as text."""


def describe_item(item: Item) -> str:
    """One line naming an item (for a dead letter or a parked stream's reason)."""
    if isinstance(item, Event):
        return f"event seq {item.seq} (id {item.event_id!r})"
    if isinstance(item, Gap):
        return f"gap {item.gap_id} after seq {item.after_seq}"
    if isinstance(item, GapClosed):
        return f"closing of gap {item.gap_id} after seq {item.after_seq}"
    return f"truncation after seq {item.after_seq} through {item.through_seq}"


def item_json(item: Item) -> dict[str, object]:
    """An item as JSON-ready values (``durable-sse tail`` prints one per line): an event
    as ``stream, seq, id, event, data, received_at``; a gap marker, a closing or a
    truncation under a key of its own, so a reader tells them apart by key."""
    if isinstance(item, Event):
        return {
            "stream": item.stream,
            "seq": item.seq,
            "id": item.event_id,
            "event": item.event_type,
            "data": item.data,
            "received_at": _iso(item.received_at),
        }
    if isinstance(item, Gap):
        return {
            "stream": item.stream,
            "after_seq": item.after_seq,
            "gap": {
                "id": item.gap_id,
                "kind": item.kind,
                "start_id": item.start_id,
                "end_id": item.end_id,
                "announced": item.announced,
                "seen_at": _iso(item.seen_at),
            },
        }
    if isinstance(item, GapClosed):
        return {
            "stream": item.stream,
            "after_seq": item.after_seq,
            "gap_closed": {
                "id": item.gap_id,
                "state": item.state,
                "recovered": item.recovered,
                "missing": item.missing,
                "closed_at": _iso(item.closed_at),
            },
        }
    return {
        "stream": item.stream,
        "truncated": {"after_seq": item.after_seq, "through_seq": item.through_seq},
    }


def _iso(moment: datetime | None) -> str | None:
    if moment is None:
        return None
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")
