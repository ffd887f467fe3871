"""(10) failover: a worker dies (SIGKILL), is paused (SIGSTOP) or is told to stop (SIGTERM)
under N streams.

Two real worker processes (``worker.py``) poll one task queue of a throwaway dev server;
N streams of the SSE source (in this driver process, loopback) each send a steady
``RATE`` events/s (``--failover-rate``) with default stream settings. Once every stream
persists, for each mode:

* ``kill``: SIGKILL the worker holding more connections; a new worker is started after
  the streams came back (or ``timeout`` passed), so two run again, and takes its share
  (or ``SPREAD_TIMEOUT`` passes);
* ``stop``: SIGSTOP the worker holding more connections for ``PAUSE_SECONDS``, then
  SIGCONT: its streams move as after a death, and once it runs again none of them may
  still be read by its connection from before the pause, beside the new one, for more
  than ``OWNER_SETTLE`` s (its lease was revoked: it ends its connections, and the fence
  refuses their commits; the balancer's make-before-break hand-overs are not counted);
* ``term``: SIGTERM the worker holding more connections (its exit time is measured).

With ``herd`` (``--failover-herd``) the streams start on one worker instead; a second
joins, idle, and the first is SIGKILLed as soon as the second polls, before the balancer
hands it anything: every stream's next connection starts on the one survivor at once
(the ``kill`` mode only).

Goals: the issue's p99 of the longest wait (:data:`GOALS`) for up to
:data:`GOAL_STREAMS` streams over two workers; with ``herd``, the goals of starting that
many streams on one worker: every stream's next connection storing within
:data:`HERD_GOAL` s, and :data:`HERD_SETTLE` s after they all came back, each event of a
:data:`HERD_WINDOW` s window stored within :data:`HERD_LAG_GOAL` s at p99 (seen by polls
of every stream's newest stored id every :data:`SETTLE_POLL_EVERY` s, which bound the
resolution). Other sizes print their figures without a goal.

Per stream that worker held, two figures, each seen stored in ``sse_events`` by a poll
every ``POLL_EVERY`` s (one clock: this process's), on one connection, timed as the poll
is sent (its snapshot shows what was committed by then; before 2026-12-07 each poll
opened a connection and was timed as it answered, which added the poll's own latency to
every wait; that latency is printed):

* longest wait (the goal's): the longest any event the source generated after the
  signal waited to be stored, by whichever connection, until the stream came back (its
  next connection stored its first event and nothing older than ``CAUGHT_UP`` waits).
  Each poll reads every stream's newest stored id, and an id's generation time is taken
  from the source's rate (within half an event's interval). A stopping worker's
  connections read on until their retries start (make before break), so for SIGTERM
  this is how long the stream's storing paused, not how long the hand-over took;
* next connection: seconds until the first event of the first connection the source saw
  open after the signal is stored (the hand-over itself). A retry after a death starts a
  few ids behind the newest stored one, so its first event is most often stored already:
  then this is when its connection opened, not when its new events were stored.

A stream that has neither within ``timeout`` counts as not recovered. After the modes the source
stops generating and the run settles: lost = ids from the first the source sent to the
last it generated that are not stored (its ids are contiguous integers: holes),
duplicates = rows per (stream, id) beyond one.

Which worker holds a stream: the pending ``read_stream`` activity's last worker identity
(``pid@host``, the SDK's default), as tests/chaos/harness.py ``reader_pid`` reads it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import psycopg
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment

from bench.common import (
    PYTHON,
    Row,
    Stack,
    percentile,
    pg_query,
    spawn,
    stop_process,
    verdict,
    wait_until,
)
from bench.many import GENERATED, stamp_generation
from bench.reconnect import CONNECTIONS, Connection, _instrument
from durable_sse.config.spec import StreamSpec
from durable_sse.contracts import StreamStatus, stream_workflow_id
from durable_sse.ops.binaries import temporal_dev_server
from durable_sse.source import SourceStreamConfig, SSESource

logger = logging.getLogger(__name__)

RATE = 3.0
"""Events per second per stream."""
POLL_EVERY = 0.1
CAUGHT_UP = 1.0
"""A stream has come back once its next connection stored its first event and nothing
generated more than this many seconds ago waits to be stored."""
"""Seconds between polls of the event log while streams come back."""
START_CONCURRENCY = 50
START_TIMEOUT = 180.0
"""Seconds for every stream's first stored event (and for steady state after a restart)."""
WORKER_START_TIMEOUT = 60.0
SETTLE_TIMEOUT = 120.0
"""Seconds for every generated id to be stored once the source stops generating."""
STOP_TIMEOUT = 120.0
"""Seconds a SIGTERMed worker may take to exit before it is killed (reported)."""
DESCRIBE_CONCURRENCY = 50
SPREAD_SHARE = 1.3
"""A worker holds no more than this times a fair share once the streams spread."""
SPREAD_TIMEOUT = 90.0
PAUSE_SECONDS = 20.0
"""How long the ``stop`` mode keeps the worker SIGSTOPped."""
OWNER_SETTLE = 10.0
"""Seconds after SIGCONT within which the paused worker must have ended its connections."""
TERM_GOAL = 2.0
"""p99 of each SIGTERMed stream's longest wait of an event to be stored (seconds)."""
KILL_GOAL = 10.0
"""p99 of each SIGKILLed stream's longest wait of an event to be stored (seconds)."""
GOALS = {"kill": KILL_GOAL, "term": TERM_GOAL}
"""The p99 goal of each mode (a pause, ``stop``, has none of its own: it is a death until
the lease says otherwise), for up to :data:`GOAL_STREAMS` streams over two workers."""
GOAL_STREAMS = 200
"""The goals above are the issue's for 200 streams; a larger run prints its figures only."""
HERD_GOAL = 60.0
"""Seconds within which every stream of the herd's killed worker stores again (its next
connection's first event): the goal of starting 1,000 streams on one worker."""
HERD_SETTLE = 30.0
"""Seconds after the herd came back before its storing lag is measured (as section 3
measures the start's, ``--many-settle 30``)."""
HERD_WINDOW = 10.0
"""Seconds of events whose lag is measured."""
HERD_LAG_GOAL = 1.0
"""p99 of that lag, seconds: the start's goal."""
SETTLE_POLL_EVERY = 0.25
"""Seconds between polls of every stream's newest stored id while the lag is measured."""


