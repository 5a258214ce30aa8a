"""Internal: the library's own mechanics, not an import path for platforms (may move).

Replicate as the simulator serves it under ``/replicate``.

Predictions (by version, official model or deployment) and trainings: create (201), get,
cancel, cursor-paged listing with ``created_after``/``created_before``, ``Prefer: wait``, RFC 7807
errors, and Standard-Webhooks ``completed`` deliveries signed with a ``whsec_`` secret.
"""

from __future__ import annotations

import base64
import json
import re
import time
from datetime import datetime
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

from .sim_core import (
    TERMINAL,
    Rejection,
    Request,
    Response,
    Script,
    Task,
    iso,
    json_response,
    media_ext,
    raw_status,
    retry_after_header,
)
from .sim_registry import SimRoute, SimWebhooks, register_route, register_webhooks
from .sim_signing import Delivery, body_digest, now_seconds, replicate_headers

if TYPE_CHECKING:
    from .simulator import Simulator

PREFIX = "replicate"
PROVIDER = "replicate"
# the simulator's webhook signing secret (whsec_ + base64 of 32 bytes), unless SimSecrets overrides it
SECRET = "whsec_" + base64.b64encode(b"sim-replicate-webhook-secret-32b!").decode()
PREFER_WAIT_CAP = 60.0

_STATUS = {"queued": "starting", "running": "processing", "succeeded": "succeeded",
           "failed": "failed", "canceled": "canceled"}
_ALPHABET = "abcdefghijklmnopqrstuvwxyz0123456789"
_MODEL_CREATE = re.compile(r"^/v1/(models|deployments)/([^/]+)/([^/]+)/predictions$")
_TRAINING_CREATE = re.compile(r"^/v1/models/([^/]+)/([^/]+)/versions/([^/]+)/trainings$")
_VERSION = re.compile(r"^/v1/models/([^/]+)/([^/]+)/versions/([^/]+)$")
_ONE = re.compile(r"^/v1/(predictions|trainings)/([^/]+)(/cancel)?$")
_ERRORS = {
    "auth": (401, "Unauthenticated", "You did not pass a valid authentication token"),
    "invalid": (422, "Input validation failed", "- input: prompt is required"),
    "rate_limit": (429, "Request was throttled",
                   "Request was throttled. Your rate limit resets in ~30s."),
    "server_error": (500, "Internal server error", "Something went wrong (simulated)."),
    "kie_200_error": (500, "Internal server error", "Something went wrong (simulated)."),
    "not_found": (404, "Not found", "The requested resource could not be found."),
}


def authorized(req: Request) -> bool:
    scheme, _, key = req.header("authorization").partition(" ")
    return scheme.lower() in ("bearer", "token") and bool(key.strip())


def error(kind: str, script: Script, code: int | None = None) -> Response:
    status, title, detail = _ERRORS[kind]
    payload: dict[str, Any] = {"title": title, "detail": detail, "status": status}
    if kind == "invalid":
        payload["invalid_fields"] = [{"type": "required", "field": "input.prompt",
                                      "description": "prompt is required"}]
    headers = retry_after_header(script) if kind == "rate_limit" else {}
    return json_response(status, payload, {"Content-Type": "application/problem+json", **headers})


def handle(sim: Simulator, req: Request) -> Response | None:
    if req.method == "POST":
        if req.path == "/v1/predictions":
            return _create(sim, req, "replicate-prediction", None, None)
        if match := _MODEL_CREATE.match(req.path):
            return _create(sim, req, "replicate-prediction", f"{match[2]}/{match[3]}", None)
        if match := _TRAINING_CREATE.match(req.path):
            return _create(sim, req, "replicate-training", f"{match[1]}/{match[2]}", match[3])
    match = _ONE.match(req.path)
    if match:
        api = "replicate-prediction" if match[1] == "predictions" else "replicate-training"
        if req.method == "GET" and not match[3]:
            return _get(sim, match[2], api)
        if req.method == "POST" and match[3]:
            return _cancel(sim, match[2], api)
    if req.method == "GET" and req.path in ("/v1/predictions", "/v1/trainings"):
        api = "replicate-prediction" if req.path == "/v1/predictions" else "replicate-training"
        return _list(sim, req, api)
    if req.method == "GET" and (match := _VERSION.match(req.path)):
        return json_response(200, _version(match[3]))
    if req.method == "GET" and req.path == "/v1/webhooks/default/secret":
        return json_response(200, {"key": sim.secrets.webhook_secret(PROVIDER)})
    return None


