"""Webhook signature schemes: each provider's valid delivery, forgeries, replays and fuzzing."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import requests
import responses
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from hypothesis import given, settings, strategies as st

from reconcile.errors import (
    ReadFailed,
    WebhookError,
    WebhookPayloadError,
    WebhookSignatureError,
    WebhookTimestampError,
)
from reconcile.webhooks import (
    JwksCache,
    WebhookEvent,
    payload_digest,
    verify,
    verify_elevenlabs,
    verify_fal,
    verify_kie,
    verify_replicate,
)

# Far from the wall clock on purpose: only the injected clock may decide freshness.
NOW = datetime(2031, 5, 6, 7, 8, 9, tzinfo=UTC)
TS = int(NOW.timestamp())
QUERY = {"job_id": "job-123"}


def _json(data: Any) -> bytes:
    return json.dumps(data).encode()


# -- Replicate ---------------------------------------------------------------------------

REPLICATE_KEY = b"replicate-test-key-0123456789abc"
REPLICATE_SECRET = "whsec_" + base64.b64encode(REPLICATE_KEY).decode()
PREDICTION = {"id": "ufawqhfynnddngldkgtslldrkq", "status": "succeeded", "output": ["https://x"]}


def replicate_headers(body: bytes, *, ts: int = TS, msg_id: str = "msg_1") -> dict[str, str]:
    # Signed independently of the library, from replicate.com/docs/topics/webhooks.
    digest = hmac.new(REPLICATE_KEY, f"{msg_id}.{ts}.".encode() + body, hashlib.sha256).digest()
    return {
        "Webhook-Id": msg_id,
        "Webhook-Timestamp": str(ts),
        "Webhook-Signature": "v1," + base64.b64encode(digest).decode(),
    }


def test_replicate_valid_delivery_is_accepted() -> None:
    """A correctly signed prediction becomes an event keyed by webhook-id."""
    body = _json(PREDICTION)
    event = verify_replicate(replicate_headers(body), body, QUERY, REPLICATE_SECRET, NOW)
    assert event == WebhookEvent(
        provider="replicate",
        delivery_id="msg_1",
        task_id=PREDICTION["id"],
        planted_job_id="job-123",
        status="succeeded",
        succeeded=True,
        failed=False,
        error=None,
        payload=PREDICTION,
        signed_body=True,
    )


def test_replicate_accepts_any_matching_signature_in_the_list() -> None:
    """During secret rotation the header lists several signatures; one match is enough."""
    body = _json(PREDICTION)
    headers = replicate_headers(body)
    headers["Webhook-Signature"] = "v1,AAAA v2,zzz " + headers["Webhook-Signature"]
    assert verify_replicate(headers, body, {}, REPLICATE_SECRET, NOW).task_id == PREDICTION["id"]


def test_replicate_failed_prediction_carries_its_error() -> None:
    """A failed prediction is reported failed with the provider's error text."""
    body = _json({"id": "p1", "status": "failed", "error": "CUDA out of memory"})
    event = verify_replicate(replicate_headers(body), body, {}, REPLICATE_SECRET, NOW)
    assert (event.succeeded, event.failed, event.error) == (False, True, "CUDA out of memory")
    assert event.planted_job_id is None


def test_replicate_running_status_is_neither_success_nor_failure() -> None:
    """A start event is not terminal."""
    body = _json({"id": "p1", "status": "processing"})
    event = verify_replicate(replicate_headers(body), body, {}, REPLICATE_SECRET, NOW)
    assert (event.succeeded, event.failed) == (False, False)


def test_replicate_wrong_signature_is_rejected() -> None:
    """A signature made with another key is refused."""
    body = _json(PREDICTION)
    headers = replicate_headers(body)
    other = "whsec_" + base64.b64encode(b"another-key-another-key-another").decode()
    with pytest.raises(WebhookSignatureError):
        verify_replicate(headers, body, {}, other, NOW)


def test_replicate_tampered_body_is_rejected() -> None:
    """Changing the signed body after signing breaks the signature."""
    body = _json(PREDICTION)
    headers = replicate_headers(body)
    tampered = _json({**PREDICTION, "status": "failed"})
    with pytest.raises(WebhookSignatureError):
        verify_replicate(headers, tampered, {}, REPLICATE_SECRET, NOW)


