"""Webhook signature schemes: verify a delivery and parse it into a :class:`WebhookEvent`.

Verification and parsing only: storing deliveries, deduping them and finishing jobs happen
elsewhere. Every verifier takes the raw ``headers`` (looked up case-insensitively), the raw
``body`` bytes, the callback URL's ``query`` (where the library plants ``job_id``), the secret
and an injected ``now``; it returns a :class:`WebhookEvent` or raises a
:class:`~reconcile.errors.WebhookError` subclass — never anything else for bad input.

- replicate: HMAC-SHA256 of ``{webhook-id}.{webhook-timestamp}.{body}`` (Standard Webhooks,
  base64, ``v1,`` entries); ±5 min; body signed.
- kie: base64 HMAC-SHA256 of ``{taskId}.{X-Webhook-Timestamp}``; ±5 min; body **not** signed.
- elevenlabs: hex HMAC-SHA256 of ``{t}.{body}`` (``ElevenLabs-Signature: t=…,v0=…``); ±30 min;
  body signed.
- fal: Ed25519 over ``{request_id}\\n{user_id}\\n{timestamp}\\n{sha256_hex(body)}`` by any key
  of fal's JWKS; ±300 s; body signed.

KIE signs only the task id and the timestamp, so its status fields are hints
(``signed_body=False``): re-read the task before acting on it. ``planted_job_id`` comes from
the unsigned callback URL (or ElevenLabs' echoed metadata), so it is a hint too: match the
event's ``task_id`` against the job's stored upstream id before finishing anything.

Replicate and ``standardwebhooks``: ``Webhook.verify`` (v1.1) reads the wall clock
(``datetime.now``) with a fixed 5-minute window and cannot take an injected clock. So the
timestamp window is checked here against ``now``, and the library's pure ``Webhook.sign`` (which
also owns the ``whsec_`` key decoding) computes the expected signature, compared constant-time
against every ``v1,`` entry — the same algorithm as ``verify``, without its clock.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import re
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import requests
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from standardwebhooks import Webhook

from .errors import (
    ReadFailed,
    WebhookPayloadError,
    WebhookSignatureError,
    WebhookTimestampError,
)

REPLICATE_TOLERANCE = timedelta(minutes=5)
KIE_TOLERANCE = timedelta(minutes=5)
ELEVENLABS_TOLERANCE = timedelta(minutes=30)
FAL_TOLERANCE = timedelta(seconds=300)
JWKS_MAX_AGE = timedelta(hours=24)
# A signature that matches no cached key may mean fal rotated keys; refetch, but not more
# often than this, so forged deliveries cannot turn us into a JWKS request flood.
JWKS_MIN_REFRESH = timedelta(minutes=5)

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


# -- Replicate (Standard Webhooks) ------------------------------------------------------

# canceled/aborted end without output: failed here; ``status`` keeps the exact word.
_REPLICATE = {"succeeded": SUCCEEDED, "failed": FAILED, "canceled": FAILED, "aborted": FAILED,
              "starting": RUNNING, "processing": RUNNING}  # fmt: skip


def verify_replicate(
    headers: Mapping[str, str],
    body: bytes,
    query: Mapping[str, str],
    secret: str | None,
    now: datetime,
) -> WebhookEvent:
    """Verify a Replicate (Standard Webhooks) delivery whose body is a prediction."""
    key = _require_secret(secret, "replicate")
    msg_id = _header(headers, "webhook-id")
    signatures = _header(headers, "webhook-signature")
    if msg_id is None or signatures is None:
        raise WebhookSignatureError("missing webhook-id or webhook-signature header")
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
    succeeded, failed = _outcome(_REPLICATE.get(status or ""))
    return WebhookEvent(
        provider="replicate",
        delivery_id=msg_id,
        task_id=task_id,
        planted_job_id=_planted(query),
        status=status,
        succeeded=succeeded,
        failed=failed,
        error=_text(data.get("error")),
        payload=data,
        signed_body=True,
    )


def _matches_v1(expected: bytes, entry: str) -> bool:
    version, _, encoded = entry.partition(",")
    if version != "v1":
        return False
    try:
        given = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        return False
    return hmac.compare_digest(expected, given)


# -- KIE (HMAC over taskId.timestamp; body NOT signed) ----------------------------------

# market `state` (Runway spells its queue states wait/queueing)
_KIE_STATE = {"success": SUCCEEDED, "fail": FAILED, "waiting": RUNNING, "queuing": RUNNING,
              "generating": RUNNING, "wait": RUNNING, "queueing": RUNNING}  # fmt: skip
# Veo/Flux/Luma `successFlag`: 4 = the callback failed but the generation succeeded
_KIE_FLAG = {0: RUNNING, 1: SUCCEEDED, 2: FAILED, 3: FAILED, 4: SUCCEEDED}
# Suno `callbackType`: text and first arrive before the last track
_KIE_CALLBACK = {"complete": SUCCEEDED, "error": FAILED, "text": RUNNING, "first": RUNNING}


def verify_kie(
    headers: Mapping[str, str],
    body: bytes,
    query: Mapping[str, str],
    key: str | None,
    now: datetime,
) -> WebhookEvent:
    """Verify a KIE callback; only its task id and timestamp are authenticated."""
    hmac_key = _require_secret(key, "kie")
    given = _header(headers, "X-Webhook-Signature")
    if given is None:
        raise WebhookSignatureError("missing X-Webhook-Signature header (kie)")
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
    succeeded, failed = _outcome(outcome)
    error = None
    if failed:
        error = _text(inner.get("failMsg") or inner.get("errorMessage") or data.get("msg"))
    return WebhookEvent(
        provider="kie",
        delivery_id=f"{task_id}:{raw_ts}",
        task_id=task_id,
        planted_job_id=_planted(query),
        status=status,
        succeeded=succeeded,
        failed=failed,
        error=error,
        payload=data,
        signed_body=False,
    )


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


# -- ElevenLabs (t=…,v0=… over t.body) ---------------------------------------------------

# Which field names the upstream task. The speech-to-text event's ``request_id`` is NOT one: it
# is the id of the HTTP request, while the job stores the create answer's ``transcription_id``
# (the id ``GET /v1/speech-to-text/transcripts/{id}`` reads). Captured deliveries carry
# ``data: {request_id, webhook_metadata, transcription}``, the transcript (the SDK's
# SpeechToTextChunkResponseModel) holding ``transcription_id``; without one anywhere the event
# binds through the signed ``webhook_metadata.job_id`` alone.
_ELEVENLABS_IDS = ("transcription_id", "dubbing_id", "conversation_id")


def verify_elevenlabs(
    headers: Mapping[str, str],
    body: bytes,
    query: Mapping[str, str],
    secret: str | None,
    now: datetime,
) -> WebhookEvent:
    """Verify an ElevenLabs workspace webhook (speech-to-text results among others)."""
    key = _require_secret(secret, "elevenlabs")
    header = _header(headers, "ElevenLabs-Signature")
    if header is None:
        raise WebhookSignatureError("missing ElevenLabs-Signature header")
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
    succeeded, failed = _outcome(outcome)
    event_type = data.get("type")
    return WebhookEvent(
        provider="elevenlabs",
        delivery_id=f"{raw_ts}:{payload_digest(body)}",
        task_id=task_id,
        planted_job_id=(_metadata_job_id(inner.get("webhook_metadata"))
                        or _dubbing_name_job_id(inner.get("name")) or _planted(query)),
        status=event_type if isinstance(event_type, str) else None,
        succeeded=succeeded,
        failed=failed,
        error=error,
        payload=data,
        signed_body=True,
    )


DUBBING_NAME_PREFIX = "reconcile-job:"  # the ElevenLabs client names dubbings this way


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


# -- fal (Ed25519 over a JWKS) ----------------------------------------------------------


def parse_jwks(document: Any) -> tuple[Ed25519PublicKey, ...]:
    """Every usable OKP/Ed25519 key of a JWKS document; unusable entries are skipped."""
    keys = document.get("keys") if isinstance(document, Mapping) else None
    found: list[Ed25519PublicKey] = []
    for jwk in keys if isinstance(keys, list) else []:
        if not isinstance(jwk, Mapping) or jwk.get("kty") != "OKP" or jwk.get("crv") != "Ed25519":
            continue
        x = jwk.get("x")
        if not isinstance(x, str):
            continue
        try:
            raw = base64.urlsafe_b64decode(x + "=" * (-len(x) % 4))
            found.append(Ed25519PublicKey.from_public_bytes(raw))
        except (binascii.Error, ValueError):
            continue
    return tuple(found)


JWKS_FAILURE_TTL = timedelta(seconds=30)  # a failed fetch is not retried sooner than this
JWKS_MAX_BYTES = 256 * 1024


class JwksCache:
    """fal's JWKS, fetched with an injected session and kept at most ``max_age`` (24 h).

    A fetch is bounded by ``timeout`` in total (not per read); a failure is remembered for
    :data:`JWKS_FAILURE_TTL`; and while one thread fetches, the others never queue behind it:
    they use the unexpired keys, or fail at once (503: fal retries the delivery).
    """

    def __init__(
        self,
        url: str,
        session: requests.Session,
        *,
        max_age: timedelta = JWKS_MAX_AGE,
        timeout: float = 10.0,
    ) -> None:
        self.url = url
        self.session = session
        self.max_age = min(max_age, JWKS_MAX_AGE)
        self.timeout = timeout
        self._keys: tuple[Ed25519PublicKey, ...] = ()
        self._fetched_at: datetime | None = None
        self._failed_at: datetime | None = None
        self._failure = ""
        self._lock = threading.Lock()

    def keys(self, now: datetime, *, refresh: bool = False) -> tuple[Ed25519PublicKey, ...]:
        """The cached keys, refetched when older than ``max_age`` or when ``refresh`` allows.

        Raises :class:`~reconcile.errors.ReadFailed` (retryable: answer 5xx so fal retries) when
        the keys are missing or expired and cannot be fetched. A failed *early* refresh (key
        rotation suspected) keeps serving the unexpired keys; expired keys are never used.
        """
        fetched = self._fetched_at
        expired = fetched is None or now - fetched >= self.max_age
        forced = refresh and (fetched is None or now - fetched >= JWKS_MIN_REFRESH)
        if not (expired or forced):
            return self._keys
        if self._failed_at is not None and now - self._failed_at < JWKS_FAILURE_TTL:
            return self._stale_or_raise(expired, f"the last JWKS fetch failed: {self._failure}")
        if not self._lock.acquire(blocking=False):  # another thread is fetching: never queue
            return self._stale_or_raise(expired, "the fal JWKS is being fetched")
        try:
            self._keys, self._fetched_at, self._failed_at = self._fetch(), now, None
        except ReadFailed as exc:
            self._failed_at, self._failure = now, exc.message
            return self._stale_or_raise(expired, exc.message)
        finally:
            self._lock.release()
        return self._keys

    def _stale_or_raise(self, expired: bool, why: str) -> tuple[Ed25519PublicKey, ...]:
        if expired:
            self._keys, self._fetched_at = (), None
            raise ReadFailed(why)
        return self._keys

    def can_refresh(self, now: datetime) -> bool:
        return self._fetched_at is None or now - self._fetched_at >= JWKS_MIN_REFRESH

    def _fetch(self) -> tuple[Ed25519PublicKey, ...]:
        from .providers.http import load_bounded

        deadline = time.monotonic() + self.timeout
        try:
            response = self.session.get(self.url, timeout=self.timeout, stream=True)
            with response:
                load_bounded(response, JWKS_MAX_BYTES, deadline)
            response.raise_for_status()
            keys = parse_jwks(response.json())
        except (requests.RequestException, ValueError, OSError) as exc:
            raise ReadFailed(f"could not fetch the fal JWKS from {self.url}: {exc}") from exc
        if not keys:
            raise ReadFailed(f"the fal JWKS at {self.url} holds no Ed25519 key")
        return keys


def verify_fal(
    headers: Mapping[str, str],
    body: bytes,
    query: Mapping[str, str],
    jwks: JwksCache | Mapping[str, Any],
    now: datetime,
    *,
    user_id: str | None = None,
) -> WebhookEvent:
    """Verify a fal queue webhook against every Ed25519 key of the JWKS (a cache or a document).

    fal signs every account's deliveries with the same keys: with ``user_id`` (our account),
    a delivery signed for another account is refused — only then can its planted ``job_id``
    be trusted (:mod:`reconcile.evidence`)."""
    request_id = _header(headers, "X-Fal-Webhook-Request-Id")
    signed_user = _header(headers, "X-Fal-Webhook-User-Id")
    signature_hex = _header(headers, "X-Fal-Webhook-Signature")
    if request_id is None or signed_user is None or signature_hex is None:
        raise WebhookSignatureError(
            "missing X-Fal-Webhook-Request-Id, -User-Id or -Signature header"
        )
    raw_ts = _timestamp(headers, "X-Fal-Webhook-Timestamp", now, FAL_TOLERANCE)
    try:
        signature = bytes.fromhex(signature_hex)
        message = "\n".join((request_id, signed_user, raw_ts, payload_digest(body))).encode()
    except (ValueError, UnicodeEncodeError):
        raise WebhookSignatureError(
            "X-Fal-Webhook-Signature is not hex, or fields are not text"
        ) from None

    if isinstance(jwks, JwksCache):
        verified = _ed25519_any(jwks.keys(now), signature, message)
        if not verified and jwks.can_refresh(now):  # maybe fal rotated its keys
            verified = _ed25519_any(jwks.keys(now, refresh=True), signature, message)
    else:
        verified = _ed25519_any(parse_jwks(jwks), signature, message)
    if not verified:
        raise WebhookSignatureError("X-Fal-Webhook-Signature matches no key in the fal JWKS")
    if user_id is not None and not hmac.compare_digest(signed_user.encode(), user_id.encode()):
        raise WebhookSignatureError("the fal delivery is signed for another fal account")

    data = _json_object(body)
    status = data.get("status")
    status = status if isinstance(status, str) else None
    succeeded, failed = _outcome({"OK": SUCCEEDED, "ERROR": FAILED}.get(status or ""))
    task_id = data.get("request_id")
    return WebhookEvent(
        provider="fal",
        delivery_id=request_id,  # fal retries one delivery per request; handlers key on it
        task_id=task_id if isinstance(task_id, str) and task_id else request_id,
        planted_job_id=_planted(query),
        status=status,
        succeeded=succeeded,
        failed=failed,
        error=_text(data.get("error") or data.get("payload_error")),
        payload=data,
        signed_body=True,
    )


def _ed25519_any(keys: tuple[Ed25519PublicKey, ...], signature: bytes, message: bytes) -> bool:
    for key in keys:
        try:
            key.verify(signature, message)
            return True
        except InvalidSignature:
            continue
    return False


# -- dispatch ---------------------------------------------------------------------------

_VERIFIERS = {
    "replicate": verify_replicate,
    "kie": verify_kie,
    "elevenlabs": verify_elevenlabs,
    "fal": verify_fal,
}
PROVIDERS = tuple(_VERIFIERS)


def verify(
    provider: str,
    headers: Mapping[str, str],
    body: bytes,
    query: Mapping[str, str],
    key: Any,
    now: datetime,
    *,
    fal_user_id: str | None = None,
) -> WebhookEvent:
    """Verify a delivery for ``provider``; ``key`` is its secret (fal: a JwksCache or JWKS)."""
    verifier = _VERIFIERS.get(provider)
    if verifier is None:
        raise WebhookPayloadError(f"no webhook scheme for provider {provider!r}")
    if provider == "fal":
        return verify_fal(headers, body, query, key, now, user_id=fal_user_id)
    return verifier(headers, body, query, key, now)


__all__ = [
    "PROVIDERS",
    "JwksCache",
    "WebhookEvent",
    "parse_jwks",
    "payload_digest",
    "verify",
    "verify_elevenlabs",
    "verify_fal",
    "verify_kie",
    "verify_replicate",
]
