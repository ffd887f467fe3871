"""SSEDecoder: WHATWG parsing details, chunking invariance, line limits, and the gaps in
httpx-sse that made us write it (each gap test shows plain httpx-sse failing on the same
bytes, through ``httpx_sse.EventSource`` over ``httpx.MockTransport``)."""

from __future__ import annotations

import re
import tracemalloc
from collections.abc import Iterator

import httpx
import httpx_sse
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from durable_sse.errors import EventTooLargeError, IdTooLongError, LineTooLongError
from durable_sse.sse.content_type import is_event_stream
from durable_sse.sse.decoder import Comment, DecodedEvent, SSEDecoder

Item = DecodedEvent | Comment


def decode_all(chunks: list[bytes], **options: object) -> tuple[list[Item], str, int | None]:
    decoder = SSEDecoder(**options)  # type: ignore[arg-type]
    items: list[Item] = []
    for chunk in chunks:
        items += decoder.feed(chunk)
    items += decoder.close()
    return items, decoder.last_event_id, decoder.retry


def decode_bytes(body: bytes) -> list[Item]:
    return decode_all([body])[0]


def httpx_sse_events(
    body: bytes, content_type: str = "text/event-stream"
) -> list[httpx_sse.ServerSentEvent]:
    """What plain httpx-sse yields for ``body`` served with ``content_type``."""

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"content-type": content_type}, content=body)

    with httpx.Client(transport=httpx.MockTransport(handler)) as client:
        with httpx_sse.connect_sse(client, "GET", "http://sse.test/stream") as source:
            return list(source.iter_sse())


# --- WHATWG details ------------------------------------------------------------------


def test_comment_text_strips_one_leading_space() -> None:
    items = decode_bytes(b": ping\n:\n:  two spaces\n:no space\n")
    assert items == [Comment("ping"), Comment(""), Comment(" two spaces"), Comment("no space")]


def test_items_come_in_stream_order() -> None:
    body = b": before\ndata: a\n: inside\n\n: after\ndata: b\n\n"
    assert decode_bytes(body) == [
        Comment("before"),
        Comment("inside"),
        DecodedEvent("a"),
        Comment("after"),
        DecodedEvent("b"),
    ]


def test_event_without_data_commits_its_id_but_is_not_dispatched() -> None:
    items, last_event_id, _ = decode_all([b"id: 7\n\nevent: x\n\n"])
    assert items == []
    assert last_event_id == "7"


def test_id_field_flag_and_inherited_id() -> None:
    items = decode_bytes(b"id: 1\ndata: a\n\ndata: b\n\nid: \0x\ndata: c\n\nid:\ndata: d\n\n")
    assert items == [
        DecodedEvent("a", id="1", id_field=True),
        DecodedEvent("b", id="1", id_field=False),
        DecodedEvent("c", id="1", id_field=False),  # an id with NUL is ignored
        DecodedEvent("d", id="", id_field=True),  # an empty id resets
    ]


def test_last_event_id_is_committed_only_by_a_blank_line() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"id: 1\ndata: a\n\nid: 2\ndata: b\n") == [
        DecodedEvent("a", id="1", id_field=True)
    ]
    assert decoder.last_event_id == "1"
    assert decoder.close() == []
    assert decoder.last_event_id == "1"


def test_close_interprets_a_final_unterminated_comment_but_drops_the_event() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"data: half\n: dropping events") == []
    assert decoder.close() == [Comment("dropping events")]
    assert decoder.close() == []


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (b"1500", 1500),
        (b"0", 0),
        (b"-5", None),
        (b"+5", None),
        (b"1_000", None),
        (b" 1000", None),  # one space is stripped, the second is part of the value
        (b"1e3", None),
        ("\u0661\u0662\u0663".encode(), None),  # Arabic-Indic digits are not ASCII digits
        (b"", None),
    ],
)
def test_retry_accepts_only_ascii_digits(value: bytes, expected: int | None) -> None:
    assert decode_all([b"retry: " + value + b"\ndata: x\n\n"])[2] == expected


def test_retry_with_absurdly_many_digits_is_ignored_not_fatal() -> None:
    body = b"retry: 5\nretry: " + b"9" * 10_000 + b"\ndata: x\n\n"
    assert decode_all([body]) == ([DecodedEvent("x")], "", 5)


def test_invalid_utf8_is_replaced() -> None:
    assert decode_bytes(b"data: a\xffb\xe2\x82\n\n") == [DecodedEvent("a\ufffdb\ufffd")]


