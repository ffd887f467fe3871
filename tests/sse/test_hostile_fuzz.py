"""Hostile bytes through every pure piece the reader runs on server input (issue #13).

Random bytes, ids (non-ASCII, lone surrogates' bytes, control characters, digits of every
script, thousands of digits) and comment lines (drop-notice words, keep-alives, huge) go
through the decoder, the drop-notice matcher, ``dropped_count``, ``contiguous_number``,
the id orders and the builders of the next request (``Last-Event-ID`` header, query
cursor) and the truncation-header reader, cut into chunks anywhere. The only exceptions
allowed out are the documented ones, each ending a connection cleanly:
``LineTooLongError``, ``EventTooLargeError``, ``IdTooLongError`` (decoder) and
``UnsendableIdError`` (request builders).
"""

from __future__ import annotations

from dataclasses import dataclass

import httpx
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from durable_sse.errors import (
    EventTooLargeError,
    IdTooLongError,
    LineTooLongError,
    UnsendableIdError,
)
from durable_sse.ids import MAX_CONTIGUOUS_DIGITS, IdOrder, contiguous_number, is_newer, sort_key
from durable_sse.sse.decoder import Comment, DecodedEvent, SSEDecoder
from durable_sse.sse.drops import DropNoticeMatcher, dropped_count
from durable_sse.sse.request import (
    id_header_problem,
    last_event_id_header,
    request_headers,
    with_cursor,
)
from durable_sse.sse.response import truncation_header

DECODER_ERRORS = (LineTooLongError, EventTooLargeError, IdTooLongError)
MATCHER = DropNoticeMatcher()
USER_MATCHER = DropNoticeMatcher(["(x+x+)+y", r"(?i)^lagged\b", "événements perdus"])

DIGITS_OF_EVERY_SCRIPT = st.characters(categories=["Nd", "No", "Nl"])
DROP_WORDS = st.sampled_from(
    [
        "dropped", "dropping", "events", "no", "zero", "0", "1,024", "12", "(3)", "were",
        "slow consumer", "queue full", "backpressure", "lagged(5)", "dropped=9", "…", ",",
        "²", "١٢", "9" * 5000, "ping", "x", "y", " ", "é",
    ]
)  # fmt: skip


@st.composite
def event_ids(draw: st.DrawFn) -> bytes:
    return draw(
        st.one_of(
            st.text(max_size=20).map(lambda t: t.encode("utf-8", "surrogatepass")),
            st.text(DIGITS_OF_EVERY_SCRIPT, max_size=12).map(str.encode),
            st.integers(0, 6000).map(lambda n: b"9" * n),
            st.binary(max_size=20),
            st.sampled_from([b" lead", b"trail ", b"\ttab", b"a\x0bb", b"\x7f", b"caf\xc3\xa9"]),
        )
    )


@st.composite
def comment_texts(draw: st.DrawFn) -> bytes:
    words = draw(st.lists(DROP_WORDS, max_size=10))
    text = draw(st.sampled_from([" ", "", ", "])).join(words)
    return draw(st.one_of(st.just(text.encode()), st.binary(max_size=40)))


@st.composite
def lines(draw: st.DrawFn) -> bytes:
    kind = draw(st.integers(0, 6))
    if kind == 0:
        return b"id: " + draw(event_ids())
    if kind == 1:
        return b":" + draw(comment_texts())
    if kind == 2:
        return b"data: " + draw(st.binary(max_size=30))
    if kind == 3:
        return b""  # dispatch
    if kind == 4:
        return b"retry: " + draw(st.text(DIGITS_OF_EVERY_SCRIPT, max_size=8)).encode()
    if kind == 5:
        return b"data:" + b"x" * draw(st.integers(0, 300))
    return draw(st.binary(max_size=30))


