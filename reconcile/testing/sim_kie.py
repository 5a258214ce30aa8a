"""Internal: the library's own mechanics, not an import path for platforms (may move).

KIE.ai as the simulator serves it under ``/kie`` (docs.kie.ai).

Market jobs, Veo, Suno, Flux Kontext, Luma modify, Runway and the OpenAI-style chat endpoint.
Every JSON answer is the ``{code, msg, data}`` envelope (``message`` instead of ``msg`` when the
script says so); record endpoints answer HTTP 200 with ``code`` 404 for an unknown task.
"""

from __future__ import annotations

import json
import re
import time
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

from .sim_core import (
    Rejection,
    Request,
    Response,
    Script,
    Task,
    int_or_raw,
    json_response,
    media_ext,
    millis,
    raw_status,
    retry_after_header,
)
from .sim_registry import SimRoute, SimWebhooks, register_route, register_webhooks
from .sim_signing import Delivery, body_text, kie_headers, now_seconds

if TYPE_CHECKING:
    from .simulator import Simulator

PREFIX = "kie"
PROVIDER = "kie"

MESSAGES = {
    200: "success", 400: "Bad request", 401: "You do not have access permissions",
    402: "Insufficient credits", 404: "Task not found", 422: "Validation error",
    429: "Rate limited: too many requests, please retry later",
    455: "Service unavailable: system maintenance", 500: "Server error, please try again later",
    501: "Generation failed", 505: "Feature disabled",
}
_MARKET = {"queued": "waiting", "running": "generating", "succeeded": "success", "failed": "fail",
           "canceled": "fail"}
_RUNWAY = {**_MARKET, "queued": "queueing"}
_SUNO = {"queued": "PENDING", "running": "TEXT_SUCCESS", "succeeded": "SUCCESS",
         "failed": "GENERATE_AUDIO_FAILED", "canceled": "GENERATE_AUDIO_FAILED"}
_FLAG = {"queued": 0, "running": 0, "succeeded": 1, "failed": 3, "canceled": 3}

# create path → (api, task id prefix); record path → api
_CHAT = re.compile(r"^/([^/]+)/v1/chat/completions$")  # KIE: one chat path per model
_CREATES = {
    "/api/v1/jobs/createTask": ("kie-market", "task_"),
    "/api/v1/veo/generate": ("kie-veo", "veo_task_"),
    "/api/v1/generate": ("kie-suno", ""),
    "/api/v1/flux/kontext/generate": ("kie-kontext", "fluxkontext_"),
    "/api/v1/modify/generate": ("kie-luma", "luma_"),
    "/api/v1/runway/generate": ("kie-runway", ""),
}
_RECORDS = {
    "/api/v1/jobs/recordInfo": "kie-market",
    "/api/v1/veo/record-info": "kie-veo",
    "/api/v1/generate/record-info": "kie-suno",
    "/api/v1/flux/kontext/record-info": "kie-kontext",
    "/api/v1/modify/record-info": "kie-luma",
    "/api/v1/runway/record-detail": "kie-runway",
}
_DEFAULT_MODEL = {"kie-veo": "veo3_fast", "kie-suno": "V4_5", "kie-kontext": "flux-kontext-pro",
                  "kie-luma": "luma-modify", "kie-runway": "runway-duration-5-generate"}
_EXT = {"kie-veo": "mp4", "kie-suno": "mp3", "kie-kontext": "png", "kie-luma": "mp4",
        "kie-runway": "mp4"}


def envelope(script: Script, code: int, data: Any = None, msg: str | None = None) -> dict[str, Any]:
    return {"code": code, script.kie_msg_key: msg or MESSAGES.get(code, "error"), "data": data}


def authorized(req: Request) -> bool:
    scheme, _, key = req.header("authorization").partition(" ")
    return scheme.lower() == "bearer" and bool(key.strip())