@dataclass
class ModeResult:
    mode: str
    held: int
    rate: float = RATE
    """Events per second per stream."""
    recovered: list[float] = field(default_factory=list)
    """The longest any event generated after the signal waited to be stored, per stream
    that came back (seconds)."""
    connected: list[float] = field(default_factory=list)
    """Seconds from the signal to the storing of the next connection's first event."""
    stop_seconds: float | None = None
    """SIGTERM to exit (term only)."""
    unsure: int = 0
    """Streams of the victim left out: they reconnected while its holders were read."""
    opened: list[float] = field(default_factory=list)
    """Seconds from the signal to the source seeing the stream's next connection open."""
    sent: list[float] = field(default_factory=list)
    """Seconds from the signal to that connection's first event sent."""
    poll_latency: list[float] = field(default_factory=list)
    """Seconds each poll of the streams' newest ids took to answer (left out of the
    waits, which are taken as the poll is sent)."""
    owners: int | None = None
    """The paused worker's streams still read by its connection from before the pause,
    beside a newer one, :data:`OWNER_SETTLE` seconds after SIGCONT (stop only)."""

    @property
    def not_recovered(self) -> int:
        return self.held - len(self.recovered)


@dataclass
class Workers:
    """The worker processes of the run, started and stopped by pid."""

    running: Stack
    address: str
    task_queue: str
    processes: dict[int, subprocess.Popen] = field(default_factory=dict)
    started: int = 0

    async def start(self) -> int:
        self.started += 1
        log = self.running.workdir / f"worker-failover-{self.started}.log"
        process = spawn(
            [PYTHON, "worker.py"],
            env={**self.running.worker_env(self.address, self.task_queue)},
            log=log,
        )
        self.processes[process.pid] = process

        async def polling() -> bool:
            if process.poll() is not None:
                raise RuntimeError(f"worker exited with {process.returncode}; see {log}")
            return log.exists() and b"worker polling task queue" in log.read_bytes()

        await wait_until(polling, timeout=WORKER_START_TIMEOUT, what="a worker to poll")
        return process.pid

    def kill(self, pid: int) -> None:
        process = self.processes.pop(pid)
        os.kill(pid, signal.SIGKILL)
        process.wait()

    async def term(self, pid: int) -> float:
        """SIGTERM, then seconds until the process exited (killed after STOP_TIMEOUT)."""
        process = self.processes.pop(pid)
        began = time.monotonic()
        os.kill(pid, signal.SIGTERM)
        deadline = began + STOP_TIMEOUT
        while process.poll() is None and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        seconds = time.monotonic() - began
        if process.poll() is None:
            process.kill()
            process.wait()
        return seconds

    async def pause(self, pid: int, seconds: float) -> None:
        """SIGSTOP for ``seconds``, then SIGCONT: a worker paused, not dead."""
        os.kill(pid, signal.SIGSTOP)
        try:
            await asyncio.sleep(seconds)
        finally:
            os.kill(pid, signal.SIGCONT)

    def stop_all(self) -> None:
        for process in self.processes.values():
            stop_process(process, timeout=STOP_TIMEOUT)
        self.processes.clear()


