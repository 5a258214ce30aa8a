"""Internal: the library's own mechanics, not an import path for platforms (may move).

KIE's callbacks: base64 HMAC-SHA256 of ``{taskId}.{X-Webhook-Timestamp}``; ±5 min; the body is
**not** signed.

KIE signs only the task id and the timestamp, so its status fields are hints
(``signed_body=False``): re-read the task before acting on it. Nothing that names the job is
signed either: a stored KIE delivery binds to a job only through a ``record-info`` /
``record-detail`` read echoing ``param.callBackUrl``'s ``job_id`` (the evidence table's row).
"""

from __future__ import annotations

import base64
import hmac
from datetime import datetime, timedelta
from typing import Any

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
    _hmac_sha256,
    _json_object,
    _planted,
    _require_secret,
    _required,
    _text,
    _timestamp,
    from_settings,
)

KIE_TOLERANCE = timedelta(minutes=5)

# market `state` (Runway spells its queue states wait/queueing)
_KIE_STATE = {"success": SUCCEEDED, "fail": FAILED, "waiting": RUNNING, "queuing": RUNNING,
              "generating": RUNNING, "wait": RUNNING, "queueing": RUNNING}  # fmt: skip
# Veo/Flux/Luma `successFlag`: 4 = the callback failed but the generation succeeded
_KIE_FLAG = {0: RUNNING, 1: SUCCEEDED, 2: FAILED, 3: FAILED, 4: SUCCEEDED}
# Suno `callbackType`: text and first arrive before the last track
_KIE_CALLBACK = {"complete": SUCCEEDED, "error": FAILED, "text": RUNNING, "first": RUNNING}


def verify_kie(headers: Headers, body: bytes, query: Headers, key: str | None,
               now: datetime) -> WebhookEvent:
    """Verify a KIE callback; only its task id and timestamp are authenticated."""
    hmac_key = _require_secret(key, "kie")
    (given,) = _required(headers, ("X-Webhook-Signature",),
                         "missing X-Webhook-Signature header (kie)")
    raw_ts = _timestamp(headers, "X-Webhook-Timestamp", now, KIE_TOLERANCE)

    data = _json_object(body)  # needed first: the signed task id lives in the body
    inner = data.get("data")
    inner = inner if isinstance(inner, dict) else {}
    task_id = inner.get("taskId") or inner.get("task_id")
    if not isinstance(task_id, str) or not task_id:
        raise WebhookPayloadError("kie callback has no data.taskId / data.task_id")
    expected = base64.b64encode(_hmac_sha256(hmac_key.encode(), f"{task_id}.{raw_ts}"))
    if not hmac.compare_digest(expected, given.encode()):
        raise WebhookSignatureError("X-Webhook-Signature does not match taskId.timestamp (kie)")

    status, outcome = _kie_status(data, inner)
    error = None
    if outcome == FAILED:
        error = _text(inner.get("failMsg") or inner.get("errorMessage") or data.get("msg"))
    return _event("kie", delivery_id=f"{task_id}:{raw_ts}", task_id=task_id,
                  planted=_planted(query), status=status, outcome=outcome, error=error,
                  payload=data, signed_body=False)


def _kie_status(data: dict[str, Any], inner: dict[str, Any]) -> tuple[str | None, str | None]:
    """(the raw status token, its outcome) from the first field the callback carries."""
    state = inner.get("state")
    if isinstance(state, str):
        return state, _KIE_STATE.get(state)
    flag = inner.get("successFlag")
    if isinstance(flag, int) and not isinstance(flag, bool):
        return str(flag), _KIE_FLAG.get(flag)
    callback = inner.get("callbackType")
    if isinstance(callback, str):
        return callback, _KIE_CALLBACK.get(callback)
    code = data.get("code")
    if isinstance(code, int) and not isinstance(code, bool):
        # Veo/Runway callbacks carry only the envelope code: 200 done, anything else failed.
        return str(code), SUCCEEDED if code == 200 else FAILED
    return None, None


SCHEME = WebhookScheme(
    provider="kie",
    verify=verify_kie,
    secret=from_settings("kie_webhook_hmac_key"),
    binding=Binding(None, "record-info/record-detail echoes param.callBackUrl's job_id"),
)

__all__ = ["KIE_TOLERANCE", "SCHEME", "verify_kie"]
