"""The ``durable-sse`` command line.

Every failure is one clear line on stderr and a non-zero exit, never a traceback:
a user's typo (an unknown stream, bad TOML, Temporal down) is not a crash.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

from durable_sse import control
from durable_sse.errors import DurableSSEError
from durable_sse.http import host_allowed, redact_url
from durable_sse.settings import Settings
from durable_sse.spec import load_streams

EXIT_ERROR = 1
EXIT_USAGE = 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="durable-sse",
        description="Consume Server-Sent Events streams without losing events, on Temporal.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    worker = commands.add_parser("worker", help="run a worker (both workflows, all activities)")
    worker.add_argument("--log-format", choices=["plain", "json"], default="plain")
    worker.add_argument(
        "--metrics-port", type=int, help="serve Prometheus metrics here (env SSE_METRICS_PORT)"
    )

    start = commands.add_parser("start", help="start streams declared in a TOML file")
    start.add_argument("--config", default="streams.toml", help="stream file (default %(default)s)")
    start.add_argument("names", nargs="*", metavar="NAME", help="only these streams")

    status = commands.add_parser("status", help="show stream status")
    status.add_argument("name", nargs="?", metavar="NAME")
    status.add_argument("--json", action="store_true", help="print JSON")

    replay = commands.add_parser("replay", help="replay a stream (lagged route by default)")
    replay.add_argument("name", metavar="NAME")
    where = replay.add_mutually_exclusive_group()
    where.add_argument("--from-id", metavar="ID")
    where.add_argument("--since", metavar="TIME", help="ISO timestamp")

    for name, text in (
        ("pause", "pause a stream (the connection flushes and closes)"),
        ("resume", "resume a paused, parked or server-stopped stream"),
        ("stop", "stop a stream gracefully (flush, then complete)"),
    ):
        command = commands.add_parser(name, help=text)
        command.add_argument("name", metavar="NAME")

    commands.add_parser("source", help="run the demo SSE source alone", add_help=False)
    commands.add_parser("dev", help="run the whole demo stack on embedded defaults", add_help=False)
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
        from durable_sse.codec_server import main as codec_main

        return codec_main(argv[1:])
    if argv and argv[0] == "dev":
        from durable_sse.dev import main as dev_main

        return dev_main(argv[1:])
    args = build_parser().parse_args(argv)
    try:
        if args.command == "worker":
            return _worker(args)
        return asyncio.run(_run(args))
    except (DurableSSEError, OSError) as error:
        print(f"durable-sse: {error}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        return 130


def _worker(args: argparse.Namespace) -> int:
    import worker

    if args.metrics_port is not None:
        os.environ["SSE_METRICS_PORT"] = str(args.metrics_port)
    worker.main(log_format=args.log_format)
    return 0


async def _run(args: argparse.Namespace) -> int:
    settings = Settings.from_env()
    if args.command == "start":
        specs = load_streams(args.config)
        if args.names:
            known = {spec.name for spec in specs}
            unknown = [name for name in args.names if name not in known]
            if unknown:
                raise DurableSSEError(f"{args.config}: no stream named {unknown[0]!r}")
            specs = [spec for spec in specs if spec.name in args.names]
        for spec in specs:
            if not host_allowed(spec.url, settings.allowed_hosts):
                raise DurableSSEError(
                    f"stream {spec.name!r}: setting 'url' names a host that is not in "
                    f"SSE_ALLOWED_HOSTS ({redact_url(spec.url)})"
                )
    client = await control.connect(settings.temporal_address, settings.temporal_namespace)
    if args.command == "start":
        for spec in specs:
            started = await control.start_stream(client, spec, task_queue=settings.task_queue)
            print(f"{spec.name}: {'started' if started else 'already running'}")
        return 0
    if args.command == "status":
        names = [args.name] if args.name else await control.running_streams(client)
        statuses = [await control.stream_status(client, name) for name in names]
        print(json.dumps(statuses, indent=2) if args.json else format_status_table(statuses))
        return 0
    if args.command == "replay":
        await control.replay(client, args.name, from_id=args.from_id, since=args.since)
    else:
        await control.signal_stream(client, args.name, args.command)
    print(f"{args.name}: {args.command} sent")
    return 0


STATUS_COLUMNS = (
    ("stream", lambda s: s["name"]),
    ("state", lambda s: s["state"]),
    ("route", lambda s: s.get("route") or "-"),
    ("cursor", lambda s: control.current_counts(s)[0] or "-"),
    ("lagging id", lambda s: s.get("lagging_id") or "-"),
    ("persisted", lambda s: control.current_counts(s)[1]),
    ("drops", lambda s: s["counters"]["drop_signals"]),
    ("recovered", lambda s: s["counters"]["events_recovered"]),
    ("lost", lambda s: s["counters"]["events_unrecoverable"]),
    ("last error", lambda s: (s.get("last_error") or "")[:60]),
)


def format_status_table(statuses: list[dict[str, Any]]) -> str:
    if not statuses:
        return "no streams running"
    rows = [[name for name, _ in STATUS_COLUMNS]]
    rows += [[str(value(status)) for _, value in STATUS_COLUMNS] for status in statuses]
    widths = [max(len(row[i]) for row in rows) for i in range(len(STATUS_COLUMNS))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in rows
    )


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
