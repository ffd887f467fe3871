"""``durable-sse consumers``: list consumer groups, move a group's position."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from datetime import UTC, datetime

import sqlalchemy as sa

from durable_sse.consume.model import Start
from durable_sse.consume.status import apply_reset, consumer_statuses, plan_reset
from durable_sse.errors import ConfigError
from durable_sse.ops.cli.tables import format_consumers_table


def list_consumers(engine: sa.Engine, args: argparse.Namespace) -> int:
    with engine.connect() as connection:
        statuses = consumer_statuses(connection, args.group)
    if args.json:
        print(
            json.dumps([{**asdict(s), "state": s.state} for s in statuses], indent=2, default=str)
        )
    else:
        print(format_consumers_table(statuses))
    return 0


def reset_consumers(engine: sa.Engine, args: argparse.Namespace) -> int:
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