@pytest.mark.parametrize("offset", [-301, 301])
def test_replicate_stale_or_future_timestamp_is_rejected(offset: int) -> None:
    """A timestamp outside ±5 minutes is refused even with a valid signature."""
    body = _json(PREDICTION)
    headers = replicate_headers(body, ts=TS + offset)
    with pytest.raises(WebhookTimestampError):
        verify_replicate(headers, body, {}, REPLICATE_SECRET, NOW)


def test_replicate_timestamp_inside_the_window_is_accepted() -> None:
    """299 seconds of delivery delay is still fresh."""
    body = _json(PREDICTION)
    headers = replicate_headers(body, ts=TS - 299)
    assert verify_replicate(headers, body, {}, REPLICATE_SECRET, NOW).succeeded is True


@pytest.mark.parametrize(
    ("missing", "error"),
    [
        ("Webhook-Id", WebhookSignatureError),
        ("Webhook-Signature", WebhookSignatureError),
        ("Webhook-Timestamp", WebhookTimestampError),
    ],
)
def test_replicate_missing_header_is_rejected(missing: str, error: type[WebhookError]) -> None:
    """Each of the three Standard Webhooks headers is required."""
    body = _json(PREDICTION)
    headers = replicate_headers(body)
    del headers[missing]
    with pytest.raises(error):
        verify_replicate(headers, body, {}, REPLICATE_SECRET, NOW)


def test_replicate_without_a_configured_secret_refuses() -> None:
    """No secret means no delivery can be trusted: fail closed, naming the provider."""
    body = _json(PREDICTION)
    with pytest.raises(WebhookSignatureError, match="replicate"):
        verify_replicate(replicate_headers(body), body, {}, None, NOW)


def test_replicate_signed_non_json_body_is_a_payload_error() -> None:
    """A genuine delivery we cannot parse is a payload error, not a signature error."""
    body = b"not json"
    with pytest.raises(WebhookPayloadError):
        verify_replicate(replicate_headers(body), body, {}, REPLICATE_SECRET, NOW)


# -- KIE -----------------------------------------------------------------------------------

KIE_KEY = "kie-hmac-key"
KIE_MARKET = {"code": 200, "msg": "success", "data": {"taskId": "task_abc", "state": "success"}}


def kie_headers(task_id: str, *, ts: int = TS, key: str = KIE_KEY) -> dict[str, str]:
    mac = hmac.new(key.encode(), f"{task_id}.{ts}".encode(), hashlib.sha256).digest()
    return {"X-Webhook-Timestamp": str(ts), "X-Webhook-Signature": base64.b64encode(mac).decode()}


def test_kie_valid_callback_is_accepted_but_marked_body_unsigned() -> None:
    """A valid KIE callback is accepted, and flags that its status must be re-read."""
    body = _json(KIE_MARKET)
    event = verify_kie(kie_headers("task_abc"), body, QUERY, KIE_KEY, NOW)
    assert event.task_id == "task_abc"
    assert event.delivery_id == f"task_abc:{TS}"
    assert event.planted_job_id == "job-123"
    assert (event.status, event.succeeded, event.failed) == ("success", True, False)
    assert event.signed_body is False


def test_kie_reads_snake_case_task_id_and_suno_callback_type() -> None:
    """Suno/Runway callbacks name the id data.task_id; a 'complete' callback is a success."""
    body = _json({"code": 200, "data": {"callbackType": "complete", "task_id": "suno_1"}})
    event = verify_kie(kie_headers("suno_1"), body, {}, KIE_KEY, NOW)
    assert (event.task_id, event.status, event.succeeded) == ("suno_1", "complete", True)


def test_kie_intermediate_suno_callback_is_not_terminal() -> None:
    """Suno's 'first' callback (one track of two) is neither success nor failure."""
    body = _json({"code": 200, "data": {"callbackType": "first", "task_id": "suno_1"}})
    event = verify_kie(kie_headers("suno_1"), body, {}, KIE_KEY, NOW)
    assert (event.succeeded, event.failed) == (False, False)


def test_kie_unrecognised_state_says_nothing() -> None:
    """A state we do not know is reported as unknown (None), not guessed."""
    body = _json({"code": 200, "data": {"taskId": "t1", "state": "teleporting"}})
    event = verify_kie(kie_headers("t1"), body, {}, KIE_KEY, NOW)
    assert (event.status, event.succeeded, event.failed) == ("teleporting", None, None)


