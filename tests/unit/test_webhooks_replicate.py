"""Replicate's Standard Webhooks scheme: a valid delivery becomes an event keyed by
webhook-id, any matching signature of a rotation list is enough; forgeries, tampered bodies,
stale timestamps and missing headers are refused; no secret fails closed.
"""

from __future__ import annotations

import base64

import pytest

from reconcile.errors import (
    WebhookError,
    WebhookPayloadError,
    WebhookSignatureError,
    WebhookTimestampError,
)
from reconcile.webhooks import WebhookEvent, verify_replicate
from tests.unit._webhook_signing import (
    NOW,
    PREDICTION,
    QUERY,
    REPLICATE_SECRET,
    TS,
    json_body,
    replicate_headers,
)


def test_replicate_valid_delivery_is_accepted() -> None:
    """A correctly signed prediction becomes an event keyed by webhook-id."""
    body = json_body(PREDICTION)
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
    body = json_body(PREDICTION)
    headers = replicate_headers(body)
    headers["Webhook-Signature"] = "v1,AAAA v2,zzz " + headers["Webhook-Signature"]
    assert verify_replicate(headers, body, {}, REPLICATE_SECRET, NOW).task_id == PREDICTION["id"]


def test_replicate_failed_prediction_carries_its_error() -> None:
    """A failed prediction is reported failed with the provider's error text."""
    body = json_body({"id": "p1", "status": "failed", "error": "CUDA out of memory"})
    event = verify_replicate(replicate_headers(body), body, {}, REPLICATE_SECRET, NOW)
    assert (event.succeeded, event.failed, event.error) == (False, True, "CUDA out of memory")
    assert event.planted_job_id is None


def test_replicate_running_status_is_neither_success_nor_failure() -> None:
    """A start event is not terminal."""
    body = json_body({"id": "p1", "status": "processing"})
    event = verify_replicate(replicate_headers(body), body, {}, REPLICATE_SECRET, NOW)
    assert (event.succeeded, event.failed) == (False, False)


def test_replicate_wrong_signature_is_rejected() -> None:
    """A signature made with another key is refused."""
    body = json_body(PREDICTION)
    headers = replicate_headers(body)
    other = "whsec_" + base64.b64encode(b"another-key-another-key-another").decode()
    with pytest.raises(WebhookSignatureError):
        verify_replicate(headers, body, {}, other, NOW)


def test_replicate_tampered_body_is_rejected() -> None:
    """Changing the signed body after signing breaks the signature."""
    body = json_body(PREDICTION)
    headers = replicate_headers(body)
    tampered = json_body({**PREDICTION, "status": "failed"})
    with pytest.raises(WebhookSignatureError):
        verify_replicate(headers, tampered, {}, REPLICATE_SECRET, NOW)


@pytest.mark.parametrize("offset", [-301, 301])
def test_replicate_stale_or_future_timestamp_is_rejected(offset: int) -> None:
    """A timestamp outside ±5 minutes is refused even with a valid signature."""
    body = json_body(PREDICTION)
    headers = replicate_headers(body, ts=TS + offset)
    with pytest.raises(WebhookTimestampError):
        verify_replicate(headers, body, {}, REPLICATE_SECRET, NOW)


def test_replicate_timestamp_inside_the_window_is_accepted() -> None:
    """299 seconds of delivery delay is still fresh."""
    body = json_body(PREDICTION)
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
    body = json_body(PREDICTION)
    headers = replicate_headers(body)
    del headers[missing]
    with pytest.raises(error):
        verify_replicate(headers, body, {}, REPLICATE_SECRET, NOW)


def test_replicate_without_a_configured_secret_refuses() -> None:
    """No secret means no delivery can be trusted: fail closed, naming the provider."""
    body = json_body(PREDICTION)
    with pytest.raises(WebhookSignatureError, match="replicate"):
        verify_replicate(replicate_headers(body), body, {}, None, NOW)


def test_replicate_signed_non_json_body_is_a_payload_error() -> None:
    """A genuine delivery we cannot parse is a payload error, not a signature error."""
    body = b"not json"
    with pytest.raises(WebhookPayloadError):
        verify_replicate(replicate_headers(body), body, {}, REPLICATE_SECRET, NOW)
