"""Hostile servers on the real stack: each hurts only its own stream (issue 13).

One worker holds a healthy stream (the demo source, 50 events/s) and, case by case, a
stream whose server misbehaves: a comment built to make a backtracking regex explode, ids
a header cannot carry as text, digits ``int()`` refuses, an id past ``max_id_bytes``, an
event that never ends, ids out of order, an older Mercure hub's truncation header. For
each, the healthy stream must keep committing with its cursor lag under a second while
the bad one misbehaves, and the bad one must end up where the design says: reading,
parked with a message naming the setting, or with its loss counted. Also: NUL in data
(stored exactly), id-less events across reconnects (new ones kept, re-sent ones not),
and rows the database refuses (only that stream's batches fail).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa
from temporalio.client import WorkflowHandle
from temporalio.testing import WorkflowEnvironment

from durable_sse.config.spec import StreamSpec
from durable_sse.ops import control
from durable_sse.source import SourceStreamConfig, SSESource
from durable_sse.stores import Stores
from tests.chaos.harness import in_process_worker, start_stream, status_of, unique, wait_until
from tests.conftest import open_stores

pytestmark = pytest.mark.slow

LAG_LIMIT = 1.0
"""Seconds: the healthy stream's cursor lag must stay under this while a case runs."""

Body = Callable[[bytes | None], AsyncIterator[bytes]]
"""Makes a response body from the request's raw Last-Event-ID (None: none sent)."""


@dataclass
class HostileServer:
    """A tiny HTTP/1.1 server whose paths each serve a canned, endless or odd body."""

    bodies: dict[str, Body] = field(default_factory=dict)
    headers: dict[str, list[tuple[bytes, bytes]]] = field(default_factory=dict)
    """Extra response headers per path."""
    requests: list[tuple[str, bytes | None]] = field(default_factory=list)
    """``(path, raw Last-Event-ID)`` of every request, in order."""
    stop_after: dict[str, int] = field(default_factory=dict)
    """Per path, how many requests get a body; later ones get ``204`` (stop)."""
    port: int = 0
    _server: asyncio.Server | None = None

    async def __aenter__(self) -> HostileServer:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._server.wait_closed(), 2)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}/{path}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            request_line, *lines = head.split(b"\r\n")
            path = request_line.split(b" ")[1].decode().lstrip("/").split("?")[0]
            last_id = None
            for line in lines:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"last-event-id":
                    last_id = value.strip()
            self.requests.append((path, last_id))
            served = sum(1 for seen, _ in self.requests if seen == path)
            if served > self.stop_after.get(path, served):
                writer.write(b"HTTP/1.1 204 No Content\r\n\r\n")
                return
            extra = b"".join(k + b": " + v + b"\r\n" for k, v in self.headers.get(path, []))
            writer.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                b"cache-control: no-cache\r\n" + extra + b"\r\n"
            )
            async for chunk in self.bodies[path](last_id):
                writer.write(chunk)
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()


async def forever(make: Callable[[int], bytes], *, pause: float = 0.01) -> AsyncIterator[bytes]:
    n = 0
    while True:
        n += 1
        yield make(n)
        await asyncio.sleep(pause)


@pytest.fixture(scope="module")
async def queue(address: str, pg_url: str, redis_url: str) -> AsyncIterator[str]:
    name = unique("hostile")
    async with in_process_worker(address, pg_url, redis_url, name):
        yield name


@pytest.fixture(scope="module")
async def log(pg_url: str) -> AsyncIterator[Stores]:
    async with open_stores(pg_url) as event_log:
        yield event_log


@pytest.fixture(scope="module")
async def healthy(
    temporal: WorkflowEnvironment, queue: str, source: SSESource, log: Stores
) -> AsyncIterator[str]:
    name = unique("healthy")
    source.add_stream(name, SourceStreamConfig(rate=50, keepalive=0.5, retry_ms=None))
    spec = StreamSpec(name=name, url=source.url(name), id_order="numeric")
    handle = await start_stream(temporal.client, spec, queue)

    async def flowing() -> bool:
        return (await newest_row(log, name))[0] > 50

    await wait_until(flowing, timeout=60, what="the healthy stream to flow")
    yield name
    await handle.signal("stop")
    await asyncio.wait_for(handle.result(), 60)


