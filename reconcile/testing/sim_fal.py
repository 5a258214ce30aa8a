"""fal.ai as the simulator serves it: the queue under ``/fal``, sync calls under ``/fal-sync``
(PROVIDERS.md §4).

Status and result URLs drop the model's subpath (``fal-ai/flux/dev`` → ``fal-ai/flux``) and
answer 404 when built with it. A failed request still shows ``COMPLETED``; only its result says
so (422 with a ``detail`` list). Webhooks are ED25519-signed; the JWKS is served at
``/fal/.well-known/jwks.json``.
"""

from __future__ import annotations

import json
import time
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

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
from .sim_signing import Delivery, fal_headers, jwks, now_seconds

if TYPE_CHECKING:
    from .simulator import Simulator

PREFIX = "fal"
PROVIDER = "fal"
JWKS_PATH = "/.well-known/jwks.json"

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
        return _status(sim, *found, logs=req.query.get("logs") == "1")
    if req.method == "GET" and not tail[1:]:
        return _result(sim, *found)
    if req.method == "PUT" and tail[1:] == ["cancel"]:
        if found[1] in TERMINAL:
            return json_response(400, {"status": "ALREADY_COMPLETED"})
        sim.set_state(found[0].task_id, "canceled")
        return json_response(202, {"status": "CANCELLATION_REQUESTED"})
    return None


def _submit(sim: Simulator, req: Request, model: str) -> Response | None:
    if model.count("/") < 1:
        return None
    body = req.json()
    if not isinstance(body, dict):
        return error("invalid", sim.script_for(None, None))
    webhook = req.query.get("fal_webhook")
    request_id = sim.new_uuid()
    outcome = sim.create(provider=PROVIDER, api="fal-queue", model=model, task_id=request_id,
                         callback_url=webhook, body=body,
                         extra={"app": "/".join(model.split("/")[:2])})
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
        return json_response(200, body)
    return json_response(202, body)


def output(sim: Simulator, task: Task, seed: int = 42) -> dict[str, Any]:
    """The model output JSON of a successful request (no envelope), shaped by media type."""
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
    headers = fal_headers(sim.fal_key, task.task_id, sim.secrets.fal_user_id, body, now_seconds())
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


SYNC = SimpleNamespace(PREFIX="fal-sync", authorized=authorized, error=error, handle=_sync)
