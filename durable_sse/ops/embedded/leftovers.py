"""What a killed run left: its servers still running, its folder in the temporary directory.

A server is recognised by its executable's name and its working directory (inside the
run's folder); a folder is stale once the process named in its ``owner.pid`` is gone.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import tempfile
import time
from pathlib import Path

from durable_sse.errors import EmbeddedServiceError
from durable_sse.ops.embedded.processes import STOP_TIMEOUT
from durable_sse.ops.processes import process_alive

log = logging.getLogger(__name__)

TEMP_PREFIX = "durable-sse-services-"
OWNER_FILE = "owner.pid"
"""The pid of the process that owns a temporary services folder."""
SERVER_NAMES = ("postgres", "redis-server")
"""Executable names of the servers this module starts: only these are ever stopped by
:func:`stop_leftovers`."""


def servers_under(folder: Path) -> list[int]:
    """Pids of our servers (by executable name) whose working directory is in ``folder``.

    PostgreSQL (postmaster and backends) works in its data directory and redis-server in
    its ``--dir``, both inside the server's folder. Linux only (``/proc``); elsewhere none.
    """
    folder = folder.resolve()
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            if Path(os.readlink(entry / "exe")).name not in SERVER_NAMES:
                continue
            cwd = os.readlink(entry / "cwd").removesuffix(" (deleted)")
        except OSError:
            continue
        if Path(cwd) == folder or Path(cwd).is_relative_to(folder):
            found.append(int(entry.name))
    return found


def stop_leftovers(folder: Path) -> list[int]:
    """Kill our servers still running in ``folder`` (left by a killed run); their pids."""
    pids = [pid for pid in servers_under(folder) if pid != os.getpid()]
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + STOP_TIMEOUT
    while any(_running(pid) for pid in pids):
        if time.monotonic() > deadline:
            raise EmbeddedServiceError(f"servers in {folder} survived SIGKILL: {pids}")
        time.sleep(0.05)
    if pids:
        log.warning("stopped servers a killed run left in %s: %s", folder, pids)
    return pids


def _running(pid: int) -> bool:
    """Not gone and not a zombie (an orphan's zombie waits for an init that may never reap)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def sweep_stale(tempdir: Path | None = None) -> list[Path]:
    """Stop and remove the services folders whose owning process is gone; those folders.

    Only folders of the current user are touched, and only when their owner (the pid in
    ``owner.pid``) no longer runs: another session's live servers are left alone.
    """
    removed = []
    for folder in Path(tempdir or tempfile.gettempdir()).glob(TEMP_PREFIX + "*"):
        try:
            if folder.stat().st_uid != os.geteuid():
                continue
            owner = int((folder / OWNER_FILE).read_text())
        except (OSError, ValueError):
            continue
        if process_alive(owner):
            continue
        stop_leftovers(folder)
        shutil.rmtree(folder, ignore_errors=True)
        removed.append(folder)
    return removed


def remove_folder(folder: Path) -> None:
    """``rmtree``, again after a moment if a process that just ended still wrote there."""
    for _ in range(10):
        try:
            shutil.rmtree(folder)
            return
        except OSError:
            if not folder.exists():
                return
            time.sleep(0.1)
    shutil.rmtree(folder)