async def newest_row(log: Stores, stream: str) -> tuple[int, float]:
    """``(rows, seconds since the newest row was received)`` of a stream."""

    def query() -> tuple[int, float]:
        with log.database.engine.connect() as connection:
            count, newest = connection.execute(
                sa.text(
                    "SELECT count(*), extract(epoch from now() - max(received_at)) "
                    "FROM sse_events WHERE stream = :s"
                ),
                {"s": stream},
            ).one()
        return int(count), float(newest or 0.0)

    return await asyncio.to_thread(query)


async def while_watching(
    log: Stores, healthy: str, act: Callable[[], Awaitable[None]]
) -> list[float]:
    """Run ``act`` while sampling the healthy stream's lag; the lags seen (rows must grow)."""
    lags: list[float] = []
    done = asyncio.Event()

    async def sample() -> None:
        while not done.is_set():
            lags.append((await newest_row(log, healthy))[1])
            await asyncio.sleep(0.2)

    rows_before = (await newest_row(log, healthy))[0]
    sampler = asyncio.create_task(sample())
    try:
        await act()
        await asyncio.sleep(1.0)  # and a little after
    finally:
        done.set()
        await sampler
    rows_after = (await newest_row(log, healthy))[0]
    assert rows_after > rows_before + 25, "the healthy stream stopped committing"
    assert lags and max(lags) < LAG_LIMIT, f"healthy cursor lag reached {max(lags):.2f} s"
    return lags


def rows_reach(log: Stores, stream: str, count: int) -> Callable[[], Awaitable[bool]]:
    """A check: the stream has ``count`` rows or more."""

    async def check() -> bool:
        return (await newest_row(log, stream))[0] >= count

    return check


async def wait_watching_healthy(
    log: Stores,
    healthy: str,
    check: Callable[[], Awaitable[bool]],
    *,
    timeout: float,
    what: str,
    handle: WorkflowHandle,
) -> list[float]:
    """``wait_until`` the hostile stream's ``check`` holds, ``while_watching`` the healthy one."""

    async def waited() -> None:
        await wait_until(check, timeout=timeout, what=what, handle=handle)

    return await while_watching(log, healthy, waited)


async def start_on(
    temporal: WorkflowEnvironment,
    queue: str,
    server: HostileServer,
    path: str,
    id_order: str,
    *,
    prefix: str | None = None,
) -> tuple[str, WorkflowHandle]:
    """A new stream (named after ``prefix``, else ``path``) reading ``path`` of ``server``."""
    name = f"{prefix or path}-" + uuid.uuid4().hex[:6]
    spec = StreamSpec(name=name, url=server.url(path), id_order=id_order)
    return name, await start_stream(temporal.client, spec, queue)


async def stop(handle: WorkflowHandle) -> None:
    await handle.signal("stop")
    await asyncio.wait_for(handle.result(), 60)


async def test_a_comment_built_to_backtrack_is_matched_fast_and_is_a_notice(
    temporal: WorkflowEnvironment, queue: str, log: Stores, healthy: str
) -> None:
    evil = ": dropped " + ",".join(str(i) for i in range(100, 140)) + " (backpressure)\n"
    near_misses = ": " + "dropped 1, " * 300 + "nothing\n"

    async def body(last: bytes | None) -> AsyncIterator[bytes]:
        start = int(last) if last else 0
        async for chunk in forever(
            lambda n: (near_misses * 20 + f"id: {start + n}\ndata: x\n\n" + evil).encode(),
            pause=0.005,
        ):
            yield chunk

    async with HostileServer({"regex": body}) as server:
        name, handle = await start_on(temporal, queue, server, "regex", "numeric")

        async def seen() -> bool:
            return (await status_of(handle)).counters.drop_signals >= 3

        await wait_watching_healthy(
            log, healthy, seen, timeout=30, what="the drop notices", handle=handle
        )
        await stop(handle)


