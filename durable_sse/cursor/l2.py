"""L2: the Redis cursor store (key ``cursor:<stream>``, value ``<stream>#<id>``), and
each running connection's live progress (key ``progress:<stream>``, a view for
``durable-sse status``: what moves with every batch stays out of Temporal's history).

L2 survives worker restarts and makes moving a stream to another worker cheap. It is a
cache, never the truth: every failure is a miss or a dropped write, logged once per
outage, and no call waits longer than the configured timeout. Writes go through one
Lua script that compares and sets atomically, so two workers writing at once (ownership
moving) can never move a cursor backward. The script's sort key is a line-for-line port
of :func:`durable_sse.ids.sort_key`; strings are compared byte by byte in Lua because
Lua's ``<`` on strings goes through ``strcoll`` (locale-dependent in Redis).

Writes of many streams are one script call over many keys; that is one round trip but
assumes a single Redis (not Redis Cluster, where the keys would span slots).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Sequence

from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from durable_sse.ids import IdOrder, is_newer

logger = logging.getLogger(__name__)

KEY_PREFIX = "cursor:"
"""Redis key of a stream's cursor: ``cursor:<stream>``."""
PROGRESS_PREFIX = "progress:"
"""Redis key of a running connection's live progress: ``progress:<stream>`` (a JSON
``ConnectionProgress``, written every few seconds; ``durable-sse status`` reads it)."""
PROGRESS_TTL_MS = 15 * 60 * 1000
"""A connection that stopped writing its progress (it ended, its worker died) leaves a
value that expires: the status then shows the workflow's view alone."""
VALUE_SEPARATOR = "#"
"""The value is ``<stream>#<id>``; the stream part is stripped by its exact length."""
MAX_KEYS_PER_CALL = 256
"""Cursors written by one script call: keeps each call short (Redis runs scripts alone)."""

SORT_KEY_LUA = r"""
local function digit_run(run)
  local significant = string.gsub(run, '^0+', '')
  if #significant > 9999 then
    return nil
  end
  return string.format('%04d', #significant) .. significant
end

local function sort_key(id, order)
  if order == 'lexicographic' then
    return id
  end
  if order == 'numeric' then
    if string.find(id, '^[0-9]+$') then
      local run = digit_run(id)
      if run then
        return '\1' .. run
      end
    end
    return '\0' .. id
  end
  if order ~= 'natural' then
    error('unknown id order: ' .. tostring(order))
  end
  local parts = {}
  local position = 1
  while true do
    local first, last = string.find(id, '[0-9]+', position)
    if not first then
      break
    end
    parts[#parts + 1] = string.sub(id, position, first - 1)
    local run = string.sub(id, first, last)
    local encoded = digit_run(run)
    if encoded then
      parts[#parts + 1] = '\0' .. encoded
    else
      parts[#parts + 1] = run
    end
    position = last + 1
  end
  parts[#parts + 1] = string.sub(id, position)
  return table.concat(parts)
end

local function compare_bytes(a, b)
  if a == b then
    return 0
  end
  local n = math.min(#a, #b)
  for i = 1, n do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then
      if x < y then
        return -1
      end
      return 1
    end
  end
  if #a < #b then
    return -1
  end
  return 1
end
"""

ADVANCE_LUA = (
    SORT_KEY_LUA
    + r"""
-- KEYS[i]: cursor key of stream i; ARGV[1]: TTL in ms;
-- ARGV[3i-1], ARGV[3i], ARGV[3i+1]: '<stream>#', new id, id order of stream i.
-- Returns one 1 (moved) or 0 (refused: not newer) per key. A value whose prefix is not
-- '<stream>#' is treated as absent and overwritten. The TTL is set or refreshed either way.
local ttl = tonumber(ARGV[1])
local moved = {}
for i = 1, #KEYS do
  local prefix, new_id, order = ARGV[3 * i - 1], ARGV[3 * i], ARGV[3 * i + 1]
  local new_key = sort_key(new_id, order)
  local current = redis.call('GET', KEYS[i])
  local forward = true
  if current and string.sub(current, 1, #prefix) == prefix and #current > #prefix then
    local current_id = string.sub(current, #prefix + 1)
    forward = compare_bytes(new_key, sort_key(current_id, order)) > 0
  end
  if forward then
    redis.call('SET', KEYS[i], prefix .. new_id, 'PX', ttl)
    moved[i] = 1
  else
    redis.call('PEXPIRE', KEYS[i], ttl)
    moved[i] = 0
  end
end
return moved
"""
)


def cursor_key(stream: str) -> str:
    return f"{KEY_PREFIX}{stream}"


def progress_key(stream: str) -> str:
    return f"{PROGRESS_PREFIX}{stream}"


def cursor_value(stream: str, event_id: str) -> str:
    return f"{stream}{VALUE_SEPARATOR}{event_id}"


