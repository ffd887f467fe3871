"""The demo/test SSE source over real sockets: every fault does exactly what it claims."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from durable_sse.errors import ConfigError
from durable_sse.source import SourceStreamConfig, SSESource, parse_stream_arg
from durable_sse.source.__main__ import main as source_main
from durable_sse.source.connection import MALFORMED

GUARD = 20.0  # seconds: only to turn a hang into a failure, never asserted on


@dataclass
class Item:
    kind: str  # "event" | "comment" | "retry"
    id: str | None = None
    event: str = "message"
    data: str = ""
    text: str = ""


class SSEReader:
    """A tiny byte-level SSE reader (comments included, unlike httpx-sse)."""

    def __init__(self, response: httpx.Response) -> None:
        self._chunks = response.aiter_raw()
        self._buffer = bytearray()
        self._pos = 0
        self.raw = bytearray()
        self.eof = False

    async def _line(self) -> bytes | None:
        while True:
            end = self._buffer.find(b"\n", self._pos)
            if end >= 0:
                line = bytes(self._buffer[self._pos : end])
                self._pos = end + 1
                if self._pos > 65536:
                    del self._buffer[: self._pos]
                    self._pos = 0
                return line
            try:
                chunk = await anext(self._chunks)
            except (StopAsyncIteration, httpx.RemoteProtocolError, httpx.ReadError):
                self.eof = True
                return None
            self.raw += chunk
            self._buffer += chunk

    async def next(self) -> Item | None:
        fields: dict[str, str] = {}
        data: list[str] = []
        while True:
            line = await self._line()
            if line is None:
                return None
            if line == b"":
                if data:
                    return Item(
                        "event", fields.get("id"), fields.get("event", "message"), "\n".join(data)
                    )
                fields.clear()
                continue
            if line.startswith(b":"):
                return Item("comment", text=line[1:].strip().decode())
            name, _, value = line.partition(b":")
            value = value[1:] if value.startswith(b" ") else value
            if name == b"retry":
                return Item("retry", text=value.decode())
            if name == b"data":
                data.append(value.decode("utf-8", "replace"))
            else:
                fields[name.decode("utf-8", "replace")] = value.decode("utf-8", "replace")

    async def items(self, count: int, *, kind: str | None = None) -> list[Item]:
        """The next ``count`` items (of ``kind``, if given, skipping the rest)."""
        found: list[Item] = []
        async with asyncio.timeout(GUARD):
            while len(found) < count:
                item = await self.next()
                assert item is not None, f"stream ended after {found!r}"
                if kind is None or item.kind == kind:
                    found.append(item)
        return found

    async def until_eof(self) -> list[Item]:
        found: list[Item] = []
        async with asyncio.timeout(GUARD):
            while (item := await self.next()) is not None:
                found.append(item)
        return found


@pytest.fixture(scope="module")
async def source() -> AsyncIterator[SSESource]:
    async with SSESource(seed=7) as server:
        yield server


@pytest.fixture(scope="module")
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(timeout=httpx.Timeout(GUARD)) as http_client:
        yield http_client


def new_stream(source: SSESource, **settings: Any) -> str:
    name = f"t-{uuid.uuid4().hex}"
    source.add_stream(name, SourceStreamConfig(**settings))
    return name


def ids(items: list[Item]) -> list[int]:
    return [int(i.id) for i in items if i.kind == "event" and i.id is not None]


async def connect(
    client: httpx.AsyncClient, url: str, **kwargs: Any
) -> tuple[httpx.Response, SSEReader]:
    request = client.build_request("GET", url, **kwargs)
    response = await client.send(request, stream=True)
    return response, SSEReader(response)


# -- resume, live, retry, keep-alive --------------------------------------------------


async def test_retry_field_then_ids_cross_999(source: SSESource, client: httpx.AsyncClient) -> None:
    name = new_stream(source, rate=0, start_id=990, retry_ms=250, payload_bytes=10)
    response, reader = await connect(client, source.url(name), headers={"Last-Event-ID": "989"})
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    first = await reader.items(1)
    assert first[0].kind == "retry" and first[0].text == "250"
    events = await reader.items(15, kind="event")
    assert ids(events) == list(range(990, 1005))
    payload = json.loads(events[0].data)
    assert events[0].event == "tick"
    assert payload["id"] == 990 and len(payload["payload"]) == 10
    await response.aclose()


@pytest.mark.parametrize(
    ("how", "param"),
    [("header", None), ("query", "cursor"), ("query", "lastEventId"), ("custom", "since")],
)
async def test_resume(
    source: SSESource, client: httpx.AsyncClient, how: str, param: str | None
) -> None:
    settings: dict[str, Any] = {"rate": 0}
    if how == "custom":
        settings["cursor_param"] = param
    name = new_stream(source, **settings)
    response, reader = await connect(client, source.url(name), params={"cursor": "0"})
    assert ids(await reader.items(50, kind="event")) == list(range(1, 51))
    await response.aclose()

    if how == "header":
        kwargs: dict[str, Any] = {"headers": {"Last-Event-ID": "30"}}
    else:
        kwargs = {"params": {param: "30"}}
    response, reader = await connect(client, source.url(name), **kwargs)
    assert response.headers["mercure-last-event-id"] == "30"
    assert ids(await reader.items(10, kind="event")) == list(range(31, 41))
    await response.aclose()


async def test_live_only_without_cursor(source: SSESource, client: httpx.AsyncClient) -> None:
    name = new_stream(source, rate=200)
    warmup, warm_reader = await connect(client, source.url(name), params={"cursor": "0"})
    await warm_reader.items(10, kind="event")
    await warmup.aclose()
    before = source.truth(name).ids[-1]
    response, reader = await connect(client, source.url(name))
    assert "mercure-last-event-id" not in response.headers
    received = ids(await reader.items(5, kind="event"))
    await response.aclose()
    assert received[0] > before
    assert received == list(range(received[0], received[0] + 5))


async def test_keepalive_comments_when_idle(source: SSESource, client: httpx.AsyncClient) -> None:
    name = new_stream(source, paused=True, keepalive=0.1)
    response, reader = await connect(client, source.url(name))
    comments = await reader.items(2, kind="comment")
    assert [c.text for c in comments] == ["keep-alive", "keep-alive"]
    assert source.truth(name).generated == 0
    await response.aclose()


async def test_history_truncated(source: SSESource, client: httpx.AsyncClient) -> None:
    name = new_stream(source, rate=0, history=20)
    response, reader = await connect(client, source.url(name), params={"cursor": "0"})
    assert ids(await reader.items(100, kind="event")) == list(range(1, 101))
    await response.aclose()
    oldest = source.truth(name).history_start
    assert oldest > 100

    response, reader = await connect(client, source.url(name), headers={"Last-Event-ID": "5"})
    assert response.headers["mercure-last-event-id"] == str(oldest - 1)
    items = await reader.items(3)
    assert items[0].kind == "retry"
    assert items[1] == Item("comment", text="history truncated")
    assert items[2].kind == "event" and items[2].id == str(oldest)
    await response.aclose()
    # the ground truth: ids 6..oldest-1 were asked for after the history had lost them
    assert source.truth(name).unavailable == [(6, oldest - 1)]


async def test_bulk_mode_is_contiguous(source: SSESource, client: httpx.AsyncClient) -> None:
    name = new_stream(source, rate=0, flush="bulk")
    response, reader = await connect(client, source.url(name), params={"cursor": "0"})
    assert ids(await reader.items(20_000, kind="event")) == list(range(1, 20_001))
    await response.aclose()


async def test_rate_limited_stream_generates(source: SSESource, client: httpx.AsyncClient) -> None:
    name = new_stream(source, rate=100, start_id=5)
    response, reader = await connect(client, source.url(name), params={"cursor": "4"})
    assert ids(await reader.items(12, kind="event")) == list(range(5, 17))
    await response.aclose()


# -- drops and disconnects -------------------------------------------------------------


@pytest.mark.parametrize("flush", ["event", "bulk"])
async def test_drop_really_skips_and_resume_resends(
    source: SSESource, client: httpx.AsyncClient, flush: str
) -> None:
    name = new_stream(source, rate=0, drop_every=10, drop_count=5, flush=flush)
    response, reader = await connect(client, source.url(name), params={"cursor": "0"})
    items = await reader.items(13)
    await response.aclose()
    assert items[0].kind == "retry"
    assert ids(items[1:11]) == list(range(1, 11))
    assert items[11] == Item("comment", text="dropping events: discarded 5 events (slow consumer)")
    assert items[12].kind == "event" and items[12].id == "16"

    truth = source.truth(name)
    assert (11, 15) in truth.dropped
    assert set(range(11, 16)) <= set(truth.ids)

    response, reader = await connect(client, source.url(name), headers={"Last-Event-ID": "10"})
    assert ids(await reader.items(10, kind="event")) == list(range(11, 21))
    await response.aclose()


async def test_one_shot_drop_action(source: SSESource, client: httpx.AsyncClient) -> None:
    name = new_stream(source, rate=0)
    reply = await client.post(
        f"{source.base_url}/control/{name}", json={"action": "drop", "count": 3}
    )
    assert reply.status_code == 200
    assert reply.json()["pending"] == [{"action": "drop", "count": 3}]
    response, reader = await connect(client, source.url(name), params={"cursor": "0"})
    items = await reader.items(3)
    await response.aclose()
    assert items[1] == Item("comment", text="dropping events: discarded 3 events (slow consumer)")
    assert items[2].id == "4"
    assert source.truth(name).dropped == [(1, 3)]
    assert source.describe(name)["pending"] == []


async def test_a_first_drop_waits_for_a_connection_that_has_sent_nothing(
    source: SSESource, client: httpx.AsyncClient
) -> None:
    """``first``: the drop is taken before a connection's first event (chaos scenario 6's
    timing), never by a connection already streaming."""
    name = new_stream(source, rate=200, keepalive=0)
    streaming, old_reader = await connect(client, source.url(name))
    await old_reader.items(2, kind="event")
    source.inject(name, action="drop", count=3, first=True)
    later = ids(await old_reader.items(20, kind="event"))
    assert later == list(range(later[0], later[0] + 20))  # the open connection skipped none
    assert source.truth(name).dropped == []
    assert source.describe(name)["pending"] == [{"action": "drop", "count": 3, "first": True}]
    response, reader = await connect(client, source.url(name), params={"cursor": "0"})
    items = [item for item in await reader.items(3) if item.kind != "retry"]
    await response.aclose()
    await streaming.aclose()
    assert items[0] == Item("comment", text="dropping events: discarded 3 events (slow consumer)")
    assert items[1].id == "4"
    assert source.truth(name).dropped == [(1, 3)]
    with pytest.raises(ConfigError):
        source.inject(name, action="drop", count=3, first="yes")


async def test_drop_on_live_rate_limited_stream(
    source: SSESource, client: httpx.AsyncClient
) -> None:
    name = new_stream(source, rate=200, keepalive=0)
    response, reader = await connect(client, source.url(name))
    first = ids(await reader.items(2, kind="event"))
    source.inject(name, action="drop", count=4)
    items: list[Item] = []
    while not any(i.kind == "comment" for i in items):
        items += await reader.items(1)
    await response.aclose()
    notice = next(i for i in items if i.kind == "comment")
    assert notice.text == "dropping events: discarded 4 events (slow consumer)"
    (skipped,) = source.truth(name).dropped
    assert skipped[1] - skipped[0] == 3 and skipped[0] > first[-1]
    assert all(not skipped[0] <= i <= skipped[1] for i in ids(items))


async def test_a_late_notice_comes_after_the_events_it_was_held_for(
    source: SSESource, client: httpx.AsyncClient
) -> None:
    name = new_stream(source, rate=200, keepalive=0)
    response, reader = await connect(client, source.url(name))
    await reader.items(2, kind="event")
    source.inject(name, action="drop", count=4, late=3)
    items: list[Item] = []
    while not any(i.kind == "comment" for i in items):
        items += await reader.items(1)
    await response.aclose()
    (skipped,) = source.truth(name).dropped
    after = [i for i in items if i.kind == "event" and int(i.id or 0) > skipped[1]]
    assert [int(i.id or 0) for i in after] == [skipped[1] + 1, skipped[1] + 2, skipped[1] + 3]
    assert items[-1].text == "dropping events: discarded 4 events (slow consumer)"
    assert source.truth(name).unannounced == []


async def test_a_lost_notice_dies_with_the_connection(
    source: SSESource, client: httpx.AsyncClient
) -> None:
    """``lost``: the skip is real, ``late`` events follow it, and the connection closes
    before its notice goes out: on the wire, a plain disconnect."""
    name = new_stream(source, rate=0, keepalive=0)
    response, reader = await connect(client, source.url(name), params={"cursor": "0"})
    await reader.items(5, kind="event")
    source.inject(name, action="drop", count=6, late=2, lost=True)
    rest = await reader.until_eof()
    await response.aclose()
    assert reader.eof and not any(i.kind == "comment" for i in rest)
    (skipped,) = source.truth(name).dropped
    assert source.truth(name).unannounced == [skipped] and skipped[1] - skipped[0] == 5
    received = ids(rest)
    assert received[-2:] == [skipped[1] + 1, skipped[1] + 2]
    assert all(not skipped[0] <= i <= skipped[1] for i in received)
    with pytest.raises(ConfigError):
        source.inject(name, action="drop", count=3, lost="yes")
    with pytest.raises(ConfigError):
        source.inject(name, action="drop", count=3, late=-1)


async def test_disconnect_after(source: SSESource, client: httpx.AsyncClient) -> None:
    name = new_stream(source, rate=0, disconnect_after=7)
    for cursor in ("0", "7"):
        response, reader = await connect(client, source.url(name), params={"cursor": cursor})
        received = ids(await reader.until_eof())
        start = int(cursor) + 1
        assert received == list(range(start, start + 7))
        assert reader.eof


async def test_disconnect_probability_is_seeded(
    source: SSESource, client: httpx.AsyncClient
) -> None:
    name = new_stream(source, rate=0, disconnect_probability=0.05)
    response, reader = await connect(client, source.url(name), params={"cursor": "0"})
    received = ids(await reader.until_eof())
    assert received and received == list(range(1, len(received) + 1))
    assert source.truth(name).generated >= len(received)


async def test_one_shot_disconnect(source: SSESource, client: httpx.AsyncClient) -> None:
    name = new_stream(source, paused=True, keepalive=0.05)
    response, reader = await connect(client, source.url(name))
    await reader.items(1, kind="comment")
    source.inject(name, action="disconnect")
    await reader.until_eof()
    assert reader.eof


# -- HTTP status faults ----------------------------------------------------------------------


@pytest.mark.parametrize("code", [204, 401, 403, 404, 410, 500, 503])
async def test_status_once(source: SSESource, client: httpx.AsyncClient, code: int) -> None:
    name = new_stream(source, rate=0)
    source.inject(name, action="status", code=code)
    refused = await client.get(source.url(name))
    assert refused.status_code == code
    assert "retry-after" not in refused.headers
    if code == 204:
        assert refused.content == b""
    response, reader = await connect(client, source.url(name), params={"cursor": "0"})
    assert response.status_code == 200
    assert ids(await reader.items(1, kind="event")) == [1]
    await response.aclose()


async def test_status_429_retry_after_times(source: SSESource, client: httpx.AsyncClient) -> None:
    name = new_stream(source, rate=0)
    reply = await client.post(
        f"{source.base_url}/control/{name}",
        json={"action": "status", "code": 429, "times": 2, "retry_after": 3},
    )
    assert reply.json()["config"]["status"] == 429
    for _ in range(2):
        refused = await client.get(source.url(name))
        assert refused.status_code == 429
        assert refused.headers["retry-after"] == "3"
    response, _ = await connect(client, source.url(name))
    assert response.status_code == 200
    await response.aclose()
    assert source.describe(name)["config"]["status"] is None


async def test_status_from_config_forever(source: SSESource, client: httpx.AsyncClient) -> None:
    name = new_stream(source, status=503, status_times=None, retry_after=2)
    for _ in range(3):
        refused = await client.get(source.url(name))
        assert (refused.status_code, refused.headers["retry-after"]) == (503, "2")
    source.inject(name, action="clear")
    response, _ = await connect(client, source.url(name))
    assert response.status_code == 200
    await response.aclose()


async def test_wrong_content_type(source: SSESource, client: httpx.AsyncClient) -> None:
    name = new_stream(source, rate=0)
    source.inject(name, action="status", code=200, content_type="text/plain")
    refused = await client.get(source.url(name))
    assert refused.status_code == 200
    assert refused.headers["content-type"] == "text/plain"
    assert b"id:" not in refused.content


async def test_cross_origin_redirect(source: SSESource, client: httpx.AsyncClient) -> None:
    name = new_stream(source, rate=0)
    source.inject(name, action="status", code=307)
    url = source.url(name) + "?cursor=5"
    refused = await client.get(url, follow_redirects=False)
    assert refused.status_code == 307
    target = urlsplit(refused.headers["location"])
    origin = urlsplit(url)
    assert target.netloc != origin.netloc
    assert (target.path, target.query) == (origin.path, origin.query)


async def test_unknown_stream_is_404(source: SSESource, client: httpx.AsyncClient) -> None:
    response = await client.get(source.url(f"t-{uuid.uuid4().hex}"))
    assert response.status_code == 404


# -- malformed and oversized bytes ----------------------------------------------------------


async def test_malformed_block(source: SSESource, client: httpx.AsyncClient) -> None:
    name = new_stream(source, rate=0)
    source.inject(name, action="malformed")
    response, reader = await connect(client, source.url(name), params={"cursor": "0"})
    items = await reader.items(3)
    await response.aclose()
    assert items[1] == Item("comment", text="malformed block follows")
    assert items[2].kind == "event" and items[2].id == "12\x0034"  # WHATWG: ignored
    assert "\ufffd" in items[2].data and "\x00" in items[2].data
    assert MALFORMED in reader.raw
    assert b"\nthis line has no colon\n" in reader.raw


async def test_oversized_line_then_close(source: SSESource, client: httpx.AsyncClient) -> None:
    name = new_stream(source, paused=True)
    source.inject(name, action="oversized", bytes=300_000)
    response, reader = await connect(client, source.url(name))
    items = await reader.until_eof()
    assert [i.kind for i in items] == ["retry"]
    tail = bytes(reader.raw).rsplit(b"\n", 1)[1]
    assert len(tail) == 300_000 and tail.startswith(b"data: xxx")


# -- control, truth, stream management --------------------------------------------------------


async def test_control_round_trip(source: SSESource, client: httpx.AsyncClient) -> None:
    name = new_stream(source, rate=5)
    base = f"{source.base_url}/control/{name}"
    reply = await client.post(base, json={"rate": "max", "drop_every": 3, "drop_count": 1})
    assert reply.status_code == 200
    shown = (await client.get(base)).json()["config"]
    assert (shown["rate"], shown["drop_every"], shown["drop_count"]) == (0.0, 3, 1)

    assert (await client.post(base, json={"rate": -1})).status_code == 400
    assert (await client.post(base, json={"nope": 1})).status_code == 400
    assert (await client.post(base, json={"action": "explode"})).status_code == 400
    assert (await client.post(base, content=b"[1]")).status_code == 400
    assert (await client.get(f"{source.base_url}/control/t-missing")).status_code == 404

    reply = await client.post(base, json={"action": "pause"})
    assert reply.json()["config"]["paused"] is True
    generated = source.truth(name).generated
    await asyncio.sleep(0.1)
    assert source.truth(name).generated == generated
    source.inject(name, action="resume")
    assert source.describe(name)["config"]["paused"] is False


async def test_truth_endpoint(source: SSESource, client: httpx.AsyncClient) -> None:
    name = new_stream(source, rate=0, start_id=100, drop_every=4, drop_count=2)
    response, reader = await connect(client, source.url(name), params={"cursor": "99"})
    await reader.items(9, kind="event")
    await response.aclose()
    truth = (await client.get(f"{source.base_url}/truth/{name}")).json()
    assert truth["ids"] == list(range(100, 100 + truth["generated"]))
    assert truth["dropped"][:2] == [[104, 105], [110, 111]]
    assert truth["generated"] >= 13
    counts = (await client.get(f"{source.base_url}/truth/{name}", params={"ids": "0"})).json()
    assert "ids" not in counts and counts["dropped"][:2] == truth["dropped"][:2]


async def test_create_and_list_streams(source: SSESource, client: httpx.AsyncClient) -> None:
    name = f"t-{uuid.uuid4().hex}"
    created = await client.post(
        f"{source.base_url}/streams/{name}", json={"rate": "max", "start_id": "42"}
    )
    assert created.status_code == 201
    assert created.json()["url"] == source.url(name)
    again = await client.post(f"{source.base_url}/streams/{name}", json={})
    assert again.status_code == 409
    bad = await client.post(f"{source.base_url}/streams/t-{uuid.uuid4().hex}", json={"flush": "x"})
    assert bad.status_code == 400
    listed = (await client.get(f"{source.base_url}/streams")).json()["streams"]
    assert name in listed
    response, reader = await connect(client, source.url(name), params={"cursor": "41"})
    assert ids(await reader.items(2, kind="event")) == [42, 43]
    await response.aclose()
    assert (await client.delete(f"{source.base_url}/streams/{name}")).status_code == 200
    assert name not in source.streams


async def test_garbage_request_gets_400(source: SSESource) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", source.port)
    writer.write(b"NONSENSE\r\n\r\n")
    await writer.drain()
    answer = await asyncio.wait_for(reader.read(), GUARD)
    writer.close()
    assert answer.startswith(b"HTTP/1.1 400 ")


# -- configuration parsing and the CLI --------------------------------------------------------


def test_parse_stream_arg() -> None:
    name, config = parse_stream_arg("noisy:rate=50,drop_every=500,drop_count=20,history_age=none")
    assert name == "noisy"
    assert (config.rate, config.drop_every, config.drop_count) == (50.0, 500, 20)
    assert config.history_age is None
    assert parse_stream_arg("demo")[1] == SourceStreamConfig()
    for bad in ("bad name", "x:rate=fast", "x:nope=1", "x:rate", "x:flush=sometimes"):
        with pytest.raises(ConfigError):
            parse_stream_arg(bad)


def test_cli_refuses_bad_stream(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        source_main(["--stream", "x:rate=fast"])
    assert exited.value.code == 2
    assert "rate" in capsys.readouterr().err


@pytest.mark.parametrize("prefix", ["id1", " x", "x ", "a\nb", "x" * 65])
def test_id_prefix_refuses_what_would_make_ids_ambiguous_or_unsendable(prefix: str) -> None:
    with pytest.raises(ConfigError, match="id_prefix"):
        SourceStreamConfig(id_prefix=prefix)
    assert SourceStreamConfig(id_prefix="café-").id_prefix == "café-"


async def test_a_cursor_without_the_id_prefix_means_live_only(
    source: SSESource, client: httpx.AsyncClient
) -> None:
    name = new_stream(source, rate=200, id_prefix="ü:")
    async with asyncio.timeout(GUARD):
        while source.describe(name)["newest"] < 5:
            await asyncio.sleep(0.01)
    response, _ = await connect(client, source.url(name), headers={"Last-Event-ID": "3"})
    assert "mercure-last-event-id" not in response.headers
    await response.aclose()