def test_kie_veo_success_flag_failure_carries_its_message() -> None:
    """successFlag 3 (generation failed) is a failure with the provider's message."""
    data = {"taskId": "veo_1", "successFlag": 3, "errorMessage": "policy"}
    body = _json({"code": 501, "data": data})
    event = verify_kie(kie_headers("veo_1"), body, {}, KIE_KEY, NOW)
    assert (event.failed, event.error) == (True, "policy")


def test_kie_wrong_signature_is_rejected() -> None:
    """A signature made with another key is refused."""
    body = _json(KIE_MARKET)
    with pytest.raises(WebhookSignatureError):
        verify_kie(kie_headers("task_abc", key="other"), body, {}, KIE_KEY, NOW)


def test_kie_tampered_task_id_is_rejected() -> None:
    """Pointing a captured delivery at another task breaks the signature."""
    headers = kie_headers("task_abc")
    body = _json({**KIE_MARKET, "data": {**KIE_MARKET["data"], "taskId": "task_victim"}})
    with pytest.raises(WebhookSignatureError):
        verify_kie(headers, body, {}, KIE_KEY, NOW)


def test_kie_tampered_timestamp_is_rejected() -> None:
    """Refreshing a captured delivery's timestamp breaks the signature."""
    headers = kie_headers("task_abc", ts=TS - 60)
    headers["X-Webhook-Timestamp"] = str(TS)
    with pytest.raises(WebhookSignatureError):
        verify_kie(headers, _json(KIE_MARKET), {}, KIE_KEY, NOW)


def test_kie_tampered_state_is_not_detected_so_body_is_flagged_unsigned() -> None:
    """KIE does not sign the body: a flipped state passes, which is why signed_body is False."""
    headers = kie_headers("task_abc")
    forged = _json({"code": 200, "data": {"taskId": "task_abc", "state": "fail"}})
    event = verify_kie(headers, forged, {}, KIE_KEY, NOW)
    assert event.status == "fail" and event.failed is True
    assert event.signed_body is False


def test_kie_stale_timestamp_is_rejected() -> None:
    """A correctly signed but six-minute-old delivery is a replay."""
    with pytest.raises(WebhookTimestampError):
        verify_kie(kie_headers("task_abc", ts=TS - 360), _json(KIE_MARKET), {}, KIE_KEY, NOW)


@pytest.mark.parametrize(
    ("missing", "error"),
    [
        ("X-Webhook-Signature", WebhookSignatureError),
        ("X-Webhook-Timestamp", WebhookTimestampError),
    ],
)
def test_kie_missing_header_is_rejected(missing: str, error: type[WebhookError]) -> None:
    """Both KIE headers are required."""
    headers = kie_headers("task_abc")
    del headers[missing]
    with pytest.raises(error):
        verify_kie(headers, _json(KIE_MARKET), {}, KIE_KEY, NOW)


@pytest.mark.parametrize("body", [b"<html>", _json({"code": 200, "data": {}}), _json([1])])
def test_kie_body_without_a_task_id_is_a_payload_error(body: bytes) -> None:
    """The signed task id lives in the body, so a body without one cannot be verified."""
    with pytest.raises(WebhookPayloadError):
        verify_kie(kie_headers("task_abc"), body, {}, KIE_KEY, NOW)


# -- ElevenLabs ----------------------------------------------------------------------------

EL_SECRET = "wsec_elevenlabs_test"
STT = {
    "type": "speech_to_text_transcription",
    "event_timestamp": TS,
    "data": {
        "request_id": "req_abc",
        "webhook_metadata": json.dumps({"job_id": "job-from-metadata"}),
        "transcription": {"language_code": "en", "text": "hello"},
    },
}


def el_headers(body: bytes, *, ts: int = TS, secret: str = EL_SECRET) -> dict[str, str]:
    mac = hmac.new(secret.encode(), f"{ts}.".encode() + body, hashlib.sha256).hexdigest()
    return {"elevenlabs-signature": f"t={ts},v0={mac}"}


