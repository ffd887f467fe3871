"""A consumer's transactions on its group's position rows, one method each.

Every method is synchronous and opens its own transaction: the consumer runs it on a
database thread (:class:`~durable_sse.consume.database.ConsumerDatabase`). The rules of
the rows (leases, epochs, attempts, parking) are :mod:`.positions`'; this module decides
which of them one step of a delivery needs, and in which transaction.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from durable_sse.consume import positions
from durable_sse.consume.handlers import HandlerCancelled, HandlerRefused
from durable_sse.consume.items import Read, all_streams, read_items
from durable_sse.consume.metrics import ConsumerMetrics
from durable_sse.consume.model import (
    Batch,
    Group,
    OnMaxHold,
    OnPoison,
    Position,
    Truncated,
    describe_item,
)
from durable_sse.consume.positions import Claim, Refused
from durable_sse.consume.schema import create_consumer_tables
from durable_sse.consume.status import lag_events

logger = logging.getLogger(__name__)

InTransaction = Callable[[Connection, Batch], None]
"""What :meth:`StreamTransactions.deliver` runs in the batch's transaction (the user's
handler, wrapped by :class:`~durable_sse.consume.handlers.HandlerCall`)."""


class HandlerError(Exception):
    """The handler raised (wraps its exception; the batch rolled back)."""


class LeaseMoved(Exception):
    """The lease moved to another process while this one delivered: roll back."""


@dataclass
class Delivered:
    """What one exactly-once delivery did."""

    batch: Batch | None = None
    next_claim: Claim | None = None
    """This process keeps the stream (the next delivery is already counted)."""
    full: bool = False
    """The stream has more at once."""


def keeps(group: Group, claim: Claim) -> bool:
    """Whether to keep a drained stream (its next delivery then needs no claim) or give
    it back so that every process of the group gets its share: a stream is kept for half
    a lease at most, then goes back to whoever comes first."""
    return time.monotonic() - claim.since < group.lease / 2


def next_claim(claim: Claim, read: Read, narrow_items: int, lease_deadline: float) -> Claim:
    """The claim of the delivery after ``read``, counted by the transaction that moved
    past it (this process keeps the stream). ``narrow_items``: the items that were still
    to deliver one at a time before ``read``; ``lease_deadline``: the lease that
    transaction renewed (see ``Claim.lease_deadline``)."""
    narrow = max(narrow_items - len(read.items), 0) if narrow_items else 0
    return Claim(
        claim.stream,
        claim.epoch,
        read.end,
        1,
        narrow,
        since=claim.since,
        lease_deadline=lease_deadline,
    )


def lease_deadline(group: Group) -> float:
    """The local end of a lease set by a transaction that starts after this call: the
    row's ``lease_until`` is taken later, so the lease lasts at least until then."""
    return time.monotonic() + group.lease


def make_batch(group: Group, stream: str, start: Position, read: Read, attempt: int) -> Batch:
    return Batch(
        group=group.name,
        stream=stream,
        items=read.items,
        start=start,
        end=read.end,
        attempt=attempt,
    )