def error(kind: str, script: Script, code: int | None = None) -> Response:
    if kind == "kie_200_error":
        return json_response(200, envelope(script, code or 500))
    status = {"auth": 401, "invalid": 422, "rate_limit": 429, "server_error": 500,
              "not_found": 404}[kind]
    headers = retry_after_header(script) if kind == "rate_limit" else {}
    if kind == "invalid":
        return json_response(422, envelope(script, 422, msg="Invalid parameters: input is invalid"))
    return json_response(status, envelope(script, status), headers)


def handle(sim: Simulator, req: Request) -> Response | None:
    if req.method == "POST" and req.path in _CREATES:
        return _create(sim, req, *_CREATES[req.path])
    if req.method == "GET" and req.path in _RECORDS:
        return _record(sim, req, _RECORDS[req.path])
    if req.method == "POST" and (match := _CHAT.match(req.path)) and match[1] != "api":
        # ``/api/…`` is KIE's task API, never a model: the old shared chat path is not served
        return _chat(sim, req, unquote(match[1]))
    if req.method == "GET" and req.path == "/api/v1/chat/credit":
        return json_response(200, envelope(sim.default_script, 200, 1000))
    if req.method == "POST" and req.path == "/api/v1/common/download-url":
        body = req.json() or {}
        return json_response(200, envelope(sim.default_script, 200, body.get("url")))
    return None


def _create(sim: Simulator, req: Request, api: str, id_prefix: str) -> Response:
    body = req.json()
    script = sim.script_for(None, None)
    if not isinstance(body, dict):
        return json_response(400, envelope(script, 400, msg="Request body must be JSON"))
    model = body.get("model") or _DEFAULT_MODEL.get(api, "")
    if api == "kie-market" and (not body.get("model") or not isinstance(body.get("input"), dict)):
        return json_response(422, envelope(script, 422, msg="model and input are required"))
    slug = "".join(ch for ch in model.split("/")[0] if ch.isalnum()) if api == "kie-market" else ""
    task_id = id_prefix + (f"{slug}_" if slug else "") + sim.new_id(16, "0123456789abcdef")
    outcome = sim.create(provider=PROVIDER, api=api, model=model, task_id=task_id,
                         callback_url=body.get("callBackUrl"), body=body)
    if isinstance(outcome, Rejection):
        return error(outcome.kind, outcome.script, outcome.code)
    return json_response(200, envelope(outcome.script, 200, {"taskId": outcome.task_id}))


def _record(sim: Simulator, req: Request, api: str) -> Response:
    task_id = req.query.get("taskId", "")
    script = sim.script_for(None, None)
    if not task_id:
        return json_response(200, envelope(script, 400, msg="taskId is required"))
    found = sim.lookup(task_id, api)
    if found is None:
        return json_response(200, envelope(script, 404))
    task, state, since = found
    return json_response(200, envelope(task.script, 200, render(sim, task, state, since)))


def _urls(sim: Simulator, task: Task, state: str) -> list[str]:
    if state != "succeeded":
        return []
    return sim.media_urls(task, _EXT.get(task.api) or media_ext(task.model))


def _fail(task: Task, default: str = "501") -> tuple[str, str]:
    return (task.script.fail_code or default,
            task.script.fail_message or "Generation failed (simulated)")


def _done_ms(task: Task, state: str, since: float) -> int | None:
    return millis(task.wall(since)) if state in ("succeeded", "failed", "canceled") else None


