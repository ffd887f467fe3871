"""Worst-case time of drop-notice matching on comments at the scan cap (RE2).

Run: ``python bench/drops.py [--runs N] [--cold N]``.

``DropNoticeMatcher().matches`` (the default patterns) and ``dropped_count`` on hostile
comments of exactly ``MAX_NOTICE_BYTES`` bytes, built to make every pattern scan to the end
(no match) or to match only at the end, plus the 182-byte notice of issue #13 that took
19.8 s with Python's ``re``, and three classic catastrophic patterns configured as a
stream's own ``drop_notice``. "warm" is the median (and 99th percentile) over ``--runs``
calls once the RE2 DFA has its states; "cold" is the median of the first call after the
patterns were compiled afresh (``re2.purge()``), which includes building DFA states. The
goal is under 1 ms per comment, cold or warm.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import re2

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # runnable from a checkout
from durable_sse.sse.drops import (  # noqa: E402
    MAX_NOTICE_BYTES,
    DropNoticeMatcher,
    dropped_count,
)

CAP = MAX_NOTICE_BYTES
ISSUE_NOTICE = "dropped " + ",".join(str(i) for i in range(100, 140)) + " (backpressure)"


def fill(unit: str, *, prefix: str = "", suffix: str = "") -> str:
    """``prefix`` + ``unit`` repeated + ``suffix``, exactly CAP bytes of UTF-8."""
    room = CAP - len(prefix.encode()) - len(suffix.encode())
    body = unit * (room // len(unit.encode()) + 1)
    while len(body.encode()) > room:
        body = body[:-1]
    text = prefix + body + suffix
    assert len(text.encode()) <= CAP
    return text


def hostile_comments() -> dict[str, tuple[str, bool]]:
    """name -> (comment, whether it is a drop notice)."""
    numbers = " ".join(str(100 + i) for i in range(CAP // 4))
    return {
        "issue #13 notice (182 B)": (ISSUE_NOTICE, True),
        "verb + numbers, no noun": (fill(numbers, prefix="dropped "), False),
        "verb + filler words": (fill("the old 1,_ ", prefix="dropped "), False),
        "verb repeated": (fill("dropping "), False),
        "noun repeated": (fill("events "), False),
        "negated nouns": (fill("no events zero events 0 events "), False),
        "id list, match at the end": (fill("x ", suffix=" dropped 1,2"), True),
        "noun + verb at the end": (fill("stream ", suffix=" events dropped"), True),
        "multi-byte text": (fill("é€😀"), False),
        "backpressure, no verb": (fill("backpressure "), False),
    }


def hostile_user_comments() -> dict[str, tuple[str, bool]]:
    """Comments for :data:`CATASTROPHIC` as a stream's own ``drop_notice``."""
    return {
        "user patterns: x...x": (fill("x"), False),
        "user patterns: words": (fill("word "), False),
        "user patterns: a...a": (fill("a"), False),
    }


def timed(call: Callable[[], object]) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


CATASTROPHIC = ("(x+x+)+y", r"^(\w+\s?)+!$", "(a|aa)*b")
"""User patterns that take exponential time with a backtracking engine."""


def measure(
    comment: str, expected: bool, runs: int, cold_runs: int, patterns: tuple[str, ...] | None
) -> tuple[float, ...]:
    matcher = DropNoticeMatcher(patterns)
    if matcher.matches(comment) is not expected:
        raise RuntimeError(f"matches({comment[:40]!r}…) is not {expected}")
    cold = []
    for _ in range(cold_runs):
        re2.purge()
        fresh = DropNoticeMatcher(patterns)
        cold.append(timed(lambda fresh=fresh: fresh.matches(comment)))
    warm = [timed(lambda: matcher.matches(comment)) for _ in range(runs)]
    counts = [timed(lambda: dropped_count(comment)) for _ in range(runs)]
    return (
        statistics.median(warm),
        statistics.quantiles(warm, n=100)[98],
        statistics.median(cold),
        statistics.median(counts),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--cold", type=int, default=50)
    args = parser.parse_args()
    lines = [
        f"cap {CAP} bytes; warm: median (p99) of {args.runs} calls; "
        f"cold: median of {args.cold} first calls after compiling; microseconds",
        f"{'comment':<28} {'bytes':>6} {'warm':>8} {'p99':>8} {'cold':>8} {'count':>8}",
    ]
    worst = 0.0
    cases = [(c, None) for c in hostile_comments().items()]
    cases += [(c, CATASTROPHIC) for c in hostile_user_comments().items()]
    for (name, (comment, expected)), patterns in cases:
        warm, high, cold, count = measure(comment, expected, args.runs, args.cold, patterns)
        worst = max(worst, warm, cold)
        lines.append(
            f"{name:<28} {len(comment.encode()):>6} {warm * 1e6:>8.1f} {high * 1e6:>8.1f} "
            f"{cold * 1e6:>8.1f} {count * 1e6:>8.1f}"
        )
    lines.append(f"worst median (warm or cold): {worst * 1e6:.1f} us; goal < 1000 us")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
