from __future__ import annotations

import asyncio
import logging
import random
import socket
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from redis.asyncio import Redis

from durable_sse.cursor.l2 import (
    ADVANCE_LUA,
    SORT_KEY_LUA,
    RedisCursors,
    cursor_key,
    cursor_value,
)
from durable_sse.ids import IdOrder, compare_ids, sort_key
from tests.services import throwaway_redis

REDIS_SERVER = Path(__file__).resolve().parents[2] / ".venv" / "bin" / "redis-server"
TTL_MS = 7 * 86_400_000


@pytest.fixture
async def raw(redis_url: str) -> AsyncIterator[Redis]:
    client = Redis.from_url(redis_url)
    yield client
    await client.aclose()


@pytest.fixture
async def cursors(redis_url: str) -> AsyncIterator[RedisCursors]:
    store = RedisCursors(redis_url)
    yield store
    await store.close()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# -- the Lua sort key is ids.sort_key ------------------------------------------------

_ALPHABET = list("0123456789" * 4) + list("#-:._ aZz~") + ["é", "日", "😀", "\x7f", "\x01"]


def _random_id(rng: random.Random) -> str:
    parts: list[str] = []
    for _ in range(rng.randint(0, 4)):
        kind = rng.random()
        if kind < 0.4:
            # digit runs around the length boundaries, with and without leading zeros
            length = rng.choice([1, 1, 2, 3, 4, 5, 9, 10, 11, 19, 20])
            run = "".join(rng.choice("0123456789") for _ in range(length))
            if rng.random() < 0.3:
                run = "0" * rng.randint(1, 3) + run
            parts.append(run)
        elif kind < 0.6:
            parts.append(rng.choice(["9", "99", "999", "1000", "10", "100", "0", "00"]))
        else:
            parts.append("".join(rng.choice(_ALPHABET) for _ in range(rng.randint(1, 4))))
    return "".join(parts)


def _id_corpus(seed: int, count: int) -> list[str]:
    rng = random.Random(seed)
    special = [
        "",
        "0",
        "00",
        "9",
        "10",
        "999",
        "1000",
        "0999",
        "a#b",
        "#",
        "1#2",
        "171-9",
        "171-10",
        "1700000000:9",
        "1700000000:10",
        "日本123",
        "x\x00y1",
        "1" * 9999,
        "1" * 10000,
        "0" + "1" * 9999,
        "a" + "2" * 10000 + "b",
        "01ARZ3NDEKTSV4RRFFQ69G5FAV",
    ]
    return special + [_random_id(rng) for _ in range(count)]


@pytest.mark.parametrize("order", [order.value for order in IdOrder])
async def test_lua_sort_key_equals_python(raw: Redis, order: str) -> None:
    ids = _id_corpus(seed=len(order), count=3000)
    sha = await raw.script_load(SORT_KEY_LUA + "\nreturn sort_key(ARGV[1], ARGV[2])")
    pipe = raw.pipeline(transaction=False)
    for event_id in ids:
        pipe.evalsha(sha, 0, event_id, order)
    lua_keys = await pipe.execute()
    mismatches = [
        (event_id, key, sort_key(event_id, order))
        for event_id, key in zip(ids, lua_keys, strict=True)
        if key != sort_key(event_id, order)
    ]
    assert mismatches == []


@pytest.mark.parametrize("order", [order.value for order in IdOrder])
async def test_lua_compare_agrees_with_python_on_random_pairs(
    raw: Redis, stream_name: str, order: str
) -> None:
    rng = random.Random(7)
    ids = [event_id for event_id in _id_corpus(seed=11, count=1500) if event_id]
    pairs = [(rng.choice(ids), rng.choice(ids)) for _ in range(3000)]
    # the sorted neighbours are where off-by-one ordering bugs live
    ordered = sorted(set(ids), key=lambda event_id: sort_key(event_id, order))
    pairs += list(zip(ordered, ordered[1:], strict=False))
    pairs += [(b, a) for a, b in zip(ordered, ordered[1:], strict=False)]
    sha = await raw.script_load(ADVANCE_LUA)
    prefix = f"{stream_name}#"
    pipe = raw.pipeline(transaction=False)
    keys = []
    for index, (first, second) in enumerate(pairs):
        key = cursor_key(f"{stream_name}-{index}")
        keys.append(key)
        pipe.evalsha(sha, 1, key, TTL_MS, prefix, first, order)
        pipe.evalsha(sha, 1, key, TTL_MS, prefix, second, order)
    replies = await pipe.execute()
    for start in range(0, len(keys), 1000):
        await raw.delete(*keys[start : start + 1000])
    disagreements = [
        (first, second)
        for (first, second), (moved_first, moved_second) in zip(
            pairs, zip(replies[::2], replies[1::2], strict=True), strict=True
        )
        if moved_first != [1] or bool(moved_second[0]) != (compare_ids(second, first, order) > 0)
    ]
    assert disagreements == []