async def failover_rows(
    running: Stack, *, streams: int, timeout: float, herd: bool = False, rate: float = RATE
) -> list[Row]:
    """The failover section: ``streams`` streams, each mode bounded by ``timeout`` s;
    ``herd``: all on one worker, killed beside an idle one (see the module docstring)."""
    _instrument()
    stamp_generation()
    tag = uuid.uuid4().hex[:6]
    names = [f"fo-{tag}-{i}" for i in range(streams)]
    config = SourceStreamConfig(rate=rate, retry_ms=None)
    results: list[ModeResult] = []
    settled_lag: list[float] = []
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=temporal_dev_server(),
        ui=False,
        dev_server_log_level="error",
    )
    address = env.client.service_client.config.target_host
    workers = Workers(running, address, f"bench-failover-{tag}")
    try:
        async with SSESource({name: config for name in names}) as source:
            await workers.start()
            if not herd:
                await workers.start()
            await _start_streams(env.client, source, names, workers.task_queue)
            await _wait_persisting(running, names)
            await _wait_steady(env.client, names, set(workers.processes))

            async def failover(mode: str) -> ModeResult:
                return await _failover(
                    env.client, running, source, workers, names, mode, timeout, rate
                )

            if herd:
                await workers.start()  # idle: the kill comes before its first balance
                results.append(await failover("kill"))
                await asyncio.sleep(HERD_SETTLE)
                settled_lag = await _storing_lag(running, source, names)
            else:
                results.append(await failover("kill"))
                await workers.start()
                await _wait_steady(env.client, names, set(workers.processes))
                await _wait_spread(env.client, names, set(workers.processes))
                results.append(await failover("stop"))
                await _wait_spread(env.client, names, set(workers.processes))
                results.append(await failover("term"))

            for name in names:
                source.inject(name, paused=True)
            ranges = {name: _sent(name, source.truth(name).ids) for name in names}
            settled = await _settle(running, {n: last for n, (_, last) in ranges.items()})
            lost, duplicates = await _count_lost_and_duplicates(running, ranges)
            claimed = await _unrecoverable_gaps(running, names)
    finally:
        workers.stop_all()
        await env.shutdown()
        for name in names:
            CONNECTIONS.pop(name, None)
            GENERATED.pop(name, None)
    goals = GOALS if not herd and streams <= GOAL_STREAMS else {}
    rows: list[Row] = []
    if settled_lag:
        p99 = percentile(settled_lag, 99)
        rows.append(
            Row(
                "10",
                f"{streams} streams @ {rate:g} ev/s on the survivor, {HERD_SETTLE:g} s after: "
                f"an event's lag to be stored over {HERD_WINDOW:g} s, p50 / p99 (ms)",
                f"{percentile(settled_lag, 50) * 1000:.0f} / {p99 * 1000:.0f}",
                f"p99 < {HERD_LAG_GOAL * 1000:.0f} ms",
                verdict(p99 < HERD_LAG_GOAL),
            )
        )
    return rows + _rows(
        results,
        goals=goals,
        herd=herd,
        label=(
            f"{streams} streams @ {rate:g} ev/s on 1 worker, killed beside an idle one"
            if herd
            else f"{streams} streams @ {rate:g} ev/s, 2 workers"
        ),
        lost=lost,
        duplicates=duplicates,
        claimed=claimed,
        settled=settled,
    )


