"""Start, wait for and stop one server process of an embedded service."""

from __future__ import annotations

import contextlib
import logging
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from durable_sse.errors import EmbeddedServiceError

log = logging.getLogger(__name__)

STARTUP_TIMEOUT = 60.0
"""How long a server may take to answer after it was started (a bound, not an estimate)."""
STOP_TIMEOUT = 30.0


def free_port() -> int:
    """A TCP port of 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def log_tail(path: Path, lines: int = 20) -> str:
    with contextlib.suppress(OSError):
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    return ""


def wait_ready(
    what: str, ready: Callable[[], bool], process: subprocess.Popen[bytes], log_path: Path
) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT
    while True:
        if process.poll() is not None:
            raise EmbeddedServiceError(
                f"{what} exited with code {process.returncode}; {log_path}:\n{log_tail(log_path)}"
            )
        if ready():
            return
        if time.monotonic() > deadline:
            raise EmbeddedServiceError(
                f"{what} did not answer in {STARTUP_TIMEOUT:g} s; {log_path}:\n{log_tail(log_path)}"
            )
        time.sleep(0.1)


def end_process(process: subprocess.Popen[bytes] | None, signum: int) -> None:
    """Send ``signum``, wait for the process to exit, kill it if it does not in time."""
    if process is None or process.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        process.send_signal(signum)
    try:
        process.wait(timeout=STOP_TIMEOUT)
    except subprocess.TimeoutExpired:
        log.warning(
            "pid %s ignored signal %s for %g s; killing it", process.pid, signum, STOP_TIMEOUT
        )
        process.kill()
        process.wait()
