"""Whether a process runs on this host: one answer for the embedded services' sweep and
the worker's watchdog (a restarted worker takes a gone predecessor's streams)."""

from __future__ import annotations

import os


def process_alive(pid: int) -> bool:
    """Whether a process with this id runs on this host (a zombie counts as alive; one
    of another user's, which we may not signal, too)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