async def _storing_lag(running: Stack, source: SSESource, names: list[str]) -> list[float]:
    """Each event generated over :data:`HERD_WINDOW` s from now: seconds from its
    generation (stamped by the in-process source, :func:`bench.many.stamp_generation`) to
    the first poll that found it stored (the stream's newest stored id reached it)."""
    began = time.time()
    # Ids up to each stream's newest came before the window: no lag is taken for them.
    seen = {name: int(source.describe(name)["newest"]) for name in names}
    end = began + HERD_WINDOW
    arrived: dict[tuple[str, int], float] = {}
    poll = Poll(running.psycopg_url)
    try:
        while time.time() < end + 3.0:
            now = time.time()
            for name, floor in (await poll.floors(names)).items():
                for event_id in range(seen[name] + 1, floor + 1):
                    arrived[(name, event_id)] = now
                seen[name] = max(seen[name], floor)
            await asyncio.sleep(SETTLE_POLL_EVERY)
    finally:
        poll.close()
    final = time.time()
    lags: list[float] = []
    for name in names:
        for event_id, generated in GENERATED[name].items():
            if began <= generated <= end:
                lags.append(arrived.get((name, event_id), final) - generated)
    return lags


def _sent(name: str, ids: list[int]) -> tuple[int, int]:
    """First id the source sent on the stream's first connection, and the last it
    generated (its ids are contiguous; the first connection takes the live route, so
    what was generated before it is no stream's loss)."""
    first = min((c.start_id for c in CONNECTIONS[name] if c.first_event is not None), default=0)
    return (first, ids[-1]) if ids and first else (1, 0)


async def _start_streams(
    client: Client, source: SSESource, names: list[str], task_queue: str
) -> None:
    semaphore = asyncio.Semaphore(START_CONCURRENCY)

    async def start(name: str) -> None:
        spec = StreamSpec(name=name, url=source.url(name), id_order="numeric")
        async with semaphore:
            await client.start_workflow(
                "StreamWorkflow",
                spec,
                id=stream_workflow_id(spec.name),
                task_queue=task_queue,
                result_type=StreamStatus,
            )

    await asyncio.gather(*(start(name) for name in names))


async def _stored_counts(running: Stack, names: list[str]) -> dict[str, int]:
    """Rows per stream (an index lookup each: the poll stays cheap as the log grows);
    none before a worker created the schema."""
    try:
        rows = await pg_query(
            running.psycopg_url,
            "SELECT s, (SELECT max(seq) FROM sse_events e WHERE e.stream = s) "
            "FROM unnest(%s::text[]) AS s",
            (names,),
        )
    except psycopg.errors.UndefinedTable:
        return {}
    return {name: seq for name, seq in rows if seq is not None}


