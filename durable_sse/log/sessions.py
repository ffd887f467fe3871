"""The event log's PostgreSQL sessions, named after the process that opened them.

A worker paused in the middle of a commit (SIGSTOP, a frozen VM, a long GC pause) keeps
its transaction open, and with it the commit-order locks of the streams in that commit
(:mod:`durable_sse.log.writer`). The worker that took those streams over waits for the
locks, and so does every stream that shares a commit group with one of them, until the
pause ends or PostgreSQL's ``idle_in_transaction_session_timeout`` fires. The watchdog
that revokes the paused worker's lease knows its host, process id and boot, so it finds
the worker's sessions by their ``application_name`` and ends the ones inside a
transaction. Nothing is lost: what they held was never committed, the fence would refuse
it, and the stream's next connection reads it again from the source.
"""

from __future__ import annotations

import functools
import hashlib
import os
import socket
from pathlib import Path

from sqlalchemy.engine import Connection

PREFIX = "durable-sse "
"""Start of every session name this package gives (``pg_stat_activity.application_name``)."""


@functools.cache
def boot_id() -> str:
    """This host's boot (Linux): two hosts with one name, or a host that rebooted, never
    pass for the same. Empty where the kernel does not say. Read once: a process's boot
    never changes."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def session_name(host: str, pid: int, boot: str) -> str:
    """The ``application_name`` of a process's sessions: short (PostgreSQL keeps 63
    bytes) and the same wherever it is computed from a worker lease's host, pid and boot."""
    digest = hashlib.blake2b(f"{host}\0{pid}\0{boot}".encode(), digest_size=8).hexdigest()
    return PREFIX + digest


def this_process() -> str:
    """This process's session name (computed each time: a forked child gets its own)."""
    return session_name(socket.gethostname(), os.getpid(), boot_id())


def end_open_transactions(connection: Connection, name: str) -> int:
    """End the sessions called ``name`` that are inside a transaction; how many.

    Never this process's own sessions (two workers in one process share them, so one
    cannot be singled out), never another role's, and nothing on SQLite, whose writers
    hold no lock across a pause of another process. Sessions outside a transaction hold
    no lock and are left alone.
    """
    if connection.dialect.name != "postgresql" or name == this_process():
        return 0
    ended = connection.exec_driver_sql(
        "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity"
        " WHERE application_name = %(name)s AND datname = current_database()"
        " AND usename = current_user AND xact_start IS NOT NULL"
        " AND pid <> pg_backend_pid()",
        {"name": name},
    ).scalar_one()
    return int(ended)