async def test_ids_a_header_cannot_carry_as_text_resume_as_utf8_bytes(
    temporal: WorkflowEnvironment, queue: str, log: Stores, healthy: str
) -> None:
    """Browsers send a non-ASCII id's UTF-8 bytes; so do we, and the stream resumes."""

    async def body(last: bytes | None) -> AsyncIterator[bytes]:
        start = int(last.decode().split("-")[1]) if last else 0
        for n in range(start + 1, start + 21):  # then the server closes: a reconnect
            yield f"id: café-{n}\ndata: {n}\n\n".encode()
            await asyncio.sleep(0.01)

    async with HostileServer({"cafe": body}) as server:
        name, handle = await start_on(temporal, queue, server, "cafe", "natural")

        await wait_watching_healthy(
            log,
            healthy,
            rows_reach(log, name, 100),
            timeout=60,
            what="100 events over reconnects",
            handle=handle,
        )
        await stop(handle)
    sent = [last for path, last in server.requests if path == "cafe" and last is not None]
    assert sent and all(last.startswith("café-".encode()) for last in sent)
    rows = await newest_row(log, name)
    assert rows[0] >= 100


async def test_ids_that_look_like_digits_but_are_not_counters_are_counted_not_fatal(
    temporal: WorkflowEnvironment, queue: str, log: Stores, healthy: str
) -> None:
    odd = ["²", "١٢", "9" * 2048]

    async def body(last: bytes | None) -> AsyncIterator[bytes]:
        n = int(last) if last and last.isdigit() and len(last) < 10 else 0
        while True:
            n += 1
            yield f"id: {n}\ndata: x\n\n".encode()
            if n % 7 == 0:
                yield f"id: {odd[n % 3]}\ndata: odd\n\n".encode()
            await asyncio.sleep(0.01)

    async with HostileServer({"digits": body}) as server:
        name = "digits-" + uuid.uuid4().hex[:6]
        spec = StreamSpec(
            name=name,
            url=server.url("digits"),
            id_order="natural",
            contiguous_ids=True,
            max_id_bytes=2048,
        )
        handle = await start_stream(temporal.client, spec, queue)

        await wait_watching_healthy(
            log, healthy, rows_reach(log, name, 80), timeout=60, what="80 rows", handle=handle
        )
        status = await status_of(handle)
        assert status.state == "reading" and status.counters.failures == 0
        await stop(handle)


@pytest.mark.parametrize(
    ("case", "make", "setting"),
    [
        ("long-id", lambda n: f"id: {'x' * 3000}\ndata: x\n\n".encode(), "max_id_bytes"),
        ("endless", lambda n: b"data: " + b"y" * 65536 + b"\n", "max_event_bytes"),
    ],
)
async def test_an_id_or_event_over_its_limit_parks_only_its_stream(
    temporal: WorkflowEnvironment,
    queue: str,
    log: Stores,
    healthy: str,
    case: str,
    make: Callable[[int], bytes],
    setting: str,
) -> None:
    async def body(last: bytes | None) -> AsyncIterator[bytes]:
        yield b"id: 1\ndata: fine\n\n"
        async for chunk in forever(make, pause=0.0005):
            yield chunk

    rss_before = resident_mb()
    async with HostileServer({case: body}) as server:
        name, handle = await start_on(temporal, queue, server, case, "natural")

        async def is_parked() -> bool:
            return (await status_of(handle)).state == "parked"

        await wait_watching_healthy(
            log, healthy, is_parked, timeout=60, what=f"{case} to park", handle=handle
        )
        status = await status_of(handle)
        assert status.last_error and setting in status.last_error
        await stop(handle)
    assert (await newest_row(log, name))[0] == 1  # the cursor stays before the bad event
    assert resident_mb() - rss_before < 200, "the worker's memory grew with the bad stream"


