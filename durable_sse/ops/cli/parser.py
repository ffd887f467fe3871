"""The ``durable-sse`` arguments, the environment each command reads, its exit codes."""

from __future__ import annotations

import argparse
import importlib.metadata
import textwrap
from collections.abc import Sequence
from typing import Any

from durable_sse.config.temporal import CLIENT_ENVIRONMENT

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
    "SSE_SECRETS": "the variables streams may send as secrets, each bound to hosts: "
    "NAME@host, NAME@*.example.org, NAME@host:port (list a name twice for two hosts); a "
    "value comes from NAME, NAME_FILE or NAME_TOKEN_URL (OAuth2 client credentials)",
    "DURABLE_SSE_REQUIRE_ENCRYPTION": "1: refuse to start without DURABLE_SSE_PAYLOAD_KEY "
    "(default 0)",
    "DATABASE_URL": "event log, postgresql://… or sqlite:///… "
    "(default sqlite:///.durable-sse/durable-sse.db)",
    "REDIS_URL": "Redis for the L2 cursor cache (default redis://127.0.0.1:6379/0)",
    "REDIS_CURSOR_TTL_DAYS": "days a stream's Redis cursor lives (default 7)",
    "REDIS_TIMEOUT": "seconds a Redis call may take before it is skipped (default 0.5)",
    "SSE_METRICS_PORT": "serve Prometheus metrics on this port (default: off)",
    "DURABLE_SSE_RETENTION": "keep events this long, e.g. 30d, for streams without a "
    "retention of their own (default: forever)",
    "TEMPORAL_DEPLOYMENT_NAME": "Worker Deployment the worker is a version of, with "
    "TEMPORAL_WORKER_BUILD_ID (both or neither; unset: unversioned)",
    "TEMPORAL_WORKER_BUILD_ID": "the worker's build id in that deployment",
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
    worker.add_argument(
        "--deployment-name",
        metavar="NAME",
        help="poll as a version of this Worker Deployment (env TEMPORAL_DEPLOYMENT_NAME)",
    )
    worker.add_argument(
        "--build-id", metavar="ID", help="this worker's build id (env TEMPORAL_WORKER_BUILD_ID)"
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
