"""Which dead workers' retries are followed (only those of a worker that may be paused),
and how soon a moved attempt is retried."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from datetime import timedelta

from temporalio.api.failure.v1 import Failure
from temporalio.converter import DataConverter, DefaultFailureConverter
from temporalio.exceptions import ApplicationError

from durable_sse.contracts import CONNECTION_MOVED, RETRY_NOW
from durable_sse.log.sessions import boot_id
from durable_sse.log.workers import WorkerLease
from durable_sse.ops.liveness import ended_here


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


def test_a_process_gone_from_this_host_is_known_gone() -> None:
    assert ended_here(lease(pid=ended_pid()))


def test_a_process_that_runs_may_be_paused() -> None:
    assert not ended_here(lease(pid=os.getppid()))


def test_a_lease_with_this_process_s_pid_is_a_predecessor_s_whose_pid_was_reused() -> None:
    assert ended_here(lease(pid=os.getpid()))


def test_another_host_or_boot_is_never_known_gone() -> None:
    pid = ended_pid()
    assert not ended_here(lease(host="elsewhere.invalid", pid=pid))
    assert not ended_here(lease(pid=pid, boot="another-boot"))


def test_a_moved_attempt_is_retried_at_once_not_after_the_policy_s_backoff() -> None:
    """The SDK leaves a zero ``next_retry_delay`` out of the failure, and the server then
    waits the retry policy's backoff (1 s, 2 s, 4 s ...): a SIGTERM's hand-over took
    1-4 s longer than it had to. ``RETRY_NOW`` reaches the server."""
    converter = DefaultFailureConverter()
    payloads = DataConverter.default.payload_converter

    def delay(error: ApplicationError) -> Failure:
        failure = Failure()
        converter.to_failure(error, payloads, failure)
        return failure

    zero = delay(ApplicationError("moved", type=CONNECTION_MOVED, next_retry_delay=timedelta(0)))
    assert not zero.application_failure_info.HasField("next_retry_delay")
    now = delay(ApplicationError("moved", type=CONNECTION_MOVED, next_retry_delay=RETRY_NOW))
    assert now.application_failure_info.HasField("next_retry_delay")
    assert now.application_failure_info.next_retry_delay.ToTimedelta() == RETRY_NOW
