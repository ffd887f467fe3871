"""``durable-sse tail``: a stream's stored events as JSON lines, like tail; -f follows."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import select
import sys
from datetime import UTC, datetime

import sqlalchemy as sa

from durable_sse.consume import positions
from durable_sse.consume.follow import follow
from durable_sse.consume.items import Read, start_position
from durable_sse.consume.model import Group, Position, Start, item_json
from durable_sse.consume.positions import Claim, default_owner
from durable_sse.consume.status import load_group
from durable_sse.errors import ConfigError, ConsumerError
from durable_sse.log.schema import events_table


def parse_since(text: str) -> datetime:
    try:
        moment = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise ConfigError(
            f"--since {text!r}: expected ISO 8601, e.g. 2026-05-01T12:00:00Z"
        ) from None
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise ConfigError(f"--since {text!r}: no time zone; add Z or an offset (+02:00)")
    return moment


async def tail(
    args: argparse.Namespace, url: str, engine: sa.Engine, since: datetime | None
) -> int:
    """Print JSON lines; exit 0 when done (or the reader closed the pipe)."""
    position = await asyncio.to_thread(_tail_start, engine, args, since)
    committer = None
    if args.commit:
        committer = _TailCommitter(engine, args.group, args.stream)
        await asyncio.to_thread(committer.claim)
    closed = asyncio.create_task(_stdout_closed()) if args.follow else None
    printing = asyncio.create_task(_print_reads(args, url, engine, position, committer))
    try:
        waiting = {printing} if closed is None else {printing, closed}
        await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
        if printing.done():
            return printing.result()
        printing.cancel()  # the reader went away while tail waited for events
        with contextlib.suppress(asyncio.CancelledError):
            await printing
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    finally:
        for task in (printing, closed):
            if task is not None:
                task.cancel()
        if committer is not None:
            await asyncio.to_thread(committer.release)


async def _stdout_closed() -> None:
    """Return once nobody reads stdout any more (a pipe whose reader exited): ``tail -f
    | head -1`` must end even when no event comes to fail a write."""
    if not hasattr(select, "poll"):
        await asyncio.Event().wait()
    poller = select.poll()
    poller.register(sys.stdout.fileno(), 0)  # errors and hang-ups are always reported
    while not any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0)):
        await asyncio.sleep(0.2)


async def _print_reads(
    args: argparse.Namespace,
    url: str,
    engine: sa.Engine,
    position: Position,
    committer: _TailCommitter | None,
) -> int:
    async for read in follow(engine, url, args.stream, position, forever=args.follow):
        lines = "".join(
            json.dumps(item_json(item), ensure_ascii=False) + "\n" for item in read.items
        )
        try:
            sys.stdout.write(lines)
            sys.stdout.flush()
        except BrokenPipeError:
            # `| head -1`: the reader has what it wanted. Nothing more is written
            # (not even at exit), nothing is committed past what it read.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 0
        if committer is not None:
            await asyncio.to_thread(committer.commit, read)
    return 0


def _tail_start(engine: sa.Engine, args: argparse.Namespace, since: datetime | None) -> Position:
    with engine.connect() as connection:
        if args.group:
            row = positions.read_row(connection, args.group, args.stream)
            if row is None:
                raise ConsumerError(
                    f"consumer group {args.group!r} has no position in stream {args.stream!r}"
                )
            return row.position
        if since is not None:
            start = Start.at_time(since)
        elif args.from_seq is not None:
            start = Start.after_seq(max(args.from_seq - 1, 0))
        else:
            events = events_table
            before = connection.execute(
                sa.select(events.c.seq)
                .where(events.c.stream == args.stream)
                .order_by(events.c.seq.desc())
                .offset(args.lines)
                .limit(1)
            ).scalar_one_or_none()
            start = Start.after_seq(int(before or 0))
        return start_position(connection, args.stream, start)


class _TailCommitter:
    """``tail --group G --commit``: move the group's position past what was printed,
    under a lease of the stream as any consumer of the group would (at least once)."""

    def __init__(self, engine: sa.Engine, group: str, stream: str) -> None:
        self._engine = engine
        self._group_name = group
        self._stream = stream
        self._owner = "tail:" + default_owner()
        self._claim: Claim | None = None

    def claim(self) -> tuple[Group, Claim]:
        """Take the stream's lease (or renew it); the group's settings and the claim."""
        with self._engine.begin() as connection:
            group = load_group(connection, self._group_name, (self._stream,))
            claim = positions.claim(connection, group, self._stream, self._owner, datetime.now(UTC))
        if not isinstance(claim, Claim):
            held = "parked" if claim.parked else "held by one of its consumers"
            raise ConsumerError(
                f"consumer group {self._group_name!r}, stream {self._stream!r} is {held}: "
                "--commit is refused (stop the group's consumers, or tail without --commit)"
            )
        self._claim = claim
        return group, claim

    def commit(self, read: Read) -> None:
        group, claim = self.claim()  # renews the lease (tail may have waited longer than it)
        with self._engine.begin() as connection:
            moved = positions.move(
                connection,
                group,
                self._stream,
                owner=self._owner,
                epoch=claim.epoch,
                end=read.end,
                items=len(read.items),
                keep=True,
                narrow_items=0,
                now=datetime.now(UTC),
                newest_received_at=read.newest_received_at,
                check_lease=True,
            )
        if not moved:
            raise ConsumerError(f"lost the lease of {self._group_name}/{self._stream}")

    def release(self) -> None:
        if self._claim is None:
            return
        with self._engine.begin() as connection:
            positions.release(
                connection,
                self._group_name,
                self._stream,
                owner=self._owner,
                epoch=self._claim.epoch,
            )
