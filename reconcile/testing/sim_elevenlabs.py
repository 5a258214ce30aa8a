"""Internal: the library's own mechanics, not an import path for platforms (may move).

ElevenLabs as the simulator serves it under ``/elevenlabs`` (the elevenlabs-python SDK).

Async: dubbing (multipart create, status, list, ``425 dubbing_not_dubbed`` audio until done) and
speech-to-text in webhook mode. Sync: text-to-speech, sound effects, speech-to-text, voice design
(``/v1/text-to-voice/design``) and saving a designed voice (``/v1/text-to-voice``), instant voice
cloning (``/v1/voices/add``) and forced alignment — the shapes of the ``elevenlabs`` SDK's
response models. Every answer carries a ``request-id`` header. Webhooks (``ElevenLabs-Signature: t=…,v0=…``) go to the
workspace webhook URL, ``Simulator.elevenlabs_webhook_url``, as the real ones do.
"""

from __future__ import annotations

import base64
import email.parser
import email.policy
import json
import re
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs

from .sim_core import (
    MEDIA,
    TERMINAL,
    Rejection,
    Request,
    Response,
    Script,
    Task,
    iso,
    json_response,
    planted_job_id,
    raw_status,
    retry_after_header,
)
from .sim_registry import SimRoute, SimWebhooks, register_route, register_webhooks
from .sim_signing import Delivery, elevenlabs_headers, now_seconds

if TYPE_CHECKING:
    from .simulator import Simulator

PREFIX = "elevenlabs"
PROVIDER = "elevenlabs"

JOB_NAME_PREFIX = "reconcile-job:"
_DUBBING = {"queued": "dubbing", "running": "dubbing", "succeeded": "dubbed", "failed": "failed",
            "canceled": "failed"}
_ALNUM = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
_DUB_ONE = re.compile(r"^/v1/dubbing/([^/]+)$")
_DUB_AUDIO = re.compile(r"^/v1/dubbing/([^/]+)/audio/([^/]+)$")
_TTS = re.compile(r"^/v1/text-to-speech/([^/]+)(/stream)?(/with-timestamps)?$")
_TRANSCRIPT = re.compile(r"^/v1/speech-to-text/transcripts/([^/]+)$")
_ERRORS = {
    "auth": (401, "authentication_error", "invalid_api_key", "Invalid API key"),
    "rate_limit": (429, "rate_limit_error", "concurrent_limit_exceeded",
                   "Too many concurrent requests"),
    "server_error": (500, "internal_error", "internal_error", "Internal server error (simulated)"),
    "kie_200_error": (500, "internal_error", "internal_error", "Internal server error (simulated)"),
    "not_found": (404, "not_found_error", "dubbing_not_found", "Dubbing not found"),
}


def authorized(req: Request) -> bool:
    return bool(req.header("xi-api-key").strip())


def _detail(status: int, kind: str, code: str, message: str, request_id: str) -> Response:
    return json_response(status, {"detail": {"type": kind, "code": code, "status": code,
                                             "message": message, "request_id": request_id}},
                         {"request-id": request_id})


def error(kind: str, script: Script, code: int | None = None) -> Response:
    request_id = "req_sim_error"
    if kind == "invalid":
        return json_response(422, {"detail": [{"loc": ["body", "text"], "msg": "field required",
                                               "type": "value_error.missing"}]},
                             {"request-id": request_id})
    status, error_type, error_code, message = _ERRORS[kind]
    response = _detail(status, error_type, error_code, message, request_id)
    if kind == "rate_limit":
        response.headers.update(retry_after_header(script))
    return response


def form(req: Request) -> dict[str, Any]:
    """The fields of a multipart, urlencoded or JSON body (file parts as bytes)."""
    ctype = req.header("content-type")
    if ctype.startswith("multipart/form-data"):
        head = f"Content-Type: {ctype}\r\nMIME-Version: 1.0\r\n\r\n".encode()
        message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(head + req.body)
        fields: dict[str, Any] = {}
        for part in message.iter_parts():
            name = part.get_param("name", header="content-disposition")
            payload = part.get_payload(decode=True) or b""
            data = payload if isinstance(payload, bytes) else str(payload).encode()
            fields[str(name)] = data if part.get_filename() else data.decode("utf-8", "replace")
        return fields
    if ctype.startswith("application/x-www-form-urlencoded"):
        return {k: v[0] for k, v in parse_qs(req.body.decode()).items()}
    body = req.json()
    return body if isinstance(body, dict) else {}


