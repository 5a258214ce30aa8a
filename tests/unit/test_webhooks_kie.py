"""KIE's callback scheme (HMAC over task id and timestamp, body unsigned): valid callbacks of
every shape are accepted and flagged ``signed_body=False``; a wrong key, a tampered task id or
timestamp, a stale timestamp, a missing header or a body without a task id are refused.
"""

from __future__ import annotations

import pytest

from reconcile.errors import (
    WebhookError,
    WebhookPayloadError,
    WebhookSignatureError,
    WebhookTimestampError,
)
from reconcile.webhooks import verify_kie
from tests.unit._webhook_signing import KIE_KEY, KIE_MARKET, NOW, QUERY, TS, json_body, kie_headers


def test_kie_valid_callback_is_accepted_but_marked_body_unsigned() -> None:
    """A valid KIE callback is accepted, and flags that its status must be re-read."""
    body = json_body(KIE_MARKET)
    event = verify_kie(kie_headers("task_abc"), body, QUERY, KIE_KEY, NOW)
    assert event.task_id == "task_abc"
    assert event.delivery_id == f"task_abc:{TS}"
    assert event.planted_job_id == "job-123"
    assert (event.status, event.succeeded, event.failed) == ("success", True, False)
    assert event.signed_body is False


def test_kie_reads_snake_case_task_id_and_suno_callback_type() -> None:
    """Suno/Runway callbacks name the id data.task_id; a 'complete' callback is a success."""
    body = json_body({"code": 200, "data": {"callbackType": "complete", "task_id": "suno_1"}})
    event = verify_kie(kie_headers("suno_1"), body, {}, KIE_KEY, NOW)
    assert (event.task_id, event.status, event.succeeded) == ("suno_1", "complete", True)


def test_kie_intermediate_suno_callback_is_not_terminal() -> None:
    """Suno's 'first' callback (one track of two) is neither success nor failure."""
    body = json_body({"code": 200, "data": {"callbackType": "first", "task_id": "suno_1"}})
    event = verify_kie(kie_headers("suno_1"), body, {}, KIE_KEY, NOW)
    assert (event.succeeded, event.failed) == (False, False)


def test_kie_unrecognised_state_says_nothing() -> None:
    """A state we do not know is reported as unknown (None), not guessed."""
    body = json_body({"code": 200, "data": {"taskId": "t1", "state": "teleporting"}})
    event = verify_kie(kie_headers("t1"), body, {}, KIE_KEY, NOW)
    assert (event.status, event.succeeded, event.failed) == ("teleporting", None, None)


def test_kie_veo_success_flag_failure_carries_its_message() -> None:
    """successFlag 3 (generation failed) is a failure with the provider's message."""
    data = {"taskId": "veo_1", "successFlag": 3, "errorMessage": "policy"}
    body = json_body({"code": 501, "data": data})
    event = verify_kie(kie_headers("veo_1"), body, {}, KIE_KEY, NOW)
    assert (event.failed, event.error) == (True, "policy")


def test_kie_wrong_signature_is_rejected() -> None:
    """A signature made with another key is refused."""
    body = json_body(KIE_MARKET)
    with pytest.raises(WebhookSignatureError):
        verify_kie(kie_headers("task_abc", key="other"), body, {}, KIE_KEY, NOW)


def test_kie_tampered_task_id_is_rejected() -> None:
    """Pointing a captured delivery at another task breaks the signature."""
    headers = kie_headers("task_abc")
    body = json_body({**KIE_MARKET, "data": {**KIE_MARKET["data"], "taskId": "task_victim"}})
    with pytest.raises(WebhookSignatureError):
        verify_kie(headers, body, {}, KIE_KEY, NOW)


def test_kie_tampered_timestamp_is_rejected() -> None:
    """Refreshing a captured delivery's timestamp breaks the signature."""
    headers = kie_headers("task_abc", ts=TS - 60)
    headers["X-Webhook-Timestamp"] = str(TS)
    with pytest.raises(WebhookSignatureError):
        verify_kie(headers, json_body(KIE_MARKET), {}, KIE_KEY, NOW)


def test_kie_tampered_state_is_not_detected_so_body_is_flagged_unsigned() -> None:
    """KIE does not sign the body: a flipped state passes, which is why signed_body is False."""
    headers = kie_headers("task_abc")
    forged = json_body({"code": 200, "data": {"taskId": "task_abc", "state": "fail"}})
    event = verify_kie(headers, forged, {}, KIE_KEY, NOW)
    assert event.status == "fail" and event.failed is True
    assert event.signed_body is False


def test_kie_stale_timestamp_is_rejected() -> None:
    """A correctly signed but six-minute-old delivery is a replay."""
    with pytest.raises(WebhookTimestampError):
        verify_kie(kie_headers("task_abc", ts=TS - 360), json_body(KIE_MARKET), {}, KIE_KEY, NOW)


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
        verify_kie(headers, json_body(KIE_MARKET), {}, KIE_KEY, NOW)


@pytest.mark.parametrize("body", [b"<html>", json_body({"code": 200, "data": {}}), json_body([1])])
def test_kie_body_without_a_task_id_is_a_payload_error(body: bytes) -> None:
    """The signed task id lives in the body, so a body without one cannot be verified."""
    with pytest.raises(WebhookPayloadError):
        verify_kie(kie_headers("task_abc"), body, {}, KIE_KEY, NOW)