def test_crlf_split_across_chunks_is_one_line_end() -> None:
    chunks = [b"data: a\r", b"\n", b"\r", b"\ndata: b\r", b"\r"]
    assert decode_all(chunks)[0] == [DecodedEvent("a"), DecodedEvent("b")]


def test_cr_dispatches_without_waiting_for_the_next_chunk() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"data: a\r\r") == [DecodedEvent("a")]


def test_bom_split_across_chunks_is_stripped() -> None:
    assert decode_all([b"\xef", b"\xbb", b"\xbfdata: a\n\n"])[0] == [DecodedEvent("a")]


def test_constructor_last_event_id_applies_to_events_without_id() -> None:
    items, last_event_id, _ = decode_all([b"data: a\n\n"], last_event_id="41")
    assert items == [DecodedEvent("a", id="41", id_field=False)]
    assert last_event_id == "41"


def test_assigning_last_event_id_before_feeding_equals_the_constructor_option() -> None:
    decoder = SSEDecoder()
    decoder.last_event_id = "41"
    assert decoder.feed(b"data: a\n\n: ping\n\n") == [DecodedEvent("a", id="41"), Comment("ping")]
    assert decoder.last_event_id == "41"


# --- chunking invariance (hypothesis) ----------------------------------------------------

VALUE_PIECES = [
    b"a",
    b"1",
    b" ",
    b":",
    b"\0",
    "\u00e9".encode(),
    "\u20ac".encode(),
    "\U0001f600".encode(),
    "\ufeff".encode(),
    b"\xff",  # invalid UTF-8
    b"\xe2\x82",  # truncated sequence
]
LINE_ENDS = [b"\n", b"\r", b"\r\n"]


@st.composite
def event_streams(draw: st.DrawFn) -> bytes:
    out = [b"\xef\xbb\xbf"] if draw(st.booleans()) else []
    for _ in range(draw(st.integers(0, 25))):
        kind = draw(st.sampled_from(["field", "field", "field", "comment", "blank", "bare"]))
        if kind == "blank":
            line = b""
        else:
            value = b"".join(draw(st.lists(st.sampled_from(VALUE_PIECES), max_size=6)))
            if kind == "comment":
                line = b":" + value
            elif kind == "bare":
                line = draw(st.sampled_from([b"data", b"id", b"retry", b"event"]))
            else:
                name = draw(st.sampled_from([b"data", b"id", b"event", b"retry", b"Data", b"x"]))
                if name == b"retry" and draw(st.booleans()):
                    value = str(draw(st.integers(0, 99999))).encode()
                line = name + draw(st.sampled_from([b":", b": ", b":  "])) + value
        out.append(line + draw(st.sampled_from(LINE_ENDS)))
    if draw(st.booleans()):
        out.append(b"data: unterminated")
    return b"".join(out)


def reference_decode(body: bytes) -> tuple[list[Item], str, int | None]:
    """An independent, literal reading of the spec: decode everything, then split."""
    text = body.decode("utf-8", "replace")
    if text.startswith("\ufeff"):
        text = text[1:]
    lines = re.split(r"\r\n|\r|\n", text)
    items: list[Item] = []
    data, event_type, id_buffer, last_id, retry = "", "", "", "", None
    for index, line in enumerate(lines):
        final = index == len(lines) - 1  # the unterminated remainder: never dispatches
        if line == "":
            if final:
                break
            last_id = id_buffer
            if data:
                items.append(
                    DecodedEvent(data.removesuffix("\n"), event_type or "message", last_id)
                )
            data, event_type = "", ""
            continue
        if line.startswith(":"):
            items.append(Comment(line[1:].removeprefix(" ")))
            continue
        if ":" in line:
            name, value = line.split(":", 1)
            value = value.removeprefix(" ")
        else:
            name, value = line, ""
        if name == "data":
            data += value + "\n"
        elif name == "event":
            event_type = value
        elif name == "id" and "\0" not in value:
            id_buffer = value
        elif name == "retry" and value and all(c in "0123456789" for c in value):
            retry = int(value)
    return items, last_id, retry


def without_id_flag(
    result: tuple[list[Item], str, int | None],
) -> tuple[list[Item], str, int | None]:
    items, last_id, retry = result
    flat = [
        DecodedEvent(i.data, i.event, i.id) if isinstance(i, DecodedEvent) else i for i in items
    ]
    return flat, last_id, retry