def _create(sim: Simulator, req: Request, api: str, model: str | None,
            version: str | None) -> Response:
    body = req.json()
    script = sim.script_for(None, None)
    if not isinstance(body, dict) or not isinstance(body.get("input"), dict):
        return error("invalid", script)
    if model is None:  # POST /v1/predictions names a version
        version = body.get("version")
        if not isinstance(version, str) or not version:
            return error("invalid", script)
        # "owner/name:sha" names the model too; a bare sha is scripted by itself
        model, _, sha = version.partition(":") if ":" in version else (version, "", version)
        version = sha
    if api == "replicate-training" and not body.get("destination"):
        return error("invalid", script)
    outcome = sim.create(provider=PROVIDER, api=api, model=model,
                         task_id=sim.new_id(26, _ALPHABET), callback_url=body.get("webhook"),
                         body=body, extra={"version": version or "hidden"})
    if isinstance(outcome, Rejection):
        return error(outcome.kind, outcome.script, outcome.code)
    wait = _prefer_wait(req.header("prefer"))
    deadline = time.monotonic() + wait
    while wait and time.monotonic() < deadline:
        found = sim.lookup(outcome.task_id, api)
        if found is None or found[1] in TERMINAL:
            break
        time.sleep(0.02)
    now_state, since = outcome.state_at(sim.now())
    obj = render(sim, outcome, now_state, since)
    return json_response(201, obj, {"Location": obj["urls"]["get"]})


def _version(version_id: str) -> dict[str, Any]:
    """``GET /v1/models/{owner}/{name}/versions/{id}`` (what ``replicate.run("o/n:v")`` reads):
    the version object of Replicate's HTTP API docs, with a file-list output schema."""
    return {"id": version_id, "created_at": "2025-01-01T00:00:00.000000Z", "cog_version": "0.14.0",
            "openapi_schema": {"openapi": "3.0.2", "components": {"schemas": {
                "Output": {"type": "array", "items": {"type": "string", "format": "uri"},
                           "title": "Output"}}}}}


def _prefer_wait(value: str) -> float:
    for part in value.split(","):
        name, _, seconds = part.strip().partition("=")
        if name.strip().lower() == "wait":
            try:
                return min(PREFER_WAIT_CAP, max(1.0, float(seconds))) if seconds else PREFER_WAIT_CAP
            except ValueError:
                return PREFER_WAIT_CAP
    return 0.0


def _get(sim: Simulator, task_id: str, api: str) -> Response:
    found = sim.lookup(task_id, api)
    if found is None:
        return error("not_found", sim.script_for(None, None))
    return json_response(200, render(sim, *found))


def _cancel(sim: Simulator, task_id: str, api: str) -> Response:
    found = sim.lookup(task_id, api)
    if found is None:
        return error("not_found", sim.script_for(None, None))
    if found[1] not in TERMINAL:
        sim.set_state(task_id, "canceled")
        found = sim.lookup(task_id, api) or found
    return json_response(200, render(sim, *found))


def _list(sim: Simulator, req: Request, api: str) -> Response:
    try:
        after = _parse_time(req.query.get("created_after"))
        before = _parse_time(req.query.get("created_before"))
        offset = int(base64.urlsafe_b64decode(req.query.get("cursor") or "MA==").decode())
    except ValueError:
        return error("invalid", sim.script_for(None, None))
    rows = []
    for task in sorted(sim.tasks.values(), key=lambda t: t.created_wall, reverse=True):
        if task.api != api or (after and task.created_wall <= after) or (
                before and task.created_wall >= before):
            continue
        found = sim.lookup(task.task_id, api)
        if found is not None:
            rows.append(render(sim, *found))
    size = sim.replicate_page_size
    page = rows[offset:offset + size]

    def link(at: int) -> str:
        query = {k: v for k, v in req.query.items() if k != "cursor"}
        query["cursor"] = base64.urlsafe_b64encode(str(at).encode()).decode()
        return f"{sim.url}/{PREFIX}{req.path}?{urlencode(query)}"

    return json_response(200, {
        "previous": link(max(0, offset - size)) if offset > 0 else None,
        "next": link(offset + size) if offset + size < len(rows) else None,
        "results": page,
    })