def handle(sim: Simulator, req: Request) -> Response | None:
    response = _route(sim, req)
    if response is not None:
        response.headers.setdefault("request-id", "req_" + sim.new_id(20))
    return response


def _route(sim: Simulator, req: Request) -> Response | None:
    if req.method == "POST" and req.path == "/v1/dubbing":
        return _dub(sim, req)
    if req.method == "GET" and req.path == "/v1/dubbing":
        return _dub_list(sim, req)
    if req.method == "POST" and req.path in _SYNC_JSON:
        return _sync_json(sim, req)
    if match := _DUB_ONE.match(req.path):
        found = sim.lookup(match[1], "elevenlabs-dubbing")
        if found is None:
            return error("not_found", sim.script_for(None, None))
        if req.method == "DELETE":
            sim.set_state(match[1], "vanished")
            return json_response(200, {"status": "ok"})
        return json_response(200, render(sim, *found)) if req.method == "GET" else None
    if req.method == "GET" and (match := _DUB_AUDIO.match(req.path)):
        return _audio(sim, match[1], match[2])
    if req.method == "POST" and (match := _TTS.match(req.path)):
        return _speech(sim, req, timestamps=bool(match[3]))
    if req.method == "POST" and req.path == "/v1/sound-generation":
        return _speech(sim, req, timestamps=False, model="sound-generation")
    if req.method == "POST" and req.path == "/v1/speech-to-text":
        return _stt(sim, req)
    if req.method == "GET" and (match := _TRANSCRIPT.match(req.path)):
        return _transcript(sim, match[1])
    return None


_SYNC_JSON = ("/v1/text-to-voice/design", "/v1/text-to-voice", "/v1/voices/add",
              "/v1/forced-alignment")


def _dub_list(sim: Simulator, req: Request) -> Response:
    """``GET /v1/dubbing``: newest first, ``{dubs, next_cursor, has_more}`` (cursor = offset)."""
    try:
        size = max(1, min(200, int(req.query.get("page_size") or 100)))
        offset = int(req.query.get("cursor") or 0)
    except ValueError:
        return error("invalid", sim.script_for(None, None))
    rows = []
    for task in sorted(sim.tasks.values(), key=lambda t: t.created_wall, reverse=True):
        found = sim.lookup(task.task_id, "elevenlabs-dubbing")
        if found is not None:
            rows.append(render(sim, *found))
    page = rows[offset:offset + size]
    more = offset + size < len(rows)
    return json_response(200, {"dubs": page, "next_cursor": str(offset + size) if more else None,
                               "has_more": more})


def _sync_json(sim: Simulator, req: Request) -> Response:
    """The one-request voice endpoints, each validated like the real one, answered in the shape
    of the SDK's response model (VoiceDesignPreviewResponse, Voice, AddVoiceIVCResponseModel,
    ForcedAlignmentResponseModel)."""
    fields = form(req)
    required = {"/v1/text-to-voice/design": ("voice_description",),
                "/v1/text-to-voice": ("voice_name", "voice_description", "generated_voice_id"),
                "/v1/voices/add": ("name", "files"),
                "/v1/forced-alignment": ("file", "text")}[req.path]
    missing = [name for name in required if not fields.get(name)]
    if missing:
        return json_response(422, {"detail": [{"loc": ["body", missing[0]], "msg": "field required",
                                               "type": "value_error.missing"}]})
    rejected = sim.call(PROVIDER, req.path.removeprefix("/v1/"))
    if rejected is not None:
        return error(rejected.kind, rejected.script, rejected.code)
    if req.path == "/v1/text-to-voice/design":
        _, audio = MEDIA["mp3"]
        previews = [{"audio_base_64": base64.b64encode(audio).decode(),
                     "generated_voice_id": sim.new_id(20, _ALNUM), "media_type": "audio/mpeg",
                     "duration_secs": 1.0, "language": "en"} for _ in range(3)]
        return json_response(200, {"previews": previews,
                                   "text": str(fields.get("text") or "Simulated preview text.")})
    if req.path == "/v1/text-to-voice":
        return json_response(200, {"voice_id": str(fields["generated_voice_id"]),
                                   "name": str(fields["voice_name"]), "category": "generated",
                                   "description": str(fields["voice_description"]),
                                   "labels": {}, "samples": None})
    if req.path == "/v1/voices/add":
        return json_response(200, {"voice_id": sim.new_id(20, _ALNUM),
                                   "requires_verification": False})
    words = str(fields["text"]).split() or ["."]
    word_rows = [{"text": w, "start": i * 0.5, "end": i * 0.5 + 0.4, "loss": 0.1}
                 for i, w in enumerate(words)]
    chars = [{"text": c, "start": i * 0.05, "end": i * 0.05 + 0.05}
             for i, c in enumerate(str(fields["text"]))]
    return json_response(200, {"characters": chars, "words": word_rows, "loss": 0.1})


