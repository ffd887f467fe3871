"""The ``durable-sse`` command line.

Every failure is one clear line on stderr and a non-zero exit, never a traceback:
a user's typo (an unknown stream, bad TOML, Temporal down) is not a crash.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.metadata
import json
import os
import select
import shutil
import sys
import textwrap
from collections.abc import Sequence
from typing import Any

from temporalio.client import Client

from durable_sse.config.settings import Settings
from durable_sse.config.spec import StreamSpec, load_streams, parse_replay_signal, spec_differences
from durable_sse.errors import ConfigError, ConsumerError, DurableSSEError
from durable_sse.log.retention import describe as retention_text
from durable_sse.ops import control
from durable_sse.ops.temporal_client import CLIENT_ENVIRONMENT
from durable_sse.sse.http import host_allowed, redact_url

EXIT_ERROR = 1
"""Something failed on the way (Temporal unreachable, a stream not found, settings differ)."""
EXIT_USAGE = 2
"""The input was refused (a flag, the stream file, an environment variable): nothing was
done."""
STOP_TIMEOUT = 120.0

ENVIRONMENT = {
    **CLIENT_ENVIRONMENT,
    "SSE_TASK_QUEUE": "task queue of the stream workflows (default sse-consumer)",
    "DURABLE_SSE_PAYLOAD_KEY": "payload encryption key (the worker's and the CLI's must match)",
    "SSE_ALLOWED_HOSTS": "hosts stream URLs may name, comma-separated, *.domain allowed "
    "(unset: any host; development only)",
    "DATABASE_URL": "event log, postgresql://… or sqlite:///… "
    "(default sqlite:///.durable-sse/durable-sse.db)",
    "REDIS_URL": "Redis for the L2 cursor cache (default redis://127.0.0.1:6379/0)",
    "REDIS_CURSOR_TTL_DAYS": "days a stream's Redis cursor lives (default 7)",
    "REDIS_TIMEOUT": "seconds a Redis call may take before it is skipped (default 0.5)",
    "SSE_METRICS_PORT": "serve Prometheus metrics on this port (default: off)",
    "DURABLE_SSE_RETENTION": "keep events this long, e.g. 30d, for streams without a "
    "retention of their own (default: forever)",
}
CLIENT_VARIABLES = (*CLIENT_ENVIRONMENT, "DURABLE_SSE_PAYLOAD_KEY")
"""What every client command reads (all commands also refuse a malformed value of any
variable in ENVIRONMENT). The Temporal ones are the ``temporal`` CLI's own."""
PROFILE_HELP = (
    "profile of the temporal CLI's temporal.toml (env TEMPORAL_PROFILE; TEMPORAL_* "
    "variables override its values)"
)


def environment_help(names: Sequence[str], *, extra: str = "") -> str:
    """An epilog listing the environment variables a command reads."""
    width = max(len(name) for name in names)
    lines = ["environment:"]
    for name in names:
        text = textwrap.wrap(ENVIRONMENT[name], 76 - width, break_on_hyphens=False)
        lines.append(f"  {name.ljust(width)}  {text[0]}")
        lines += [f"  {'':{width}}  {more}" for more in text[1:]]
    if extra:
        lines.append(f"  {extra}")
    return "\n".join(lines)


