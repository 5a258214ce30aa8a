"""Internal: the library's own mechanics, not an import path for platforms (may move).

Replicate's webhooks (Standard Webhooks): HMAC-SHA256 of ``{webhook-id}.{webhook-timestamp}.
{body}``, base64, ``v1,`` entries; ±5 min; the body (a prediction or training) is signed.

``standardwebhooks``' ``Webhook.verify`` (v1.1) reads the wall clock (``datetime.now``) with a
fixed 5-minute window and cannot take an injected clock. So the timestamp window is checked here
against ``now``, and the library's pure ``Webhook.sign`` (which also owns the ``whsec_`` key
decoding) computes the expected signature, compared constant-time against every ``v1,`` entry —
the same algorithm as ``verify``, without its clock.
"""

from __future__ import annotations

import base64
import binascii
import hmac
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from standardwebhooks import Webhook

from ...errors import WebhookPayloadError, WebhookSignatureError
from ..scheme import (
    FAILED,
    RUNNING,
    SUCCEEDED,
    Binding,
    Headers,
    WebhookEvent,
    WebhookScheme,
    _event,
    _json_object,
    _planted,
    _require_secret,
    _required,
    _text,
    _timestamp,
    from_settings,
)

if TYPE_CHECKING:
    from ...settings import Settings
    from ..family import Kind

REPLICATE_TOLERANCE = timedelta(minutes=5)

# canceled/aborted end without output: failed here; ``status`` keeps the exact word.
_REPLICATE = {"succeeded": SUCCEEDED, "failed": FAILED, "canceled": FAILED, "aborted": FAILED,
              "starting": RUNNING, "processing": RUNNING}  # fmt: skip


def verify_replicate(headers: Headers, body: bytes, query: Headers, secret: str | None,
                     now: datetime) -> WebhookEvent:
    """Verify a Replicate (Standard Webhooks) delivery whose body is a prediction."""
    key = _require_secret(secret, "replicate")
    msg_id, signatures = _required(headers, ("webhook-id", "webhook-signature"),
                                   "missing webhook-id or webhook-signature header")
    ts = int(_timestamp(headers, "webhook-timestamp", now, REPLICATE_TOLERANCE))
    try:
        text = body.decode()
    except UnicodeDecodeError:
        raise WebhookPayloadError("body is not UTF-8") from None
    try:
        signer = Webhook(key)
    except Exception:  # binascii.Error, EmptyWebhookSecretError: a bad configured secret
        raise WebhookSignatureError("the replicate secret is not a whsec_ key") from None
    try:
        signed = signer.sign(msg_id, datetime.fromtimestamp(ts, UTC), text)
    except UnicodeEncodeError:
        raise WebhookSignatureError("signed fields are not valid text") from None
    expected = base64.b64decode(signed.partition(",")[2])
    if not any(_matches_v1(expected, part) for part in signatures.split()):
        raise WebhookSignatureError("no webhook-signature entry matches (replicate)")

    data = _json_object(body)
    task_id, status = data.get("id"), data.get("status")
    if not isinstance(task_id, str) or not task_id:
        raise WebhookPayloadError("replicate delivery has no prediction id")
    status = status if isinstance(status, str) else None
    return _event("replicate", delivery_id=msg_id, task_id=task_id, planted=_planted(query),
                  status=status, outcome=_REPLICATE.get(status or ""),
                  error=_text(data.get("error")), payload=data, signed_body=True)


def _matches_v1(expected: bytes, entry: str) -> bool:
    version, _, encoded = entry.partition(",")
    if version != "v1":
        return False
    try:
        given = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        return False
    return hmac.compare_digest(expected, given)


def _signed_job_id(payload: Mapping[str, Any], job_id: str | None, settings: Settings) -> str | None:
    """The signed body is the prediction, whose ``webhook`` is our callback URL (its job_id)."""
    from ._common import planted_job_id

    return planted_job_id(payload.get("webhook"))


def _same_kind(payload: Mapping[str, Any], kind: Kind) -> bool:
    """A training's ``urls.get`` names ``/trainings/``: never evidence for a prediction job."""
    urls = payload.get("urls")
    get = urls.get("get") if isinstance(urls, dict) else None
    return not (isinstance(get, str) and ("/trainings/" in get) != (kind.name == "replicate-training"))


SCHEME = WebhookScheme(
    provider="replicate",
    verify=verify_replicate,
    secret=from_settings("replicate_webhook_secret"),
    binding=Binding("signed body `webhook` (the callback URL's job_id)",
                    "GET prediction/training echoes `webhook`"),
    signed_job_id=_signed_job_id,
    same_kind=_same_kind,
)

__all__ = ["REPLICATE_TOLERANCE", "SCHEME", "verify_replicate"]