async def _wait_persisting(running: Stack, names: list[str]) -> None:
    async def all_persisting() -> bool:
        return len(await _stored_counts(running, names)) == len(names)

    await wait_until(
        all_persisting, timeout=START_TIMEOUT, what=f"{len(names)} streams to persist", every=1
    )


async def _holders(client: Client, names: list[str]) -> dict[str, int | None]:
    """The pid of the worker running each stream's read attempt (None: none running)."""
    semaphore = asyncio.Semaphore(DESCRIBE_CONCURRENCY)

    async def one(name: str) -> tuple[str, int | None]:
        async with semaphore:
            description = await client.get_workflow_handle(stream_workflow_id(name)).describe()
        for pending in description.raw_description.pending_activities:
            if pending.activity_type.name == "read_stream" and pending.last_worker_identity:
                head = pending.last_worker_identity.split("@", 1)[0]
                if head.isdigit() and pending.state == 2:  # PENDING_ACTIVITY_STATE_STARTED
                    return name, int(head)
        return name, None

    return dict(await asyncio.gather(*(one(name) for name in names)))


async def _wait_steady(client: Client, names: list[str], pids: set[int]) -> None:
    """Every stream has a running read attempt on a live worker, or ``START_TIMEOUT``
    passed (streams a mode did not bring back are reported by it, not waited for)."""
    running = 0

    async def steady() -> bool:
        nonlocal running
        holders = await _holders(client, names)
        running = sum(pid in pids for pid in holders.values())
        return running == len(names)

    try:
        await wait_until(steady, timeout=START_TIMEOUT, what="every stream to run", every=1)
    except TimeoutError:
        logger.warning("%d of %d streams run on a live worker; going on", running, len(names))


async def _wait_spread(client: Client, names: list[str], pids: set[int]) -> None:
    """The restarted worker took its share (workers hand over what exceeds 1.25 times a
    fair share) and nothing moved between two looks, or ``SPREAD_TIMEOUT`` passed: a
    build without that hand-over never spreads, and the next mode then stops the worker
    that holds them all."""
    share = SPREAD_SHARE * len(names) / len(pids)

    last: dict[str, int | None] = {}

    async def spread() -> bool:
        nonlocal last
        holders = await _holders(client, names)
        counts = Counter(pid for pid in holders.values() if pid in pids)
        settled = holders == last  # nothing moved since the last look
        last = holders
        return settled and len(counts) == len(pids) and max(counts.values()) <= share

    try:
        await wait_until(spread, timeout=SPREAD_TIMEOUT, what="the streams to spread", every=3)
    except TimeoutError:
        logger.info("streams did not spread over the workers in %g s; going on", SPREAD_TIMEOUT)
    await asyncio.sleep(2.0)


async def _failover(
    client: Client,
    running: Stack,
    source: SSESource,
    workers: Workers,
    names: list[str],
    mode: str,
    timeout: float,
    rate: float,
) -> ModeResult:
    looked = time.time()
    holders = await _holders(client, names)
    counts = Counter(pid for pid in holders.values() if pid in workers.processes)
    victim, _ = counts.most_common(1)[0]
    began = time.time()
    # A stream that reconnected while the holders were read may no longer be the
    # victim's: left out (counted), so that it is not waited for in vain.
    held = [
        name
        for name, pid in holders.items()
        if pid == victim and not _opened_between(name, looked, began)
    ]
    result = ModeResult(mode=mode, held=len(held), rate=rate, unsure=counts[victim] - len(held))
    following = {name: int(source.describe(name)["newest"]) + 1 for name in held}
    paused = None
    if mode == "kill":
        workers.kill(victim)
        stopping = None
    elif mode == "stop":
        stopping = None
        paused = asyncio.create_task(workers.pause(victim, PAUSE_SECONDS))
    else:
        stopping = asyncio.create_task(workers.term(victim))
    pending, unconnected = set(held), set(held)
    waited: dict[str, float] = {}
    deadline = time.monotonic() + timeout
    poll = Poll(running.psycopg_url)
    try:
        while (pending or unconnected) and time.monotonic() < deadline:
            await asyncio.sleep(POLL_EVERY)
            await _look(poll, result, began, following, pending, unconnected, waited)
    finally:
        poll.close()
    if stopping is not None:
        result.stop_seconds = await stopping
    if paused is not None:
        await paused
        result.owners = await _extra_readers(held, paused=began, resumed=time.time())
    logger.info(
        "failover %s: %d of %d streams back, p99 %.2f s",
        mode,
        len(result.recovered),
        len(held),
        percentile(result.recovered, 99),
    )
    return result


