"""The simulation quiets the ``durable_sse`` logger (thousands of schedules warn on
purpose); each test puts its level back, so later tests' ``caplog`` still sees warnings."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def restore_log_level() -> Iterator[None]:
    logger = logging.getLogger("durable_sse")
    level = logger.level
    yield
    logger.setLevel(level)
