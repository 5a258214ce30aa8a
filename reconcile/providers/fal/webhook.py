"""Internal: the library's own mechanics, not an import path for platforms (may move).

fal's queue webhooks: Ed25519 over ``{request_id}\\n{user_id}\\n{timestamp}\\n
{sha256_hex(body)}`` by any key of fal's JWKS; ±300 s; the body is signed.

fal signs every account's deliveries with the same keys, so only the signed
``X-Fal-Webhook-User-Id`` equal to ``RECONCILE_FAL_WEBHOOK_USER_ID`` makes a planted ``job_id``
ours; ingestion records which account was checked with every stored delivery
(:data:`FAL_CHECKED_USER`). Status reads echo nothing: there is no confirming read.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import threading
import time
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

import requests
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from ...errors import ReadFailed, WebhookSignatureError
from ..scheme import (
    FAILED,
    SUCCEEDED,
    Binding,
    Headers,
    WebhookEvent,
    WebhookScheme,
    _event,
    _json_object,
    _planted,
    _required,
    _text,
    _timestamp,
    payload_digest,
)

if TYPE_CHECKING:
    from ...core.runtime_view import RuntimeView
    from ...settings import Settings

FAL_TOLERANCE = timedelta(seconds=300)
JWKS_MAX_AGE = timedelta(hours=24)
# A signature that matches no cached key may mean fal rotated keys; refetch, but not more
# often than this, so forged deliveries cannot turn us into a JWKS request flood.
JWKS_MIN_REFRESH = timedelta(minutes=5)
FAL_CHECKED_USER = "_reconcile_fal_user_id"  # set by ingestion on every stored fal delivery


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
        from ..deadline import bounded, prepare
        from ..http import load_bounded

        deadline = time.monotonic() + self.timeout
        try:
            prepare(self.session, self.url)
            with bounded(self.timeout):  # connect to last byte, headers included
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


def verify_fal(headers: Headers, body: bytes, query: Headers,
               jwks: JwksCache | Mapping[str, Any], now: datetime, *,
               user_id: str | None = None) -> WebhookEvent:
    """Verify a fal queue webhook against every Ed25519 key of the JWKS (a cache or a document).

    fal signs every account's deliveries with the same keys: with ``user_id`` (our account),
    a delivery signed for another account is refused — only then can its planted ``job_id``
    be trusted (:mod:`reconcile.jobstore.evidence`)."""
    request_id, signed_user, signature_hex = _required(
        headers,
        ("X-Fal-Webhook-Request-Id", "X-Fal-Webhook-User-Id", "X-Fal-Webhook-Signature"),
        "missing X-Fal-Webhook-Request-Id, -User-Id or -Signature header",
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
    task_id = data.get("request_id")
    return _event(
        "fal",
        delivery_id=request_id,  # fal retries one delivery per request; handlers key on it
        task_id=task_id if isinstance(task_id, str) and task_id else request_id,
        planted=_planted(query),
        status=status,
        outcome={"OK": SUCCEEDED, "ERROR": FAILED}.get(status or ""),
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


def _jwks(rt: RuntimeView) -> JwksCache:
    """The runtime's one JWKS cache (fetched with its HTTP session)."""
    cache = rt._clients.get("__fal_jwks__")
    if cache is None:
        cache = rt._clients["__fal_jwks__"] = JwksCache(
            rt.settings.fal_jwks_url, rt.http or requests.Session())
    return cache


def _stamp(payload: dict[str, Any], settings: Settings) -> dict[str, Any]:
    # Which account the signature was checked against, kept with the row: a delivery stored
    # while RECONCILE_FAL_WEBHOOK_USER_ID was unset (any fal account's) never binds later.
    return {**payload, FAL_CHECKED_USER: settings.fal_webhook_user_id}


def _signed_job_id(payload: Mapping[str, Any], job_id: str | None, settings: Settings) -> str | None:
    # ingestion refused every delivery whose signed user id is not the configured one, and
    # recorded that id on the row (a row stored while it was unset is any account's)
    if settings.fal_webhook_user_id and job_id is not None \
            and payload.get(FAL_CHECKED_USER) == settings.fal_webhook_user_id:
        return job_id
    return None


SCHEME = WebhookScheme(
    provider="fal",
    verify=verify_fal,
    secret=_jwks,
    binding=Binding("signed X-Fal-Webhook-User-Id == RECONCILE_FAL_WEBHOOK_USER_ID", None),
    options=lambda settings: {"user_id": settings.fal_webhook_user_id},
    keywords={"fal_user_id": "user_id"},  # webhooks.verify(..., fal_user_id=…)
    signed_job_id=_signed_job_id,
    stamp=_stamp,
)

__all__ = ["FAL_CHECKED_USER", "FAL_TOLERANCE", "JWKS_FAILURE_TTL", "JWKS_MAX_AGE", "JWKS_MAX_BYTES",
           "JWKS_MIN_REFRESH", "JwksCache", "SCHEME", "parse_jwks", "verify_fal"]