async def _look(
    poll: Poll,
    result: ModeResult,
    began: float,
    following: dict[str, int],
    pending: set[str],
    unconnected: set[str],
    waited: dict[str, float],
) -> None:
    """One poll of the event log: each stream's waits, and which came back.

    Times are taken as each query is sent: its snapshot shows what was committed by then
    (the query's own latency is left out of the waits; :attr:`ModeResult.poll_latency`
    records it)."""
    if pending:
        now = time.time()
        floors = await poll.floors(list(pending))
        result.poll_latency.append(time.time() - now)
        for name, floor in floors.items():
            # The oldest event generated since the signal and not stored yet, and how
            # long it has waited (the source generates ``rate`` a second from ``following``).
            waiting = max(floor + 1, following[name])
            generated = began + (waiting - following[name] + 0.5) / result.rate
            waited[name] = max(waited.get(name, 0.0), now - generated)
            if floor >= following[name] and name not in unconnected:
                if now - generated < CAUGHT_UP:
                    result.recovered.append(waited[name])
                    pending.discard(name)
    targets = {n: first for n in unconnected if (first := _next_first_id(n, began))}
    if targets:
        now = time.time()
        for name in await poll.stored_ids(targets):
            result.connected.append(now - began)
            unconnected.discard(name)
            connection = _next_connection(name, began)
            if connection is not None and connection.first_event is not None:
                result.opened.append(connection.opened - began)
                result.sent.append(connection.first_event - began)


async def _extra_readers(held: list[str], paused: float, resumed: float) -> int:
    """Streams the paused worker held whose connection from before the pause is still
    open beside a newer one, waited for up to :data:`OWNER_SETTLE` seconds after SIGCONT
    (its lease was revoked: it must end its connections, and the fence refuses their
    commits meanwhile).

    Other streams read by two connections for a moment are hand-overs in progress (the
    balancer spreading connections onto the worker that came back, make before break):
    logged, not counted."""
    deadline = time.monotonic() + OWNER_SETTLE
    while True:
        stale = [name for name in held if _left_open(name, paused)]
        if not stale or time.monotonic() > deadline:
            doubled = sum(
                1
                for connections in CONNECTIONS.values()
                if sum(c.closed is None for c in connections) > 1
            )
            logger.info(
                "%.1f s after SIGCONT: %d streams still read from before the pause, %d read "
                "by two connections",
                time.time() - resumed,
                len(stale),
                doubled,
            )
            for name in stale:
                logger.info(
                    "  %s: connections opened at %s s from the pause, still open: %s",
                    name,
                    [round(c.opened - paused, 2) for c in CONNECTIONS[name]],
                    [c.closed is None for c in CONNECTIONS[name]],
                )
            return len(stale)
        await asyncio.sleep(0.5)


def _left_open(name: str, before: float) -> bool:
    """Whether a connection opened before ``before`` is still open beside a newer one."""
    connections = [c for c in CONNECTIONS[name] if c.closed is None]
    return len(connections) > 1 and any(c.opened < before for c in connections)


def _opened_between(name: str, first: float, last: float) -> bool:
    return any(first <= connection.opened <= last for connection in CONNECTIONS[name])