def _dub(sim: Simulator, req: Request) -> Response:
    fields = form(req)
    if not (fields.get("file") or fields.get("source_url")):
        return json_response(422, {"detail": [{"loc": ["body", "file"], "type": "value_error",
                                               "msg": "file or source_url is required"}]})
    name = str(fields.get("name") or "")
    # the library's client names a dubbing "reconcile-job:<job_id>"; other names count whole
    job_id = (planted_job_id(fields.get("webhook_metadata")) or planted_job_id(name)
              or name.removeprefix(JOB_NAME_PREFIX) or None)
    targets = [lang.strip() for lang in str(fields.get("target_lang") or "es").split(",")]
    body = {k: v for k, v in fields.items() if not isinstance(v, bytes)}
    outcome = sim.create(provider=PROVIDER, api="elevenlabs-dubbing", model="dubbing",
                         task_id=sim.new_id(20, _ALNUM), callback_url=None, body=body,
                         job_id=job_id, extra={"target_languages": targets})
    if isinstance(outcome, Rejection):
        return error(outcome.kind, outcome.script, outcome.code)
    return json_response(200, {"dubbing_id": outcome.task_id, "expected_duration_sec": 10.0})


def render(sim: Simulator, task: Task, state: str, since: float) -> dict[str, Any]:
    """The dubbing object (``GET /v1/dubbing/{id}``) in ``state``."""
    return {
        "dubbing_id": task.task_id, "name": task.body.get("name", ""),
        "status": raw_status(state, _DUBBING),
        "source_language": task.body.get("source_lang", "en"),
        "target_languages": task.extra["target_languages"], "editable": False,
        "created_at": iso(task.created_wall),
        "media_metadata": {"content_type": "audio/mpeg", "duration": 10.0},
        "error": (task.script.fail_message or "Dubbing failed (simulated)")
        if state in ("failed", "canceled") else None,
    }


def _audio(sim: Simulator, dubbing_id: str, language: str) -> Response:
    found = sim.lookup(dubbing_id, "elevenlabs-dubbing")
    if found is None:
        return error("not_found", sim.script_for(None, None))
    task, state, _ = found
    if language not in task.extra["target_languages"]:
        return _detail(404, "not_found_error", "language_not_found",
                       f"Language {language} not found in this dubbing", "req_sim")
    if state != "succeeded":
        return _detail(425, "too_early", "dubbing_not_dubbed", "Dubbing has not finished yet",
                       "req_sim")
    content_type, data = MEDIA["mp3"]
    return Response(200, data, {"Content-Type": content_type})


def _speech(sim: Simulator, req: Request, *, timestamps: bool, model: str | None = None) -> Response:
    body = req.json()
    if not isinstance(body, dict) or not body.get("text"):
        return error("invalid", sim.script_for(None, None))
    rejected = sim.call(PROVIDER, model or str(body.get("model_id") or "eleven_multilingual_v2"))
    if rejected is not None:
        return error(rejected.kind, rejected.script, rejected.code)
    content_type, audio = MEDIA["mp3"]
    if timestamps:
        chars = list(str(body["text"]))
        times = [round(i * 0.05, 3) for i in range(len(chars))]
        alignment = {"characters": chars, "character_start_times_seconds": times,
                     "character_end_times_seconds": [t + 0.05 for t in times]}
        return json_response(200, {"audio_base64": base64.b64encode(audio).decode(),
                                   "alignment": alignment, "normalized_alignment": alignment})
    return Response(200, audio, {"Content-Type": content_type})


def _transcript_body(task_id: str | None) -> dict[str, Any]:
    return {"language_code": "en", "language_probability": 0.99, "text": "Simulated transcript.",
            "words": [{"text": "Simulated", "start": 0.0, "end": 0.5, "type": "word"},
                      {"text": "transcript.", "start": 0.6, "end": 1.2, "type": "word"}],
            "transcription_id": task_id, "audio_duration_secs": 1.2}


