"""Internal: the library's own mechanics, not an import path for platforms (may move).

fal.ai as the simulator serves it: the queue under ``/fal``, sync calls under ``/fal-sync``
(docs.fal.ai/model-endpoints/queue, fal-js ``queue.ts``).

Status and result URLs drop the model's subpath (``fal-ai/flux/dev`` → ``fal-ai/flux``) and
answer 404 when built with it; ``workflows/…`` and ``comfy/…`` are namespaces that keep three
segments (``workflows/fal-ai/my-flow``), as fal_client's ``AppId`` has it. A failed request still
shows ``COMPLETED``; only its result says so (422 with a ``detail`` list) — unless its script's
``fail_code`` is one of fal's request error types (``runner_disconnected``, ``request_timeout``…),
which the status reports as ``error``/``error_type`` and the result as that type's 5xx.
``?logs=1`` and ``?logs=true`` (what fal_client sends) both include the logs. Webhooks are
ED25519-signed; the JWKS is served at ``/fal/.well-known/jwks.json``.
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

from ..providers.outputs import Expect, declared_output
from .sim_core import (
    TERMINAL,
    Rejection,
    Request,
    Response,
    Script,
    Task,
    json_response,
    media_ext,
    raw_status,
    retry_after_header,
)
from .sim_registry import SimRoute, SimWebhooks, register_route, register_webhooks
from .sim_signing import Delivery, body_digest, body_text, fal_headers, jwks, now_seconds

if TYPE_CHECKING:
    from .simulator import Simulator

PREFIX = "fal"
PROVIDER = "fal"
JWKS_PATH = "/.well-known/jwks.json"

NAMESPACES = ("workflows", "comfy")  # fal_client.client.APP_NAMESPACES
# fal.ai/docs/documentation/model-apis/request-errors: infrastructure error types and statuses
INFRA_ERRORS = {"request_timeout": 504, "startup_timeout": 504, "runner_scheduling_failure": 503,
                "runner_connection_timeout": 503, "runner_disconnected": 503,
                "runner_connection_refused": 503, "runner_connection_error": 503,
                "runner_incomplete_response": 502, "runner_server_error": 500,
                "internal_error": 500}
_STATUS = {"queued": "IN_QUEUE", "running": "IN_PROGRESS", "succeeded": "COMPLETED",
           "failed": "COMPLETED", "canceled": "COMPLETED"}
_ERRORS: dict[str, tuple[int, Any]] = {
    "auth": (401, "Missing or invalid Authorization header"),
    "invalid": (422, [{"loc": ["body", "prompt"], "msg": "field required", "type": "missing"}]),
    "rate_limit": (429, "Rate limit exceeded"),
    "server_error": (500, "Internal server error"),
    "kie_200_error": (500, "Internal server error"),
    "not_found": (404, "Request not found"),
}


def authorized(req: Request) -> bool:
    if req.path == JWKS_PATH:
        return True
    scheme, _, key = req.header("authorization").partition(" ")
    return scheme.lower() in ("key", "bearer") and bool(key.strip())


def error(kind: str, script: Script, code: int | None = None) -> Response:
    status, detail = _ERRORS[kind]
    payload: dict[str, Any] = {"detail": detail}
    headers = retry_after_header(script) if kind == "rate_limit" else {}
    if status == 500:
        payload["error_type"] = "internal_error"
        headers["X-Fal-Error-Type"] = "internal_error"
    return json_response(status, payload, headers)


def _urls(sim: Simulator, task: Task) -> dict[str, str]:
    base = f"{sim.url}/{PREFIX}/{task.extra['app']}/requests/{task.task_id}"
    return {"request_id": task.task_id, "response_url": base, "status_url": base + "/status",
            "cancel_url": base + "/cancel"}


def handle(sim: Simulator, req: Request) -> Response | None:
    if req.method == "GET" and req.path == JWKS_PATH:
        return json_response(200, jwks(sim.fal_key))
    segments = [unquote(s) for s in req.path.strip("/").split("/")]
    if "requests" not in segments:
        return _submit(sim, req, "/".join(segments)) if req.method == "POST" else None
    at = segments.index("requests")
    tail = segments[at + 1:]
    if not tail:
        return None
    found = sim.lookup(tail[0], "fal-queue")
    if found is None or "/".join(segments[:at]) != found[0].extra["app"]:
        return error("not_found", sim.script_for(None, None))
    if req.method == "GET" and tail[1:] == ["status"]:
        return _status(sim, *found, logs=req.query.get("logs", "").lower() in ("1", "true"))
    if req.method == "GET" and not tail[1:]:
        return _result(sim, *found)
    if req.method == "PUT" and tail[1:] == ["cancel"]:
        if found[1] in TERMINAL:
            return json_response(400, {"status": "ALREADY_COMPLETED"})
        sim.set_state(found[0].task_id, "canceled")
        return json_response(202, {"status": "CANCELLATION_REQUESTED"})
    return None


def app_of(model: str) -> str:
    """``[namespace/]owner/app`` of an endpoint id."""
    segments = model.split("/")
    return "/".join(segments[:3] if segments[0] in NAMESPACES else segments[:2])


def _submit(sim: Simulator, req: Request, model: str) -> Response | None:
    if model.count("/") < (2 if model.split("/")[0] in NAMESPACES else 1):
        return None
    body = req.json()
    if not isinstance(body, dict):
        return error("invalid", sim.script_for(None, None))
    webhook = req.query.get("fal_webhook")
    request_id = sim.new_uuid()
    outcome = sim.create(provider=PROVIDER, api="fal-queue", model=model, task_id=request_id,
                         callback_url=webhook, body=body,
                         extra={"app": app_of(model)})
    if isinstance(outcome, Rejection):
        return error(outcome.kind, outcome.script, outcome.code)
    answer = {**_urls(sim, outcome), "status": "IN_QUEUE", "queue_position": 0}
    if webhook:
        answer["gateway_request_id"] = request_id
    return json_response(200, answer)


def _status(sim: Simulator, task: Task, state: str, since: float, *, logs: bool) -> Response:
    status = raw_status(state, _STATUS)
    body: dict[str, Any] = {"status": status, **_urls(sim, task)}
    entries = [{"message": "simulated step", "level": "INFO", "source": "user",
                "timestamp": task.wall(since).isoformat()}]
    if state == "queued":
        body["queue_position"] = 0
    else:
        body["logs"] = entries if logs else None
    if status == "COMPLETED":
        body["metrics"] = {"inference_time": round(max(0.0, since - task.created_at), 3)}
        if state == "failed" and task.script.fail_code in INFRA_ERRORS:
            body["error"] = task.script.fail_message or "Runner disconnected (simulated)"
            body["error_type"] = task.script.fail_code
        return json_response(200, body)
    return json_response(202, body)


def output(sim: Simulator, task: Task, seed: int = 42) -> dict[str, Any]:
    """The model output JSON of a successful request (no envelope), shaped by media type; an
    endpoint declared TEXT (``reconcile.providers.outputs``) answers its text field instead."""
    spec = declared_output("fal", task.model)
    if spec.expects is Expect.TEXT:
        # fal.ai/models/fal-ai/whisper/api: {"text", "chunks": [{timestamp, text}]}
        text = "Simulated transcript." if task.script.outputs else ""
        return {spec.key or "text": text, "chunks": [{"timestamp": [0.0, 1.2], "text": text}]}
    ext = media_ext(task.model)
    urls = sim.media_urls(task, ext)
    files = [{"url": url, "content_type": {"mp4": "video/mp4", "mp3": "audio/mpeg"}.get(
        ext, "image/png"), "file_name": url.rsplit("/", 1)[-1], "file_size": 1024}
        for url in urls]
    if ext == "mp4":
        return {"video": files[0] if files else None, "seed": seed}
    if ext == "mp3":
        return {"audio": files[0] if files else None}
    images = [{**f, "width": 1024, "height": 1024} for f in files]
    return {"images": images, "seed": seed, "timings": {"inference": 1.0},
            "has_nsfw_concepts": [False] * len(images), "prompt": task.body.get("prompt", "")}


def _failure(task: Task) -> dict[str, Any]:
    return {"detail": [{"loc": ["body"], "type": task.script.fail_code or "no_media_generated",
                        "msg": task.script.fail_message or "Generation failed (simulated)"}]}


def _result(sim: Simulator, task: Task, state: str, since: float) -> Response:
    headers = {"x-fal-request-id": task.task_id}
    if state == "succeeded":
        return json_response(200, output(sim, task), headers)
    if state == "failed" and task.script.fail_code in INFRA_ERRORS:
        error_type = task.script.fail_code
        return json_response(INFRA_ERRORS[error_type],
                             {"detail": task.script.fail_message or "Request failed (simulated)",
                              "error_type": error_type},
                             {**headers, "X-Fal-Error-Type": error_type})
    if state == "failed":
        return json_response(422, _failure(task), headers)
    if state == "canceled":
        return json_response(499, {"detail": "Request was cancelled",
                                   "error_type": "client_cancelled"},
                             {**headers, "X-Fal-Error-Type": "client_cancelled"})
    return json_response(400, {"detail": "Request is still in progress"}, headers)


def callback(sim: Simulator, task: Task, state: str, since: float) -> Delivery | None:
    """The webhook POST: ``OK`` with the output or ``ERROR`` with the error payload."""
    if not task.callback_url:
        return None
    payload: dict[str, Any] = {"request_id": task.task_id, "gateway_request_id": task.task_id}
    if state == "succeeded":
        payload.update(status="OK", payload=output(sim, task))
    else:
        payload.update(status="ERROR", error="Invalid status code: 422", payload=_failure(task))
    body = json.dumps(payload, separators=(",", ":")).encode()
    headers = fal_headers(sim.fal_key, task.task_id, sim.secrets.webhook_secret(PROVIDER), body, now_seconds())
    return Delivery(task.callback_url, body, headers)


def _sync(sim: Simulator, req: Request) -> Response | None:
    model = req.path.strip("/")
    if req.method != "POST" or model.count("/") < 1:
        return None
    body = req.json()
    if not isinstance(body, dict):
        return error("invalid", sim.script_for(None, None))
    rejected = sim.call("fal-sync", model)
    if rejected is not None:
        return error(rejected.kind, rejected.script, rejected.code)
    task = sim.sync_task("fal-sync", model, body)
    return json_response(200, output(sim, task, seed=int(time.time()) % 1000),
                         {"x-fal-request-id": task.task_id})


def sign(sim: Simulator, body: bytes, timestamp: int) -> dict[str, str]:
    """Ed25519 with the simulator's key, for its account, over the body's ``request_id``."""
    request_id = body_text(body, "request_id") or "req-" + body_digest(body, 12)
    return fal_headers(sim.fal_key, request_id, sim.secrets.webhook_secret(PROVIDER), body, timestamp)


SYNC = register_route(SimRoute("fal-sync", authorized, error, _sync,
                               url_settings={"fal_sync_base_url": ""}))


register_route(SimRoute(
    PREFIX, authorized, error, handle,
    url_settings={"fal_base_url": "", "fal_jwks_url": "/.well-known/jwks.json"},
    api_key_settings=("fal_api_key",),
    examples={"fal-queue": ("fal-ai/flux/dev", {"prompt": "x"})},
    chaos={"fal-queue": 3}))
# fal signs every account with one JWKS: the setting binds its deliveries to the simulated account
register_webhooks(SimWebhooks(PROVIDER, callback, fal_headers,
                              secret_setting="fal_webhook_user_id",
                              secret="sim-fal-user", sign=sign,
                              verify_key=lambda sim: jwks(sim.fal_key)))
