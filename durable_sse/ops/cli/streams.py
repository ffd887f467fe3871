"""The commands that talk to Temporal: start, status, replay, pause, resume, stop."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from collections.abc import Mapping

from temporalio.client import Client

from durable_sse.config.hosts import host_allowed
from durable_sse.config.replay import parse_replay_signal
from durable_sse.config.settings import Settings
from durable_sse.config.spec import StreamSpec
from durable_sse.config.streams import load_streams, spec_differences
from durable_sse.cursor.l2 import RedisCursors
from durable_sse.errors import ConfigError
from durable_sse.ops import control
from durable_sse.ops.cli.parser import EXIT_ERROR
from durable_sse.ops.cli.tables import format_status_table
from durable_sse.ops.live import LiveStores
from durable_sse.redact import redact_url
from durable_sse.stores import Stores


async def run_stream_command(args: argparse.Namespace) -> int:
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
        return await start_streams(client, specs, settings, args)
    if args.command == "status":
        names = [args.name] if args.name else await control.running_streams(client)
        live = live_stores(settings)
        try:
            statuses = [await control.stream_status(client, name, live=live) for name in names]
        finally:
            await live.close()
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


def live_stores(settings: Settings, environ: Mapping[str, str] | None = None) -> LiveStores:
    """The deployment's stores for ``status``'s live figures: Redis when ``REDIS_URL`` is
    set, the event log when ``DATABASE_URL`` is (never the embedded defaults, which would
    be some other deployment's, or none)."""
    environ = os.environ if environ is None else environ
    l2 = stores = None
    if environ.get("REDIS_URL"):
        l2 = RedisCursors(settings.redis_url, timeout=settings.redis_timeout)
    if environ.get("DATABASE_URL"):
        stores = Stores.open(settings.database_url)
    return LiveStores(l2=l2, stores=stores)


async def start_streams(
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