def parse_value(stream: str, value: bytes | str | None) -> str | None:
    """The id in a stored value, or None when absent, empty or foreign (logged)."""
    if value is None:
        return None
    raw = value if isinstance(value, bytes) else value.encode("utf-8")
    prefix = f"{stream}{VALUE_SEPARATOR}".encode()
    if not raw.startswith(prefix):
        logger.warning(
            "redis cursor %s holds a value for another stream; treated as a miss",
            cursor_key(stream),
        )
        return None
    try:
        event_id = raw[len(prefix) :].decode("utf-8")
    except UnicodeDecodeError:
        logger.warning("redis cursor %s is not UTF-8; treated as a miss", cursor_key(stream))
        return None
    return event_id or None


class RedisCursors:
    """Forward-only stream cursors in Redis that never raise and never block for long.

    Args:
        redis_url: ``redis://``, ``rediss://`` or ``unix://`` URL.
        ttl_days: lifetime of a cursor key, refreshed on every write.
        timeout: bound on every call (connect, read, the whole command); no retries.
    """

    def __init__(self, redis_url: str, *, ttl_days: float = 7.0, timeout: float = 0.5) -> None:
        self._redis: Redis = Redis.from_url(
            redis_url,
            socket_timeout=timeout,
            socket_connect_timeout=timeout,
            retry=Retry(NoBackoff(), 0),
            retry_on_error=[],
            health_check_interval=0,
        )
        self._timeout = timeout
        self._ttl_ms = max(1, int(ttl_days * 86_400_000))
        self._advance_script = self._redis.register_script(ADVANCE_LUA)
        self._down = False
        self._pending: dict[str, tuple[str, str]] = {}
        self._progress: dict[str, str] = {}
        """Live progress values waiting to be written, the newest per stream."""
        self._wakeup = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._flusher: asyncio.Task[None] | None = None
        self._closed = False
        self.writes = 0
        """Cursor writes Redis accepted (moved or refused as not newer)."""
        self.write_failures = 0
        """Cursor writes dropped because Redis failed."""
        self.read_failures = 0

    # -- reads ---------------------------------------------------------------------

    async def get(self, stream: str) -> str | None:
        """The stream's cursor, or None on a miss, a foreign value or a Redis error."""
        try:
            async with asyncio.timeout(self._timeout):
                value = await self._redis.get(cursor_key(stream))
        except Exception as error:  # a cache miss, whatever went wrong
            self.read_failures += 1
            self._failed("read", error)
            return None
        self._recovered()
        return parse_value(stream, value)

    async def get_many(self, streams: Iterable[str]) -> dict[str, str | None]:
        """Cursors of many streams in one round trip (MGET); all misses on error."""
        names = list(dict.fromkeys(streams))
        if not names:
            return {}
        try:
            async with asyncio.timeout(self._timeout):
                values = await self._redis.mget([cursor_key(name) for name in names])
        except Exception as error:
            self.read_failures += 1
            self._failed("read", error)
            return dict.fromkeys(names)
        self._recovered()
        return {name: parse_value(name, value) for name, value in zip(names, values, strict=True)}

    # -- writes --------------------------------------------------------------------

    async def advance(self, stream: str, event_id: str, id_order: IdOrder | str) -> bool | None:
        """Atomically move the cursor forward; True moved, False not newer, None on error."""
        result = await self.advance_many([(stream, event_id, id_order)])
        return result.get(stream)

    async def advance_many(
        self, items: Sequence[tuple[str, str, IdOrder | str]]
    ) -> dict[str, bool | None]:
        """Advance many streams' cursors, one script call per :data:`MAX_KEYS_PER_CALL`.

        A stream listed twice keeps its newest id. Empty ids are refused (False) without
        a write. Returns stream -> moved (None where Redis failed).
        """
        wanted: dict[str, tuple[str, str]] = {}
        results: dict[str, bool | None] = {}
        for stream, event_id, id_order in items:
            order = IdOrder(id_order).value
            if not event_id:
                results.setdefault(stream, False)
                continue
            previous = wanted.get(stream)
            if previous is None or is_newer(event_id, previous[0], order):
                wanted[stream] = (event_id, order)
        streams = list(wanted)
        for start in range(0, len(streams), MAX_KEYS_PER_CALL):
            chunk = streams[start : start + MAX_KEYS_PER_CALL]
            keys = [cursor_key(stream) for stream in chunk]
            args: list[str | int] = [self._ttl_ms]
            for stream in chunk:
                event_id, order = wanted[stream]
                args += [f"{stream}{VALUE_SEPARATOR}", event_id, order]
            try:
                async with asyncio.timeout(self._timeout):
                    moved = await self._advance_script(keys=keys, args=args)
            except Exception as error:  # L2 is a cache: drop and log
                self.write_failures += len(chunk)
                self._failed("write", error)
                results.update(dict.fromkeys(chunk))
                continue
            self._recovered()
            self.writes += len(chunk)
            results.update({stream: bool(flag) for stream, flag in zip(chunk, moved, strict=True)})
        return results

    async def forget(self, stream: str) -> bool:
        """Delete the stream's cursor (stream removed); False on a Redis error."""
        self._pending.pop(stream, None)
        try:
            async with asyncio.timeout(self._timeout):
                await self._redis.delete(cursor_key(stream))
        except Exception as error:
            self._failed("write", error)
            return False
        self._recovered()
        return True

    def submit(self, stream: str, event_id: str, id_order: IdOrder | str) -> None:
        """Queue a forward write without waiting (the reader's path, once per batch).

        Coalesced per stream: only the newest pending id of each stream is kept, and one
        background task writes whatever is pending, so a slow or absent Redis costs the
        caller nothing and memory stays bounded by the number of streams.
        """
        if self._closed or not event_id:
            return
        order = IdOrder(id_order).value
        pending = self._pending.get(stream)
        if pending is None or is_newer(event_id, pending[0], order):
            self._pending[stream] = (event_id, order)
        self._wake_flusher()

    def submit_progress(self, stream: str, value: str) -> None:
        """Queue a running connection's live progress (JSON) without waiting: written by
        the cursor flusher, the newest value per stream, never blocking the caller."""
        if self._closed:
            return
        self._progress[stream] = value
        self._wake_flusher()

    async def get_progress(self, stream: str) -> str | None:
        """A running connection's live progress, or None (none, expired, or Redis failed)."""
        try:
            async with asyncio.timeout(self._timeout):
                value = await self._redis.get(progress_key(stream))
        except Exception as error:
            self.read_failures += 1
            self._failed("read", error)
            return None
        self._recovered()
        if value is None:
            return None
        return value.decode("utf-8") if isinstance(value, bytes) else str(value)

    async def flush(self) -> None:
        """Wait until every cursor submitted so far has been attempted."""
        if self._flusher is None or self._flusher.done():
            if self._pending or self._progress:
                await self._write_pending()
            self._idle.set()
            return
        self._wakeup.set()
        await self._idle.wait()

    async def close(self) -> None:
        """Attempt pending writes, stop the flusher and close the connections."""
        if self._closed:
            return
        await self.flush()
        self._closed = True
        if self._flusher is not None:
            # The flag ends the flusher's loop even if a cancellation landing inside a
            # Redis call comes back as a timeout (caught as a failed batch); the wait is
            # bounded, and a cancellation of close() itself is never swallowed.
            self._flusher.cancel()
            await asyncio.wait({self._flusher}, timeout=5)
        await self._redis.aclose()

    async def _flush_forever(self) -> None:
        while not self._closed:
            await self._wakeup.wait()
            self._wakeup.clear()
            while self._pending or self._progress:
                await self._write_pending()
            self._idle.set()

    def _wake_flusher(self) -> None:
        """Something is pending: the flusher writes it (started on first use)."""
        self._idle.clear()
        self._wakeup.set()
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.get_running_loop().create_task(
                self._flush_forever(), name="redis-cursor-flusher"
            )

    async def _write_pending(self) -> None:
        """Take everything pending and write it: cursors in one call, progress in one."""
        batch, self._pending = self._pending, {}
        progress, self._progress = self._progress, {}
        try:
            if batch:
                await self.advance_many(
                    [(stream, event_id, order) for stream, (event_id, order) in batch.items()]
                )
            if progress:
                await self._write_progress(progress)
        except Exception:  # the flusher must outlive any bug in one batch
            logger.exception("redis cursor flush failed; %d cursors dropped", len(batch))

    async def _write_progress(self, progress: dict[str, str]) -> None:
        """One pipelined round trip: ``SET progress:<stream> value PX ttl`` each."""
        pipeline = self._redis.pipeline(transaction=False)
        for stream, value in progress.items():
            pipeline.set(progress_key(stream), value, px=PROGRESS_TTL_MS)
        try:
            async with asyncio.timeout(self._timeout):
                await pipeline.execute()
        except Exception as error:  # a view: dropped, the next one says it all again
            self._failed("write", error)
            return
        self._recovered()

    # -- outage logging --------------------------------------------------------------

    def _failed(self, what: str, error: BaseException) -> None:
        if not self._down:
            self._down = True
            logger.warning(
                "redis cursor store unavailable (%s failed: %s: %s); "
                "reads are misses and writes are dropped until it recovers",
                what,
                type(error).__name__,
                error,
            )

    def _recovered(self) -> None:
        if self._down:
            self._down = False
            logger.info("redis cursor store recovered")
