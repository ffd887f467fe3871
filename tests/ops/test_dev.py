"""`durable-sse dev` as a user runs it: a subprocess on free ports in an empty directory."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from urllib.parse import unquote

import psycopg
import pytest

from durable_sse.ops.embedded.leftovers import servers_under
from tests.ops.helpers import alive

pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def descendants(pid: int) -> set[int]:
    """Every live process below ``pid`` (read from /proc, no extra packages)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(parent, []).append(int(entry.name))
    found: set[int] = set()
    stack = [pid]
    while stack:
        for child in children.get(stack.pop(), []):
            found.add(child)
            stack.append(child)
    return found


def ctrl_c(process: subprocess.Popen[bytes], *, timeout: float) -> None:
    """Send SIGINT, as Ctrl-C does, and wait; kill it if it is not gone in ``timeout`` s."""
    process.send_signal(signal.SIGINT)
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        raise


def assert_stopped_cleanly(
    process: subprocess.Popen[bytes], children: set[int], output: Path
) -> None:
    """``dev`` exited 0 after Ctrl-C, and none of its ``children`` survived it."""
    assert process.returncode == 0, output.read_text()
    survivors = [pid for pid in children if alive(pid)]
    assert survivors == [], f"children survived Ctrl-C: {survivors}"


def start_dev(
    cwd: Path,
    state: Path,
    output: Path,
    *options: str,
    temporal_port: int | None = None,
    ui_port: int | None = None,
) -> subprocess.Popen[bytes]:
    """``durable-sse dev`` in ``cwd`` keeping its state in ``state``, printing to ``output``:
    with none of the stores' addresses in its environment, it starts its own."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("TEMPORAL_ADDRESS", "REDIS_URL", "DATABASE_URL")
    }
    ports = {
        "--temporal-port": temporal_port or free_port(),
        "--ui-port": ui_port or free_port(),
        "--source-port": free_port(),
    }
    command = [sys.executable, "-m", "durable_sse.ops.cli", "dev", *options, "--dir", str(state)]
    for option, port in ports.items():
        command += [option, str(port)]
    with output.open("wb") as out:
        return subprocess.Popen(command, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT)


def rows(database: Path, table: str = "sse_events") -> int:
    if not database.exists():
        return 0
    try:
        with sqlite3.connect(database, timeout=1) as connection:
            return connection.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
    except sqlite3.Error:
        return 0


def listed(temporal_port: int, query: str) -> set[str]:
    """Workflow ids the plain `temporal` CLI lists for ``query`` (retried: visibility lags)."""
    found: set[str] = set()
    for _ in range(20):
        out = subprocess.run(
            [
                str(Path(sys.executable).parent / "temporal"),
                "workflow",
                "list",
                "--address",
                f"127.0.0.1:{temporal_port}",
                "--query",
                query,
                "--output",
                "json",
            ],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
        found = set(re.findall(r'"workflowId":\s*"([^"]+)"', out))
        if len(found) >= 2:
            break
        time.sleep(0.5)
    return found


def test_dev_brings_up_the_stack_and_ctrl_c_stops_everything(tmp_path: Path) -> None:
    ui_port = free_port()
    temporal_port = free_port()
    state = tmp_path / "state"
    output = tmp_path / "dev.out"
    process = start_dev(tmp_path, state, output, temporal_port=temporal_port, ui_port=ui_port)
    try:
        deadline = time.monotonic() + 90
        database = state / "durable-sse.db"
        children: set[int] = set()
        while time.monotonic() < deadline and rows(database) < 50:
            assert process.poll() is None, output.read_text()
            children |= descendants(process.pid)
            time.sleep(0.5)
        text = output.read_text()
        assert rows(database) >= 50, text
        assert f"Temporal Web UI: http://127.0.0.1:{ui_port}" in text
        # The printed lists: streams only, and parked streams only (URL-encoded queries).
        links = dict(re.findall(r"^  (streams|parked streams): (\S+)$", text, re.MULTILINE))
        queries = {what: unquote(link.split("?query=", 1)[1]) for what, link in links.items()}
        assert queries == {
            "streams": 'WorkflowType="StreamWorkflow"',
            "parked streams": 'WorkflowType="StreamWorkflow" AND SseStreamState="parked"',
        }, text
        for link in links.values():
            with urllib.request.urlopen(link, timeout=5) as page:
                assert page.status == 200
        # dev registered the attribute: the demo streams are listed by their state.
        assert listed(temporal_port, 'SseStreamState="reading"') >= {
            "sse-stream:ticks",
            "sse-stream:noisy",
        }, text
        with urllib.request.urlopen(f"http://127.0.0.1:{ui_port}/", timeout=5) as page:
            assert page.status == 200
        # Both demo streams are running and persisting.
        with sqlite3.connect(database) as connection:
            streams = {
                row[0] for row in connection.execute("SELECT DISTINCT stream FROM sse_events")
            }
        assert streams == {"ticks", "noisy", "guarded"}
        assert "ticks: " in text and "noisy: " in text and "guarded: " in text
        # The example consumer (examples/consumer.py) writes them to its own table: the
        # events flow all the way through, and the summary says so.
        while time.monotonic() < deadline + 60 and rows(database, "demo_ledger") < 20:
            assert process.poll() is None, output.read_text()
            time.sleep(0.5)
        assert rows(database, "demo_ledger") >= 20, output.read_text()
        while time.monotonic() < deadline + 60 and "consumer demo-ledger: handled=" not in text:
            time.sleep(0.5)
            text = output.read_text()
        assert "consumer demo-ledger: handled=" in text, text
        children |= descendants(process.pid)
        assert children, "dev started no child processes (Temporal, Redis)"
    finally:
        ctrl_c(process, timeout=40)
    assert_stopped_cleanly(process, children, output)
    assert not list(state.glob("*.pid"))


def pg_rows(url: str) -> int:
    try:
        with psycopg.connect(url.replace("+psycopg", ""), connect_timeout=2) as connection:
            return connection.execute("SELECT count(*) FROM sse_events").fetchone()[0]
    except psycopg.Error:
        return 0


def test_dev_postgres_runs_the_demo_on_an_embedded_postgresql_and_ctrl_c_stops_it() -> None:
    # Not pytest's tmp_path: as root PostgreSQL runs as nobody, who must reach its data.
    home = Path(tempfile.mkdtemp(prefix="durable-sse-dev-")).resolve()
    home.chmod(0o711)
    state = home / "state"
    output = home / "dev.out"
    try:
        process = start_dev(home, state, output, "--postgres")
        try:
            deadline = time.monotonic() + 90
            url = None
            children: set[int] = set()
            while time.monotonic() < deadline and (url is None or pg_rows(url) < 50):
                assert process.poll() is None, output.read_text()
                children |= descendants(process.pid)
                found = re.search(r"PostgreSQL \(embedded\): (\S+)", output.read_text())
                url = found.group(1) if found else None
                time.sleep(0.5)
            text = output.read_text()
            assert url is not None, text
            assert url.startswith("postgresql+psycopg://postgres@127.0.0.1:"), url
            assert f"event log: {url}" in text
            assert pg_rows(url) >= 50, text
            with psycopg.connect(url.replace("+psycopg", "")) as connection:
                streams = {
                    row[0] for row in connection.execute("SELECT DISTINCT stream FROM sse_events")
                }
            assert streams == {"ticks", "noisy", "guarded"}
            assert not (state / "durable-sse.db").exists()  # no SQLite on the side
            children |= descendants(process.pid)
            assert servers_under(state), "no embedded PostgreSQL runs under the state dir"
        finally:
            ctrl_c(process, timeout=60)
        assert_stopped_cleanly(process, children, output)
        assert servers_under(state) == []
        assert not (state / "postgres" / "data" / "postmaster.pid").exists()
        assert (state / "postgres" / "data" / "PG_VERSION").is_file()  # kept, like SQLite
    finally:
        shutil.rmtree(home)