async def test_ids_out_of_order_are_counted_and_the_stream_reads_on(
    temporal: WorkflowEnvironment, queue: str, log: Stores, healthy: str
) -> None:
    async def body(last: bytes | None) -> AsyncIterator[bytes]:
        # ULIDs under the natural order: "10AA" sorts after "9ZZZ" as 10 > 9.
        async for chunk in forever(
            lambda n: f"id: {n}ZZZ\ndata: a\n\nid: {n - 1}AAA\ndata: b\n\n".encode()
        ):
            yield chunk

    async with HostileServer({"order": body}) as server:
        name, handle = await start_on(temporal, queue, server, "order", "natural")

        await wait_watching_healthy(
            log, healthy, rows_reach(log, name, 60), timeout=60, what="60 rows", handle=handle
        )
        await handle.signal("pause")  # ends the connection: its counts reach the status

        async def counted() -> bool:
            return (await status_of(handle)).counters.ids_out_of_order > 0

        await wait_until(counted, timeout=30, what="ids out of order counted", handle=handle)
        await stop(handle)


async def test_an_older_mercure_hub_truncation_header_counts_the_loss(
    temporal: WorkflowEnvironment, queue: str, log: Stores, healthy: str
) -> None:
    """Older hubs send ``Last-Event-ID`` (not ``Mercure-Last-Event-ID``) on the response;
    unlike the cursor sent, it says the history no longer reaches it."""
    state = {"connections": 0}

    async def body(last: bytes | None) -> AsyncIterator[bytes]:
        state["connections"] += 1
        start = int(last) if last else 0
        if state["connections"] > 1:
            start += 10  # the hub lost ten events: its header says where it resumed
        for n in range(start + 1, start + 31):
            yield f"id: {n}\ndata: x\n\n".encode()
            await asyncio.sleep(0.01)

    async with HostileServer({"hub": body}) as server:
        server.headers["hub"] = [(b"last-event-id", b"earliest")]
        name = "hub-" + uuid.uuid4().hex[:6]
        spec = StreamSpec(
            name=name,
            url=server.url("hub"),
            id_order="numeric",
            mercure_last_event_id=True,
            contiguous_ids=True,
        )
        handle = await start_stream(temporal.client, spec, queue)

        async def lost() -> bool:
            summary = await log.gap_store.gap_summary(name, "numeric")
            return summary.totals.unrecoverable >= 1

        await wait_watching_healthy(
            log, healthy, lost, timeout=60, what="the lost events counted", handle=handle
        )
        summary = await log.gap_store.gap_summary(name, "numeric")
        assert summary.totals.events_unrecoverable >= 10
        await stop(handle)


async def test_nul_in_data_is_stored_exactly(
    temporal: WorkflowEnvironment, queue: str, log: Stores, healthy: str
) -> None:
    """Issue 13 case 7: a WHATWG client delivers U+0000; so does the event log."""

    async def body(last: bytes | None) -> AsyncIterator[bytes]:
        start = int(last) if last else 0
        for n in range(start + 1, start + 21):  # then the server closes: a reconnect
            yield f"id: {n}\ndata: a\0b {n}\n\n".encode()
            await asyncio.sleep(0.01)

    async with HostileServer({"nul": body}) as server:
        name, handle = await start_on(temporal, queue, server, "nul", "numeric")

        await wait_watching_healthy(
            log,
            healthy,
            rows_reach(log, name, 60),
            timeout=60,
            what="60 events over reconnects",
            handle=handle,
        )
        await stop(handle)
    events = await log.reads.events(name, limit=60)
    assert [event.data for event in events] == [f"a\0b {n}" for n in range(1, 61)]


async def test_an_idless_event_after_a_reconnect_is_kept_and_a_resent_one_is_not(
    temporal: WorkflowEnvironment, queue: str, log: Stores, healthy: str
) -> None:
    """Issue 13 case 8 on the real stack: the first connection reads ``5: a`` and an
    id-less ``b``; every later one resumes after 5 and reads ``b`` again and a new ``c``."""
    connections = {"count": 0}

    async def body(last: bytes | None) -> AsyncIterator[bytes]:
        connections["count"] += 1
        if last is None:
            yield b"id: 5\ndata: a\n\ndata: b\n\n"
        else:
            yield b"data: b\n\ndata: c\n\n"
        await asyncio.sleep(0.05)

    async with HostileServer({"idless": body}) as server:
        name, handle = await start_on(temporal, queue, server, "idless", "numeric")

        async def enough() -> bool:
            return connections["count"] >= 4

        await wait_watching_healthy(
            log, healthy, enough, timeout=60, what="four connections", handle=handle
        )
        await stop(handle)
    rows = [(e.event_id, e.event_ord, e.data) for e in await log.reads.events(name)]
    assert rows == [("5", 0, "a"), ("5", 1, "b"), ("5", 2, "c")]