def _next_connection(name: str, after: float) -> Connection | None:
    """The first connection opened after ``after`` that sent an event."""
    for connection in CONNECTIONS[name]:
        if connection.opened > after and connection.first_event is not None:
            return connection
    return None


def _next_first_id(name: str, after: float) -> int | None:
    """The first id of the first connection opened after ``after`` that sent one."""
    connection = _next_connection(name, after)
    return connection.start_id if connection is not None else None


class Poll:
    """The failover's polls of the event log, on one connection held while it polls."""

    def __init__(self, url: str) -> None:
        self._url = url
        self._connection: psycopg.Connection[Any] | None = None

    async def floors(self, names: list[str]) -> dict[str, int]:
        """The newest stored id of each stream (0: none yet)."""
        rows = await self._query(
            "SELECT t.s, (SELECT e.event_id FROM sse_events e WHERE e.stream = t.s "
            "AND e.id_key IS NOT NULL ORDER BY e.id_key DESC LIMIT 1) "
            "FROM unnest(%s::text[]) AS t(s)",
            (names,),
        )
        return {name: int(floor) if floor else 0 for name, floor in rows}

    async def stored_ids(self, targets: dict[str, int]) -> list[str]:
        """Streams whose given id is stored."""
        names = list(targets)
        rows = await self._query(
            "SELECT t.s FROM unnest(%s::text[], %s::text[]) AS t(s, id) WHERE EXISTS "
            "(SELECT 1 FROM sse_events e WHERE e.stream = t.s AND e.event_id = t.id)",
            (names, [str(targets[n]) for n in names]),
        )
        return [row[0] for row in rows]

    async def _query(self, sql: str, params: tuple[Any, ...]) -> list[Any]:
        def run() -> list[Any]:
            if self._connection is None:
                self._connection = psycopg.connect(self._url, autocommit=True)
            return list(self._connection.execute(sql, params).fetchall())

        return await asyncio.to_thread(run)

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()


async def _settle(running: Stack, newest: dict[str, int]) -> bool:
    """Wait until every stream's newest generated id is stored (False: not in time)."""

    poll = Poll(running.psycopg_url)

    async def done() -> bool:
        return len(await poll.stored_ids(newest)) == len(newest)

    try:
        await wait_until(done, timeout=SETTLE_TIMEOUT, what="the run to settle", every=1)
    except TimeoutError:
        return False
    finally:
        poll.close()
    return True


async def _unrecoverable_gaps(running: Stack, names: list[str]) -> int:
    """Gaps the streams declared unrecoverable; each is logged. Nothing was skipped by
    the source, so each one claims a loss that the lost count must back up."""
    rows = await pg_query(
        running.psycopg_url,
        "SELECT stream, kind, start_id, end_id, notice_id, reread_to, truncated, "
        "short_reads, recovered, missing, detail FROM sse_gaps "
        "WHERE stream = ANY(%s) AND state = 'unrecoverable' ORDER BY stream",
        (names,),
    )
    for row in rows[:10]:
        logger.warning("unrecoverable gap: %s", row)
    return len(rows)


async def _count_lost_and_duplicates(
    running: Stack, ranges: dict[str, tuple[int, int]]
) -> tuple[int, int]:
    names = list(ranges)
    lost_rows = await pg_query(
        running.psycopg_url,
        "SELECT coalesce(sum(t.last - t.first + 1 - (SELECT count(DISTINCT e.event_id) "
        "FROM sse_events e WHERE e.stream = t.s AND e.event_id ~ '^[0-9]+$' "
        "AND e.event_id::bigint BETWEEN t.first AND t.last)), 0) "
        "FROM unnest(%s::text[], %s::bigint[], %s::bigint[]) AS t(s, first, last)",
        (names, [ranges[n][0] for n in names], [ranges[n][1] for n in names]),
    )
    duplicate_rows = await pg_query(
        running.psycopg_url,
        "SELECT coalesce(sum(n - 1), 0) FROM (SELECT count(*) AS n FROM sse_events "
        "WHERE stream = ANY(%s) GROUP BY stream, event_id HAVING count(*) > 1) AS d",
        (names,),
    )
    return int(lost_rows[0][0]), int(duplicate_rows[0][0])