# -- forward-only under contention ----------------------------------------------------


def _drifting_id(rng: random.Random, progress: float, top: int = 20_000) -> int:
    """Mostly near a point that climbs through 1..top (crossing 999/1000 and 9999/10000),
    sometimes anywhere: forward and backward writes mixed."""
    if rng.random() < 0.2:
        return rng.randint(1, top)
    centre = int(progress * top)
    return min(top, max(1, centre + rng.randint(-1500, 1500)))


async def _sample_monotonic(
    raw: Redis, key: str, prefix: bytes, done: asyncio.Event
) -> tuple[int, int]:
    """Sample the key until ``done``; return (samples, regressions seen)."""
    samples = regressions = 0
    best = 0
    while not done.is_set():
        value = await raw.get(key)
        if value is not None:
            number = int(value[len(prefix) :])
            samples += 1
            if number < best:
                regressions += 1
            best = max(best, number)
        await asyncio.sleep(0)
    return samples, regressions


async def test_script_never_moves_backward_under_contention(
    raw: Redis, redis_url: str, stream_name: str
) -> None:
    writers, per_writer, chunk = 8, 12_500, 250
    key = cursor_key(stream_name)
    stores = [RedisCursors(redis_url, timeout=5.0) for _ in range(writers)]
    written: list[int] = []
    done = asyncio.Event()

    async def write(index: int, store: RedisCursors) -> None:
        rng = random.Random(index)
        sha = await raw.script_load(ADVANCE_LUA)
        connection = store._redis  # each writer: its own connection pool
        for start in range(0, per_writer, chunk):
            pipe = connection.pipeline(transaction=False)
            for step in range(start, start + chunk):
                number = _drifting_id(rng, step / per_writer)
                written.append(number)
                pipe.evalsha(sha, 1, key, TTL_MS, f"{stream_name}#", str(number), "numeric")
            await pipe.execute()
            # and the production path, interleaved
            number = _drifting_id(rng, start / per_writer)
            written.append(number)
            assert await store.advance(stream_name, str(number), "numeric") is not None

    sampler = asyncio.create_task(_sample_monotonic(raw, key, f"{stream_name}#".encode(), done))
    try:
        await asyncio.gather(*(write(i, store) for i, store in enumerate(stores)))
    finally:
        done.set()
        samples, regressions = await sampler
        for store in stores:
            await store.close()
    assert len(written) >= 100_000
    assert samples > 0
    assert regressions == 0
    assert await raw.get(key) == cursor_value(stream_name, str(max(written))).encode()
    assert 0 < await raw.pttl(key) <= TTL_MS
    await raw.delete(key)


async def test_get_then_set_does_regress_under_the_same_load(
    raw: Redis, redis_url: str, stream_name: str
) -> None:
    """The control: without the script, concurrent writers move the cursor backward."""
    writers, per_writer = 8, 1_500
    key = cursor_key(stream_name)
    prefix = f"{stream_name}#"
    clients = [Redis.from_url(redis_url) for _ in range(writers)]
    regressions = 0

    async def write(index: int, client: Redis) -> None:
        nonlocal regressions
        rng = random.Random(100 + index)
        for step in range(per_writer):
            number = _drifting_id(rng, step / per_writer)
            current = await client.get(key)
            if current is None or number > int(current[len(prefix) :]):
                # SET ... GET reports what this write overwrote: exact regression detection
                overwritten = await client.set(key, f"{prefix}{number}", get=True)
                if overwritten is not None and int(overwritten[len(prefix) :]) > number:
                    regressions += 1

    try:
        await asyncio.gather(*(write(i, client) for i, client in enumerate(clients)))
    finally:
        for client in clients:
            await client.aclose()
        await raw.delete(key)
    assert regressions > 0


# -- namespacing, TTL, reads -----------------------------------------------------------


