"""Internal: the library's own mechanics, not an import path for platforms (may move).

What every provider family's webhook scheme is made of: :class:`WebhookScheme` (verify, secret,
the evidence facts), :class:`Binding`, the normalised :class:`WebhookEvent`, and the shared checks
(header and secret handling, the timestamp window, the bounded JSON body, the outcome mapping).

A family's scheme module (``reconcile/providers/<family>/webhook.py``) builds its ``SCHEME`` from
these; :mod:`reconcile.webhooks` registers it from the family's declaration and re-exports the
public names (a platform's own scheme uses them from there, so it refuses bad input the same way
the shipped ones do). This module sits below :mod:`reconcile.webhooks` so that a family package
never imports the package that imports every family.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from ..errors import WebhookPayloadError, WebhookSignatureError, WebhookTimestampError

if TYPE_CHECKING:
    from ..core.runtime_view import RuntimeView
    from ..settings import Settings
    from .kind import Kind

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


# -- the scheme -------------------------------------------------------------------------

# (headers, body, query, key, now, **options) -> WebhookEvent; raises a WebhookError subclass
Verifier = Callable[..., WebhookEvent]


@dataclass(frozen=True)
class Binding:
    """What ties a stored delivery to a job: the signed field, and the read that confirms it.

    ``signed_field``: the field the provider's signature covers that names the job (None: none).
    ``confirming_read``: the read of the task that echoes the planted job id (None: none).
    """

    signed_field: str | None
    confirming_read: str | None


def _no_options(settings: Settings) -> Mapping[str, Any]:
    return {}


def _nothing_signed(payload: Mapping[str, Any], job_id: str | None, settings: Settings) -> None:
    return None


def _any_kind(payload: Mapping[str, Any], kind: Kind) -> bool:
    return True


def _unchanged(payload: dict[str, Any], settings: Settings) -> dict[str, Any]:
    return payload


@dataclass(frozen=True)
class WebhookScheme:
    """One provider family's webhooks.

    - ``verify(headers, body, query, key, now, **options)`` → :class:`WebhookEvent`, or raises a
      :class:`~reconcile.errors.WebhookError` subclass (never anything else for bad input);
    - ``secret(rt)``: the ``key`` ingestion hands to ``verify`` (None/empty: fail closed);
    - ``options(settings)``: extra keyword arguments for ``verify`` (fal: the account id);
    - ``keywords``: keyword arguments of :func:`reconcile.webhooks.verify` this scheme's
      ``verify`` takes under its own name (fal: ``fal_user_id`` → ``user_id``); ``verify``
      hands them to this scheme only and drops them for every other one;
    - ``binding``: the evidence table's row (README "Security model");
    - ``signed_job_id(payload, stored_job_id, settings)``: the job id the signature itself ties a
      stored delivery to, or None;
    - ``same_kind(payload, kind)``: False when the body says it is for another kind of the family;
    - ``stamp(payload, settings)``: what ingestion records with the stored payload.
    """

    provider: str
    verify: Verifier
    # (rt) -> the key, rt the Runtime (typed loosely: a platform's own may take a ``Runtime``,
    # the shipped ones take what they read of it, a RuntimeView)
    secret: Callable[[Any], Any]
    binding: Binding = Binding(None, None)
    options: Callable[[Settings], Mapping[str, Any]] = field(default=_no_options, compare=False)
    signed_job_id: Callable[[Mapping[str, Any], str | None, Settings], str | None] = field(
        default=_nothing_signed, compare=False)
    same_kind: Callable[[Mapping[str, Any], Kind], bool] = field(default=_any_kind, compare=False)
    stamp: Callable[[dict[str, Any], Settings], dict[str, Any]] = field(
        default=_unchanged, compare=False)
    keywords: Mapping[str, str] = field(default_factory=dict, compare=False)

    @property
    def echo_check(self) -> bool:
        """A delivery not bound by the signature may be bound by a read echoing the job id."""
        return self.binding.confirming_read is not None


def from_settings(attribute: str) -> Callable[[RuntimeView], Any]:
    """A ``secret`` that is one attribute of the runtime's settings (an HMAC key, say)."""

    def secret(rt: RuntimeView) -> Any:
        return getattr(rt.settings, attribute)

    secret.__qualname__ = f"from_settings({attribute!r})"
    return secret


# The shared checks under the names a platform's own scheme uses them by (reconcile.webhooks
# re-exports them); the shipped schemes call them by their underscored names
header = _header
required_headers = _required
require_secret = _require_secret
fresh_timestamp = _timestamp
json_object = _json_object
hmac_sha256 = _hmac_sha256
event = _event
