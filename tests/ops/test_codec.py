"""Payload encryption: the codec on its own, end to end on a real dev server, and the
codec server over real HTTP.

The end-to-end test proves the point of the feature: a marker string passed as workflow
input and raised in an activity failure message never appears in the raw history bytes,
while a client holding the key reads the result. A control run without the codec shows
the same marker *does* appear when encryption is off, so the absence is meaningful.
"""

from __future__ import annotations

import base64
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta

import pytest
from temporalio import workflow
from temporalio.api.common.v1 import Payload, Payloads
from temporalio.client import Client, WorkflowHandle
from temporalio.converter import DataConverter, DefaultFailureConverterWithEncodedAttributes
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from durable_sse.ops.binaries import temporal_dev_server
from tests.ops.codec_workflows import MarkerWorkflow, fail_loudly

with workflow.unsafe.imports_passed_through():
    import httpx
    from google.protobuf import json_format

    from durable_sse.config.temporal import PAYLOAD_KEY_ENV as KEY_ENV
    from durable_sse.errors import ConfigError, DurableSSEError
    from durable_sse.ops.codec import (
        ENCODING,
        REFUSED_ENCODING,
        EncryptionCodec,
        PlaintextPayloadError,
        data_converter_from_env,
        generate_key,
        key_id,
        parse_key,
    )
    from durable_sse.ops.codec_server import TOKEN_ENV, main, serve

KEY = generate_key()
OTHER_KEY = generate_key()


def _payload(value: object) -> Payload:
    return DataConverter.default.payload_converter.to_payloads([value])[0]


# -- the codec ----------------------------------------------------------------------------


async def test_round_trip_hides_the_plaintext_and_uses_a_fresh_nonce() -> None:
    codec = EncryptionCodec(parse_key(KEY))
    marker = f"marker-{uuid.uuid4().hex}"
    original = _payload({"url": f"https://{marker}.example/stream"})

    first, second = await codec.encode([original, original])

    assert first.metadata["encoding"] == ENCODING
    assert first.metadata["encryption-key-id"] == key_id(parse_key(KEY)).encode()
    assert marker.encode() not in first.SerializeToString()
    assert first.data != second.data
    assert await codec.decode([first, second]) == [original, original]


async def test_hex_and_base64_spellings_are_the_same_key() -> None:
    raw = bytes.fromhex(KEY)
    padded = base64.urlsafe_b64encode(raw).decode()
    spellings = [KEY, KEY.upper(), padded, padded.rstrip("="), f"  {KEY}\n"]

    assert {parse_key(s) for s in spellings} == {raw}


async def test_wrong_key_is_a_clear_error_naming_both_key_ids() -> None:
    encoded = await EncryptionCodec(parse_key(KEY)).encode([_payload("x")])
    other = EncryptionCodec(parse_key(OTHER_KEY))

    with pytest.raises(ConfigError) as caught:
        await other.decode(encoded)

    message = str(caught.value)
    assert KEY_ENV in message
    assert key_id(parse_key(KEY)) in message
    assert other.key_id in message
    assert KEY not in message and OTHER_KEY not in message


async def test_altered_ciphertext_fails_authentication() -> None:
    codec = EncryptionCodec(parse_key(KEY))
    [encoded] = await codec.encode([_payload("x")])
    flipped = bytes([encoded.data[-1] ^ 1])
    altered = Payload(metadata=dict(encoded.metadata), data=encoded.data[:-1] + flipped)

    with pytest.raises(DurableSSEError, match="failed authentication"):
        await codec.decode([altered])


async def test_plain_payloads_are_refused_with_a_one_line_reason() -> None:
    codec = EncryptionCodec(parse_key(KEY))
    marker = f"marker-{uuid.uuid4().hex}"
    plain = [_payload({"name": marker}), _payload(None), _payload(b"\x00raw")]

    decoded = await codec.decode(plain)

    assert [p.metadata["encoding"] for p in decoded] == [REFUSED_ENCODING] * 3
    converter = data_converter_from_env({KEY_ENV: KEY}).payload_converter
    for payload in decoded:
        with pytest.raises(PlaintextPayloadError) as caught:
            converter.from_payloads([payload])
        error = caught.value
        assert error.non_retryable and error.type == "PlaintextPayloadError"
        assert KEY_ENV in error.message and "\n" not in error.message
        assert marker not in error.message and KEY not in error.message
        assert isinstance(error, DurableSSEError)  # the CLI prints it as one line
    assert await codec.decode(decoded) == decoded  # a refusal stays a refusal


