"""ElevenLabs' webhook scheme: a signed transcription binds through its planted job and its
transcription id, a dubbing through its project name; a wrong secret, a tampered body, a delivery
past the 30-minute tolerance or a header missing a part is refused.
"""

from __future__ import annotations

from typing import Any

import pytest

from reconcile.errors import WebhookError, WebhookSignatureError, WebhookTimestampError
from reconcile.webhooks import payload_digest, verify_elevenlabs
from tests.unit._webhook_signing import EL_SECRET, NOW, QUERY, STT, TS, el_headers, json_body


def test_elevenlabs_valid_transcription_is_accepted() -> None:
    """A signed STT result binds through the job planted in webhook_metadata; its request_id is
    the HTTP request's id, not the stored transcription_id, so it names no task (issue 15)."""
    body = json_body(STT)
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
    body = json_body({**STT, "data": data})
    event = verify_elevenlabs(el_headers(body), body, QUERY, EL_SECRET, NOW)
    assert event.task_id == "tr_123"
    top = json_body({**STT, "data": {**STT["data"], "transcription_id": "tr_456"}})
    assert verify_elevenlabs(el_headers(top), top, QUERY, EL_SECRET, NOW).task_id == "tr_456"


@pytest.mark.parametrize(
    ("metadata", "expected"),
    [({"job_id": "job-obj"}, "job-obj"), (None, "job-123"), ("not json", "job-123")],
)
def test_elevenlabs_planted_job_id_from_metadata_object_or_query(
    metadata: Any, expected: str
) -> None:
    """webhook_metadata may come back as an object; without it the query's job_id is used."""
    body = json_body({**STT, "data": {**STT["data"], "webhook_metadata": metadata}})
    event = verify_elevenlabs(el_headers(body), body, QUERY, EL_SECRET, NOW)
    assert event.planted_job_id == expected


def test_elevenlabs_wrong_signature_is_rejected() -> None:
    """A signature made with another secret is refused."""
    body = json_body(STT)
    with pytest.raises(WebhookSignatureError):
        verify_elevenlabs(el_headers(body, secret="other"), body, {}, EL_SECRET, NOW)


def test_elevenlabs_tampered_body_is_rejected() -> None:
    """The body is signed: swapping the transcript breaks the signature."""
    body = json_body(STT)
    headers = el_headers(body)
    tampered = body.replace(b"hello", b"HACKED")
    with pytest.raises(WebhookSignatureError):
        verify_elevenlabs(headers, tampered, {}, EL_SECRET, NOW)


def test_elevenlabs_tolerance_is_thirty_minutes() -> None:
    """29 minutes late is accepted; 31 minutes late is a replay."""
    body = json_body(STT)
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
        verify_elevenlabs(headers, json_body(STT), {}, EL_SECRET, NOW)


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
