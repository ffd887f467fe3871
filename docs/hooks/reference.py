"""The configuration reference, generated from the code when the site is built.

An mkdocs hook (``hooks:`` in mkdocs.yml). ``docs/configuration.md`` holds two markers,
and this module replaces them with tables built from the code itself:

* ``<!-- generated: stream-settings -->``: every field of
  :class:`durable_sse.config.spec.StreamSpec`, its default as :func:`parse_spec` fills it
  in, what it accepts in the validator's own words (a probe value is refused, and the
  refusal is quoted), and its attribute docstring.
* ``<!-- generated: worker-environment -->``: the worker's environment, as
  ``durable-sse worker --help`` lists it (:data:`durable_sse.ops.cli.parser.ENVIRONMENT`),
  plus any variable :mod:`durable_sse.config.settings` reads that the list lacks, described
  by the :class:`Settings` field that names it.

A setting or a variable with no description, or a note here for a setting that no longer
exists, fails the build: the page cannot drift from the code unnoticed.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import re
from pathlib import Path
from typing import Any

from durable_sse.config import settings as settings_module
from durable_sse.config import spec as spec_module
from durable_sse.config.durations import format_duration
from durable_sse.errors import ConfigError
from durable_sse.ops.cli.parser import ENVIRONMENT
from durable_sse.sse.drops import DEFAULT_DROP_PATTERNS

STREAM_MARKER = "<!-- generated: stream-settings -->"
WORKER_MARKER = "<!-- generated: worker-environment -->"

NOTES = {
    "name": "The stream's name; its workflow id is `sse-stream:<name>`.",
    "url": "The SSE endpoint. Never put a token here: use `query_from_env`.",
    "lagged_reconnect_interval": (
        "At most one lagged reconnect (a repair) per stream per this interval; a second "
        "drop signal inside it keeps reading live and is repaired when the interval allows."
    ),
    "idle_timeout": "No bytes at all (not even a keep-alive comment) for this long: dropped.",
    "batch_max_events": "Most events in one batch (one commit).",
    "max_line_bytes": (
        "Longest line the reader takes; a longer one ends the connection with an error "
        "naming this setting."
    ),
    "max_connection_age": "A connection older than this ends and the next one resumes live.",
}
"""Descriptions for the fields whose attribute carries no docstring (yet)."""

PROBE: list[None] = [None]
"""A value every setting refuses: the refusal says what the setting accepts."""

DURATION_FORMS = r" \(seconds, or a string like [^)]*\)$"
"""The duration forms every duration setting names: said once above the table instead."""

_ENV_NAME = re.compile(r"^[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+$")


class ReferenceError(RuntimeError):
    """The reference cannot be generated: the code changed in a way the page must follow."""


def attribute_docstrings(cls: type) -> dict[str, str]:
    """``field -> docstring`` for the string literals right after a class's fields."""
    tree = ast.parse(inspect.getsource(inspect.getmodule(cls)))  # type: ignore[arg-type]
    node = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == cls.__name__)
    found: dict[str, str] = {}
    body = node.body
    for current, following in zip(body, body[1:], strict=False):
        if (
            isinstance(current, ast.AnnAssign)
            and isinstance(current.target, ast.Name)
            and isinstance(following, ast.Expr)
            and isinstance(following.value, ast.Constant)
            and isinstance(following.value.value, str)
        ):
            found[current.target.id] = inspect.cleandoc(following.value.value)
    return found


def _one_line(text: str) -> str:
    """One Markdown table cell: reST roles as code, ``*`` and ``|`` escaped outside code."""
    text = " ".join(text.split())
    text = re.sub(r":(?:class|func|mod|data|meth):`~?([^`]+)`", r"`\1`", text)
    parts = text.replace("``", "`").split("`")
    parts[::2] = [part.replace("*", "\\*") for part in parts[::2]]
    return "`".join(parts).replace("|", "\\|")


def _bytes(value: int) -> str:
    for unit, size in (("MiB", 1024 * 1024), ("KiB", 1024)):
        if value >= size and value % size == 0:
            return f"{value // size} {unit}"
    return f"{value} bytes"