async def test_the_codec_server_codec_passes_plain_payloads_through_for_display() -> None:
    codec = EncryptionCodec(parse_key(KEY), accept_plaintext=True)
    plain = [_payload({"name": "s1"}), _payload(None), _payload(b"\x00raw")]

    assert await codec.decode(plain) == plain


@pytest.mark.parametrize(
    "value",
    [
        "hunter2-not-a-key",
        KEY[:-1],
        KEY[:-2] + "zz",
        base64.urlsafe_b64encode(b"sixteen-byte-key").decode(),
        base64.urlsafe_b64encode(b"a" * 33).decode(),
    ],
)
async def test_bad_key_is_a_config_error_that_never_echoes_the_value(value: str) -> None:
    with pytest.raises(ConfigError) as caught:
        data_converter_from_env({KEY_ENV: value})

    assert KEY_ENV in str(caught.value)
    assert value not in str(caught.value)


async def test_set_but_empty_key_is_refused_not_read_as_off() -> None:
    with pytest.raises(ConfigError, match=KEY_ENV):
        data_converter_from_env({KEY_ENV: "  "})


async def test_data_converter_only_changes_when_the_key_is_set() -> None:
    assert data_converter_from_env({}) is DataConverter.default

    converter = data_converter_from_env({KEY_ENV: KEY})

    assert isinstance(converter.payload_codec, EncryptionCodec)
    assert isinstance(converter.failure_converter, DefaultFailureConverterWithEncodedAttributes)


# -- end to end on a dev server -------------------------------------------------------------


@pytest.fixture(scope="module")
async def env() -> AsyncIterator[WorkflowEnvironment]:
    async with await WorkflowEnvironment.start_local(
        dev_server_existing_path=temporal_dev_server(),
        data_converter=data_converter_from_env({KEY_ENV: KEY}),
    ) as environment:
        yield environment


def _plain_client(client: Client) -> Client:
    return Client(client.service_client, namespace=client.namespace)


async def _run_marker_workflow(client: Client, marker: str) -> WorkflowHandle[MarkerWorkflow, str]:
    task_queue = f"codec-{uuid.uuid4().hex}"
    async with Worker(
        client, task_queue=task_queue, workflows=[MarkerWorkflow], activities=[fail_loudly]
    ):
        handle = await client.start_workflow(
            MarkerWorkflow.run,
            marker,
            id=f"codec-test-{uuid.uuid4().hex}",
            task_queue=task_queue,
            execution_timeout=timedelta(seconds=30),
        )
        await handle.result()
    return handle


async def _raw_history(client: Client, workflow_id: str) -> bytes:
    history = await _plain_client(client).get_workflow_handle(workflow_id).fetch_history()
    failed = [e for e in history.events if e.HasField("activity_task_failed_event_attributes")]
    assert failed, "the activity failure must be in the history for this test to mean anything"
    return b"".join(e.SerializeToString() for e in history.events) + history.to_json().encode()


async def test_history_holds_no_plaintext_and_the_keyed_client_reads_it(
    env: WorkflowEnvironment,
) -> None:
    marker = f"secret-{uuid.uuid4().hex}"

    handle = await _run_marker_workflow(env.client, marker)

    raw = await _raw_history(env.client, handle.id)
    assert marker.encode() not in raw
    assert ENCODING in raw
    keyed = env.client.get_workflow_handle_for(MarkerWorkflow.run, handle.id)
    assert await keyed.result() == (f"recovered {marker}: could not reach https://{marker}.example")
    with pytest.raises(KeyError, match="binary/encrypted"):
        await _plain_client(env.client).get_workflow_handle(handle.id).result()


async def test_control_without_the_codec_the_marker_is_in_history(
    env: WorkflowEnvironment,
) -> None:
    marker = f"visible-{uuid.uuid4().hex}"

    handle = await _run_marker_workflow(_plain_client(env.client), marker)

    assert marker.encode() in await _raw_history(env.client, handle.id)


# -- the codec server ----------------------------------------------------------------------


