"""``durable-sse``: the entry point, and which module runs each command."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Sequence

from durable_sse.config.settings import database_url_from_env
from durable_sse.consume.database import normalize_url
from durable_sse.errors import ConfigError, DurableSSEError
from durable_sse.log.database import make_engine
from durable_sse.ops.cli.consumers import list_consumers, reset_consumers
from durable_sse.ops.cli.parser import EXIT_ERROR, EXIT_USAGE, build_parser
from durable_sse.ops.cli.streams import run_stream_command
from durable_sse.ops.cli.tail import parse_since, tail
from durable_sse.ops.codec_server import main as codec_server_main
from durable_sse.source.__main__ import main as source_main


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # `source` and `dev` own their flags; hand everything after the command to them.
    if argv and argv[0] == "source":
        return source_main(argv[1:])
    if argv and argv[0] == "codec-server":
        return codec_server_main(argv[1:])
    if argv and argv[0] == "dev":
        from durable_sse import worker  # lazy: loads every workflow and activity
        from durable_sse.ops.dev import main as dev_main  # lazy: the dev stack (Redis, servers)

        return dev_main(argv[1:], run_worker=worker.run_worker)
    args = build_parser().parse_args(argv)
    try:
        if args.command == "worker":
            return _worker(args)
        if args.command in ("tail", "consumers"):
            return asyncio.run(_consume_command(args))
        return asyncio.run(run_stream_command(args))
    except ConfigError as error:
        print(f"durable-sse: {error}", file=sys.stderr)
        return EXIT_USAGE
    except (DurableSSEError, OSError) as error:
        print(f"durable-sse: {error}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        return 130


def _worker(args: argparse.Namespace) -> int:
    from durable_sse import worker  # lazy: loads every workflow and activity

    if args.metrics_port is not None:
        os.environ["SSE_METRICS_PORT"] = str(args.metrics_port)
    if args.deployment_name is not None:
        os.environ["TEMPORAL_DEPLOYMENT_NAME"] = args.deployment_name
    if args.build_id is not None:
        os.environ["TEMPORAL_WORKER_BUILD_ID"] = args.build_id
    worker.main(log_format=args.log_format, profile=args.profile)
    return 0


async def _consume_command(args: argparse.Namespace) -> int:
    """``tail`` and ``consumers``: the database only (no Temporal)."""
    url = normalize_url(database_url_from_env())
    if args.command == "tail":
        if args.commit and not args.group:
            raise ConfigError("--commit moves a group's position: name the group (--group)")
        if args.lines < 0:
            raise ConfigError(f"-n must not be negative, got {args.lines}")
        since = parse_since(args.since) if args.since else None
        engine = make_engine(url)
        try:
            return await tail(args, url, engine, since)
        finally:
            engine.dispose()
    engine = make_engine(url)
    try:
        if args.action == "reset":
            return await asyncio.to_thread(reset_consumers, engine, args)
        return await asyncio.to_thread(list_consumers, engine, args)
    finally:
        engine.dispose()


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