def test_elevenlabs_valid_transcription_is_accepted() -> None:
    """A signed STT result binds through the job planted in webhook_metadata; its request_id is
    the HTTP request's id, not the stored transcription_id, so it names no task (issue 15)."""
    body = _json(STT)
    event = verify_elevenlabs(el_headers(body), body, QUERY, EL_SECRET, NOW)
    assert event.task_id is None
    assert event.planted_job_id == "job-from-metadata"
    assert (event.status, event.succeeded, event.signed_body) == (STT["type"], True, True)
    assert event.delivery_id == f"{TS}:{payload_digest(body)}"


def test_elevenlabs_transcription_binds_by_transcription_id_not_request_id() -> None:
    """The transcript's transcription_id (what the create answered and the job stores) names the
    task; the event's request_id never does."""
    data = {**STT["data"], "transcription": {"language_code": "en", "text": "hello",
                                             "transcription_id": "tr_123"}}
    body = _json({**STT, "data": data})
    event = verify_elevenlabs(el_headers(body), body, QUERY, EL_SECRET, NOW)
    assert event.task_id == "tr_123"
    top = _json({**STT, "data": {**STT["data"], "transcription_id": "tr_456"}})
    assert verify_elevenlabs(el_headers(top), top, QUERY, EL_SECRET, NOW).task_id == "tr_456"


@pytest.mark.parametrize(
    ("metadata", "expected"),
    [({"job_id": "job-obj"}, "job-obj"), (None, "job-123"), ("not json", "job-123")],
)
def test_elevenlabs_planted_job_id_from_metadata_object_or_query(
    metadata: Any, expected: str
) -> None:
    """webhook_metadata may come back as an object; without it the query's job_id is used."""
    body = _json({**STT, "data": {**STT["data"], "webhook_metadata": metadata}})
    event = verify_elevenlabs(el_headers(body), body, QUERY, EL_SECRET, NOW)
    assert event.planted_job_id == expected


def test_elevenlabs_wrong_signature_is_rejected() -> None:
    """A signature made with another secret is refused."""
    body = _json(STT)
    with pytest.raises(WebhookSignatureError):
        verify_elevenlabs(el_headers(body, secret="other"), body, {}, EL_SECRET, NOW)


def test_elevenlabs_tampered_body_is_rejected() -> None:
    """The body is signed: swapping the transcript breaks the signature."""
    body = _json(STT)
    headers = el_headers(body)
    tampered = body.replace(b"hello", b"HACKED")
    with pytest.raises(WebhookSignatureError):
        verify_elevenlabs(headers, tampered, {}, EL_SECRET, NOW)


def test_elevenlabs_tolerance_is_thirty_minutes() -> None:
    """29 minutes late is accepted; 31 minutes late is a replay."""
    body = _json(STT)
    ok = el_headers(body, ts=TS - 29 * 60)
    assert verify_elevenlabs(ok, body, {}, EL_SECRET, NOW).succeeded is True
    with pytest.raises(WebhookTimestampError):
        verify_elevenlabs(el_headers(body, ts=TS - 31 * 60), body, {}, EL_SECRET, NOW)


@pytest.mark.parametrize(
    ("headers", "error"),
    [
        ({}, WebhookSignatureError),
        ({"ElevenLabs-Signature": "v0=abcd"}, WebhookTimestampError),
        ({"ElevenLabs-Signature": f"t={TS}"}, WebhookSignatureError),
    ],
)
def test_elevenlabs_missing_parts_are_rejected(
    headers: dict[str, str], error: type[WebhookError]
) -> None:
    """The header, its t= and its v0= are all required."""
    with pytest.raises(error):
        verify_elevenlabs(headers, _json(STT), {}, EL_SECRET, NOW)


# -- fal -----------------------------------------------------------------------------------

FAL_OK = {
    "request_id": "req-fal-1",
    "gateway_request_id": "req-fal-1",
    "status": "OK",
    "payload": {"images": [{"url": "https://v3.fal.media/files/x.png"}]},
}
KEY_A, KEY_B = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
JWKS_URL = "https://rest.fal.ai/.well-known/jwks.json"


def jwk(private: Ed25519PrivateKey) -> dict[str, str]:
    raw = private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    x = base64.urlsafe_b64encode(raw).rstrip(b"=").decode()
    return {"kty": "OKP", "crv": "Ed25519", "x": x, "kid": x[:8]}


