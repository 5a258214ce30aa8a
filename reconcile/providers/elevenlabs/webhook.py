"""Internal: the library's own mechanics, not an import path for platforms (may move).

ElevenLabs' workspace webhooks: hex HMAC-SHA256 of ``{t}.{body}`` (``ElevenLabs-Signature:
t=…,v0=…``); ±30 min; the body is signed.

The signed body names the job: speech-to-text echoes ``data.webhook_metadata.job_id``, a dubbing
event its project ``name`` (``reconcile-job:<id>``, which the client always writes; submit refuses
an input setting either), each event by its own field only. A dubbing read
(``GET /v1/dubbing/{id}``) echoes the name back; speech-to-text has no confirming read.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from ...errors import WebhookSignatureError
from ..base import JOB_REF_PREFIX
from ..scheme import (
    FAILED,
    SUCCEEDED,
    Binding,
    Headers,
    WebhookEvent,
    WebhookScheme,
    _event,
    _fresh,
    _json_object,
    _planted,
    _require_secret,
    _required,
    _text,
    from_settings,
    payload_digest,
)

ELEVENLABS_TOLERANCE = timedelta(minutes=30)

# Which field names the upstream task. The speech-to-text event's ``request_id`` is NOT one: it
# is the id of the HTTP request, while the job stores the create answer's ``transcription_id``
# (the id ``GET /v1/speech-to-text/transcripts/{id}`` reads). Captured deliveries carry
# ``data: {request_id, webhook_metadata, transcription}``, the transcript (the SDK's
# SpeechToTextChunkResponseModel) holding ``transcription_id``; without one anywhere the event
# binds through the signed ``webhook_metadata.job_id`` alone.
_ELEVENLABS_IDS = ("transcription_id", "dubbing_id", "conversation_id")


def verify_elevenlabs(headers: Headers, body: bytes, query: Headers, secret: str | None,
                      now: datetime) -> WebhookEvent:
    """Verify an ElevenLabs workspace webhook (speech-to-text results among others)."""
    key = _require_secret(secret, "elevenlabs")
    (header,) = _required(headers, ("ElevenLabs-Signature",), "missing ElevenLabs-Signature header")
    fields: dict[str, list[str]] = {}
    for part in header.split(","):
        name, _, value = part.strip().partition("=")
        fields.setdefault(name, []).append(value.strip())
    raw_ts = _fresh(
        (fields.get("t") or [""])[0], "ElevenLabs-Signature t=", now, ELEVENLABS_TOLERANCE
    )
    candidates = fields.get("v0")
    if not candidates:
        raise WebhookSignatureError("ElevenLabs-Signature has no v0= signature")
    # The SDK signs f"{t}.{body}" as text; hashing the bytes directly is the same thing for
    # UTF-8 bodies and still well-defined for any other bytes.
    expected = hmac.new(key.encode(), f"{raw_ts}.".encode() + body, hashlib.sha256).hexdigest()
    if not any(hmac.compare_digest(expected.encode(), c.lower().encode()) for c in candidates):
        raise WebhookSignatureError("ElevenLabs-Signature v0 does not match the body")

    data = _json_object(body)
    inner = data.get("data")
    inner = inner if isinstance(inner, dict) else {}
    task_id = next((inner[k] for k in _ELEVENLABS_IDS if isinstance(inner.get(k), str)), None)
    transcription = inner.get("transcription")
    if task_id is None and isinstance(transcription, dict):
        nested = transcription.get("transcription_id")
        task_id = nested if isinstance(nested, str) else None
    if task_id is None and data.get("type") != "speech_to_text_transcription" and \
            isinstance(inner.get("request_id"), str):
        task_id = inner["request_id"]  # other event types: the only id there is
    error = _text(inner.get("error") or data.get("error"))
    # No status field: an error means failure, a transcript means success.
    outcome = (
        FAILED if error is not None else SUCCEEDED if isinstance(transcription, dict) else None
    )
    event_type = data.get("type")
    return _event(
        "elevenlabs",
        delivery_id=f"{raw_ts}:{payload_digest(body)}",
        task_id=task_id,
        planted=_bound_job_id(data) or _planted(query),
        status=event_type if isinstance(event_type, str) else None,
        outcome=outcome,
        error=error,
        payload=data,
        signed_body=True,
    )


DUBBING_NAME_PREFIX = JOB_REF_PREFIX  # the ElevenLabs client names dubbings this way


def _dubbing_name_job_id(name: Any) -> str | None:
    """A dubbing event echoes the project's ``name``, where the client planted the job id."""
    if isinstance(name, str) and name.startswith(DUBBING_NAME_PREFIX):
        return name[len(DUBBING_NAME_PREFIX):] or None
    return None


def _metadata_job_id(metadata: Any) -> str | None:
    """``webhook_metadata`` is echoed back as sent: a JSON string or an object."""
    if isinstance(metadata, str):
        try:
            metadata = json.loads(metadata)
        except (ValueError, RecursionError):
            return None
    if isinstance(metadata, dict):
        value = metadata.get("job_id")
        return value if isinstance(value, str) and value else None
    return None


def _bound_job_id(payload: Mapping[str, Any]) -> str | None:
    """The job id the event's own binding names: a dubbing's ``name``, a speech-to-text task's
    ``webhook_metadata`` — never the other field, which the library does not write for that
    task (a dubbing echoing a ``webhook_metadata`` sent with its create binds by ``name`` only)."""
    inner = payload.get("data")
    if not isinstance(inner, dict):
        return None
    event_type = payload.get("type")
    if isinstance(inner.get("dubbing_id"), str) or (
            isinstance(event_type, str) and "dubbing" in event_type.lower()):
        return _dubbing_name_job_id(inner.get("name"))
    return _metadata_job_id(inner.get("webhook_metadata"))


def signed_job_id(payload: Mapping[str, Any]) -> str | None:
    """The job id in the signed body only (never the unsigned query)."""
    return _bound_job_id(payload)


SCHEME = WebhookScheme(
    provider="elevenlabs",
    verify=verify_elevenlabs,
    secret=from_settings("elevenlabs_webhook_secret"),
    binding=Binding("signed body data.webhook_metadata.job_id (dubbing: data.name)",
                    "GET dubbing echoes `name` (speech-to-text: none)"),
    signed_job_id=lambda payload, job_id, settings: signed_job_id(payload),
)

# what reconcile.webhooks re-exports (signed_job_id is the scheme's own, not a platform's)
__all__ = ["DUBBING_NAME_PREFIX", "ELEVENLABS_TOLERANCE", "SCHEME", "verify_elevenlabs"]