def _default(name: str, value: Any) -> str:
    if name == "drop_notice" and value is None:
        return f"the {len(DEFAULT_DROP_PATTERNS)} default patterns"
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if name in spec_module.DURATION_BOUNDS:
        return f"`{format_duration(float(value))}`"
    if name.endswith("_bytes") and isinstance(value, int):
        return _bytes(value)
    if value in ([], {}):
        return "`[]`" if value == [] else "`{}`"
    return f"`{value}`"


def _accepted(name: str) -> str:
    """What ``name`` accepts, as :func:`parse_spec` words its refusal of a probe value."""
    table: dict[str, Any] = {"name": "probe", "url": "http://example.org/", name: PROBE}
    try:
        spec_module.parse_spec(table)
    except ConfigError as refusal:
        message = re.sub(r" \(and \d+ more\)$", "", str(refusal))
        found = re.search(r": (expected .*)$", message)
        if found:
            accepted = re.sub(r"^expected ", "", found.group(1))
            return _one_line(re.sub(DURATION_FORMS, "", accepted))
        raise ReferenceError(f"StreamSpec.{name}: unexpected refusal: {message}") from None
    raise ReferenceError(f"StreamSpec.{name} accepts {PROBE!r}: pick another probe value")


def stream_settings_table() -> str:
    """The Markdown table of every StreamSpec setting."""
    fields = [f.name for f in dataclasses.fields(spec_module.StreamSpec)]
    stale = sorted(set(NOTES) - set(fields))
    if stale:
        raise ReferenceError(f"docs/hooks/reference.py NOTES names no StreamSpec field: {stale}")
    docs = attribute_docstrings(spec_module.StreamSpec)
    defaults = spec_module.parse_spec({"name": "probe", "url": "http://example.org/"})
    rows = ["| setting | default | accepted | what it does |", "|---|---|---|---|"]
    for name in fields:
        text = docs.get(name) or NOTES.get(name)
        if not text:
            raise ReferenceError(
                f"StreamSpec.{name} has no docstring: document the field in "
                "durable_sse/config/spec.py (or add a note in docs/hooks/reference.py)"
            )
        default = "required" if name in ("name", "url") else _default(name, getattr(defaults, name))
        rows.append(f"| `{name}` | {default} | {_accepted(name)} | {_one_line(text)} |")
    return "\n".join(rows)


def _variables_read(module: Any) -> set[str]:
    """Every environment variable name a module spells out, or imports as a constant."""
    names = set()
    for node in ast.walk(ast.parse(inspect.getsource(module))):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            if _ENV_NAME.match(node.value):
                names.add(node.value)
        elif isinstance(node, ast.Name) and node.id.endswith("_ENV"):
            value = getattr(module, node.id, None)
            if isinstance(value, str) and _ENV_NAME.match(value):
                names.add(value)
    return names


def worker_environment_table() -> str:
    """The Markdown table of the worker's environment variables."""
    missing = sorted(_variables_read(settings_module) - set(ENVIRONMENT))
    if missing:
        raise ReferenceError(
            f"the worker reads {', '.join(missing)}, which ENVIRONMENT "
            "(durable_sse/ops/cli/parser.py, what `durable-sse worker --help` lists) "
            "does not describe"
        )
    rows = ["| variable | what it sets |", "|---|---|"]
    rows += [f"| `{name}` | {_one_line(text)} |" for name, text in ENVIRONMENT.items()]
    return "\n".join(rows)


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    """mkdocs hook: fill the markers of the configuration page."""
    if STREAM_MARKER in markdown:
        markdown = markdown.replace(STREAM_MARKER, stream_settings_table())
    if WORKER_MARKER in markdown:
        markdown = markdown.replace(WORKER_MARKER, worker_environment_table())
    return markdown


if __name__ == "__main__":  # print the tables: python docs/hooks/reference.py
    print(stream_settings_table(), worker_environment_table(), sep="\n\n")
    print(
        f"\n(from {Path(inspect.getfile(spec_module)).name} and "
        f"{Path(inspect.getfile(settings_module)).name})"
    )