def fal_headers(body: bytes, signer: Ed25519PrivateKey, *, ts: int = TS) -> dict[str, str]:
    message = f"req-fal-1\nuser-9\n{ts}\n{hashlib.sha256(body).hexdigest()}".encode()
    return {
        "X-Fal-Webhook-Request-Id": "req-fal-1",
        "X-Fal-Webhook-User-Id": "user-9",
        "X-Fal-Webhook-Timestamp": str(ts),
        "X-Fal-Webhook-Signature": signer.sign(message).hex(),
    }


def test_fal_accepts_a_signature_by_the_second_key_of_the_jwks() -> None:
    """Every Ed25519 key of the JWKS is tried, so a rotated-in second key verifies."""
    body = _json(FAL_OK)
    jwks = {"keys": [{"kty": "RSA", "n": "x", "e": "AQAB"}, jwk(KEY_A), jwk(KEY_B)]}
    event = verify_fal(fal_headers(body, KEY_B), body, QUERY, jwks, NOW)
    assert (event.task_id, event.delivery_id, event.planted_job_id) == (
        "req-fal-1",
        "req-fal-1",
        "job-123",
    )
    assert (event.status, event.succeeded, event.failed, event.signed_body) == (
        "OK",
        True,
        False,
        True,
    )


def test_fal_error_delivery_is_a_failure_with_its_error() -> None:
    """status ERROR is a failure carrying fal's error text."""
    body = _json(
        {"request_id": "req-fal-1", "status": "ERROR", "error": "Invalid status code: 422"}
    )
    event = verify_fal(fal_headers(body, KEY_A), body, {}, {"keys": [jwk(KEY_A)]}, NOW)
    assert (event.failed, event.error) == (True, "Invalid status code: 422")


def test_fal_signature_by_a_key_outside_the_jwks_is_rejected() -> None:
    """A signature by any key the JWKS does not list is refused."""
    body = _json(FAL_OK)
    with pytest.raises(WebhookSignatureError):
        verify_fal(fal_headers(body, KEY_B), body, {}, {"keys": [jwk(KEY_A)]}, NOW)


def test_fal_tampered_body_is_rejected() -> None:
    """The body's sha256 is in the signed message, so editing the body breaks it."""
    body = _json(FAL_OK)
    headers = fal_headers(body, KEY_A)
    tampered = _json({**FAL_OK, "status": "ERROR"})
    with pytest.raises(WebhookSignatureError):
        verify_fal(headers, tampered, {}, {"keys": [jwk(KEY_A)]}, NOW)


@pytest.mark.parametrize("offset", [-301, 301])
def test_fal_timestamp_beyond_300_seconds_is_rejected(offset: int) -> None:
    """|now - timestamp| > 300 s is refused."""
    body = _json(FAL_OK)
    with pytest.raises(WebhookTimestampError):
        verify_fal(fal_headers(body, KEY_A, ts=TS + offset), body, {}, {"keys": [jwk(KEY_A)]}, NOW)


@pytest.mark.parametrize(
    ("missing", "error"),
    [
        ("X-Fal-Webhook-Request-Id", WebhookSignatureError),
        ("X-Fal-Webhook-User-Id", WebhookSignatureError),
        ("X-Fal-Webhook-Signature", WebhookSignatureError),
        ("X-Fal-Webhook-Timestamp", WebhookTimestampError),
    ],
)
def test_fal_missing_header_is_rejected(missing: str, error: type[WebhookError]) -> None:
    """All four fal headers are required."""
    body = _json(FAL_OK)
    headers = fal_headers(body, KEY_A)
    del headers[missing]
    with pytest.raises(error):
        verify_fal(headers, body, {}, {"keys": [jwk(KEY_A)]}, NOW)


def test_fal_non_hex_signature_is_rejected() -> None:
    """A signature that is not hex is a signature error, not a crash."""
    body = _json(FAL_OK)
    headers = {**fal_headers(body, KEY_A), "X-Fal-Webhook-Signature": "zz-not-hex"}
    with pytest.raises(WebhookSignatureError):
        verify_fal(headers, body, {}, {"keys": [jwk(KEY_A)]}, NOW)