def _rows(
    results: list[ModeResult],
    *,
    goals: dict[str, float],
    herd: bool,
    label: str,
    lost: int,
    duplicates: int,
    claimed: int,
    settled: bool,
) -> list[Row]:
    rows: list[Row] = []
    for result in results:
        values = result.recovered
        p50, p99 = percentile(values, 50), percentile(values, 99)
        worst = max(values) if values else float("nan")
        goal, met = "", None
        limit = goals.get(result.mode)
        if limit is not None:
            goal, met = f"p99 <= {limit:g} s", result.not_recovered == 0 and p99 <= limit
        rows.append(
            Row(
                "10",
                f"{label}: {result.mode} -> an event's longest wait to be stored, p50 / p99 / max "
                "(s)",
                f"{p50:.2f} / {p99:.2f} / {worst:.2f}",
                goal,
                verdict(met),
            )
        )
        if result.connected:
            connected = result.connected
            goal, met = "", None
            if herd:
                goal = f"max <= {HERD_GOAL:g} s"
                met = result.not_recovered == 0 and max(connected) <= HERD_GOAL
            rows.append(
                Row(
                    "10",
                    f"{label}: {result.mode} -> next connection's first event stored, "
                    "p50 / p99 / max (s)",
                    f"{percentile(connected, 50):.2f} / {percentile(connected, 99):.2f}"
                    f" / {max(connected):.2f}",
                    goal,
                    verdict(met) if goal else "",
                )
            )
        if result.poll_latency:
            latency = result.poll_latency
            rows.append(
                Row(
                    "10",
                    f"{label}: {result.mode} -> the bench's own poll, answered in p50 / p99 (s)",
                    f"{percentile(latency, 50):.2f} / {percentile(latency, 99):.2f}",
                )
            )
        if result.opened:
            rows.append(
                Row(
                    "10",
                    f"{label}: {result.mode} -> source sees the connection / its first event "
                    "sent, p50 / p99 (s)",
                    f"{percentile(result.opened, 50):.2f} / {percentile(result.opened, 99):.2f}"
                    f" / {percentile(result.sent, 50):.2f} / {percentile(result.sent, 99):.2f}",
                )
            )
        unsure = f" ({result.unsure} more reconnected as it was signalled)" if result.unsure else ""
        rows.append(
            Row(
                "10",
                f"{label}: {result.mode}: streams moved / held / not recovered",
                f"{len(values)} / {result.held} / {result.not_recovered}{unsure}",
            )
        )
        if result.owners is not None:
            rows.append(
                Row(
                    "10",
                    f"{label}: SIGSTOP {PAUSE_SECONDS:g} s, SIGCONT: streams still read from "
                    f"before the pause {OWNER_SETTLE:g} s after",
                    str(result.owners),
                    "0",
                    verdict(result.owners == 0),
                )
            )
        if result.stop_seconds is not None:
            rows.append(
                Row(
                    "10",
                    f"{label}: SIGTERM -> worker exit, {result.held} connections (s)",
                    f"{result.stop_seconds:.2f}",
                )
            )
    rows.append(
        Row(
            "10",
            f"{label}: events lost / duplicates after the run settled",
            f"{lost} / {duplicates}" + ("" if settled else " (not settled in time)"),
            "0 / 0",
            verdict(lost == 0 and duplicates == 0 and settled),
        )
    )
    rows.append(
        Row(
            "10",
            f"{label}: gaps declared unrecoverable (the source skipped nothing)",
            str(claimed),
            "0",
            verdict(claimed == 0),
        )
    )
    return rows