async def test_a_server_that_restarts_its_id_counter_loses_nothing(
    temporal: WorkflowEnvironment, queue: str, log: Stores, healthy: str
) -> None:
    """Issue 24 item 7 end to end: ids 1..5 (``a1``..``a5``), a close, then, to
    ``Last-Event-ID: 5``, ids 1..3 with new data and no more. All 8 rows are stored, and
    the status (the query, ``durable-sse status --json``, the Web UI's details) counts 3
    reused ids and no duplicates; the cursor stays at 5."""
    connections = {"count": 0}

    async def body(last: bytes | None) -> AsyncIterator[bytes]:
        connections["count"] += 1
        if connections["count"] == 1:
            yield b"retry: 50\n" + b"".join(b"id: %d\ndata: a%d\n\n" % (n, n) for n in range(1, 6))
            return
        if connections["count"] == 2:
            yield b"".join(b"id: %d\ndata: b%d\n\n" % (n, n) for n in range(1, 4))
        while True:  # the restarted server has nothing newer
            yield b": keep-alive\n\n"
            await asyncio.sleep(0.2)

    async with HostileServer({"restart": body}) as server:
        name, handle = await start_on(temporal, queue, server, "restart", "numeric")

        async def eight() -> bool:
            return (await newest_row(log, name))[0] >= 8

        await wait_watching_healthy(log, healthy, eight, timeout=60, what="8 rows", handle=handle)
        await handle.signal("pause")  # ends the connection: its counts reach the status

        async def counted() -> bool:
            return (await status_of(handle)).counters.ids_reused == 3

        await wait_until(counted, timeout=30, what="3 reused ids counted", handle=handle)
        status = await status_of(handle)
        assert (status.counters.events_persisted, status.counters.duplicates) == (8, 0)
        assert status.live_cursor == "5"
        assert server.requests[1] == ("restart", b"5")
        row = await control.stream_status(temporal.client, name)
        assert row["counters"]["ids_reused"] == 3
        details = str((await handle.query("__temporal_workflow_metadata")).current_details)
        assert "ids reused 3" in details, details
        await stop(handle)
    rows = [(e.event_id, e.data) for e in await log.reads.events(name)]
    assert rows == [
        *((str(n), f"a{n}") for n in range(1, 6)),
        ("1", "b1"),
        ("2", "b2"),
        ("3", "b3"),
    ]


async def test_a_servers_retry_of_years_is_cut_to_max_retry_delay(
    temporal: WorkflowEnvironment, queue: str
) -> None:
    """Issue 24, item 6: ``retry: 99999999999`` (about three years), then the server
    closes. The stream waits ``max_retry_delay`` (5 minutes by default) and says so."""

    async def body(last: bytes | None) -> AsyncIterator[bytes]:
        yield b"retry: 99999999999\n\n"

    async with HostileServer({"retry": body}) as server:
        name, handle = await start_on(temporal, queue, server, "retry", "numeric")

        async def waiting() -> bool:
            return (await status_of(handle)).state == "waiting"

        await wait_until(waiting, timeout=30, what="the stream to wait", handle=handle)
        status = await status_of(handle)
        assert status.next_reconnect_at is not None
        wait = datetime.fromisoformat(status.next_reconnect_at) - datetime.now(UTC)
        assert timedelta(0) < wait <= timedelta(seconds=300)
        assert status.retry_capped_from_ms == 99_999_999_999
        assert status.last_outcome == "dropped"
        await stop(handle)