@responses.activate
def test_jwks_cache_fetches_once_per_day() -> None:
    """The JWKS is fetched once, reused within 24 h and refetched after."""
    responses.get(JWKS_URL, json={"keys": [jwk(KEY_A)]})
    cache = JwksCache(JWKS_URL, requests.Session())
    body = _json(FAL_OK)
    verify_fal(fal_headers(body, KEY_A), body, {}, cache, NOW)
    later = NOW + timedelta(hours=23)
    verify_fal(fal_headers(body, KEY_A, ts=TS + 23 * 3600), body, {}, cache, later)
    assert len(responses.calls) == 1
    cache.keys(NOW + timedelta(hours=24))
    assert len(responses.calls) == 2


@responses.activate
def test_jwks_cache_refetches_on_unknown_key_but_rate_limits_it() -> None:
    """A rotated key triggers one refetch; forgeries right after do not refetch again."""
    responses.get(JWKS_URL, json={"keys": [jwk(KEY_A)]})
    responses.get(JWKS_URL, json={"keys": [jwk(KEY_A), jwk(KEY_B)]})
    cache = JwksCache(JWKS_URL, requests.Session())
    cache.keys(NOW)
    at = NOW + timedelta(minutes=10)
    body = _json(FAL_OK)
    verify_fal(fal_headers(body, KEY_B, ts=TS + 600), body, {}, cache, at)
    assert len(responses.calls) == 2
    forger = Ed25519PrivateKey.generate()
    with pytest.raises(WebhookSignatureError):
        verify_fal(fal_headers(body, forger, ts=TS + 600), body, {}, cache, at)
    assert len(responses.calls) == 2


@responses.activate
def test_jwks_fetch_failure_without_keys_is_retryable_read_failure() -> None:
    """When no JWKS can be had, the caller gets a retryable ReadFailed (answer 5xx)."""
    responses.get(JWKS_URL, status=503)
    cache = JwksCache(JWKS_URL, requests.Session())
    body = _json(FAL_OK)
    with pytest.raises(ReadFailed):
        verify_fal(fal_headers(body, KEY_A), body, {}, cache, NOW)


# -- dispatch and digest -------------------------------------------------------------------


def test_dispatch_routes_by_provider_and_refuses_unknown_ones() -> None:
    """verify() picks the scheme by name; an unknown provider is a payload error."""
    body = _json(KIE_MARKET)
    assert verify("kie", kie_headers("task_abc"), body, {}, KIE_KEY, NOW).provider == "kie"
    with pytest.raises(WebhookPayloadError):
        verify("nosuchfamily", {}, body, {}, "k", NOW)


def test_payload_digest_is_sha256_hex() -> None:
    """The digest is the body's sha256 in hex."""
    assert payload_digest(b"abc") == hashlib.sha256(b"abc").hexdigest()


# -- fuzzing: only WebhookError escapes ----------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4)
    ),
    max_leaves=12,
)
NAMES = [
    "webhook-id",
    "webhook-timestamp",
    "webhook-signature",
    "X-Webhook-Timestamp",
    "X-Webhook-Signature",
    "ElevenLabs-Signature",
    "X-Fal-Webhook-Request-Id",
    "X-Fal-Webhook-User-Id",
    "X-Fal-Webhook-Timestamp",
    "X-Fal-Webhook-Signature",
]
header_values = st.one_of(
    st.text(max_size=40),
    st.integers(min_value=TS - 400, max_value=TS + 400).map(str),
    st.just(f"t={TS},v0=00"),
    st.just("v1,AAAA"),
)
arbitrary_headers = st.dictionaries(st.sampled_from(NAMES) | st.text(max_size=10), header_values)
bodies = st.binary(max_size=200) | json_values.map(lambda v: json.dumps(v).encode())
shaped_bodies = st.fixed_dictionaries(
    {},
    optional={
        "id": json_values,
        "status": json_values,
        "error": json_values,
        "type": json_values,
        "request_id": json_values,
        "code": json_values,
        "data": st.fixed_dictionaries(
            {},
            optional={
                "taskId": json_values,
                "task_id": json_values,
                "state": json_values,
                "successFlag": json_values,
                "callbackType": json_values,
                "transcription": json_values,
                "webhook_metadata": json_values,
                "request_id": json_values,
                "error": json_values,
            },
        ),
    },
).map(lambda d: json.dumps(d).encode())
KEYS: dict[str, Any] = {
    "replicate": REPLICATE_SECRET,
    "kie": KIE_KEY,
    "elevenlabs": EL_SECRET,
    "fal": {"keys": [jwk(KEY_A)]},
}


