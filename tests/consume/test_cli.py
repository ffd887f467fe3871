"""``durable-sse tail`` and ``durable-sse consumers``, on real PostgreSQL and SQLite.

Output is checked byte for byte; ``-f | head -1`` and Ctrl-C run the real command."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from durable_sse.consume import Consumer, Group
from durable_sse.consume import positions as position_rows
from durable_sse.gaps.model import GapChange, GapRecord
from durable_sse.log.records import EventRecord
from durable_sse.ops.cli.main import main
from durable_sse.stores import Stores
from tests.conftest import open_stores

T0 = datetime(2024, 5, 1, 12, 0, 0, tzinfo=UTC)
CLI = [sys.executable, "-m", "durable_sse.ops.cli"]


@pytest.fixture(params=["postgresql", "sqlite"])
async def log(
    request: pytest.FixtureRequest, pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Stores]:
    url = pg_url if request.param == "postgresql" else f"sqlite:///{tmp_path / 'events.db'}"
    monkeypatch.setenv("DATABASE_URL", url)
    async with open_stores(url) as event_log:
        yield event_log


def event(event_id: str, data: str, at: datetime) -> EventRecord:
    return EventRecord(event_id, 0, "tick", data, at)


async def fill(log: Stores, stream: str) -> list[int]:
    """Three events at T0 (one with NUL), a gap, two events an hour later."""
    await log.writer.insert_batch(
        stream, "numeric", [event("1", "a", T0), event("2", "nul\x00é", T0), event("3", "c", T0)]
    )
    gap = GapRecord(
        gap_id="g1", stream=stream, kind="comment", start_id="3", end_id="4", notice_id="3",
        seen_at=T0.isoformat(), announced=2,
    )  # fmt: skip
    later = T0 + timedelta(hours=1)
    await log.writer.committed(
        log.writer.submit_batch(
            stream,
            "numeric",
            [event("4", '{"x": 1}', later), event("5", "e", later)],
            gap_changes=[GapChange("g1", opened=gap)],
        )
    )
    return [e.seq for e in await log.reads.events(stream)]


async def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = await asyncio.to_thread(main, list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def lines(stream: str, seqs: list[int], *, first: int = 0) -> str:
    s = stream
    every = [
        f'{{"stream": "{s}", "seq": {seqs[0]}, "id": "1", "event": "tick", "data": "a", '
        '"received_at": "2024-05-01T12:00:00Z"}\n',
        f'{{"stream": "{s}", "seq": {seqs[1]}, "id": "2", "event": "tick", '
        '"data": "nul\\u0000é", "received_at": "2024-05-01T12:00:00Z"}\n',
        f'{{"stream": "{s}", "seq": {seqs[2]}, "id": "3", "event": "tick", "data": "c", '
        '"received_at": "2024-05-01T12:00:00Z"}\n',
        f'{{"stream": "{s}", "seq": {seqs[3]}, "id": "4", "event": "tick", '
        '"data": "{\\"x\\": 1}", "received_at": "2024-05-01T13:00:00Z"}\n',
        f'{{"stream": "{s}", "seq": {seqs[4]}, "id": "5", "event": "tick", "data": "e", '
        '"received_at": "2024-05-01T13:00:00Z"}\n',
        f'{{"stream": "{s}", "after_seq": {seqs[4]}, "gap": {{"id": "g1", "kind": "comment", '
        '"start_id": "3", "end_id": "4", "announced": 2, "seen_at": "2024-05-01T12:00:00Z"}}\n',
    ]
    return "".join(every[first:])


async def test_tail_prints_json_lines_byte_for_byte(
    log: Stores, stream_name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    seqs = await fill(log, stream_name)
    assert await run_cli(capsys, "tail", stream_name) == (0, lines(stream_name, seqs), "")
    assert await run_cli(capsys, "tail", stream_name, "-n", "2") == (
        0,
        lines(stream_name, seqs, first=3),
        "",
    )
    since = await run_cli(capsys, "tail", stream_name, "--since", "2024-05-01T14:30:00+02:00")
    assert since == (0, lines(stream_name, seqs, first=3), "")
    from_seq = await run_cli(capsys, "tail", stream_name, "--from-seq", str(seqs[2]))
    assert from_seq == (0, lines(stream_name, seqs, first=2), "")
    code, out, err = await run_cli(capsys, "tail", stream_name, "--since", "2024-05-01T14:30:00")
    assert code == 2 and out == "" and "no time zone" in err


async def test_tail_of_a_group_reads_from_its_position_and_commits_only_when_asked(
    log: Stores, stream_name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    seqs = await fill(log, stream_name)
    group = "g-" + uuid.uuid4().hex[:8]
    consumer = Consumer(
        os.environ["DATABASE_URL"], Group(group, streams=[stream_name], batch_size=2)
    )
    await consumer.start()
    batch = await anext(consumer.batches())
    await batch.ack()  # the group consumed events 1 and 2
    await consumer.close()
    expected = lines(stream_name, seqs, first=2)
    assert await run_cli(capsys, "tail", stream_name, "--group", group) == (0, expected, "")
    assert _position(log, group, stream_name) == seqs[1]  # unchanged
    committed = await run_cli(capsys, "tail", stream_name, "--group", group, "--commit")
    assert committed == (0, expected, "")
    assert _position(log, group, stream_name) == seqs[4]
    assert await run_cli(capsys, "tail", stream_name, "--group", group) == (0, "", "")


def _position(log: Stores, group: str, stream: str) -> int:
    with log.database.engine.connect() as connection:
        row = position_rows.read_row(connection, group, stream)
    assert row is not None
    return row.position.seq


async def test_consumers_lists_groups_and_resets_only_when_confirmed_and_free(
    log: Stores, stream_name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    seqs = await fill(log, stream_name)
    group = "g-" + uuid.uuid4().hex[:8]
    consumer = Consumer(
        os.environ["DATABASE_URL"],
        Group(group, streams=[stream_name], batch_size=3, hold_retention=True, max_hold=3600),
    )
    await consumer.start()
    batch = await anext(consumer.batches())  # holds the lease now
    code, out, _ = await run_cli(capsys, "consumers", "--group", group)
    header, row = out.splitlines()
    assert header.split()[:5] == ["group", "stream", "state", "position", "lag"]
    assert row.split()[:6] == [group, stream_name, "consuming", "0", "5", row.split()[5]]
    assert consumer.owner in row and "up to 1h" in row
    refused = await run_cli(capsys, "consumers", "reset", group, "--to", "latest", "--yes")
    assert refused[0] == 1 and "being consumed by" in refused[2]
    await batch.ack()
    await consumer.close()
    dry = await run_cli(capsys, "consumers", "reset", group, "--to", str(seqs[0]))
    assert dry == (
        0,
        f"would move {group}/{stream_name}: seq {seqs[2]} -> "
        f"{seqs[0]} (2 events delivered again)\ndry run: nothing changed (--yes does it)\n",
        "",
    )
    assert _position(log, group, stream_name) == seqs[2]
    done = await run_cli(capsys, "consumers", "reset", group, "--to", str(seqs[0]), "--yes")
    assert done[0] == 0 and _position(log, group, stream_name) == seqs[0]
    bad = await run_cli(capsys, "consumers", "reset", group, "--to", "yesterday")
    assert bad[0] == 2 and "--to" in bad[2]


def _spawn_tail(url: str, *argv: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "DATABASE_URL": url}
    return subprocess.Popen(
        [*CLI, "tail", *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
    )


async def test_tail_follow_ends_cleanly_on_a_closed_pipe_and_on_ctrl_c(
    pg_url: str, stream_name: str
) -> None:
    log = Stores.open(pg_url)
    await log.create_schema()
    try:
        seqs = await fill(log, stream_name)
        env = {**os.environ, "DATABASE_URL": pg_url}
        piped = await asyncio.to_thread(
            subprocess.run,
            f"{' '.join(CLI)} tail -f {stream_name} | head -1",
            shell=True,
            capture_output=True,
            env=env,
            timeout=60,
        )
        assert piped.returncode == 0 and piped.stderr == b""
        assert piped.stdout.decode() == lines(stream_name, seqs).splitlines(keepends=True)[0]
        follower = _spawn_tail(pg_url, "-f", "-n", "0", stream_name)
        try:
            await asyncio.sleep(3)  # it has started and waits for events
            await log.writer.insert_batch(stream_name, "numeric", [event("6", "f", T0)])
            deadline = asyncio.get_running_loop().time() + 20
            line = b""
            while not line:  # the new event arrives by NOTIFY
                line = await asyncio.to_thread(follower.stdout.readline)  # type: ignore[union-attr]
                assert asyncio.get_running_loop().time() < deadline
            assert b'"id": "6"' in line
            follower.send_signal(signal.SIGINT)
            out, err = await asyncio.to_thread(follower.communicate, timeout=20)
            assert follower.returncode == 130 and err == b"" and out == b""
        finally:
            if follower.poll() is None:
                follower.kill()
    finally:
        await log.close()
