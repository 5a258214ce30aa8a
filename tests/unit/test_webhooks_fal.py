"""fal's ED25519 scheme and its JWKS: every key of the JWKS is tried, an error delivery is a
failure; a key outside the JWKS, a tampered body, a timestamp past 300 s, a missing header or a
non-hex signature is refused; the JWKS is fetched once a day, refetched (rate-limited) for an
unknown key, and a failed fetch is a retryable read failure.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
import requests
import responses
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from reconcile.errors import ReadFailed, WebhookError, WebhookSignatureError, WebhookTimestampError
from reconcile.webhooks import JwksCache, verify_fal
from tests.unit._webhook_signing import (
    FAL_OK,
    JWKS_URL,
    KEY_A,
    KEY_B,
    NOW,
    QUERY,
    TS,
    fal_headers,
    json_body,
    jwk,
)


def test_fal_accepts_a_signature_by_the_second_key_of_the_jwks() -> None:
    """Every Ed25519 key of the JWKS is tried, so a rotated-in second key verifies."""
    body = json_body(FAL_OK)
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
    body = json_body(
        {"request_id": "req-fal-1", "status": "ERROR", "error": "Invalid status code: 422"}
    )
    event = verify_fal(fal_headers(body, KEY_A), body, {}, {"keys": [jwk(KEY_A)]}, NOW)
    assert (event.failed, event.error) == (True, "Invalid status code: 422")


def test_fal_signature_by_a_key_outside_the_jwks_is_rejected() -> None:
    """A signature by any key the JWKS does not list is refused."""
    body = json_body(FAL_OK)
    with pytest.raises(WebhookSignatureError):
        verify_fal(fal_headers(body, KEY_B), body, {}, {"keys": [jwk(KEY_A)]}, NOW)


def test_fal_tampered_body_is_rejected() -> None:
    """The body's sha256 is in the signed message, so editing the body breaks it."""
    body = json_body(FAL_OK)
    headers = fal_headers(body, KEY_A)
    tampered = json_body({**FAL_OK, "status": "ERROR"})
    with pytest.raises(WebhookSignatureError):
        verify_fal(headers, tampered, {}, {"keys": [jwk(KEY_A)]}, NOW)


@pytest.mark.parametrize("offset", [-301, 301])
def test_fal_timestamp_beyond_300_seconds_is_rejected(offset: int) -> None:
    """|now - timestamp| > 300 s is refused."""
    body = json_body(FAL_OK)
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
    body = json_body(FAL_OK)
    headers = fal_headers(body, KEY_A)
    del headers[missing]
    with pytest.raises(error):
        verify_fal(headers, body, {}, {"keys": [jwk(KEY_A)]}, NOW)


def test_fal_non_hex_signature_is_rejected() -> None:
    """A signature that is not hex is a signature error, not a crash."""
    body = json_body(FAL_OK)
    headers = {**fal_headers(body, KEY_A), "X-Fal-Webhook-Signature": "zz-not-hex"}
    with pytest.raises(WebhookSignatureError):
        verify_fal(headers, body, {}, {"keys": [jwk(KEY_A)]}, NOW)


@responses.activate
def test_jwks_cache_fetches_once_per_day() -> None:
    """The JWKS is fetched once, reused within 24 h and refetched after."""
    responses.get(JWKS_URL, json={"keys": [jwk(KEY_A)]})
    cache = JwksCache(JWKS_URL, requests.Session())
    body = json_body(FAL_OK)
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
    body = json_body(FAL_OK)
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
    body = json_body(FAL_OK)
    with pytest.raises(ReadFailed):
        verify_fal(fal_headers(body, KEY_A), body, {}, cache, NOW)