def render(sim: Simulator, task: Task, state: str, since: float) -> dict[str, Any]:
    """The ``data`` of the task's record endpoint in ``state`` (entered at clock ``since``)."""
    urls = _urls(sim, task, state)
    failed = state in ("failed", "canceled")
    code, message = _fail(task)
    created, done = millis(task.created_wall), _done_ms(task, state, since)
    param = json.dumps(dict(task.body), separators=(",", ":"))
    if task.api == "kie-market":
        return {
            "taskId": task.task_id, "model": task.model, "state": raw_status(state, _MARKET),
            "param": param, "resultJson": json.dumps({"resultUrls": urls}, separators=(",", ":")) if urls else "",
            "failCode": code if failed else "", "failMsg": message if failed else "",
            "costTime": (done - created) if done else 0, "completeTime": done,
            "createTime": created, "updateTime": done or millis(task.wall(since)),
        }
    if task.api == "kie-suno":
        tracks = [_suno_track(task, i, urls[i] if urls else "") for i in range(task.script.outputs)]
        return {
            "taskId": task.task_id, "parentMusicId": "", "param": param, "type": "GENERATE",
            "response": ({"taskId": task.task_id, "sunoData": tracks}
                         if state in ("running", "succeeded") else None),
            "status": raw_status(state, _SUNO),
            "errorCode": int_or_raw(code) if failed else None,
            "errorMessage": message if failed else None,
        }
    if task.api == "kie-runway":
        expired = sim.media_expired(task)
        return {
            "taskId": task.task_id, "parentTaskId": "",
            "generateParam": {"prompt": task.body.get("prompt", ""),
                              "imageUrl": task.body.get("imageUrl", ""), "expandPrompt": False},
            "state": raw_status(state, _RUNWAY),
            "generateTime": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(task.created_wall.timestamp())),
            "videoInfo": ({"videoId": task.task_id + "_v0", "taskId": task.task_id,
                           "videoUrl": urls[0], "imageUrl": urls[0] + ".png"} if urls else None),
            "failCode": int_or_raw(code) if failed else None,
            "failMsg": message if failed else "", "expireFlag": 1 if expired else 0,
        }
    data: dict[str, Any] = {
        "taskId": task.task_id, "paramJson": param, "createTime": created,
        "completeTime": done, "successFlag": int_or_raw(raw_status(state, _FLAG)),
        "errorCode": int_or_raw(code) if failed else None,
        "errorMessage": message if failed else None,
    }
    if task.api == "kie-veo":
        data["completeTime"] = (time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(done / 1000))
                                if done else None)  # Veo's example uses strings
        data["fallbackFlag"] = False
        data["response"] = ({"taskId": task.task_id, "resultUrls": urls, "originUrls": urls,
                             "resolution": "720p"} if urls else None)
    elif task.api == "kie-kontext":
        data["response"] = ({"originImageUrl": task.body.get("inputImage"),
                             "resultImageUrl": urls[0]} if urls else None)
    else:  # kie-luma
        data["response"] = ({"taskId": task.task_id, "originUrls": urls, "resultUrls": urls}
                            if urls else None)
    return data


def _suno_track(task: Task, index: int, url: str) -> dict[str, Any]:
    return {
        "id": f"{task.task_id}-{index}", "audioUrl": url, "streamAudioUrl": url, "imageUrl": "",
        "prompt": task.body.get("prompt", ""), "modelName": task.model,
        "title": task.body.get("title", "Simulated"), "tags": task.body.get("style", ""),
        "createTime": millis(task.created_wall), "duration": 30.0,
    }