@st.composite
def bodies(draw: st.DrawFn) -> list[bytes]:
    ends = st.sampled_from([b"\n", b"\r", b"\r\n"])
    body = b"".join(draw(lines()) + draw(ends) for _ in range(draw(st.integers(0, 25))))
    if draw(st.booleans()):
        body = b"\xef\xbb\xbf" + body
    cuts = sorted(draw(st.lists(st.integers(0, len(body)), max_size=12)))
    return [body[a:b] for a, b in zip([0, *cuts], [*cuts, len(body)], strict=True) if b > a]


@dataclass
class Limits:
    line: int
    event: int
    id: int


LIMITS = st.one_of(
    st.just(Limits(1024 * 1024, 8 * 1024 * 1024, 1024)),  # the defaults
    st.builds(Limits, st.integers(1, 400), st.integers(1, 600), st.integers(1, 64)),
)


def next_request(cursor: str) -> None:
    """What the reader builds to reconnect from ``cursor``: both ways of sending it."""
    try:
        headers = request_headers(
            cursor=cursor,
            cursor_param=None,
            secret_headers={},
            stream="fuzz",
        )
        assert headers.get("Last-Event-ID", b"") == cursor.encode("utf-8")
        assert id_header_problem(cursor) is None or cursor == ""
    except UnsendableIdError:
        assert id_header_problem(cursor) is not None
    try:
        url = with_cursor("http://sse.test/s?k=1", "since", cursor, stream="fuzz")
        if cursor:
            assert httpx.URL(url).params["since"] == cursor
    except UnsendableIdError:
        pass


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(chunks=bodies(), limits=LIMITS, resume_from=event_ids())
# A BOM split across chunks was once held as 2 bytes of a line under a 1-byte line cap.
@example(chunks=[b"\xef\xbb", b"\xbf"], limits=Limits(1, 1, 1), resume_from=b"")
def test_hostile_input_raises_only_documented_errors(
    chunks: list[bytes], limits: Limits, resume_from: bytes
) -> None:
    start = resume_from.decode("utf-8", "replace").replace("\0", "")
    decoder = SSEDecoder(
        max_line_bytes=limits.line,
        max_event_bytes=limits.event,
        max_id_bytes=limits.id,
        last_event_id=start,
    )
    next_request(start)
    for chunk in chunks:
        try:
            items = decoder.feed(chunk)
        except DECODER_ERRORS as error:
            items = getattr(error, "items", [])
            assert decoder.pending_bytes == 0 and decoder.event_bytes == 0
            ended = True
        else:
            ended = False
        assert decoder.pending_bytes <= limits.line
        assert decoder.event_bytes <= limits.event
        for item in items:
            if isinstance(item, Comment):
                assert isinstance(MATCHER.matches(item.text), bool)
                assert isinstance(USER_MATCHER.matches(item.text), bool)
                count = dropped_count(item.text)
                assert count is None or 0 <= count < 10**18
            else:
                assert isinstance(item, DecodedEvent)
                if item.id_field:
                    assert len(item.id.encode("utf-8", "surrogatepass")) <= limits.id
                number = contiguous_number(item.id)
                assert number is None or len(str(number)) <= MAX_CONTIGUOUS_DIGITS
                for order in IdOrder:
                    sort_key(item.id, order)
                    is_newer(item.id, start, order)
        next_request(decoder.last_event_id)
        if ended:
            return
    try:
        decoder.close()
    except DECODER_ERRORS:
        pass


@settings(max_examples=300, deadline=None)
@given(value=st.binary(max_size=40), older=st.booleans(), cursor=st.text(max_size=10))
def test_truncation_header_reads_any_bytes(value: bytes, older: bool, cursor: str) -> None:
    name = b"Last-Event-ID" if older else b"Mercure-Last-Event-ID"
    found = truncation_header(httpx.Headers([(name, value)]))
    assert found == value.decode("utf-8", "replace")
    if id_header_problem(cursor) is None and cursor:
        # what we send, echoed back, reads as the same id
        echoed = httpx.Headers([(name, last_event_id_header(cursor))])
        assert truncation_header(echoed) == cursor
