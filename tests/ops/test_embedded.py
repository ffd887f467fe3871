"""Throwaway PostgreSQL and Redis from wheels: they start, answer, stop, and leave nothing.

"Nothing" is checked the hard way: every server process (found by working directory under
the services folder, from /proc) is gone, and the folder is removed.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
import redis

from durable_sse.errors import EmbeddedServiceError
from durable_sse.ops.embedded.leftovers import servers_under, sweep_stale
from durable_sse.ops.embedded.postgres import EmbeddedPostgres
from durable_sse.ops.embedded.redis import EmbeddedRedis
from durable_sse.ops.embedded.services import embedded_services, start_services
from tests.ops.helpers import alive
from tests.services import DEFAULT_PG_URL, DEFAULT_REDIS_URL, services_to_embed

ROOT = Path(__file__).resolve().parents[2]


def uid_of(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Uid:"):
            return int(line.split()[1])
    raise AssertionError(f"no Uid in /proc/{pid}/status")


def plain(url: str) -> str:
    return url.replace("+psycopg", "")


@pytest.fixture
def scratch() -> Iterator[Path]:
    """A folder in the temporary directory that others may pass through: as root,
    PostgreSQL runs as ``nobody`` and must reach its data."""
    folder = Path(tempfile.mkdtemp(prefix="durable-sse-test-")).resolve()
    folder.chmod(0o711)
    yield folder
    shutil.rmtree(folder)


def test_services_start_answer_stop_and_leave_nothing_behind() -> None:
    with embedded_services() as services:
        assert services.postgres is not None and services.redis is not None
        root = services.root
        assert root.is_dir()
        with psycopg.connect(plain(services.postgres.url)) as connection:
            connection.execute("CREATE TABLE t (n int)")
            connection.execute("INSERT INTO t VALUES (7)")
            assert connection.execute("SELECT n FROM t").fetchone() == (7,)
            database = connection.execute("SELECT current_database()").fetchone()
        assert database == ("test",)
        client = redis.Redis.from_url(services.redis.url)
        client.set("k", "v")
        assert client.get("k") == b"v"
        client.close()
        pids = servers_under(root)
        postmaster = services.postgres.process
        assert postmaster is not None and postmaster.pid in pids
        assert services.redis.process is not None and services.redis.process.pid in pids
        assert len(pids) > 2  # PostgreSQL's checkpointer, walwriter, ... too
        expected = pwd.getpwnam("nobody").pw_uid if os.geteuid() == 0 else os.geteuid()
        assert uid_of(postmaster.pid) == expected
    assert not root.exists()
    assert [pid for pid in pids if alive(pid)] == []
    assert servers_under(root) == []


def test_a_failure_inside_the_block_still_stops_and_removes_everything() -> None:
    with pytest.raises(RuntimeError, match="boom"), embedded_services(redis=False) as services:
        root = services.root
        pids = servers_under(root)
        raise RuntimeError("boom")
    assert pids
    assert not root.exists()
    assert [pid for pid in pids if alive(pid)] == []


def test_an_interrupt_half_way_through_starting_stops_what_had_started(
    scratch: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C after PostgreSQL is up but before Redis answers: PostgreSQL is stopped too."""

    def interrupted(self: EmbeddedRedis) -> str:
        raise KeyboardInterrupt

    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    monkeypatch.setattr(EmbeddedRedis, "start", interrupted)
    with pytest.raises(KeyboardInterrupt):
        start_services()
    assert list(scratch.iterdir()) == []
    assert servers_under(scratch) == []


def test_immediate_restart_keeps_committed_rows_and_the_url() -> None:
    with embedded_services(redis=False) as services:
        postgres = services.postgres
        assert postgres is not None and postgres.process is not None
        url, before = postgres.url, postgres.process.pid
        with psycopg.connect(plain(url), autocommit=True) as connection:
            connection.execute("CREATE TABLE t (n int)")
            connection.execute("INSERT INTO t VALUES (1)")
            postgres.restart(immediate=True)
            with pytest.raises(psycopg.OperationalError):
                connection.execute("SELECT 1")  # the old connection was cut
        assert postgres.process.pid != before
        assert postgres.url == url
        with psycopg.connect(plain(url)) as connection:
            assert connection.execute("SELECT n FROM t").fetchone() == (1,)


