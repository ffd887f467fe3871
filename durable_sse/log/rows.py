"""Events as rows: the tuples the writer COPYs or inserts, and the rules that make them.

A row is ``(pos, stream, event_id, event_ord, follower_key, id_key, event_type, data,
data_bytes, digest, received_at)`` (:data:`durable_sse.log.schema.STAGING_COLUMNS`).
Plain functions, no driver: what a row holds is decided here, how it travels is the
writer's business.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from durable_sse.ids import IdOrder, key_function
from durable_sse.log.keys import CARRIER_KEY, FOLLOWER_WINDOW, data_digest, follower_key, reused_key
from durable_sse.log.records import EventRecord, to_utc
from durable_sse.log.retention import after_horizon

Row = tuple[Any, ...]

POS, STREAM, EVENT_ID, EVENT_ORD, FOLLOWER_KEY, ID_KEY = 0, 1, 2, 3, 4, 5
DIGEST = 9
"""Index of ``digest`` in a row."""


def event_rows(
    stream: str,
    order: IdOrder,
    events: Sequence[EventRecord],
    *,
    start: int = 0,
    clean: bool = False,
) -> list[Row]:
    """The rows of a batch, ``pos`` counting from ``start``.

    No id in force means no keys and a NULL ordinal, whatever the caller passed: NULLs
    never conflict, so id-less events are always stored, never collapsed. Data holding
    NUL goes into ``data_bytes`` exactly (see ``schema.SSEEvent``); ``clean`` (the retry
    after the driver refused a batch) does the same for lone surrogates in data and
    replaces them with U+FFFD in ids and types. A carrier's ``digest`` is computed here
    when the reader did not (it does, once per event).
    """
    rows: list[Row] = []
    keyed = key_function(order)
    received, received_utc = None, None
    for pos, record in enumerate(events, start):
        if record.received_at is not received:  # one timestamp per chunk read, mostly
            received, received_utc = record.received_at, to_utc(record.received_at)
        event_id, event_type = record.event_id, record.event_type
        if clean:
            event_id, event_type = clean_text(event_id), clean_text(event_type)
        key: bytes | None = None
        follower: bytes | None = None
        digest: bytes | None = None
        ordinal = None
        if event_id:
            key = record.id_key if record.id_key is not None and not clean else keyed(event_id)
            ordinal = record.event_ord
            if ordinal is not None:
                follower = _follower_key(record)
                digest = record.digest
                if digest is None and ordinal == 0:
                    digest = data_digest(record.event_type, record.data)
        data, data_bytes = _storable_data(record.data, clean=clean)
        rows.append(
            (
                pos,
                stream,
                event_id,
                ordinal,
                follower,
                key,
                event_type,
                data,
                data_bytes,
                digest,
                received_utc,
            )
        )
    return rows


def rows_after_horizon(rows: list[Row], horizon: bytes) -> list[Row]:
    """The rows :func:`durable_sse.log.retention.after_horizon` lets through: the others
    sort at or before what retention deleted, and storing them would make them new rows.
    (``pos`` may skip numbers afterwards: it only orders the rows.)"""
    return [row for row in rows if after_horizon(row[ID_KEY], horizon)]


def extended_row(row: Row) -> Row:
    """A row of a reused id under its extended key (``keys.reused_key``)."""
    return (*row[:4], reused_key(row[DIGEST], row[FOLLOWER_KEY]), *row[5:])


def new_rows_per_batch(
    inserted: list[tuple[str, str, bytes | None]],
    rows: list[Row],
    spans: list[tuple[int, int]],
) -> list[int]:
    """Attribute the keys one statement inserted to the batches of the group.

    A key in several batches was inserted from the first (rows go in ``pos`` order, the
    rest conflict); rows with no id (NULL follower key) never conflict, so every one of
    them is new and counted where it is.
    """
    counts = [0] * len(spans)
    owner: dict[tuple[str, str, bytes], int] = {}
    for index, (start, end) in enumerate(spans):
        for row in rows[start:end]:
            if row[FOLLOWER_KEY] is None:
                counts[index] += 1
            else:
                owner.setdefault((row[STREAM], row[EVENT_ID], bytes(row[FOLLOWER_KEY])), index)
    for stream, event_id, key in inserted:
        if key is not None:
            counts[owner[(stream, event_id, bytes(key))]] += 1
    return counts


def stored_data(data: str, data_bytes: bytes | None) -> str:
    """An event's exact data from its two columns (the rule ``schema.SSEEvent`` documents)."""
    if data_bytes is None:
        return data
    return bytes(data_bytes).decode("utf-8", "surrogatepass")


def clean_text(text: str) -> str:
    """U+FFFD for what a database text column cannot hold: NUL and lone surrogates."""
    text = text.replace("\x00", "\ufffd")
    if text.isascii():
        return text
    return "".join("\ufffd" if "\ud800" <= char <= "\udfff" else char for char in text)


def _follower_key(record: EventRecord) -> bytes:
    if record.follower_key is not None:
        return record.follower_key
    if record.event_ord == 0:
        return CARRIER_KEY
    window = (max(record.event_ord or 1, 1) - 1) // FOLLOWER_WINDOW
    return follower_key(record.event_type, record.data, window=window)


def _storable_data(data: str, *, clean: bool) -> tuple[str, bytes | None]:
    """``(data, data_bytes)`` as stored: the exact bytes beside a readable stand-in when
    ``data`` cannot hold the text (NUL; with ``clean``, lone surrogates too)."""
    if "\x00" in data:
        return clean_text(data), data.encode("utf-8", "surrogatepass")
    if clean:
        cleaned = clean_text(data)
        if cleaned != data:
            return cleaned, data.encode("utf-8", "surrogatepass")
    return data, None
