"""What every webhook scheme shares: the normalised event, header and secret handling, the
timestamp window, the bounded JSON body, and the outcome mapping.

Private to :mod:`reconcile.webhooks`; a platform's own scheme may use these helpers (they are
re-exported there under public names) so it refuses bad input the same way the shipped ones do.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from ..errors import WebhookPayloadError, WebhookSignatureError, WebhookTimestampError

Headers = Mapping[str, str]  # headers (looked up case-insensitively) and the query string
_UNIX_SECONDS = re.compile(r"\d{1,12}")  # bounded so float conversion can never overflow


@dataclass(frozen=True)
class WebhookEvent:
    """One verified delivery, normalised across providers."""

    provider: str
    delivery_id: str  # stable per delivery: the dedupe key
    task_id: str | None  # the upstream id (prediction / taskId / request id)
    planted_job_id: str | None  # a hint: check it against the job's stored task id
    status: str | None  # the provider's own status token, as sent
    succeeded: bool | None  # None: the delivery does not say
    failed: bool | None
    error: str | None
    payload: dict[str, Any]
    signed_body: bool  # False: the body may have been altered; re-read before acting


def payload_digest(body: bytes) -> str:
    """The sha256 hex digest of a raw body (evidence and dedupe)."""
    return hashlib.sha256(body).hexdigest()


# -- shared helpers ---------------------------------------------------------------------


def _header(headers: Mapping[str, str], name: str) -> str | None:
    wanted = name.lower()
    for key, value in headers.items():
        if isinstance(key, str) and key.lower() == wanted and isinstance(value, str):
            return value.strip() or None
    return None


def _require_secret(secret: str | None, provider: str) -> str:
    # Fail closed: a delivery we cannot verify is refused, and the message names the setting.
    if not secret:
        raise WebhookSignatureError(
            f"no {provider} webhook secret is configured; refusing delivery"
        )
    return secret


def _timestamp(headers: Mapping[str, str], header: str, now: datetime, tolerance: timedelta) -> str:
    return _fresh(_header(headers, header), header, now, tolerance)


def _fresh(raw: str | None, header: str, now: datetime, tolerance: timedelta) -> str:
    """The timestamp text, checked to lie within ``tolerance`` of ``now`` (either side)."""
    if not raw:
        raise WebhookTimestampError(f"missing {header} header")
    if not _UNIX_SECONDS.fullmatch(raw):
        raise WebhookTimestampError(f"{header} is not a unix timestamp in seconds: {raw[:40]!r}")
    ts = int(raw)
    if now.tzinfo is None:  # a naive clock is taken as UTC, never as local time
        now = now.replace(tzinfo=UTC)
    skew = now.timestamp() - ts
    if abs(skew) > tolerance.total_seconds():
        direction = "old" if skew > 0 else "far in the future"
        raise WebhookTimestampError(f"{header} {ts} is too {direction} (tolerance {tolerance})")
    return raw


MAX_DEPTH = 64  # no provider nests its webhook body anywhere near this


def _json_object(body: bytes) -> dict[str, Any]:
    try:
        data = json.loads(body)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError and UnicodeDecodeError
        raise WebhookPayloadError(f"body is not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise WebhookPayloadError(f"body is JSON {type(data).__name__}, not an object")
    if _deeper_than(data, MAX_DEPTH):  # later passes (NUL scrub, jsonb) recurse over it
        raise WebhookPayloadError(f"body nests deeper than {MAX_DEPTH} levels")
    return data


def _deeper_than(value: Any, limit: int) -> bool:
    """Iteratively (a recursive walk is what a deep body would break)."""
    stack = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > limit:
            return True
        if isinstance(node, dict):
            stack.extend((child, depth + 1) for child in node.values())
        elif isinstance(node, list):
            stack.extend((child, depth + 1) for child in node)
    return False


def _text(value: Any) -> str | None:
    if value is None or value == "":
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, bool | int | float):
        return str(value)
    return json.dumps(value, sort_keys=True, default=str)


# Outcomes, so every provider maps to (succeeded, failed) the same way: a known in-flight
# status is (False, False); a status we do not recognise is (None, None).
SUCCEEDED, FAILED, RUNNING = "succeeded", "failed", "running"


def _outcome(outcome: str | None) -> tuple[bool | None, bool | None]:
    if outcome is None:
        return None, None
    return outcome == SUCCEEDED, outcome == FAILED


def _planted(query: Mapping[str, str]) -> str | None:
    value = query.get("job_id")
    return value if isinstance(value, str) and value else None


def _hmac_sha256(key: bytes, message: str) -> bytes:
    try:
        return hmac.new(key, message.encode(), hashlib.sha256).digest()
    except UnicodeEncodeError:  # e.g. a lone surrogate smuggled into a header
        raise WebhookSignatureError("signed fields are not valid text") from None


def _required(headers: Mapping[str, str], names: tuple[str, ...], missing: str) -> tuple[str, ...]:
    """Every header in ``names`` (case-insensitively), or WebhookSignatureError(``missing``)."""
    values = tuple(_header(headers, name) for name in names)
    if any(value is None for value in values):
        raise WebhookSignatureError(missing)
    return values  # type: ignore[return-value]


def _event(provider: str, *, delivery_id: str, task_id: str | None, planted: str | None,
           status: str | None, outcome: str | None, error: str | None, payload: dict[str, Any],
           signed_body: bool) -> WebhookEvent:
    """The :class:`WebhookEvent` of a verified delivery, its outcome mapped the one way."""
    succeeded, failed = _outcome(outcome)
    return WebhookEvent(provider=provider, delivery_id=delivery_id, task_id=task_id,
                        planted_job_id=planted, status=status, succeeded=succeeded, failed=failed,
                        error=error, payload=payload, signed_body=signed_body)
