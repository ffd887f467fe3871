"""The worker keeps the garbage collector from pausing it (issue 25: the p99 cursor lag at
1,000 streams was the collector's full passes)."""

from __future__ import annotations

import gc

from durable_sse.worker import GC_YOUNG_THRESHOLD, tune_collector


def test_the_worker_freezes_what_it_built_and_collects_young_objects_less_often() -> None:
    before = gc.get_threshold()
    try:
        tune_collector()
        assert gc.get_freeze_count() > 0  # what the process built is never scanned again
        assert gc.get_threshold() == (GC_YOUNG_THRESHOLD, before[1], before[2])
        # Cyclic garbage is still collected.
        cycle: list[object] = []
        cycle.append(cycle)
        del cycle
        assert gc.collect() >= 1
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