def callback(sim: Simulator, task: Task, state: str, since: float) -> Delivery | None:
    """The callback POST KIE makes when ``task`` ends, signed with the KIE HMAC key."""
    if not task.callback_url:
        return None
    ok = state == "succeeded"
    code, message = _fail(task)
    env_code = 200 if ok else (int(code) if code.isdigit() else 501)
    msg = "success" if ok else message
    urls = _urls(sim, task, state)
    if task.api == "kie-market":
        data: dict[str, Any] = render(sim, task, state, since)
    elif task.api == "kie-veo":
        data = {"taskId": task.task_id, "fallbackFlag": False,
                "info": {"resultUrls": urls, "originUrls": urls, "resolution": "720p"} if ok else None}
    elif task.api == "kie-suno":
        tracks = [{"id": f"{task.task_id}-{i}", "audio_url": url, "stream_audio_url": url,
                   "image_url": "", "prompt": task.body.get("prompt", ""),
                   "model_name": task.model, "title": task.body.get("title", "Simulated"),
                   "tags": task.body.get("style", ""), "createTime": millis(task.created_wall),
                   "duration": 30.0} for i, url in enumerate(urls)]
        data = {"callbackType": "complete" if ok else "error", "task_id": task.task_id,
                "data": tracks if ok else None}
        msg = "All generated successfully." if ok else message
    elif task.api == "kie-runway":
        data = {"task_id": task.task_id, "video_id": task.task_id + "_v0",
                "video_url": urls[0] if urls else "", "image_url": urls[0] + ".png" if urls else ""}
        msg = "All generated successfully." if ok else message
    elif task.api == "kie-kontext":
        data = {"taskId": task.task_id,
                "info": {"originImageUrl": task.body.get("inputImage"),
                         "resultImageUrl": urls[0]} if urls else None}
    else:
        data = {"taskId": task.task_id, "resultUrls": urls, "originUrls": urls}
    payload = {"code": env_code, task.script.kie_msg_key: msg, "data": data}
    body = json.dumps(payload, separators=(",", ":")).encode()
    headers = kie_headers(sim.secrets.webhook_secret(PROVIDER), task.task_id, now_seconds())
    return Delivery(task.callback_url, body, headers)


def _chat(sim: Simulator, req: Request, model: str) -> Response:
    """KIE's per-model chat path, ``POST /{model}/v1/chat/completions`` (the model is the path)."""
    body = req.json()
    script = sim.script_for(None, None)
    if not isinstance(body, dict) or not body.get("messages"):
        return json_response(422, envelope(script, 422, msg="messages is required"))
    rejected = sim.call(PROVIDER, model)
    if rejected is not None:
        return error(rejected.kind, rejected.script, rejected.code)
    return json_response(200, {
        "id": "chatcmpl-" + sim.new_id(24), "object": "chat.completion",
        "created": int(time.time()), "model": model,
        "choices": [{"index": 0, "finish_reason": "stop",
                     "message": {"role": "assistant", "content": "Simulated reply."}}],
        "usage": {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15},
    })


def sign(sim: Simulator, body: bytes, timestamp: int) -> dict[str, str]:
    """KIE signs the body's ``data.taskId`` (``task_id``) and the timestamp, not the body."""
    task_id = body_text(body, "data", "taskId") or body_text(body, "data", "task_id") or ""
    return kie_headers(sim.secrets.webhook_secret(PROVIDER), task_id, timestamp)


register_route(SimRoute(
    PREFIX, authorized, error, handle, url_settings={"kie_base_url": ""},
    api_key_settings=("kie_api_key",),
    examples={
        "kie-standard": ("seedream/4.5-edit", {"prompt": "x"}),
        "kie-veo": ("veo3_fast", {"prompt": "x"}),
        "kie-suno": ("V4_5", {"prompt": "x", "customMode": False, "instrumental": False}),
        "kie-kontext": ("flux-kontext-pro", {"prompt": "x"}),
        "kie-luma": ("luma", {"prompt": "x", "videoUrl": "https://example.com/v.mp4"}),
        "kie-kling3": ("kling-3.0/video", {"prompt": "x"}),
        "kie-runway": ("runway-duration-5-generate", {"prompt": "x", "aspectRatio": "16:9"}),
        "kie-lip-sync": ("infinitalk/from-audio", {"prompt": "x"}),
        "kie-llm": ("gpt-x", {"messages": [{"role": "user", "content": "hi"}]}),
    },
    chaos={"kie-standard": 3, "kie-veo": 2, "kie-llm": 1}))
register_webhooks(SimWebhooks(PROVIDER, callback, kie_headers,
                              secret_setting="kie_webhook_hmac_key",
                              secret="sim-kie-webhook-hmac-key", sign=sign))
