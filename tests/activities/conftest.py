"""The read activity's fixture, shared with tests/reader (where it is defined)."""

from __future__ import annotations

from tests.reader.conftest import reader

__all__ = ["reader"]