def _stt(sim: Simulator, req: Request) -> Response:
    fields = form(req)
    if not (fields.get("file") or fields.get("cloud_storage_url") or fields.get("source_url")):
        return json_response(422, {"detail": [{"loc": ["body", "file"], "type": "value_error",
                                               "msg": "file or cloud_storage_url is required"}]})
    model = str(fields.get("model_id") or "scribe_v1")
    if str(fields.get("webhook", "")).lower() != "true":
        rejected = sim.call(PROVIDER, model)
        if rejected is not None:
            return error(rejected.kind, rejected.script, rejected.code)
        return json_response(200, _transcript_body(None))
    metadata = fields.get("webhook_metadata")
    body = {k: v for k, v in fields.items() if not isinstance(v, bytes)}
    outcome = sim.create(provider=PROVIDER, api="elevenlabs-stt", model=model,
                         task_id=sim.new_id(20, _ALNUM), callback_url=None, body=body,
                         job_id=planted_job_id(metadata))
    if isinstance(outcome, Rejection):
        return error(outcome.kind, outcome.script, outcome.code)
    return json_response(200, {"message": "Request accepted", "request_id": "req_" + sim.new_id(20),
                               "transcription_id": outcome.task_id})


def _transcript(sim: Simulator, transcription_id: str) -> Response:
    found = sim.lookup(transcription_id, "elevenlabs-stt")
    if found is None:
        return _detail(404, "not_found_error", "transcript_not_found", "Transcript not found",
                       "req_sim")
    task, state, _ = found
    if state == "succeeded":
        return json_response(200, _transcript_body(task.task_id))
    if state in ("failed", "canceled"):
        return _detail(422, "transcription_error", "transcription_failed",
                       task.script.fail_message or "Transcription failed (simulated)", "req_sim")
    # pending: the docs say nothing; like the library's client, assume "not found" until done
    return _detail(404, "not_found_error", "transcript_not_found", "Transcript not found",
                   "req_sim")


def callback(sim: Simulator, task: Task, state: str, since: float) -> Delivery | None:
    """A workspace-webhook event for a finished dubbing or speech-to-text task."""
    url = sim.elevenlabs_webhook_url
    if not url:
        return None
    timestamp = now_seconds()
    if task.api == "elevenlabs-stt":
        metadata = task.body.get("webhook_metadata")
        try:
            metadata = json.loads(metadata) if isinstance(metadata, str) else metadata
        except ValueError:
            pass
        # The captured shape of the real event: ``data: {request_id, webhook_metadata,
        # transcription}`` — no top-level ``transcription_id``; the transcript carries it.
        data: dict[str, Any] = {
            "request_id": "req_" + sim.new_id(20),
            "webhook_metadata": metadata,
            "transcription": _transcript_body(task.task_id) if state == "succeeded" else None,
        }
        if state in TERMINAL - {"succeeded"}:
            data["error"] = task.script.fail_message or "Transcription failed (simulated)"
        event = {"type": "speech_to_text_transcription", "event_timestamp": timestamp, "data": data}
    else:
        event = {"type": "dubbing", "event_timestamp": timestamp,
                 "data": render(sim, task, state, since)}
    body = json.dumps(event, separators=(",", ":")).encode()
    return Delivery(url, body, elevenlabs_headers(sim.secrets.webhook_secret(PROVIDER), body,
                                                  timestamp))


def sign(sim: Simulator, body: bytes, timestamp: int) -> dict[str, str]:
    """``t=…,v0=…``: HMAC-SHA256 over ``{timestamp}.{body}``."""
    return elevenlabs_headers(sim.secrets.webhook_secret(PROVIDER), body, timestamp)


register_route(SimRoute(
    PREFIX, authorized, error, handle, url_settings={"elevenlabs_base_url": ""},
    api_key_settings=("elevenlabs_api_key",),
    examples={"elevenlabs-async": ("dubbing", {"source_url": "https://example.com/a.mp4",
                                               "target_lang": "es"}),
              "elevenlabs-sync": ("tts:voice1", {"text": "hello"})},
    chaos={"elevenlabs-async": 1, "elevenlabs-sync": 1}))
register_webhooks(SimWebhooks(PROVIDER, callback, elevenlabs_headers,
                              secret_setting="elevenlabs_webhook_secret",
                              secret="sim-elevenlabs-webhook-secret", sign=sign))
