"""Deliveries signed the providers' way, independently of the library, for the webhook
scheme tests: a fixed clock far from the wall clock (only the injected one may decide
freshness), each provider's secret or keys, a sample body, and the headers that sign it.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from datetime import UTC, datetime
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

# Far from the wall clock on purpose: only the injected clock may decide freshness.
NOW = datetime(2031, 5, 6, 7, 8, 9, tzinfo=UTC)
TS = int(NOW.timestamp())
QUERY = {"job_id": "job-123"}


def json_body(data: Any) -> bytes:
    return json.dumps(data).encode()


# -- Replicate ---------------------------------------------------------------------------

REPLICATE_KEY = b"replicate-test-key-0123456789abc"
REPLICATE_SECRET = "whsec_" + base64.b64encode(REPLICATE_KEY).decode()
PREDICTION = {"id": "ufawqhfynnddngldkgtslldrkq", "status": "succeeded", "output": ["https://x"]}


def replicate_headers(body: bytes, *, ts: int = TS, msg_id: str = "msg_1") -> dict[str, str]:
    # Signed independently of the library, from replicate.com/docs/topics/webhooks.
    digest = hmac.new(REPLICATE_KEY, f"{msg_id}.{ts}.".encode() + body, hashlib.sha256).digest()
    return {
        "Webhook-Id": msg_id,
        "Webhook-Timestamp": str(ts),
        "Webhook-Signature": "v1," + base64.b64encode(digest).decode(),
    }


# -- KIE -----------------------------------------------------------------------------------

KIE_KEY = "kie-hmac-key"
KIE_MARKET = {"code": 200, "msg": "success", "data": {"taskId": "task_abc", "state": "success"}}


def kie_headers(task_id: str, *, ts: int = TS, key: str = KIE_KEY) -> dict[str, str]:
    mac = hmac.new(key.encode(), f"{task_id}.{ts}".encode(), hashlib.sha256).digest()
    return {"X-Webhook-Timestamp": str(ts), "X-Webhook-Signature": base64.b64encode(mac).decode()}


# -- ElevenLabs ----------------------------------------------------------------------------

EL_SECRET = "wsec_elevenlabs_test"
STT = {
    "type": "speech_to_text_transcription",
    "event_timestamp": TS,
    "data": {
        "request_id": "req_abc",
        "webhook_metadata": json.dumps({"job_id": "job-from-metadata"}),
        "transcription": {"language_code": "en", "text": "hello"},
    },
}


def el_headers(body: bytes, *, ts: int = TS, secret: str = EL_SECRET) -> dict[str, str]:
    mac = hmac.new(secret.encode(), f"{ts}.".encode() + body, hashlib.sha256).hexdigest()
    return {"elevenlabs-signature": f"t={ts},v0={mac}"}


# -- fal -----------------------------------------------------------------------------------

FAL_OK = {
    "request_id": "req-fal-1",
    "gateway_request_id": "req-fal-1",
    "status": "OK",
    "payload": {"images": [{"url": "https://v3.fal.media/files/x.png"}]},
}
KEY_A, KEY_B = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
JWKS_URL = "https://rest.fal.ai/.well-known/jwks.json"


def jwk(private: Ed25519PrivateKey) -> dict[str, str]:
    raw = private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    x = base64.urlsafe_b64encode(raw).rstrip(b"=").decode()
    return {"kty": "OKP", "crv": "Ed25519", "x": x, "kid": x[:8]}


def fal_headers(body: bytes, signer: Ed25519PrivateKey, *, ts: int = TS) -> dict[str, str]:
    message = f"req-fal-1\nuser-9\n{ts}\n{hashlib.sha256(body).hexdigest()}".encode()
    return {
        "X-Fal-Webhook-Request-Id": "req-fal-1",
        "X-Fal-Webhook-User-Id": "user-9",
        "X-Fal-Webhook-Timestamp": str(ts),
        "X-Fal-Webhook-Signature": signer.sign(message).hex(),
    }