def _parse_time(value: str | None) -> datetime | None:
    if not value:
        return None
    moment = datetime.fromisoformat(value)
    if moment.tzinfo is None:
        raise ValueError("created_after needs a timezone")
    return moment


def render(sim: Simulator, task: Task, state: str, since: float) -> dict[str, Any]:
    """The prediction (or training) object in ``state``."""
    kind = "trainings" if task.api == "replicate-training" else "predictions"
    base = f"{sim.url}/{PREFIX}/v1/{kind}/{task.task_id}"
    now = sim.now()
    started = task.first_at({"running", *TERMINAL}, now)
    done = since if state in TERMINAL else None
    output: Any = None
    if state == "succeeded":
        if task.api == "replicate-training":
            urls = sim.media_urls(task, "tar")
            output = {"version": f"{task.model}:{task.task_id}", "weights": urls[0] if urls else None}
        else:
            output = sim.media_urls(task, media_ext(task.model))
    obj: dict[str, Any] = {
        "id": task.task_id, "model": task.model if "/" in task.model else "sim/model",
        "version": task.extra.get("version", "hidden"), "input": task.body.get("input", {}),
        "logs": "", "output": output,
        "error": (task.script.fail_message or "Prediction failed (simulated)")
        if state == "failed" else None,
        "status": raw_status(state, _STATUS), "source": "api",
        "data_removed": sim.media_expired(task),
        "created_at": iso(task.created_wall),
        "started_at": iso(task.wall(started[1])) if started else None,
        "completed_at": iso(task.wall(done)) if done is not None else None,
        "urls": {"get": base, "cancel": base + "/cancel",
                 "web": f"https://replicate.com/p/{task.task_id}"},
        # NOT in Replicate's documented Prediction schema (the OpenAPI-generated types and the
        # SDK's Prediction have no ``webhook``): served for the sweep's evidence tests; what that
        # means for evidence: README, Provider notes.
        "webhook": task.callback_url,
        "webhook_events_filter": task.body.get("webhook_events_filter"),
        "metrics": {"predict_time": round(done - started[1], 3)}
        if done is not None and started else {},
    }
    if kind == "predictions":
        obj["urls"]["stream"] = base + "/stream"
    else:
        obj["destination"] = task.body.get("destination")
    return obj


def callback(sim: Simulator, task: Task, state: str, since: float) -> Delivery | None:
    """The ``completed`` webhook: the object itself, signed the Standard-Webhooks way."""
    events = task.body.get("webhook_events_filter")
    if not task.callback_url or (isinstance(events, list) and "completed" not in events):
        return None
    body = json.dumps(render(sim, task, state, since), separators=(",", ":")).encode()
    headers = replicate_headers(sim.secrets.webhook_secret(PROVIDER), body,
                                "msg_" + sim.new_id(27), now_seconds())
    return Delivery(task.callback_url, body, headers)


def sign(sim: Simulator, body: bytes, timestamp: int) -> dict[str, str]:
    """Standard Webhooks over ``{id}.{timestamp}.{body}`` (the id: the body's digest)."""
    return replicate_headers(sim.secrets.webhook_secret(PROVIDER), body,
                             "msg_" + body_digest(body), timestamp)


register_route(SimRoute(
    PREFIX, authorized, error, handle, url_settings={"replicate_base_url": ""},
    api_key_settings=("replicate_api_key",),
    examples={"replicate-prediction": ("owner/model:v1", {"prompt": "x"}),
              "replicate-training": ("owner/model:v1", {"steps": 1})},
    chaos={"replicate-prediction": 3}))
register_webhooks(SimWebhooks(PROVIDER, callback, replicate_headers,
                              secret_setting="replicate_webhook_secret",
                              secret=SECRET, sign=sign))
