"""``python -m durable_sse.source`` (also ``durable-sse source``): run the SSE source alone."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal

from durable_sse.errors import ConfigError
from durable_sse.source.config import SourceStreamConfig, parse_stream_arg
from durable_sse.source.server import SSESource

logger = logging.getLogger(__name__)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="durable-sse source",
        description="Serve demo SSE streams with injectable faults.",
        epilog="Settings: "
        + ", ".join(SourceStreamConfig.__dataclass_fields__)
        + ". Example: --stream demo:rate=20,start_id=990 "
        "--stream noisy:rate=50,drop_every=500,drop_count=20",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--seed", type=int, default=0, help="seed of the fault RNG")
    parser.add_argument(
        "--stream",
        action="append",
        default=[],
        metavar="NAME[:KEY=VALUE,...]",
        help="a stream to serve (repeatable); POST /streams/<name> adds one at run time",
    )
    parser.add_argument("--log-level", default="INFO")
    return parser


async def _serve(source: SSESource) -> None:
    await source.start()
    logger.info("streams: %s", ", ".join(source.url(n) for n in source.streams) or "(none)")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await source.stop()


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(message)s")
    streams: dict[str, SourceStreamConfig] = {}
    for text in args.stream:
        try:
            name, config = parse_stream_arg(text)
        except ConfigError as exc:
            parser.error(f"--stream {text!r}: {exc}")
        if name in streams:
            parser.error(f"--stream {name!r} given twice")
        streams[name] = config
    source = SSESource(streams, host=args.host, port=args.port, seed=args.seed)
    try:
        asyncio.run(_serve(source))
    except OSError as exc:
        logger.error("cannot listen on %s:%d: %s", args.host, args.port, exc)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