def _only_webhook_errors(provider: str, headers: dict[str, str], body: bytes) -> None:
    try:
        event = verify(provider, headers, body, {"job_id": "j"}, KEYS[provider], NOW)
    except WebhookError:
        return
    assert isinstance(event, WebhookEvent) and event.provider == provider


@pytest.mark.parametrize("provider", sorted(KEYS))
@settings(deadline=None, max_examples=150)
@given(headers=arbitrary_headers, body=bodies | shaped_bodies)
def test_fuzz_arbitrary_deliveries_raise_only_webhook_errors(
    provider: str, headers: dict[str, str], body: bytes
) -> None:
    """Garbage headers and bodies are refused with a WebhookError, never a crash."""
    _only_webhook_errors(provider, headers, body)


SIGNERS = {
    "replicate": replicate_headers,
    "kie": lambda body: kie_headers(_kie_task_id(body)),
    "elevenlabs": el_headers,
    "fal": lambda body: fal_headers(body, KEY_A),
}


def _kie_task_id(body: bytes) -> str:
    try:
        data = json.loads(body).get("data") or {}
        value = data.get("taskId") or data.get("task_id")
    except (ValueError, AttributeError):
        return ""
    return value if isinstance(value, str) else ""


@pytest.mark.parametrize("provider", sorted(KEYS))
@settings(deadline=None, max_examples=150)
@given(body=bodies | shaped_bodies)
def test_fuzz_correctly_signed_odd_bodies_parse_or_raise_payload_errors(
    provider: str, body: bytes
) -> None:
    """A genuinely signed but oddly shaped body parses or is a WebhookPayloadError."""
    try:
        event = verify(provider, SIGNERS[provider](body), body, {}, KEYS[provider], NOW)
    except WebhookPayloadError:
        return
    assert event.signed_body is (provider != "kie")


def test_elevenlabs_dubbing_event_names_its_job_through_the_project_name() -> None:
    """A signed dubbing event carries the planted job id in ``data.name`` (reconcile-job:<id>)."""
    import hashlib as _hashlib
    import hmac as _hmac
    import json as _json
    from datetime import UTC as _UTC, datetime as _datetime

    from reconcile import webhooks as _webhooks

    now = _datetime(2031, 1, 1, tzinfo=_UTC)
    ts = str(int(now.timestamp()))
    body = _json.dumps({"type": "dubbing", "data": {"dubbing_id": "dub_1",
                                                    "name": "reconcile-job:1234"}}).encode()
    sig = _hmac.new(b"s3cret", f"{ts}.".encode() + body, _hashlib.sha256).hexdigest()
    event = _webhooks.verify_elevenlabs({"ElevenLabs-Signature": f"t={ts},v0={sig}"}, body, {},
                                        "s3cret", now)
    assert (event.task_id, event.planted_job_id) == ("dub_1", "1234")


def test_a_declared_scheme_is_registered_and_a_foreign_one_is_refused() -> None:
    """atk2: PROVIDERS is "what the families declared", and each one is served. (Before the
    declarations, the package scanned its own modules for ``SCHEME``: a module defining one but
    never registering it — dropped there by mistake, a new family's forgotten foot line — made
    PROVIDERS name a provider whose deliveries every route refused as unknown, a silent drop of
    that provider's webhooks, and the scan refused to load such a package.) Now a family's
    scheme is registered from its declaration, and a declaration naming another provider's
    scheme is refused where it is written."""
    from datetime import timedelta as _timedelta

    import reconcile.webhooks as package
    from reconcile.providers.family import Kind, ProviderFamily, families
    from reconcile.webhooks import WebhookScheme

    declared = {f.name: f.webhook for f in families() if f.webhook is not None}
    assert set(package.PROVIDERS) == set(declared) and declared
    for name, scheme in declared.items():
        assert package.get_scheme(name) is scheme
    stray = WebhookScheme("atk2stray", verify=lambda *a, **k: None, secret=lambda rt: "x")
    kind = Kind("atk2-render", False, _timedelta(minutes=1), None, None, None, "unused:unused")
    with pytest.raises(ValueError, match="atk2stray"):
        ProviderFamily("atk2", kinds=(kind,), webhook=stray)
    assert package.get_scheme("atk2stray") is None and package.get_scheme("atk2") is None