@pytest.fixture
async def codec_url() -> AsyncIterator[str]:
    codec = EncryptionCodec(parse_key(KEY))
    server = await serve(
        "127.0.0.1", 0, codec, cors_origin="http://localhost:8233", token="t0ken-for-tests"
    )
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.close()
        await server.wait_closed()


AUTH = {"Authorization": "Bearer t0ken-for-tests"}


async def test_codec_server_decodes_what_the_codec_encoded(codec_url: str) -> None:
    original = _payload({"name": "s1", "url": "https://example.test/sse"})
    [encoded] = await EncryptionCodec(parse_key(KEY)).encode([original])
    body = {"payloads": [json_format.MessageToDict(encoded)]}

    async with httpx.AsyncClient(base_url=codec_url) as http_client:
        plain = await http_client.post("/decode", json=body, headers=AUTH)
        namespaced = await http_client.post("/default/decode", json=body, headers=AUTH)

    assert plain.status_code == 200
    [decoded] = json_format.ParseDict(plain.json(), Payloads()).payloads
    assert decoded == original
    assert namespaced.json() == plain.json()


async def test_codec_server_encode_then_decode_round_trips(codec_url: str) -> None:
    original = _payload([1, 2, 3])
    body = {"payloads": [json_format.MessageToDict(original)]}

    async with httpx.AsyncClient(base_url=codec_url) as http_client:
        encoded = await http_client.post("/encode", json=body, headers=AUTH)
        decoded = await http_client.post("/decode", json=encoded.json(), headers=AUTH)

    [sealed] = json_format.ParseDict(encoded.json(), Payloads()).payloads
    assert sealed.metadata["encoding"] == ENCODING
    assert json_format.ParseDict(decoded.json(), Payloads()).payloads[0] == original


async def test_codec_server_refuses_a_missing_or_wrong_token(codec_url: str) -> None:
    [encoded] = await EncryptionCodec(parse_key(KEY)).encode([_payload("secret")])
    body = {"payloads": [json_format.MessageToDict(encoded)]}
    origin = {"Origin": "http://localhost:8233"}

    async with httpx.AsyncClient(base_url=codec_url) as http_client:
        missing = await http_client.post("/decode", json=body, headers=origin)
        wrong = await http_client.post(
            "/decode", json=body, headers={**origin, "Authorization": "Bearer nope"}
        )

    assert missing.status_code == 401
    assert wrong.status_code == 401
    assert b"secret" not in missing.content
    assert missing.headers["access-control-allow-origin"] == "http://localhost:8233"


async def test_codec_server_preflight_allows_only_the_ui_origin(codec_url: str) -> None:
    preflight_headers = {
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type, x-namespace",
    }
    async with httpx.AsyncClient(base_url=codec_url) as http_client:
        ui = await http_client.options(
            "/decode", headers={**preflight_headers, "Origin": "http://localhost:8233"}
        )
        stranger = await http_client.options(
            "/decode", headers={**preflight_headers, "Origin": "http://evil.test"}
        )

    assert ui.status_code == 204
    assert ui.headers["access-control-allow-origin"] == "http://localhost:8233"
    assert "POST" in ui.headers["access-control-allow-methods"]
    assert "authorization" in ui.headers["access-control-allow-headers"]
    assert "access-control-allow-origin" not in stranger.headers


async def test_codec_server_reports_a_wrong_key_without_a_500(codec_url: str) -> None:
    [foreign] = await EncryptionCodec(parse_key(OTHER_KEY)).encode([_payload("x")])
    body = {"payloads": [json_format.MessageToDict(foreign)]}

    async with httpx.AsyncClient(base_url=codec_url) as http_client:
        response = await http_client.post("/decode", json=body, headers=AUTH)

    assert response.status_code == 400
    assert key_id(parse_key(OTHER_KEY)) in response.json()["error"]


async def test_codec_server_main_refuses_unsafe_or_keyless_starts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(KEY_ENV, raising=False)
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    assert main(["--port", "0"]) == 2

    monkeypatch.setenv(KEY_ENV, "hunter2-not-a-key")
    assert main(["--port", "0"]) == 2

    monkeypatch.setenv(KEY_ENV, KEY)
    assert main(["--host", "0.0.0.0", "--port", "0"]) == 2