class StreamTransactions:
    """The transactions of one consumer (``owner``) of ``group``."""

    def __init__(
        self, engine: sa.Engine, group: Group, owner: str, metrics: ConsumerMetrics
    ) -> None:
        self._engine = engine
        self.group = group
        self.owner = owner
        self.metrics = metrics

    def register(self) -> None:
        """Create the consumer tables when missing, then the group's row and its streams'."""
        with self._engine.begin() as connection:
            create_consumer_tables(connection)
        with self._engine.begin() as connection:
            now = _now()
            positions.register_group(connection, self.group, now)
            if self.group.streams:
                positions.ensure_positions(connection, self.group, list(self.group.streams), now)

    def all_streams(self) -> list[str]:
        with self._engine.connect() as connection:
            return all_streams(connection)

    # -- claims -----------------------------------------------------------------------

    def claim(self, stream: str, new_streams: bool) -> Claim | Refused:
        """Claim the stream and count the delivery about to start (committed first: the
        count must survive a crash). ``new_streams``: the group discovers its streams, so
        a stream without a position row gets one."""
        deadline = lease_deadline(self.group)
        with self._engine.connect() as connection:
            with connection.begin():
                if connection.dialect.name == "postgresql":
                    # The count must survive a crash of this process, not of the
                    # database server: an asynchronous commit is enough, and costs no
                    # flush.
                    connection.exec_driver_sql("SET LOCAL synchronous_commit = off")
                if new_streams and positions.read_row(connection, self.group.name, stream) is None:
                    positions.ensure_positions(connection, self.group, [stream], _now())
                claimed = positions.claim(connection, self.group, stream, self.owner, _now())
        if isinstance(claimed, Claim):
            return dataclasses.replace(claimed, lease_deadline=deadline)
        return claimed

    def renew(self, stream: str, claim: Claim) -> Claim | None:
        """Renew the lease of a stream kept since its last delivery; None when it is not
        this process's any more (another process took it over, or it was reset)."""
        deadline = lease_deadline(self.group)
        with self._engine.begin() as connection:
            renewed = positions.renew(
                connection, self.group, stream, owner=self.owner, epoch=claim.epoch, now=_now()
            )
        return dataclasses.replace(claim, lease_deadline=deadline) if renewed else None

    def release(self, stream: str, claim: Claim) -> None:
        with self._engine.begin() as connection:
            positions.release(
                connection, self.group.name, stream, owner=self.owner, epoch=claim.epoch
            )

    def release_all(self, held: list[tuple[str, Claim]]) -> None:
        with self._engine.begin() as connection:
            for stream, claim in held:
                positions.release(
                    connection, self.group.name, stream, owner=self.owner, epoch=claim.epoch
                )

    # -- exactly once -----------------------------------------------------------------

    def deliver(self, stream: str, claim: Claim, handler: InTransaction) -> Delivered:
        """Read the next batch with the position row locked, run ``handler(tx, batch)``
        in that transaction, and move the position past the batch in it too.

        Raises:
            HandlerError: the handler raised (the transaction rolled back).
            HandlerRefused, HandlerCancelled: see :mod:`.handlers` (rolled back).
            LeaseMoved: another process holds the stream now (rolled back).
        """
        group, deadline, now = self.group, lease_deadline(self.group), _now()
        with self._engine.connect() as connection, connection.begin():
            row = positions.lock_row(connection, group.name, stream)
            if row is None:
                raise LeaseMoved  # a reset holds it
            if row.owner != self.owner or row.epoch != claim.epoch or row.parked_at:
                raise LeaseMoved
            limit = 1 if row.narrow_items else group.batch_size
            read = read_items(connection, stream, row.position, limit=limit)
            if not read.items:
                if keeps(group, claim):
                    return Delivered(next_claim=claim)
                positions.release(
                    connection, group.name, stream, owner=self.owner, epoch=claim.epoch
                )
                return Delivered()
            if self._truncation_parks(connection, stream, claim, read, now):
                return Delivered()
            batch = make_batch(group, stream, row.position, read, claim.attempts)
            self.metrics.record_handler_latency(batch)
            try:
                handler(connection, batch)
            except (HandlerRefused, HandlerCancelled):
                raise
            except Exception as error:
                raise HandlerError(str(error)) from error
            keep = read.full or keeps(group, claim)
            if not positions.move(
                connection,
                group,
                stream,
                owner=self.owner,
                epoch=claim.epoch,
                end=read.end,
                items=len(read.items),
                keep=keep,
                narrow_items=row.narrow_items,
                now=now,
                newest_received_at=read.newest_received_at,
            ):
                raise LeaseMoved
        following = next_claim(claim, read, row.narrow_items, deadline) if keep else None
        return Delivered(batch=batch, next_claim=following, full=read.full)

    # -- at least once ----------------------------------------------------------------

    def read(self, stream: str, position: Position, limit: int) -> Read:
        with self._engine.connect() as connection:
            return read_items(connection, stream, position, limit=limit)

    def ack(self, stream: str, claim: Claim, read: Read, keep: bool) -> bool:
        """Move past an acknowledged batch, under this process's lease; False: the lease
        is not this process's any more."""
        with self._engine.begin() as connection:
            return positions.move(
                connection,
                self.group,
                stream,
                owner=self.owner,
                epoch=claim.epoch,
                end=read.end,
                items=len(read.items),
                keep=keep,
                narrow_items=claim.narrow_items,
                now=_now(),
                newest_received_at=read.newest_received_at,
                check_lease=True,
            )

    # -- failures, poison, truncation -------------------------------------------------

    def record_failure(self, stream: str, claim: Claim, text: str) -> None:
        with self._engine.begin() as connection:
            positions.record_failure(
                connection, self.group.name, stream, owner=self.owner, epoch=claim.epoch, error=text
            )

    def poison(self, stream: str, claim: Claim) -> bool:
        """Park the stream on its poison item, or move the item to the dead letters; True
        when the stream goes on (dead letter)."""
        group, now = self.group, _now()
        with self._engine.connect() as connection, connection.begin():
            row = positions.lock_row(connection, group.name, stream)
            if row is None or row.owner != self.owner or row.epoch != claim.epoch:
                return False
            read = read_items(connection, stream, row.position, limit=1)
            if not read.items:
                positions.release(
                    connection, group.name, stream, owner=self.owner, epoch=claim.epoch
                )
                return False
            item = read.items[0]
            tries = claim.attempts - 1
            error = positions.failure_text(claim)
            if group.on_poison is OnPoison.DEAD_LETTER:
                positions.dead_letter(
                    connection, group.name, stream, item, error=error, attempts=tries, now=now
                )
                positions.move(
                    connection,
                    group,
                    stream,
                    owner=self.owner,
                    epoch=claim.epoch,
                    end=read.end,
                    items=1,
                    keep=False,
                    narrow_items=row.narrow_items,
                    now=now,
                    newest_received_at=read.newest_received_at,
                )
                outcome = True
            else:
                reason = f"{describe_item(item)} failed {tries} times alone: {error}"
                positions.park(
                    connection, group.name, stream, epoch=claim.epoch, reason=reason, now=now
                )
                outcome = False
        if outcome:
            self.metrics.dead_letters.add(1, {"stream": stream})
            logger.error(
                "consumer %s, stream %s: %s moved to the dead letters after %d attempts alone: %s",
                group.name,
                stream,
                describe_item(item),
                tries,
                error.splitlines()[0],
            )
        else:
            self.metrics.parked.set(1, {"stream": stream})
            logger.error(
                "consumer %s, stream %s: parked on %s after %d attempts alone (nothing after it "
                "is delivered until `durable-sse consumers reset`): %s",
                group.name,
                stream,
                describe_item(item),
                tries,
                error.splitlines()[0],
            )
        return outcome

    def truncation_parks(self, stream: str, claim: Claim, read: Read) -> bool:
        """Whether the group parks on the truncation that ``read`` starts with (then it
        has, in a transaction of its own)."""
        if self.group.on_max_hold is not OnMaxHold.ERROR:
            return False
        with self._engine.begin() as connection:
            return self._truncation_parks(connection, stream, claim, read, _now())

    def _truncation_parks(
        self, connection: Connection, stream: str, claim: Claim, read: Read, now: datetime
    ) -> bool:
        """A group that chose ``on_max_hold = error`` parks where rows it had not read were
        deleted, rather than go on past them."""
        first = read.items[0]
        if not isinstance(first, Truncated) or self.group.on_max_hold is not OnMaxHold.ERROR:
            return False
        reason = (
            f"retention deleted rows this group had not read (after seq {first.after_seq} "
            f"through {first.through_seq}); reset the position to go on"
        )
        positions.park(
            connection, self.group.name, stream, epoch=claim.epoch, reason=reason, now=now
        )
        self.metrics.parked.set(1, {"stream": stream})
        logger.error("consumer %s, stream %s: parked: %s", self.group.name, stream, reason)
        return True

    # -- metrics ----------------------------------------------------------------------

    def lags(self, streams: set[str]) -> dict[str, int]:
        """Events not consumed yet, of each of ``streams`` the group has a position in."""
        with self._engine.connect() as connection:
            rows = positions.list_rows(connection, self.group.name)
            return {
                row.stream: lag_events(connection, row.stream, row.position.seq)
                for row in rows
                if row.stream in streams
            }


def _now() -> datetime:
    return datetime.now(UTC)