def split_at(body: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({min(cut, len(body)) for cut in cuts})
    bounds = [0, *points, len(body)]
    return [body[a:b] for a, b in zip(bounds, bounds[1:], strict=False) if b > a]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=event_streams(), cuts=st.lists(st.integers(0, 2000), max_size=30))
def test_any_chunking_decodes_the_same(body: bytes, cuts: list[int]) -> None:
    whole = decode_all([body])
    assert decode_all([body[i : i + 1] for i in range(len(body))]) == whole
    assert decode_all(split_at(body, cuts)) == whole
    assert without_id_flag(whole) == reference_decode(body)


def test_bom_mixed_line_ends_and_multibyte_bytewise() -> None:
    sample = b"\xef\xbb\xbfid: 1\r\ndata: \xe2\x82\xac\r\r: c\ndata\n\n"
    whole = decode_all([sample])
    assert whole[0] == [
        DecodedEvent("\u20ac", id="1", id_field=True),
        Comment("c"),
        DecodedEvent("", id="1"),
    ]
    assert decode_all([sample[i : i + 1] for i in range(len(sample))]) == whole


# --- max_line_bytes ------------------------------------------------------------------


def test_64_mib_line_raises_at_the_cap_with_bounded_memory() -> None:
    cap, chunk_size = 1024 * 1024, 64 * 1024
    decoder = SSEDecoder(max_line_bytes=cap)
    fed = 0
    tracemalloc.start()
    try:
        with pytest.raises(LineTooLongError, match=str(cap)):
            for _ in range(64 * 1024 * 1024 // chunk_size):
                assert decoder.pending_bytes <= cap
                decoder.feed(b"x" * chunk_size)  # a fresh object each time, as from a socket
                fed += chunk_size
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert fed == cap  # the chunk that crossed the cap raised
    assert peak < cap + 4 * chunk_size
    assert decoder.pending_bytes == 0  # what it held was released


def test_a_long_line_complete_in_one_chunk_raises_too() -> None:
    decoder = SSEDecoder(max_line_bytes=10)
    assert decoder.feed(b"data: 1234\n\n") == [DecodedEvent("1234")]
    with pytest.raises(LineTooLongError):
        decoder.feed(b"data: 12345\n\n")


def test_a_long_line_hands_over_what_its_chunk_completed_before_it() -> None:
    """Events before the long line in the same chunk were received: the error carries
    them, and the id in force is the last of them (the cursor stays before the event that
    holds the long line)."""
    decoder = SSEDecoder(max_line_bytes=16)
    with pytest.raises(LineTooLongError) as raised:
        decoder.feed(b"id: 1\ndata: a\n\n: ping\nid: 2\ndata: b\n\nid: 3\ndata: " + b"c" * 40)
    assert raised.value.items == [
        DecodedEvent("a", id="1", id_field=True),
        Comment("ping"),
        DecodedEvent("b", id="2", id_field=True),
    ]
    assert decoder.last_event_id == "2"
    with pytest.raises(LineTooLongError) as raised:
        SSEDecoder(max_line_bytes=16).feed(b"data: " + b"x" * 40 + b"\n\nid: 5\ndata: y\n\n")
    assert raised.value.items == []  # the long line came first: nothing before it


@settings(max_examples=200, deadline=None)
@given(
    cap=st.integers(4, 64),
    lengths=st.lists(st.integers(0, 100), min_size=1, max_size=8),
    ends=st.lists(st.sampled_from(LINE_ENDS), min_size=8, max_size=8),
    chunk_size=st.integers(1, 80),
)
def test_line_limit_is_independent_of_chunking(
    cap: int, lengths: list[int], ends: list[bytes], chunk_size: int
) -> None:
    body = b"".join(
        b":" + b"x" * (n - 1) + end if n else end for n, end in zip(lengths, ends, strict=False)
    )
    expect_raise = any(n > cap for n in lengths)
    decoder = SSEDecoder(max_line_bytes=cap)
    raised = False
    items: list[Item] = []
    try:
        for start in range(0, len(body), chunk_size):
            items += decoder.feed(body[start : start + chunk_size])
            assert decoder.pending_bytes <= cap
        decoder.close()
    except LineTooLongError as error:
        raised = True
        items += error.items
    assert raised == expect_raise
    if raised:
        # Every line before the long one came out, however the body was chunked.
        before = lengths[: next(i for i, n in enumerate(lengths) if n > cap)]
        assert items == [Comment("x" * (n - 1)) for n in before if n]


# --- max_event_bytes and max_id_bytes (issue #13, case 5) ----------------------------

GIB = 1024 * 1024 * 1024
CHUNK = 64 * 1024


def endless_event(line: bytes, chunk_size: int = CHUNK, total: int = GIB) -> Iterator[bytes]:
    """``total`` bytes of one event's ``data`` lines with no blank line, made chunk by chunk
    (never held whole); each chunk is a fresh object, as from a socket."""
    per_chunk = max(1, chunk_size // len(line))
    sent = 0
    while sent < total:
        chunk = line * per_chunk
        sent += len(chunk)
        yield chunk


def feed_until_error(
    decoder: SSEDecoder, chunks: Iterator[bytes], error: type[Exception]
) -> tuple[int, int, int]:
    """Feed until ``error``; return (bytes fed before the failing chunk, its size, the
    tracemalloc peak)."""
    fed = 0
    tracemalloc.start()
    try:
        with pytest.raises(error):
            for chunk in chunks:
                assert decoder.event_bytes <= decoder.max_event_bytes
                size = len(chunk)
                decoder.feed(chunk)
                fed += size
                del chunk
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return fed, size, peak


def test_1_gib_endless_event_raises_after_the_cap_with_bounded_memory() -> None:
    decoder = SSEDecoder()  # the defaults: 8 MiB per event, 1 MiB per line
    cap = decoder.max_event_bytes
    assert cap == 8 * 1024 * 1024
    line = b"data: " + b"x" * 1000 + b"\n"
    fed, last_chunk, peak = feed_until_error(decoder, endless_event(line), EventTooLargeError)
    # The error came with the chunk that took the event's data past the cap ...
    assert fed <= cap * len(line) / (len(line) - len(b"data: ")) < fed + last_chunk
    # ... and memory stayed near the cap, not near the gigabyte offered.
    assert peak < cap + cap // 4 + 8 * CHUNK
    assert decoder.event_bytes == 0 and decoder.pending_bytes == 0  # released


@pytest.mark.parametrize("chunk_size", [7, 1000, CHUNK])
def test_millions_of_short_data_lines_cost_their_bytes_not_an_object_each(
    chunk_size: int,
) -> None:
    """``data:ab`` lines: 3 bytes of data each, ~60 bytes each as a list of str."""
    cap = 256 * 1024
    decoder = SSEDecoder(max_event_bytes=cap)
    chunks = endless_event(b"data:ab\n", chunk_size)
    fed, last_chunk, peak = feed_until_error(decoder, chunks, EventTooLargeError)
    assert fed < cap * 8 / 3 + last_chunk
    # a chunk of tiny lines briefly costs ~16x its size in line objects while it is parsed
    assert peak < cap + cap // 4 + 20 * max(chunk_size, 4096)


def test_every_other_field_repeated_endlessly_holds_no_memory() -> None:
    """Comments, ids, event types, retry and unknown fields never accumulate: 16 MiB of
    them (no blank line) in 64 KiB chunks keep the decoder within a few chunks."""
    block = b": comment\nid: " + b"7" * 100 + b"\nevent: " + b"e" * 100 + b"\nretry: 5\nx: y\n"
    chunk = block * (CHUNK // len(block))
    decoder = SSEDecoder()
    tracemalloc.start()
    try:
        for _ in range(16 * 1024 * 1024 // len(chunk)):
            decoder.feed(bytes(chunk))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 16 * CHUNK
    assert decoder.event_bytes == 0 and decoder.pending_bytes == 0


def test_event_at_the_cap_passes_and_one_byte_more_raises() -> None:
    cap = 100
    at_cap = b"data: " + b"a" * 49 + b"\ndata: " + b"b" * 50 + b"\n\n"  # 49 + LF + 50
    assert decode_all([at_cap], max_event_bytes=cap)[0] == [
        DecodedEvent("a" * 49 + "\n" + "b" * 50)
    ]
    over = at_cap.replace(b"b" * 50, b"b" * 51)
    with pytest.raises(EventTooLargeError, match=r"max_event_bytes=100\b"):
        decode_all([over], max_event_bytes=cap)


def test_event_size_counts_utf8_bytes() -> None:
    euros = "€" * 34  # 102 bytes, 34 characters
    body = b"data: " + euros.encode() + b"\n\n"
    with pytest.raises(EventTooLargeError):
        decode_all([body], max_event_bytes=101)
    assert decode_all([body], max_event_bytes=102)[0] == [DecodedEvent(euros)]
    # the same across chunks (the data is carried as bytes)
    half = len(body) // 2
    with pytest.raises(EventTooLargeError):
        decode_all([b"data: \n", body[:half], body[half:]], max_event_bytes=102)


def test_too_large_event_keeps_the_cursor_before_it_and_hands_back_earlier_items() -> None:
    decoder = SSEDecoder(max_event_bytes=10, last_event_id="0")
    body = b"id: 1\ndata: ok\n\n: note\nid: 2\ndata: 0123456789\ndata: more\n\n"
    with pytest.raises(EventTooLargeError) as caught:
        decoder.feed(body)
    assert caught.value.items == [DecodedEvent("ok", id="1", id_field=True), Comment("note")]
    assert decoder.last_event_id == "1"
    assert decoder.event_bytes == 0


def test_an_open_event_over_the_cap_raises_at_the_end_of_the_chunk() -> None:
    decoder = SSEDecoder(max_event_bytes=10)
    assert decoder.feed(b"data: 01234\n") == []
    assert decoder.event_bytes == 5
    with pytest.raises(EventTooLargeError) as caught:
        decoder.feed(b"data: 5\n: c\ndata: 6789\n")
    assert caught.value.items == [Comment("c")]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    cap=st.integers(1, 40),
    events=st.lists(st.lists(st.integers(0, 20), min_size=1, max_size=4), max_size=5),
    closed=st.booleans(),
    chunk_size=st.integers(1, 50),
)
def test_event_limit_is_independent_of_chunking(
    cap: int, events: list[list[int]], closed: bool, chunk_size: int
) -> None:
    """It raises exactly when some event's data (lines + LFs between them) exceeds the
    cap, wherever the chunks fall; a trailing event without its blank line counts too."""
    blocks = [b"".join(b"data:" + b"x" * n + b"\n" for n in lines) for lines in events]
    body = b"\n".join(blocks) + (b"\n" if closed else b"")
    sizes = [sum(lines) + len(lines) - 1 for lines in events]
    expect_raise = any(size > cap for size in sizes)
    decoder = SSEDecoder(max_event_bytes=cap)
    try:
        for start in range(0, len(body), chunk_size):
            decoder.feed(body[start : start + chunk_size])
            assert decoder.event_bytes <= cap
        decoder.close()
        raised = False
    except EventTooLargeError:
        raised = True
    assert raised == expect_raise


def test_id_over_max_id_bytes_raises_at_dispatch() -> None:
    decoder = SSEDecoder(max_id_bytes=8)
    assert decoder.feed(b"id: 12345678\ndata: a\n\n") == [
        DecodedEvent("a", id="12345678", id_field=True)
    ]
    # the long id alone does not raise: its event is not complete yet
    assert decoder.feed(b"data: b\nid: 123456789\n") == []
    with pytest.raises(IdTooLongError, match=r"9 bytes exceeded max_id_bytes=8\b") as caught:
        decoder.feed(b": c\n\n")
    assert caught.value.items == [Comment("c")]
    assert decoder.last_event_id == "12345678"  # the cursor stays before the event


def test_id_limit_counts_utf8_bytes_and_defaults_to_1024() -> None:
    assert SSEDecoder().max_id_bytes == 1024
    assert decode_all([b"id: " + "é".encode() * 512 + b"\ndata: a\n\n"])[1] == "é" * 512
    with pytest.raises(IdTooLongError):
        decode_all([b"id: " + "é".encode() * 512 + b"x\ndata: a\n\n"])
    with pytest.raises(IdTooLongError):
        decode_all([b"id: " + b"1" * 1025 + b"\ndata: a\n\n"])


def test_long_id_of_an_event_without_data_raises_too() -> None:
    """It would become the cursor although no event is dispatched."""
    with pytest.raises(IdTooLongError):
        decode_all([b"id: 123456789\n\n"], max_id_bytes=8)


def test_long_id_replaced_before_dispatch_is_fine() -> None:
    items, last_event_id, _ = decode_all([b"id: 123456789\nid: 1\ndata: a\n\n"], max_id_bytes=8)
    assert items == [DecodedEvent("a", id="1", id_field=True)]
    assert last_event_id == "1"


def test_a_long_line_releases_the_open_event_too() -> None:
    decoder = SSEDecoder(max_line_bytes=10)
    decoder.feed(b"data: abc\n")
    assert decoder.event_bytes == 3
    with pytest.raises(LineTooLongError):
        decoder.feed(b"data: 0123456789\n")
    assert decoder.event_bytes == 0 and decoder.pending_bytes == 0


@pytest.mark.parametrize("option", ["max_line_bytes", "max_event_bytes", "max_id_bytes"])
def test_limits_must_be_positive(option: str) -> None:
    with pytest.raises(ValueError, match=option):
        SSEDecoder(**{option: 0})  # type: ignore[arg-type]


# --- content type ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [
        "text/event-stream",
        "TEXT/Event-Stream",
        "text/event-stream; charset=utf-8",
        "text/event-stream;charset=windows-1252",
        "text/event-stream;",
        " text/event-stream ; charset=utf-8",
    ],
)
def test_is_event_stream_accepts(value: str) -> None:
    assert is_event_stream(value) is True


@pytest.mark.parametrize(
    "value",
    [
        None,
        "",
        "text/event-stream-bogus",
        "text/plain;x=text/event-stream",
        "x-text/event-stream",
        "text/event-stream, text/html",
        "text/event stream",
        "text/plain",
        "event-stream",
        "x bogus",
    ],
)
def test_is_event_stream_rejects(value: str | None) -> None:
    assert is_event_stream(value) is False


# --- the httpx-sse gaps --------------------------------------------------------------


def test_gap_comments_are_visible() -> None:
    body = b": dropping events, slow consumer\n\ndata: x\n\n"
    assert Comment("dropping events, slow consumer") in decode_bytes(body)
    # httpx-sse drops comment lines: nothing it yields carries the notice.
    theirs = httpx_sse_events(body)
    assert [event.data for event in theirs] == ["x"]
    assert not any("dropping" in f"{e.event}{e.data}{e.id}" for e in theirs)


def test_gap_no_phantom_events_after_an_id() -> None:
    body = b"id: 1\ndata: a\n\n: keep-alive\n\n\n: ping\n\n"
    ours = [item for item in decode_bytes(body) if isinstance(item, DecodedEvent)]
    assert ours == [DecodedEvent("a", id="1", id_field=True)]
    theirs = httpx_sse_events(body)
    assert [event.data for event in theirs] == ["a", "", "", ""]  # three phantom events


def test_gap_leading_bom_keeps_the_first_event() -> None:
    body = b"\xef\xbb\xbfdata: first\n\ndata: second\n\n"
    assert decode_bytes(body) == [DecodedEvent("first"), DecodedEvent("second")]
    assert [event.data for event in httpx_sse_events(body)] == ["second"]


def test_gap_body_is_utf8_whatever_charset_is_declared() -> None:
    body = "data: ok\u2026 caf\u00e9\n\n".encode()
    assert decode_bytes(body) == [DecodedEvent("ok\u2026 caf\u00e9")]
    theirs = httpx_sse_events(body, "text/event-stream; charset=windows-1252")
    assert [event.data for event in theirs] == ["ok\u00e2\u20ac\u00a6 caf\u00c3\u00a9"]


@pytest.mark.parametrize(
    ("value", "httpx_sse_retry"),
    [("-5", -5), ("1_000", 1000), ("\u0661\u0662\u0663", 123), (" 7", 7)],
)
def test_gap_retry_only_ascii_digits(value: str, httpx_sse_retry: int) -> None:
    body = f"retry: {value}\ndata: x\n\n".encode()
    assert decode_all([body])[2] is None
    assert [event.retry for event in httpx_sse_events(body)] == [httpx_sse_retry]


@pytest.mark.parametrize(
    ("content_type", "ours", "theirs"),
    [
        ("text/event-stream-bogus", False, True),
        ("application/not-text/event-stream", False, True),
        ("TEXT/EVENT-STREAM", True, False),
    ],
)
def test_gap_content_type_is_parsed_not_substring_matched(
    content_type: str, ours: bool, theirs: bool
) -> None:
    assert is_event_stream(content_type) is ours
    try:
        httpx_sse_events(b"data: x\n\n", content_type)
        accepted = True
    except httpx_sse.SSEError:
        accepted = False
    assert accepted is theirs


def _chunks(body: bytes, size: int) -> Iterator[bytes]:
    for start in range(0, len(body), size):
        yield body[start : start + size]


def test_large_stream_in_odd_chunks_matches_whole() -> None:
    body = b"".join(
        f'id: {n}\r\nevent: tick\r\ndata: {{"n":{n},"s":"\u00e9\u20ac"}}\r\n: c\r\n\r\n'.encode()
        for n in range(2000)
    )
    whole = decode_all([body])
    assert len([i for i in whole[0] if isinstance(i, DecodedEvent)]) == 2000
    for size in (1, 7, 4096):
        assert decode_all(list(_chunks(body, size))) == whole