def _version() -> str:
    try:
        return importlib.metadata.version("durable-sse")
    except importlib.metadata.PackageNotFoundError:  # running from a bare checkout
        return "unknown"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="durable-sse",
        description="Consume Server-Sent Events streams without losing events, on Temporal.",
        epilog="exit codes: 0 done, 1 failed (Temporal unreachable, no such stream, settings "
        "differ), 2 input refused (a flag, the stream file, an environment variable): "
        "nothing was done. `durable-sse COMMAND --help` lists what each command reads.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, text: str, variables: Sequence[str], **kwargs: Any) -> Any:
        sub = commands.add_parser(
            name,
            help=text,
            description=text[0].upper() + text[1:] + ".",
            epilog=environment_help(variables, extra=kwargs.pop("extra", "")),
            formatter_class=argparse.RawDescriptionHelpFormatter,
            **kwargs,
        )
        sub.add_argument("--profile", metavar="NAME", help=PROFILE_HELP)
        return sub

    worker = command(
        "worker",
        "run a worker (both workflows, all activities)",
        list(ENVIRONMENT),
        extra="and the variables the streams name in headers_from_env/query_from_env",
    )
    worker.add_argument("--log-format", choices=["plain", "json"], default="plain")
    worker.add_argument(
        "--metrics-port", type=int, help="serve Prometheus metrics here (env SSE_METRICS_PORT)"
    )

    start = command(
        "start",
        "start the streams declared in a TOML file",
        (*CLIENT_VARIABLES, "SSE_TASK_QUEUE", "SSE_ALLOWED_HOSTS"),
    )
    start.add_argument("--config", default="streams.toml", help="stream file (default %(default)s)")
    start.add_argument(
        "--restart",
        action="store_true",
        help="a running stream whose settings differ from the file is stopped gracefully, "
        "waited for, and started with the file's settings (without it: listed, exit 1)",
    )
    start.add_argument(
        "--stop-timeout",
        type=float,
        default=STOP_TIMEOUT,
        metavar="SECONDS",
        help="with --restart, how long to wait for the old run to end (default %(default)g)",
    )
    start.add_argument("names", nargs="*", metavar="NAME", help="only these streams")

    status = command("status", "show stream status", CLIENT_VARIABLES)
    status.add_argument("name", nargs="?", metavar="NAME")
    status.add_argument("--json", action="store_true", help="print JSON")
    status.add_argument(
        "--wide",
        action="store_true",
        help="one line per stream: the last error is not wrapped to the terminal's width "
        "(it is never cut short either way)",
    )

    replay = command(
        "replay",
        "replay a stream: the lagged route by default, or from an id or a time",
        CLIENT_VARIABLES,
    )
    replay.add_argument("name", metavar="NAME")
    where = replay.add_mutually_exclusive_group()
    where.add_argument(
        "--from-id",
        metavar="ID",
        help="resume from this event id, exactly as the server sent it (sent as "
        "Last-Event-ID or cursor_param); must not be empty",
    )
    where.add_argument(
        "--since",
        metavar="TIME",
        help="replay from the newest event persisted at or before TIME: ISO 8601 with Z or an "
        "offset, e.g. 2026-05-01T12:00:00Z or 2026-05-01T14:00:00+02:00. No time zone is "
        "assumed: a time without one is refused",
    )

    for name, text in (
        ("pause", "pause a stream (the connection flushes and closes)"),
        ("resume", "resume a paused, parked or server-stopped stream"),
        ("stop", "stop a stream gracefully (flush, then complete)"),
    ):
        command(name, text, CLIENT_VARIABLES).add_argument("name", metavar="NAME")

    tail = command(
        "tail",
        "print a stream's stored events (and gaps) as JSON lines, like tail; -f follows",
        ("DATABASE_URL",),
    )
    tail.add_argument("stream", metavar="STREAM")
    tail.add_argument("-f", "--follow", action="store_true", help="wait for new events")
    tail.add_argument(
        "-n",
        "--lines",
        type=int,
        default=10,
        metavar="N",
        help="start with the stream's last N events (default %(default)s)",
    )
    start_at = tail.add_mutually_exclusive_group()
    start_at.add_argument("--from-seq", type=int, metavar="N", help="from the event with seq N")
    start_at.add_argument(
        "--since",
        metavar="TIME",
        help="events received at or after TIME: ISO 8601 with Z or an offset",
    )
    start_at.add_argument(
        "--group", metavar="GROUP", help="from the consumer group's position (read-only)"
    )
    tail.add_argument(
        "--commit",
        action="store_true",
        help="with --group: move the group's position past each line printed (refused "
        "while one of the group's consumers holds the stream)",
    )

    consumers = command(
        "consumers",
        "list consumer groups: position, lag, owner, dead letters, retention held",
        ("DATABASE_URL",),
    )
    consumers.add_argument("--group", metavar="GROUP", help="only this group")
    consumers.add_argument("--json", action="store_true", help="print JSON")
    actions = consumers.add_subparsers(dest="action", metavar="ACTION")
    reset = actions.add_parser(
        "reset",
        help="move a group's position (a dry run unless --yes)",
        description="Move a consumer group's position in its streams (all, or the ones "
        "named): back to deliver events again, forward to skip them; unparks. A dry run "
        "unless --yes; refused while a consumer of the group holds one of the streams.",
    )
    reset.add_argument("reset_group", metavar="GROUP")
    reset.add_argument("streams", nargs="*", metavar="STREAM")
    reset.add_argument(
        "--to",
        required=True,
        metavar="WHERE",
        help="earliest, latest, a seq (the position: events after it are delivered), or "
        "an ISO 8601 time with Z or an offset",
    )
    reset.add_argument("--yes", action="store_true", help="do it (without: show the plan)")

    commands.add_parser(
        "source", help="run the demo SSE source alone (see its --help)", add_help=False
    )
    commands.add_parser(
        "dev",
        help="run the whole demo stack on embedded defaults (see its --help: ports)",
        add_help=False,
    )
    commands.add_parser(
        "codec-server", help="serve payload decryption to the Web UI", add_help=False
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # `source` and `dev` own their flags; hand everything after the command to them.
    if argv and argv[0] == "source":
        from durable_sse.source.__main__ import main as source_main

        return source_main(argv[1:])
    if argv and argv[0] == "codec-server":
        from durable_sse.ops.codec_server import main as codec_main

        return codec_main(argv[1:])
    if argv and argv[0] == "dev":
        from durable_sse.ops.dev import main as dev_main

        return dev_main(argv[1:])
    args = build_parser().parse_args(argv)
    try:
        if args.command == "worker":
            return _worker(args)
        if args.command in ("tail", "consumers"):
            return asyncio.run(_consume_command(args))
        return asyncio.run(_run(args))
    except ConfigError as error:
        print(f"durable-sse: {error}", file=sys.stderr)
        return EXIT_USAGE
    except (DurableSSEError, OSError) as error:
        print(f"durable-sse: {error}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        return 130


def _worker(args: argparse.Namespace) -> int:
    import worker

    if args.metrics_port is not None:
        os.environ["SSE_METRICS_PORT"] = str(args.metrics_port)
    worker.main(log_format=args.log_format, profile=args.profile)
    return 0


async def _run(args: argparse.Namespace) -> int:
    """One client command. Every input is checked before Temporal is contacted."""
    settings = Settings.from_env(profile=args.profile)
    if args.command == "start":
        specs = load_streams(args.config)
        if args.names:
            known = {spec.name for spec in specs}
            unknown = [name for name in args.names if name not in known]
            if unknown:
                raise ConfigError(f"{args.config}: no stream named {unknown[0]!r}")
            specs = [spec for spec in specs if spec.name in args.names]
        for spec in specs:
            if not host_allowed(spec.url, settings.allowed_hosts):
                raise ConfigError(
                    f"stream {spec.name!r}: setting 'url' names a host that is not in "
                    f"SSE_ALLOWED_HOSTS ({redact_url(spec.url)})"
                )
        if not args.stop_timeout > 0:
            raise ConfigError(f"--stop-timeout must be positive, got {args.stop_timeout:g}")
    if args.command == "replay":
        signal = parse_replay_signal(
            {"from_id": args.from_id, "since": args.since}, stream=args.name
        )
    client = await control.connect(settings.temporal)
    if args.command == "start":
        return await _start(client, specs, settings, args)
    if args.command == "status":
        names = [args.name] if args.name else await control.running_streams(client)
        statuses = [await control.stream_status(client, name) for name in names]
        if args.json:
            print(json.dumps(statuses, indent=2))
        else:
            width = None if args.wide else shutil.get_terminal_size().columns
            print(format_status_table(statuses, width=width))
        return 0
    if args.command == "replay":
        await control.replay(client, args.name, from_id=signal.from_id, since=signal.since)
    else:
        await control.signal_stream(client, args.name, args.command)
    print(f"{args.name}: {args.command} sent")
    return 0


async def _start(
    client: Client, specs: list[StreamSpec], settings: Settings, args: argparse.Namespace
) -> int:
    """Start each stream; a running one with other settings is listed, or restarted."""
    code = 0
    for spec in specs:
        if await control.start_stream(client, spec, task_queue=settings.task_queue):
            print(f"{spec.name}: started")
            continue
        try:
            changes = ", ".join(
                map(str, spec_differences(await control.running_spec(client, spec.name), spec))
            )
        except ConfigError as error:
            changes = f"its running input is invalid ({error})"
        if not changes:
            print(f"{spec.name}: already running (same settings)")
        elif args.restart:
            await control.restart_stream(
                client, spec, task_queue=settings.task_queue, timeout=args.stop_timeout
            )
            print(f"{spec.name}: restarted: {changes}")
        else:
            print(
                f"durable-sse: stream {spec.name!r} is running with other settings: {changes}; "
                f"`durable-sse start --restart {spec.name}` applies them",
                file=sys.stderr,
            )
            code = EXIT_ERROR
    return code


STATUS_COLUMNS = (
    ("stream", lambda s: s["name"]),
    ("state", lambda s: s["state"]),
    ("route", lambda s: s.get("route") or "-"),
    ("cursor", lambda s: control.current_counts(s)[0] or "-"),
    ("lagging id", lambda s: s.get("lagging_id") or "-"),
    ("persisted", lambda s: control.current_counts(s)[1]),
    ("lag", lambda s: control.lag_text(s)),
    ("drops", lambda s: s["counters"]["drop_signals"]),
    ("open gaps", control.open_gaps_text),
    ("recovered", lambda s: s["counters"]["events_recovered"]),
    ("lost", lambda s: control.lost_text(s["counters"])),
    ("retention", lambda s: retention_text(s.get("retention"))),
    ("last error", lambda s: s.get("last_error") or ""),
)
ERROR_INDENT = "    "


def format_status_table(statuses: list[dict[str, Any]], *, width: int | None = None) -> str:
    """The status table; the last error (why a stream is parked) is never cut short.

    Args:
        width: the terminal's width. A last error that does not fit after its row goes
            on the lines below it, wrapped to this width; None writes every row on one
            line however long (``--wide``).
    """
    if not statuses:
        return "no streams running"
    rows = [[name for name, _ in STATUS_COLUMNS]]
    rows += [[str(value(status)) for _, value in STATUS_COLUMNS] for status in statuses]
    widths = [max(len(row[i]) for row in rows) for i in range(len(STATUS_COLUMNS) - 1)]
    room = None if width is None else width - sum(widths) - 2 * len(widths)
    lines = []
    for number, row in enumerate(rows):
        head = "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=False))
        last = row[-1]
        if number == 0 or width is None or room is None or len(last) <= room:
            lines.append(f"{head}  {last}".rstrip())
            continue
        lines.append(head.rstrip())
        lines += textwrap.wrap(
            f"last error: {last}",
            max(width - len(ERROR_INDENT), 20),
            initial_indent=ERROR_INDENT,
            subsequent_indent=ERROR_INDENT,
            break_long_words=True,
            break_on_hyphens=False,
        )
    return "\n".join(lines)


# -- consumers of the log: tail, consumers -------------------------------------------


async def _consume_command(args: argparse.Namespace) -> int:
    """``tail`` and ``consumers``: the database only (no Temporal)."""
    from durable_sse.config.settings import database_url_from_env
    from durable_sse.consume.database import normalize_url
    from durable_sse.log.schema import make_engine

    url = normalize_url(database_url_from_env())
    if args.command == "tail":
        if args.commit and not args.group:
            raise ConfigError("--commit moves a group's position: name the group (--group)")
        if args.lines < 0:
            raise ConfigError(f"-n must not be negative, got {args.lines}")
        since = _parse_since(args.since) if args.since else None
        engine = make_engine(url)
        try:
            return await _tail(args, url, engine, since)
        finally:
            engine.dispose()
    engine = make_engine(url)
    try:
        if args.action == "reset":
            return await asyncio.to_thread(_reset_consumers, engine, args)
        return await asyncio.to_thread(_list_consumers, engine, args)
    finally:
        engine.dispose()


def _parse_since(text: str) -> Any:
    from datetime import datetime

    try:
        moment = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise ConfigError(
            f"--since {text!r}: expected ISO 8601, e.g. 2026-05-01T12:00:00Z"
        ) from None
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise ConfigError(f"--since {text!r}: no time zone; add Z or an offset (+02:00)")
    return moment


async def _tail(args: argparse.Namespace, url: str, engine: Any, since: Any) -> int:
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
    args: argparse.Namespace, url: str, engine: Any, position: Any, committer: Any
) -> int:
    from durable_sse.consume.follow import follow
    from durable_sse.consume.model import item_json

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


def _tail_start(engine: Any, args: argparse.Namespace, since: Any) -> Any:
    import sqlalchemy as sa

    from durable_sse.consume import positions
    from durable_sse.consume.model import Start
    from durable_sse.consume.reader import start_position
    from durable_sse.log.schema import events_table

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

    def __init__(self, engine: Any, group: str, stream: str) -> None:
        from durable_sse.consume.positions import default_owner

        self._engine = engine
        self._group_name = group
        self._stream = stream
        self._owner = "tail:" + default_owner()
        self._claim: Any = None
        self._group: Any = None

    def claim(self) -> None:
        from datetime import UTC, datetime

        from durable_sse.consume import positions
        from durable_sse.consume.status import load_group

        with self._engine.begin() as connection:
            self._group = load_group(connection, self._group_name, (self._stream,))
            claim = positions.claim(
                connection, self._group, self._stream, self._owner, datetime.now(UTC)
            )
        if not isinstance(claim, positions.Claim):
            held = "parked" if claim.parked else "held by one of its consumers"
            raise ConsumerError(
                f"consumer group {self._group_name!r}, stream {self._stream!r} is {held}: "
                "--commit is refused (stop the group's consumers, or tail without --commit)"
            )
        self._claim = claim

    def commit(self, read: Any) -> None:
        from datetime import UTC, datetime

        from durable_sse.consume import positions

        self.claim()  # renews the lease (tail may have waited longer than it)
        with self._engine.begin() as connection:
            moved = positions.move(
                connection,
                self._group,
                self._stream,
                owner=self._owner,
                epoch=self._claim.epoch,
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
        from durable_sse.consume import positions

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


CONSUMER_COLUMNS = (
    ("group", lambda s: s.group),
    ("stream", lambda s: s.stream),
    ("state", lambda s: s.state),
    ("position", lambda s: s.position),
    ("lag", lambda s: f"{s.lag_events}+" if s.lag_events >= _lag_cap() else s.lag_events),
    ("lag s", lambda s: f"{s.lag_seconds:.1f}"),
    ("owner", lambda s: s.owner or "-"),
    ("dead letters", lambda s: s.dead_letters),
    ("holds retention", lambda s: _hold_text(s)),
)


def _lag_cap() -> int:
    from durable_sse.consume.status import LAG_CAP

    return LAG_CAP


def _hold_text(status: Any) -> str:
    if not status.holds_retention:
        return "-"
    if status.max_hold is None:
        return "yes"
    from durable_sse.config.durations import format_duration

    return f"up to {format_duration(status.max_hold)}"


def format_consumers_table(statuses: list[Any]) -> str:
    """One row per group and stream; why a stream is parked on the line below it."""
    if not statuses:
        return "no consumer groups"
    rows = [[name for name, _ in CONSUMER_COLUMNS]]
    rows += [[str(value(status)) for _, value in CONSUMER_COLUMNS] for status in statuses]
    widths = [max(len(row[i]) for row in rows) for i in range(len(CONSUMER_COLUMNS))]
    lines = []
    for number, row in enumerate(rows):
        lines.append("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
        status = statuses[number - 1] if number else None
        if status is not None and status.parked_reason:
            lines.append(f"{ERROR_INDENT}parked: {status.parked_reason}")
        elif status is not None and status.last_error:
            lines.append(f"{ERROR_INDENT}last error: {status.last_error.splitlines()[0]}")
    return "\n".join(lines)


def _list_consumers(engine: Any, args: argparse.Namespace) -> int:
    from dataclasses import asdict

    from durable_sse.consume.status import consumer_statuses

    with engine.connect() as connection:
        statuses = consumer_statuses(connection, args.group)
    if args.json:
        print(
            json.dumps([{**asdict(s), "state": s.state} for s in statuses], indent=2, default=str)
        )
    else:
        print(format_consumers_table(statuses))
    return 0


def _reset_consumers(engine: Any, args: argparse.Namespace) -> int:
    from datetime import UTC, datetime

    from durable_sse.consume.model import Start
    from durable_sse.consume.status import apply_reset, plan_reset

    try:
        start = Start.parse(args.to)
    except ValueError as error:
        raise ConfigError(f"--to: {error}") from None
    with engine.begin() as connection:
        plans = plan_reset(connection, args.reset_group, args.streams or None, start)
        for plan in plans:
            print(("" if args.yes else "would move ") + plan.describe())
        if not args.yes:
            print("dry run: nothing changed (--yes does it)")
            return 0
        apply_reset(connection, plans, now=datetime.now(UTC))
    print(f"{args.reset_group}: reset")
    return 0


def entry() -> None:
    """Console entry point: exit without interpreter finalization.

    The Temporal client's native runtime keeps threads that can call into Python while
    the interpreter finalizes, which aborted the process after its work was done (seen
    with the encryption codec). Everything is flushed and closed by then.
    """
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    entry()
