"""The simulator's webhook deliveries: terminal tasks POST deliveries signed by each
provider's scheme (KIE HMAC, Standard Webhooks, fal ED25519, ElevenLabs), checked here
independently of the library; a delivery to a dead receiver is recorded as an error.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import queue
import socket
import threading
from http.server import BaseHTTPRequestHandler
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from standardwebhooks import Webhook

from reconcile.testing.sim_http import LoopbackHTTPServer
from reconcile.testing.simulator import Script
from tests.integration._sim_helpers import (
    ELEVEN,
    FAL,
    clock as clock,
    http as http,
    kie_create,
    replicate_create,
    sim as sim,
)

# --- webhooks --------------------------------------------------------------------------------


class Receiver:
    """A tiny local webhook receiver that records every POST."""

    def __init__(self) -> None:
        self.got: queue.Queue[tuple[str, Any, bytes]] = queue.Queue()
        got = self.got

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                got.put((self.path, self.headers, body))
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        # the simulator delivers each webhook on a thread of its own: a burst connects at once
        self.server = LoopbackHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def take(self, count: int) -> dict[str, tuple[Any, bytes]]:
        """The next ``count`` deliveries keyed by the receiver path they were posted to."""
        items = [self.got.get(timeout=5) for _ in range(count)]
        return {path.split("?")[0]: (headers, body) for path, headers, body in items}

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_webhooks_arrive_signed_for_every_scheme(sim, clock, http) -> None:
    """Terminal tasks POST signed deliveries: KIE HMAC, Standard Webhooks, fal ED25519, ElevenLabs."""
    receiver = Receiver()
    try:
        sim.script_default(Script(timeline=[(0, "running"), (5, "succeeded")], webhook=True))
        sim.configure(elevenlabs_webhook_url=receiver.url + "/eleven")
        kie_task = kie_create(http, sim, "/api/v1/jobs/createTask", "w1", model="m/x", input={},
                              callBackUrl=receiver.url + "/kie?job_id=w1").json()["data"]["taskId"]
        replicate_create(http, sim, "w2", webhook=receiver.url + "/replicate?job_id=w2")
        http.post(f"{sim.url}/fal/fal-ai/flux/dev", headers=FAL, json={"prompt": "p"},
                  params={"fal_webhook": receiver.url + "/fal?job_id=w3"})
        http.post(f"{sim.url}/elevenlabs/v1/speech-to-text", headers=ELEVEN,
                  files={"file": ("a.mp3", b"ID3")},
                  data={"webhook": "true", "webhook_metadata": json.dumps({"job_id": "w4"})})
        assert receiver.got.empty()
        clock.advance(5)
        got = receiver.take(4)
    finally:
        receiver.close()
    secrets = sim.secrets

    headers, body = got["/kie"]
    payload = json.loads(body)
    assert payload["data"]["taskId"] == kie_task and payload["data"]["state"] == "success"
    signed = f"{kie_task}.{headers['X-Webhook-Timestamp']}".encode()
    expected = base64.b64encode(hmac.new(secrets.kie_webhook_hmac_key.encode(), signed,
                                         hashlib.sha256).digest()).decode()
    assert hmac.compare_digest(headers["X-Webhook-Signature"], expected)

    headers, body = got["/replicate"]
    key = base64.b64decode(secrets.replicate_webhook_secret.removeprefix("whsec_"))
    signed = f"{headers['webhook-id']}.{headers['webhook-timestamp']}.".encode() + body
    expected = "v1," + base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
    assert headers["webhook-signature"] == expected
    Webhook(secrets.replicate_webhook_secret).verify(body, {k.lower(): v for k, v in headers.items()})
    assert json.loads(body)["status"] == "succeeded"

    headers, body = got["/fal"]
    jwk = http.get(sim.base_urls()["RECONCILE_FAL_JWKS_URL"]).json()["keys"][0]
    public = Ed25519PublicKey.from_public_bytes(base64.urlsafe_b64decode(jwk["x"] + "=="))
    message = "\n".join([headers["X-Fal-Webhook-Request-Id"], headers["X-Fal-Webhook-User-Id"],
                         headers["X-Fal-Webhook-Timestamp"], hashlib.sha256(body).hexdigest()])
    public.verify(bytes.fromhex(headers["X-Fal-Webhook-Signature"]), message.encode())
    assert json.loads(body)["status"] == "OK"

    headers, body = got["/eleven"]
    parts = dict(part.split("=", 1) for part in headers["ElevenLabs-Signature"].split(","))
    expected = hmac.new(secrets.elevenlabs_webhook_secret.encode(), f"{parts['t']}.".encode() + body,
                        hashlib.sha256).hexdigest()
    assert parts["v0"] == expected
    assert json.loads(body)["data"]["webhook_metadata"] == {"job_id": "w4"}
    assert len(sim.wait_deliveries(4)) == 4


def test_webhook_delivery_failures_are_ignored(sim, clock, http) -> None:
    """A delivery to a dead receiver is recorded as an error and nothing else breaks."""
    sim.script_default(Script(timeline=[(0, "failed")], webhook=True))
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{probe.getsockname()[1]}/cb?job_id=dead"
    replicate_create(http, sim, "dead", webhook=dead)
    [delivery] = sim.wait_deliveries(1)
    assert delivery["status"] is None and delivery["error"] and delivery["state"] == "failed"
