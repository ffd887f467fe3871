"""The streams a TOML file declares, and how a running stream differs from its file.

``durable-sse start`` and ``dev`` read the ``[[stream]]`` tables (:func:`load_streams`),
each validated by :func:`~durable_sse.config.spec.parse_spec`; for a stream that is
already running, ``start`` names each setting the file would change
(:func:`spec_differences`), and ``start --restart`` applies them.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from durable_sse.config.spec import SETTINGS, StreamSpec, parse_spec, show_setting
from durable_sse.errors import ConfigError

# --- the TOML stream file ------------------------------------------------------------------


def load_streams(path: str | Path) -> list[StreamSpec]:
    """Read and validate the ``[[stream]]`` tables of a TOML file.

    An unreadable or malformed file, an unknown top-level key, a file that declares no
    stream, a bad setting or a name declared twice: one ConfigError line each.
    """
    path = Path(path)
    try:
        document = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not UTF-8 text") from None
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"{path}: invalid TOML: {error}") from None
    unknown = sorted(key for key in document if key != "stream")
    if unknown:
        raise ConfigError(f"{path}: unknown key {unknown[0]!r}: expected [[stream]] tables only")
    tables = document.get("stream", [])
    if not isinstance(tables, list) or not all(isinstance(t, dict) for t in tables):
        raise ConfigError(f"{path}: 'stream' must be an array of tables ([[stream]])")
    if not tables:
        raise ConfigError(f"no streams declared in {path}")
    specs = [
        parse_spec(table, source=f"{path} [[stream]] #{number}")
        for number, table in enumerate(tables, start=1)
    ]
    seen: set[str] = set()
    for spec in specs:
        if spec.name in seen:
            raise ConfigError(f"{path}: stream {spec.name!r} is declared twice")
        seen.add(spec.name)
    return specs


# --- comparing a running spec with a declared one -----------------------------------------


@dataclass(frozen=True)
class SettingChange:
    """One setting that differs between the running spec and the declared one."""

    setting: str
    old: Any
    new: Any

    def __str__(self) -> str:
        old, new = show_setting(self.setting, self.old), show_setting(self.setting, self.new)
        return f"{self.setting} {old} → {new}"


def spec_differences(running: StreamSpec, declared: StreamSpec) -> list[SettingChange]:
    """Settings whose values differ, in declaration order (names only for secrets:
    ``*_from_env`` values are variable names, URLs are shown redacted)."""
    return [
        SettingChange(name, getattr(running, name), getattr(declared, name))
        for name in SETTINGS
        if getattr(running, name) != getattr(declared, name)
    ]
