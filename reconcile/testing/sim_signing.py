"""Internal: the library's own mechanics, not an import path for platforms (may move).

Webhook signatures exactly as the providers make them (docs.kie.ai/common-api/webhook-verification,
replicate.com/docs/topics/webhooks, ElevenLabs ``t=…,v0=…``, docs.fal.ai/model-endpoints/webhooks),
and the fire-and-forget delivery the simulator uses."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import requests
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

FAL_KID = "sim-fal-ed25519"


@dataclass(frozen=True)
class Delivery:
    """One webhook POST: where, the exact bytes, and the signed headers."""

    url: str
    body: bytes
    headers: Mapping[str, str]


def kie_headers(hmac_key: str, task_id: str, timestamp: int) -> dict[str, str]:
    """KIE: base64(HMAC-SHA256(key, f"{taskId}.{timestamp}")); the body is not signed."""
    digest = hmac.new(hmac_key.encode(), f"{task_id}.{timestamp}".encode(), hashlib.sha256).digest()
    return {"X-Webhook-Timestamp": str(timestamp),
            "X-Webhook-Signature": base64.b64encode(digest).decode()}


def replicate_headers(secret: str, body: bytes, message_id: str, timestamp: int) -> dict[str, str]:
    """Standard Webhooks: v1,base64(HMAC-SHA256(b64decode(secret after whsec_), id.ts.body))."""
    key = base64.b64decode(secret.removeprefix("whsec_"))
    signed = f"{message_id}.{timestamp}.".encode() + body
    signature = base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
    return {"webhook-id": message_id, "webhook-timestamp": str(timestamp),
            "webhook-signature": f"v1,{signature}"}


def elevenlabs_headers(secret: str, body: bytes, timestamp: int) -> dict[str, str]:
    """ElevenLabs: ``t=<ts>,v0=<hex HMAC-SHA256(secret, f"{t}.{body}")>``."""
    digest = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
    return {"ElevenLabs-Signature": f"t={timestamp},v0={digest}"}


def fal_headers(key: Ed25519PrivateKey, request_id: str, user_id: str, body: bytes,
                timestamp: int) -> dict[str, str]:
    """fal: hex ED25519 over ``request_id\\nuser_id\\ntimestamp\\nhex(sha256(body))``."""
    message = "\n".join([request_id, user_id, str(timestamp), hashlib.sha256(body).hexdigest()])
    return {
        "X-Fal-Webhook-Request-Id": request_id,
        "X-Fal-Webhook-User-Id": user_id,
        "X-Fal-Webhook-Timestamp": str(timestamp),
        "X-Fal-Webhook-Signature": key.sign(message.encode()).hex(),
    }


def fal_key(seed: bytes | None) -> Ed25519PrivateKey:
    return Ed25519PrivateKey.from_private_bytes(seed) if seed else Ed25519PrivateKey.generate()


def jwks(key: Ed25519PrivateKey) -> dict[str, Any]:
    raw = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    x = base64.urlsafe_b64encode(raw).rstrip(b"=").decode()
    return {"keys": [{"kty": "OKP", "crv": "Ed25519", "x": x, "kid": FAL_KID, "use": "sig",
                      "alg": "EdDSA"}]}


def body_text(body: bytes, *path: str) -> str | None:
    """The non-empty string at ``path`` in a JSON object ``body`` (None for anything else): what
    a signer that signs a field of the body (KIE's ``taskId``) reads."""
    try:
        value: Any = json.loads(body)
    except (ValueError, RecursionError):
        return None
    for key in path:
        value = value.get(key) if isinstance(value, dict) else None
    return value if isinstance(value, str) and value else None


def body_digest(body: bytes, length: int = 27) -> str:
    """A stable id for ``body`` (hex SHA-256), where a signer needs a message id."""
    return hashlib.sha256(body).hexdigest()[:length]


def now_seconds() -> int:
    return int(time.time())


def deliver(delivery: Delivery, record: Callable[[dict[str, Any]], None],
            timeout: float = 15.0) -> threading.Thread:
    """POST ``delivery`` in a daemon thread; failures are recorded and otherwise ignored."""

    def post() -> None:
        outcome: dict[str, Any] = {"url": delivery.url, "status": None, "error": None}
        try:
            with requests.Session() as session:
                session.trust_env = False  # loopback receivers: never through a proxy
                answer = session.post(
                    delivery.url, data=delivery.body, timeout=timeout, allow_redirects=False,
                    headers={"Content-Type": "application/json", **delivery.headers},
                )
            outcome["status"] = answer.status_code
        except requests.RequestException as exc:
            outcome["error"] = repr(exc)
        record(outcome)

    thread = threading.Thread(target=post, name="sim-webhook", daemon=True)
    thread.start()
    return thread
