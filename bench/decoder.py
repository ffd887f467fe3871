"""Throughput of our SSE decoder against httpx-sse's, on the same bytes and chunks.

Run: ``python bench/decoder.py [--events N] [--runs N]``.

httpx-sse's side is what ``EventSource.iter_sse`` does per chunk: httpx's incremental
UTF-8 text decoder, ``SSELineDecoder`` (its line splitter), ``line.rstrip("\\n")`` and
``SSEDecoder.decode`` per line. Ours is ``durable_sse.sse.decoder.SSEDecoder.feed``. Two
chunkings: one chunk per event (a server that flushes every event) and 64 KiB (bulk).
"""

from __future__ import annotations

import argparse
import codecs
import logging
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from httpx_sse._decoders import SSEDecoder as HttpxSSEDecoder
from httpx_sse._decoders import SSELineDecoder

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # runnable from a checkout
from durable_sse.sse.decoder import DecodedEvent, SSEDecoder  # noqa: E402

logger = logging.getLogger(__name__)

BULK_CHUNK = 64 * 1024
PAYLOAD = "x" * 48


@dataclass
class Figures:
    median: float
    low: float
    high: float


def make_event_chunks(count: int) -> list[bytes]:
    """One chunk per event; every 100th event is preceded by a keep-alive comment line.

    The comment sits inside the event block (no blank line of its own) so httpx-sse emits
    no phantom event for it and both decoders yield exactly ``count`` events.
    """
    chunks = []
    for n in range(count):
        comment = ": keep-alive\n" if n % 100 == 0 else ""
        text = f'{comment}id: {n}\nevent: tick\ndata: {{"n":{n},"payload":"{PAYLOAD}"}}\n\n'
        chunks.append(text.encode())
    return chunks


def rechunk(chunks: list[bytes], size: int) -> list[bytes]:
    body = b"".join(chunks)
    return [body[i : i + size] for i in range(0, len(body), size)]


def run_httpx_sse(chunks: list[bytes]) -> int:
    text_decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    line_decoder = SSELineDecoder()
    decoder = HttpxSSEDecoder()
    count = 0
    for chunk in chunks:
        for line in line_decoder.decode(text_decoder.decode(chunk)):
            if decoder.decode(line.rstrip("\n")) is not None:
                count += 1
    tail = text_decoder.decode(b"", True)
    lines = line_decoder.decode(tail) if tail else []
    for line in lines + line_decoder.flush():
        if decoder.decode(line.rstrip("\n")) is not None:
            count += 1
    return count


def run_ours(chunks: list[bytes]) -> int:
    decoder = SSEDecoder()
    count = 0
    for chunk in chunks:
        for item in decoder.feed(chunk):
            if type(item) is DecodedEvent:
                count += 1
    for item in decoder.close():
        if type(item) is DecodedEvent:
            count += 1
    return count


def timed_rate(run: Callable[[list[bytes]], int], chunks: list[bytes], expected: int) -> float:
    start = time.perf_counter()
    count = run(chunks)
    elapsed = time.perf_counter() - start
    if count != expected:
        raise RuntimeError(f"{run.__name__} decoded {count} events, expected {expected}")
    return count / elapsed


def compare(chunks: list[bytes], expected: int, runs: int) -> tuple[Figures, Figures, float]:
    """Alternate the two decoders run by run, so load from other processes hits both."""
    theirs, ours = [], []
    for _ in range(runs):
        theirs.append(timed_rate(run_httpx_sse, chunks, expected))
        ours.append(timed_rate(run_ours, chunks, expected))
    ratio = statistics.median(o / t for o, t in zip(ours, theirs, strict=True))
    return _figures(theirs), _figures(ours), ratio


def _figures(rates: list[float]) -> Figures:
    return Figures(statistics.median(rates), min(rates), max(rates))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()

    per_event = make_event_chunks(args.events)
    chunkings = {"per-event flush": per_event, "bulk (64 KiB)": rechunk(per_event, BULK_CHUNK)}
    size_mib = sum(map(len, per_event)) / 2**20
    lines = [
        f"{args.events} events, {size_mib:.1f} MiB, median of {args.runs} runs (min-max), events/s",
        f"{'chunking':<16} {'httpx-sse':>28} {'ours':>28} {'ours/httpx-sse':>15}",
    ]
    for name, chunks in chunkings.items():
        theirs, ours, ratio = compare(chunks, args.events, args.runs)
        lines.append(f"{name:<16} {_fmt(theirs):>28} {_fmt(ours):>28} {ratio:>15.2f}")
    lines.append("ratio = median over runs of (ours / httpx-sse) measured back to back")
    print("\n".join(lines))


def _fmt(figures: Figures) -> str:
    return f"{figures.median:,.0f} ({figures.low:,.0f}-{figures.high:,.0f})"


if __name__ == "__main__":
    main()