DEFAULT_SIGINT = "import signal\nsignal.signal(signal.SIGINT, signal.default_int_handler)\n"
"""First lines of every child: Ctrl-C raises KeyboardInterrupt, as in a terminal. A suite
started in the background by a non-interactive shell (``pytest … &`` in a script) runs
with SIGINT ignored, its children inherit that, and Python then leaves it ignored: the
test would measure the caller's shell, not the code. (Set in the child, not with
``preexec_fn``, which is unsafe in a parent with threads.)"""


def _child(script: str, tmpdir: Path) -> tuple[subprocess.Popen[str], Path]:
    """A Python process that starts services and prints their folder; and that folder."""
    process = subprocess.Popen(
        [sys.executable, "-c", DEFAULT_SIGINT + script],
        cwd=ROOT,
        env={**os.environ, "TMPDIR": str(tmpdir)},
        stdout=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    line = process.stdout.readline().strip()
    assert line, f"the child printed nothing (exit {process.poll()})"
    return process, Path(line)


def test_ctrl_c_stops_and_removes_everything(scratch: Path) -> None:
    process, root = _child(
        "import time\n"
        "from durable_sse.ops.embedded.services import embedded_services\n"
        "with embedded_services() as services:\n"
        "    print(services.root, flush=True)\n"
        "    time.sleep(600)\n",
        scratch,
    )
    pids = servers_under(root)
    assert len(pids) > 2
    process.send_signal(signal.SIGINT)
    assert process.wait(timeout=60) != 0
    assert not root.exists()
    assert [pid for pid in pids if alive(pid)] == []
    assert list(scratch.iterdir()) == []


def test_servers_of_a_killed_owner_are_stopped_by_the_next_start(scratch: Path) -> None:
    process, root = _child(
        "import time\n"
        "from durable_sse.ops.embedded.services import start_services\n"
        "print(start_services().root, flush=True)\n"
        "time.sleep(600)\n",
        scratch,
    )
    process.kill()  # no cleanup can run: the servers outlive their owner
    process.wait()
    pids = servers_under(root)
    assert len(pids) > 2
    assert root.exists()
    assert sweep_stale(scratch) == [root]
    assert not root.exists()
    assert [pid for pid in pids if alive(pid)] == []


def test_a_live_owners_services_are_not_swept(scratch: Path) -> None:
    with embedded_services(postgres=False) as services:
        assert sweep_stale(services.root.parent) == []
        assert services.root.exists()
        assert services.redis is not None
        assert redis.Redis.from_url(services.redis.url).ping()


def test_a_kept_cluster_keeps_its_data_across_stop_and_start(scratch: Path) -> None:
    """``dev --postgres`` keeps its cluster under the state directory, like its SQLite."""
    first = EmbeddedPostgres(scratch / "postgres", database="durable_sse")
    try:
        url = first.start()
        with psycopg.connect(plain(url)) as connection:
            connection.execute("CREATE TABLE kept (n int)")
            connection.execute("INSERT INTO kept VALUES (42)")
    finally:
        first.stop()
    assert servers_under(scratch) == []
    second = EmbeddedPostgres(scratch / "postgres", database="durable_sse")
    try:
        with psycopg.connect(plain(second.start())) as connection:
            assert connection.execute("SELECT n FROM kept").fetchone() == (42,)
    finally:
        second.stop()
    assert servers_under(scratch) == []
    assert (scratch / "postgres" / "data" / "PG_VERSION").is_file()


def test_a_server_that_cannot_start_is_a_clear_error(scratch: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        server = EmbeddedRedis(scratch / "redis", port=taken.getsockname()[1])
        with pytest.raises(EmbeddedServiceError, match="redis-server exited"):
            server.start()
    assert servers_under(scratch) == []


def test_what_to_embed() -> None:
    def up(url: str) -> bool:
        return True

    def down(url: str) -> bool:
        return False

    assert services_to_embed({}, pg_answers=up, redis_answers=up) == (False, False)
    assert services_to_embed({}, pg_answers=down, redis_answers=up) == (True, False)
    assert services_to_embed({}, pg_answers=up, redis_answers=down) == (False, True)
    named = {"TEST_DATABASE_URL": "postgresql://x", "TEST_REDIS_URL": "redis://x"}
    assert services_to_embed(named, pg_answers=down, redis_answers=down) == (False, False)
    flag = {**named, "DURABLE_SSE_EMBEDDED_SERVICES": "1"}
    assert services_to_embed(flag, pg_answers=up, redis_answers=up) == (True, True)
    asked: list[str] = []

    def record(url: str) -> bool:
        asked.append(url)
        return True

    services_to_embed({}, pg_answers=record, redis_answers=record)
    assert asked == [DEFAULT_PG_URL, DEFAULT_REDIS_URL]
