"""Which dead workers' retries are followed: only those of a worker that may be paused."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

from durable_sse.log.workers import WorkerLease
from durable_sse.ops.failover import gone
from durable_sse.ops.liveness import boot_id


def lease(*, host: str | None = None, pid: int, boot: str | None = None) -> WorkerLease:
    return WorkerLease(
        worker_id="w",
        pool="default:q",
        host=socket.gethostname() if host is None else host,
        pid=pid,
        boot_id=boot_id() if boot is None else boot,
        state="revoked",
        renewed_at=0.0,
        expires_at=0.0,
    )


def ended_pid() -> int:
    """The pid of a process that ran here and has ended (reaped)."""
    done = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        text=True,
        capture_output=True,
        check=True,
    )
    return int(done.stdout)


def test_a_process_gone_from_this_host_is_gone() -> None:
    assert gone(lease(pid=ended_pid()))


def test_a_process_that_runs_may_be_paused() -> None:
    assert not gone(lease(pid=os.getpid()))


def test_another_host_or_boot_is_never_known_gone() -> None:
    pid = ended_pid()
    assert not gone(lease(host="elsewhere.invalid", pid=pid))
    assert not gone(lease(pid=pid, boot="another-boot"))