async def test_namespacing(
    cursors: RedisCursors, raw: Redis, stream_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    a, ab, a_hash_b = f"{stream_name}a", f"{stream_name}ab", f"{stream_name}a#b"
    assert await cursors.advance(ab, "5", "numeric") is True
    assert await cursors.advance(a_hash_b, "6", "numeric") is True
    assert await cursors.get(a) is None
    assert await cursors.get(ab) == "5"
    assert await cursors.get(a_hash_b) == "6"

    # a value that belongs to another stream is a miss (logged) and gets overwritten
    await raw.set(cursor_key(a), cursor_value(ab, "99"))
    with caplog.at_level(logging.WARNING, logger="durable_sse.cursor.l2"):
        assert await cursors.get(a) is None
    assert "another stream" in caplog.text
    assert await cursors.advance(a, "1", "numeric") is True
    assert await cursors.get(a) == "1"

    # ids containing '#' round-trip: the prefix is stripped by length, not split on '#'
    assert await cursors.advance(a, "x#2#3", "natural") is True
    assert await cursors.get(a) == "x#2#3"
    assert await cursors.advance(a, "x#2#4", "natural") is True
    assert await cursors.advance(a, "x#2#3", "natural") is False
    assert await cursors.get(a) == "x#2#4"
    await raw.delete(cursor_key(a), cursor_key(ab), cursor_key(a_hash_b))


async def test_get_many_is_per_stream(cursors: RedisCursors, raw: Redis, stream_name: str) -> None:
    names = [f"{stream_name}-{i}" for i in range(5)]
    await cursors.advance_many([(name, f"id#{i}", "natural") for i, name in enumerate(names[:3])])
    await raw.set(cursor_key(names[3]), cursor_value(names[0], "foreign"))
    found = await cursors.get_many(names)
    assert found == {
        names[0]: "id#0",
        names[1]: "id#1",
        names[2]: "id#2",
        names[3]: None,
        names[4]: None,
    }
    assert await cursors.get_many([]) == {}
    await raw.delete(*(cursor_key(name) for name in names))


async def test_advance_many_moves_only_forward(
    cursors: RedisCursors, raw: Redis, stream_name: str
) -> None:
    one, two = f"{stream_name}-1", f"{stream_name}-2"
    await cursors.advance(one, "1000", "numeric")
    moved = await cursors.advance_many(
        [
            (one, "999", "numeric"),
            (two, "5", "numeric"),
            (two, "7", "numeric"),
            (two, "6", "numeric"),
        ]
    )
    assert moved == {one: False, two: True}
    assert await cursors.get_many([one, two]) == {one: "1000", two: "7"}
    await raw.delete(cursor_key(one), cursor_key(two))


async def test_ttl_set_and_kept(raw: Redis, redis_url: str, stream_name: str) -> None:
    store = RedisCursors(redis_url, ttl_days=2.0)
    key = cursor_key(stream_name)
    two_days = 2 * 86_400_000
    try:
        assert await store.advance(stream_name, "10", "numeric") is True
        assert 0 < await raw.pttl(key) <= two_days
        await raw.pexpire(key, 60_000)
        assert await store.advance(stream_name, "9", "numeric") is False
        assert 60_000 < await raw.pttl(key) <= two_days  # refused, yet refreshed
        await raw.pexpire(key, 60_000)
        assert await store.advance(stream_name, "11", "numeric") is True
        assert 60_000 < await raw.pttl(key) <= two_days
    finally:
        await store.close()
        await raw.delete(key)


# -- submit: coalesced, non-blocking ---------------------------------------------------


async def test_submits_coalesce(cursors: RedisCursors, raw: Redis, stream_name: str) -> None:
    for number in range(1, 10_001):
        cursors.submit(stream_name, str(number), "numeric")
        if number % 100 == 0:
            await asyncio.sleep(0)  # let the flusher run, as a reader between batches would
    await cursors.flush()
    assert await cursors.get(stream_name) == "10000"
    assert 1 <= cursors.writes <= 200
    assert cursors.write_failures == 0
    # an older submit after a newer one never wins, even when it lands in its own flush
    cursors.submit(stream_name, "5", "numeric")
    await cursors.flush()
    assert await cursors.get(stream_name) == "10000"
    await raw.delete(cursor_key(stream_name))


async def test_submits_of_many_streams(cursors: RedisCursors, raw: Redis, stream_name: str) -> None:
    names = [f"{stream_name}-{i}" for i in range(600)]  # more than one script call's worth
    for name in names:
        cursors.submit(name, "3", "numeric")
        cursors.submit(name, "2", "numeric")
    await cursors.flush()
    found = await cursors.get_many(names)
    assert set(found.values()) == {"3"}
    assert cursors.writes == len(names)
    await raw.delete(*(cursor_key(name) for name in names))


# -- Redis down ------------------------------------------------------------------------


def _warnings(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [
        record
        for record in caplog.records
        if record.name == "durable_sse.cursor.l2" and record.levelno == logging.WARNING
    ]


async def test_redis_down_closed_port(stream_name: str, caplog: pytest.LogCaptureFixture) -> None:
    timeout = 0.3
    store = RedisCursors(f"redis://127.0.0.1:{free_port()}/0", timeout=timeout)
    caplog.set_level(logging.INFO, logger="durable_sse.cursor.l2")
    try:
        started = time.monotonic()
        for number in range(200):
            store.submit(stream_name, str(number), "numeric")  # never blocks, never raises
        assert time.monotonic() - started < timeout + 2.0
        for call in (
            store.get(stream_name),
            store.get_many([stream_name, "other"]),
            store.advance(stream_name, "1", "numeric"),
            store.advance_many([(stream_name, "2", "numeric")]),
            store.flush(),
        ):
            started = time.monotonic()
            result = await call
            assert time.monotonic() - started < timeout + 2.0
            assert result in (None, {stream_name: None, "other": None}, {stream_name: None})
        assert store.write_failures >= 3
        assert store.writes == 0
        assert len(_warnings(caplog)) == 1
    finally:
        await store.close()


async def test_redis_unresponsive_is_bounded_by_timeout(stream_name: str) -> None:
    """A server that accepts and never answers: every call returns within the timeout."""
    accepted: list[asyncio.StreamWriter] = []

    async def swallow(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(writer)

    server = await asyncio.start_server(swallow, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    timeout = 0.3
    store = RedisCursors(f"redis://127.0.0.1:{port}/0", timeout=timeout)
    try:
        for call in (
            store.get(stream_name),
            store.advance(stream_name, "1", "numeric"),
            store.get_many([stream_name]),
        ):
            started = time.monotonic()
            result = await call
            assert time.monotonic() - started < timeout + 2.0
            assert result in (None, {stream_name: None})
        store.submit(stream_name, "2", "numeric")
        started = time.monotonic()
        await store.flush()
        assert time.monotonic() - started < timeout + 2.0
        assert store.write_failures >= 2
    finally:
        await store.close()
        for writer in accepted:
            writer.close()
        server.close()
        await server.wait_closed()


async def _wait_for_redis(url: str) -> None:
    client = Redis.from_url(url, socket_connect_timeout=0.2)
    try:
        for _ in range(100):
            try:
                await client.ping()
                return
            except Exception:
                await asyncio.sleep(0.05)
        raise AssertionError(f"throwaway redis-server at {url} did not start")
    finally:
        await client.aclose()


def _start_redis(port: int, directory: Path) -> subprocess.Popen[bytes]:
    assert REDIS_SERVER.exists(), f"{REDIS_SERVER} is missing"
    return throwaway_redis(REDIS_SERVER, port, directory)


def _stop(process: subprocess.Popen[bytes]) -> None:
    process.kill()
    process.wait(timeout=10)


async def test_outage_logged_once_and_recovery(
    stream_name: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    port = free_port()
    url = f"redis://127.0.0.1:{port}/0"
    caplog.set_level(logging.INFO, logger="durable_sse.cursor.l2")
    process = _start_redis(port, tmp_path)
    store = RedisCursors(url, timeout=0.3)
    try:
        await _wait_for_redis(url)
        assert await store.advance(stream_name, "10", "numeric") is True

        _stop(process)
        for number in range(11, 60):
            store.submit(stream_name, str(number), "numeric")
            await store.flush()
        assert await store.get(stream_name) is None
        assert await store.advance(stream_name, "70", "numeric") is None
        assert store.write_failures >= 2
        assert len(_warnings(caplog)) == 1

        process = _start_redis(port, tmp_path)  # comes back empty
        await _wait_for_redis(url)
        store.submit(stream_name, "80", "numeric")
        await store.flush()
        assert await store.get(stream_name) == "80"
        recoveries = [r for r in caplog.records if "recovered" in r.getMessage()]
        assert len(recoveries) == 1
        assert len(_warnings(caplog)) == 1
    finally:
        await store.close()
        _stop(process)


async def test_forget(cursors: RedisCursors, raw: Redis, stream_name: str) -> None:
    await cursors.advance(stream_name, "1000", "numeric")
    cursors.submit(stream_name, "1001", "numeric")
    assert await cursors.forget(stream_name) is True
    await cursors.flush()
    assert await raw.exists(cursor_key(stream_name)) == 0
    assert await cursors.get(stream_name) is None
    assert await cursors.advance(stream_name, "1", "numeric") is True
    await cursors.forget(stream_name)