async def test_each_reconnect_of_a_stream_without_ids_is_a_counted_loss_window(
    temporal: WorkflowEnvironment, queue: str, log: Stores, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 24, item 8: id-less events, and the server closes each connection after a
    short while; no reconnect can resume. Each one after the first records a gap of kind
    ``no_resume`` (unknown size), counted in status; the stream warns once."""
    caplog.set_level(logging.WARNING)
    sent = itertools.count(1)

    async def body(last: bytes | None) -> AsyncIterator[bytes]:
        assert last is None  # nothing to resume from: it never sends one
        for _ in range(5):
            yield f"data: event {next(sent)}\n\n".encode()
            await asyncio.sleep(0.1)

    async with HostileServer({"idless": body}, stop_after={"idless": 5}) as server:
        name, handle = await start_on(temporal, queue, server, "idless", "numeric", prefix="noids")

        async def stopped() -> bool:
            return (await status_of(handle)).state == "stopped-by-server"

        await wait_until(stopped, timeout=60, what="five connections, then 204", handle=handle)
        status = await status_of(handle)
        await stop(handle)
    c = status.counters
    assert (c.connections, c.events_persisted) == (6, 25)  # five with events, then 204
    assert c.reconnects_without_cursor == 4  # the first connection is no loss window
    assert (c.gaps_unrecoverable, c.gaps_unknown_size, c.events_unrecoverable) == (4, 4, 0)
    kinds = [(g.kind, g.state, g.missing) for g in await log.gap_store.gaps(name)]
    assert kinds == [("no_resume", "unrecoverable", None)] * 4
    warned = [r.getMessage() for r in caplog.records if "no ids to resume from" in r.getMessage()]
    assert len(warned) == 1 and "the server must send ids" in warned[0]


async def test_rows_the_database_refuses_park_only_their_own_stream(
    temporal: WorkflowEnvironment, queue: str, log: Stores, healthy: str
) -> None:
    """Issue 13 case 4 / invariant 7: a trigger refuses one stream's rows. Its batches
    share group transactions with the healthy stream's; those commit, the refused ones
    fail alone. Writing them again would be refused again, so the stream parks with the
    database's message in its status (not an attempt retried out of sight), and once the
    database takes the rows, ``resume`` reads them again: nothing is lost."""
    name = "refused-" + uuid.uuid4().hex[:6]
    trigger = f"refuse_{name.replace('-', '_')}"

    def ddl(*statements: str) -> None:
        with log.database.engine.begin() as connection:
            for statement in statements:
                connection.exec_driver_sql(statement)

    await asyncio.to_thread(
        ddl,
        "CREATE OR REPLACE FUNCTION durable_sse_test_refuse() RETURNS trigger "
        "LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'refused by the test'; END $$",
        f"CREATE TRIGGER {trigger} BEFORE INSERT ON sse_events FOR EACH ROW "
        f"WHEN (NEW.stream = '{name}') EXECUTE FUNCTION durable_sse_test_refuse()",
    )
    try:

        async def body(last: bytes | None) -> AsyncIterator[bytes]:
            start = int(last) if last else 0
            async for chunk in forever(lambda n: f"id: {start + n}\ndata: x\n\n".encode()):
                yield chunk

        async with HostileServer({"refused": body}) as server:
            spec = StreamSpec(name=name, url=server.url("refused"), id_order="numeric")
            handle = await start_stream(temporal.client, spec, queue)

            async def is_parked() -> bool:
                return (await status_of(handle)).state == "parked"

            await wait_watching_healthy(
                log,
                healthy,
                is_parked,
                timeout=60,
                what="the refused stream to park",
                handle=handle,
            )
            status = await status_of(handle)
            assert status.last_error is not None
            assert f"refused a batch of stream '{name}'" in status.last_error
            assert "refused by the test" in status.last_error
            assert "parked until resumed" in status.last_error
            assert (await newest_row(log, name))[0] == 0

            await asyncio.to_thread(ddl, f"DROP TRIGGER {trigger} ON sse_events")
            await handle.signal("resume")

            async def stored() -> bool:
                return (await newest_row(log, name))[0] >= 50

            await wait_until(stored, timeout=60, what="rows after resume", handle=handle)
            await stop(handle)
    finally:
        await asyncio.to_thread(ddl, f"DROP TRIGGER IF EXISTS {trigger} ON sse_events")
    ids = [int(event.event_id) for event in await log.reads.events(name, limit=100_000)]
    assert ids[0] == 1 and ids == list(range(1, len(ids) + 1))  # from the first id, no hole


def resident_mb() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0
