"""ElevenLabs: dubbing and webhook-mode STT (async), everything else sync (PROVIDERS.md §3).

Async model strings (``CreateRequest.model``, also passed to ``poll``):

* ``dubbing`` (or empty) — ``POST /v1/dubbing`` (multipart) → ``dubbing_id``; poll
  ``GET /v1/dubbing/{id}``. Unless the input names the dubbing, ``name`` is set to
  ``reconcile-job:<job_id>`` so the job id is visible upstream.
* ``speech-to-text[:<model_id>]`` / ``stt[:<model_id>]`` — ``POST /v1/speech-to-text`` with
  ``webhook=true`` and ``webhook_metadata={"job_id": …}`` (the planted id the webhook echoes).
  The answer is ``{message, request_id, transcription_id?}``; the task id is
  ``transcription_id``, else ``request_id``. Poll ``GET /v1/speech-to-text/transcripts/{id}``:
  the transcript once done; before that (or when only a ``request_id`` was returned) we assume
  a 404, read as NOT_FOUND — the workspace webhook normally completes these jobs first.

Sync model strings (:class:`ElevenLabsSyncClient.call`):

* ``tts:<voice_id>[:<model_id>]`` — ``POST /v1/text-to-speech/{voice_id}`` → audio bytes;
* ``sound-effects[:<model_id>]`` — ``POST /v1/sound-generation`` → audio bytes;
* ``stt[:<model_id>]`` — ``POST /v1/speech-to-text`` (multipart) → transcript JSON;
* ``voice-clone`` — ``POST /v1/voices/add`` (multipart) → ``{voice_id, …}``;
* ``voice-design[:<model_id>]`` — ``POST /v1/text-to-voice/design`` → one audio Output per preview;
* ``voice-create`` — ``POST /v1/text-to-voice`` (saves a designed voice) → JSON;
* ``forced-alignment`` — ``POST /v1/forced-alignment`` (multipart) → alignment JSON.

``output_format``, ``enable_logging`` and ``optimize_streaming_latency`` in the input go to the
query string. In multipart inputs, ``bytes`` values (or base64 strings under ``<field>_base64``,
so stored JSON inputs can carry files) become file parts; other values become form fields.
"""

from __future__ import annotations

import base64
import binascii
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal
from urllib.parse import quote

import requests
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..errors import (
    InvalidParam,
    MediaExpired,
    MediaFetchFailed,
    MediaTooLarge,
    ProviderError,
    ReadFailed,
)
from ..settings import Settings
from . import deadline
from .base import (
    Created,
    CreateRequest,
    ListedTask,
    Output,
    PollResult,
    PollStatus,
    SyncResult,
    unwrap_sdk,
)
from .http import HttpClient, parse_retry_after
from .http import body_json as _json
from .http import body_text as _text
from .http import header_value as _header
from .outcome import Op, status_error, transport_error

__all__ = [
    "JOB_NAME_PREFIX",
    "ApiErrorDetail",
    "Dubbing",
    "DubbingCreated",
    "ElevenLabsAsyncClient",
    "ElevenLabsSyncClient",
    "Preview",
    "SttAccepted",
    "SyncCall",
    "VoiceDesign",
    "async_client",
    "async_operation",
    "audio_url",
    "build_create",
    "build_sync",
    "form_parts",
    "parse_create",
    "parse_dubbing",
    "parse_sync",
    "parse_transcript",
    "sync_client",
    "to_error",
]

AsyncOperation = Literal["dubbing", "speech-to-text"]

JOB_NAME_PREFIX = "reconcile-job:"
_RUNNING = frozenset({"queued", "preparing", "dubbing"})
_QUERY_KEYS = ("output_format", "enable_logging", "optimize_streaming_latency")
_REQUEST_ID_HEADERS = ("request-id", "x-request-id")
FormParts = list[tuple[str, tuple[str | None, bytes | str]]]


class DubbingCreated(BaseModel):
    model_config = ConfigDict(extra="allow")

    dubbing_id: str = Field(min_length=1)
    expected_duration_sec: float | None = None


class SttAccepted(BaseModel):
    """The early answer of a webhook-mode transcription."""

    model_config = ConfigDict(extra="allow")

    request_id: str | None = None
    transcription_id: str | None = None


class Dubbing(BaseModel):
    model_config = ConfigDict(extra="allow")

    dubbing_id: str | None = None
    name: str | None = None
    status: str | None = None
    target_languages: list[str] = Field(default_factory=list)
    media_metadata: dict[str, Any] | None = None
    error: Any = None


class ApiErrorDetail(BaseModel):
    """``detail``: ``{type, code, message, request_id}`` or legacy ``{status, message}``."""

    model_config = ConfigDict(extra="allow")

    type: str | None = None
    code: str | None = None
    status: str | None = None
    message: str | None = None
    request_id: str | None = None


class Preview(BaseModel):
    model_config = ConfigDict(extra="allow")

    audio_base_64: str
    generated_voice_id: str | None = None
    media_type: str | None = None


class VoiceDesign(BaseModel):
    model_config = ConfigDict(extra="allow")

    previews: list[Preview]


# --- pure helpers -----------------------------------------------------------------------------




def _describe(body: Any) -> tuple[str | None, str | None, str | None, bool]:
    """(message, provider code, request id, well-formed?) of an ElevenLabs error body."""
    detail = body.get("detail") if isinstance(body, Mapping) else None
    if isinstance(detail, str):
        return detail, None, None, True
    if isinstance(detail, list):  # FastAPI 422: [{loc, msg, type}, …]
        items = [d for d in detail if isinstance(d, Mapping)]
        messages = [str(d.get("msg")) for d in items if d.get("msg") is not None]
        first_type = items[0].get("type") if items else None
        return (
            "; ".join(messages) or None,
            str(first_type) if first_type else "validation_error",
            None,
            True,
        )
    if isinstance(detail, Mapping):
        try:
            parsed = ApiErrorDetail.model_validate(detail)
        except ValidationError:  # still ElevenLabs' error shape, just with odd field types
            return None, None, None, True
        return parsed.message, parsed.code or parsed.status or parsed.type, parsed.request_id, True
    return None, None, None, False


def to_error(
    op: Op,
    status: int | None = None,
    body: str | bytes | None = None,
    headers: Mapping[str, str] | None = None,
    exc: BaseException | None = None,
) -> ProviderError:
    """The one place an ElevenLabs answer (or a transport failure) becomes an exception."""
    if exc is not None:
        return transport_error("elevenlabs", op, exc)
    message, provider_code, body_request_id, well_formed = _describe(_json(body))
    kw: dict[str, Any] = {
        "status": status,
        "provider_code": provider_code,
        "request_id": _header(headers, *_REQUEST_ID_HEADERS) or body_request_id,
        "body": _text(body),
    }
    return status_error(
        "elevenlabs", op, status, kw, message=message, well_formed=well_formed,
        retry_after=parse_retry_after(_header(headers, "Retry-After")),
    )


def _form_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, Mapping | list):
        return json.dumps(value)
    return str(value)


def form_parts(fields: Mapping[str, Any]) -> FormParts:
    """Multipart parts for ``requests(files=…)`` (which forces multipart even without files)."""
    parts: FormParts = []
    for key, value in fields.items():
        if value is None:
            continue
        name = key
        items = value if isinstance(value, list) else [value]
        if key.endswith("_base64"):
            name = key.removesuffix("_base64")
            try:
                items = [base64.b64decode(str(v), validate=True) for v in items]
            except (binascii.Error, ValueError):
                raise InvalidParam(f"{key} is not valid base64", param=key) from None
        if items and all(isinstance(v, bytes) for v in items):
            parts.extend((name, (name, v)) for v in items)
        else:
            parts.append((name, (None, _form_value(value))))
    return parts


def async_operation(model: str | None) -> tuple[AsyncOperation, str | None]:
    """(operation, model_id) for an async model string; see the module docstring."""
    head, _, model_id = (model or "dubbing").partition(":")
    if head == "dubbing" and not model_id:
        return "dubbing", None
    if head in ("speech-to-text", "stt"):
        return "speech-to-text", model_id or None
    raise InvalidParam(
        f"elevenlabs async model must be dubbing or speech-to-text[:model], got {model!r}",
        param="model",
    )


def build_create(request: CreateRequest) -> tuple[str, FormParts]:
    """Path and multipart parts of an async create (job id in ``name``/``webhook_metadata``)."""
    operation, model_id = async_operation(request.model)
    fields = dict(request.input)
    if operation == "dubbing":
        fields.setdefault("name", f"{JOB_NAME_PREFIX}{request.job_id}")
        return "/v1/dubbing", form_parts(fields)
    metadata = fields.get("webhook_metadata") or {}
    if isinstance(metadata, str):
        metadata = _json(metadata)
    if not isinstance(metadata, Mapping):
        raise InvalidParam("webhook_metadata must be a JSON object", param="webhook_metadata")
    fields["webhook_metadata"] = {**metadata, "job_id": request.job_id}
    fields["webhook"] = True
    if request.extra.get("webhook_id"):
        fields["webhook_id"] = request.extra["webhook_id"]
    if model_id:
        fields["model_id"] = model_id
    if not fields.get("model_id"):
        raise InvalidParam(
            "speech-to-text needs a model_id (stt:<model_id> or input.model_id)", param="model_id"
        )
    return "/v1/speech-to-text", form_parts(fields)


def parse_create(
    status_code: int,
    body: str | bytes | None,
    headers: Mapping[str, str] | None = None,
    *,
    operation: AsyncOperation = "dubbing",
) -> Created:
    """The id of a dubbing or webhook-mode transcription, or the outcome as an exception."""
    if not 200 <= status_code < 300:
        raise to_error("create", status_code, body, headers)
    data, _ = unwrap_sdk(_json(body))
    header_id = _header(headers, *_REQUEST_ID_HEADERS)
    try:
        if operation == "dubbing":
            return Created(DubbingCreated.model_validate(data).dubbing_id, header_id, data)
        accepted = SttAccepted.model_validate(data)
    except ValidationError:
        raise to_error("create", status_code, body, headers) from None
    task_id = accepted.transcription_id or accepted.request_id
    if not task_id:
        raise to_error("create", status_code, body, headers)
    return Created(task_id, accepted.request_id or header_id, data)


def audio_url(base_url: str, dubbing_id: str, language: str) -> str:
    """The download endpoint of one dubbed language (needs the ``xi-api-key`` header)."""
    dub, lang = quote(dubbing_id, safe=""), quote(language, safe="")
    return f"{base_url.rstrip('/')}/v1/dubbing/{dub}/audio/{lang}"


def parse_dubbing(
    status_code: int,
    body: str | bytes | None,
    headers: Mapping[str, str] | None = None,
    *,
    base_url: str = "https://api.elevenlabs.io",
    task_id: str | None = None,
) -> PollResult:
    """One ``GET /v1/dubbing/{id}`` answer; ``dubbed`` gives a download URL per target language."""
    if status_code == 404:
        return PollResult(status=PollStatus.NOT_FOUND, raw_status="404")
    if not 200 <= status_code < 300:
        raise to_error("read", status_code, body, headers)
    data, wrapped_id = unwrap_sdk(_json(body))
    try:
        dubbing = Dubbing.model_validate(data)
    except ValidationError:
        raise to_error("read", status_code, body, headers) from None
    dubbing_id = dubbing.dubbing_id or task_id
    name = dubbing.name or ""
    common: dict[str, Any] = {
        "raw_status": dubbing.status,
        "request_id": wrapped_id or _header(headers, *_REQUEST_ID_HEADERS),
        "planted_job_id": name.removeprefix(JOB_NAME_PREFIX)
        if name.startswith(JOB_NAME_PREFIX)
        else None,
        "raw": data,
    }
    if dubbing.status in _RUNNING:
        return PollResult(status=PollStatus.RUNNING, **common)
    if dubbing.status == "dubbed":
        if not dubbing_id:
            raise to_error("read", status_code, body, headers)
        media_type = (dubbing.media_metadata or {}).get("content_type")
        outputs = tuple(
            Output(
                url=audio_url(base_url, dubbing_id, lang),
                media_type=media_type if isinstance(media_type, str) else None,
            )
            for lang in dubbing.target_languages
        )
        return PollResult(status=PollStatus.SUCCEEDED, outputs=outputs, **common)
    if dubbing.status == "failed":
        error = dubbing.error
        message = error if isinstance(error, str) else (json.dumps(error) if error else None)
        return PollResult(status=PollStatus.FAILED, error_message=message, **common)
    return PollResult(status=PollStatus.UNKNOWN, **common)


def parse_transcript(
    status_code: int, body: str | bytes | None, headers: Mapping[str, str] | None = None
) -> PollResult:
    """One ``GET /v1/speech-to-text/transcripts/{id}`` answer: the transcript JSON as one Output."""
    if status_code == 404:
        return PollResult(status=PollStatus.NOT_FOUND, raw_status="404")
    if not 200 <= status_code < 300:
        raise to_error("read", status_code, body, headers)
    data, wrapped_id = unwrap_sdk(_json(body))
    if not isinstance(data, Mapping) or not ({"text", "transcripts"} & set(data)):
        raise to_error("read", status_code, body, headers)
    return PollResult(
        status=PollStatus.SUCCEEDED,
        outputs=(Output(text=json.dumps(data), media_type="application/json"),),
        raw_status="done",
        request_id=wrapped_id or _header(headers, *_REQUEST_ID_HEADERS),
        raw=data,
    )


# --- sync calls -------------------------------------------------------------------------------

ResponseKind = Literal["audio", "json", "previews"]


@dataclass(frozen=True)
class SyncCall:
    """One sync request, built purely from ``(model, input)``."""

    path: str
    kind: ResponseKind
    json: dict[str, Any] | None = None
    form: FormParts | None = None
    params: dict[str, str] = field(default_factory=dict)


def build_sync(model: str, input: Mapping[str, Any]) -> SyncCall:
    """Dispatch a sync model string (see the module docstring) to its request."""
    head, _, rest = model.partition(":")
    body = {k: v for k, v in input.items() if k not in _QUERY_KEYS}
    params = {k: _form_value(input[k]) for k in _QUERY_KEYS if input.get(k) is not None}
    if head == "tts":
        voice_id, _, model_id = rest.partition(":")
        if not voice_id:
            raise InvalidParam("tts model must be tts:<voice_id>[:<model_id>]", param="model")
        if model_id:
            body["model_id"] = model_id
        return SyncCall(
            f"/v1/text-to-speech/{quote(voice_id, safe='')}", "audio", json=body, params=params
        )
    if head == "sound-effects":
        if rest:
            body["model_id"] = rest
        return SyncCall("/v1/sound-generation", "audio", json=body, params=params)
    if head == "stt":
        body.pop("webhook", None)  # a sync call must get the transcript, not an acknowledgement
        if rest:
            body["model_id"] = rest
        if not body.get("model_id"):
            raise InvalidParam(
                "stt needs a model_id (stt:<model_id> or input.model_id)", param="model_id"
            )
        return SyncCall("/v1/speech-to-text", "json", form=form_parts(body), params=params)
    if head == "voice-design":
        if rest:
            body["model_id"] = rest
        return SyncCall("/v1/text-to-voice/design", "previews", json=body, params=params)
    simple: dict[str, tuple[str, bool]] = {
        "voice-clone": ("/v1/voices/add", True),
        "voice-create": ("/v1/text-to-voice", False),
        "forced-alignment": ("/v1/forced-alignment", True),
    }
    if head in simple and not rest:
        path, multipart = simple[head]
        if multipart:
            return SyncCall(path, "json", form=form_parts(body), params=params)
        return SyncCall(path, "json", json=body, params=params)
    raise InvalidParam(f"unknown elevenlabs sync model {model!r}", param="model")


def parse_sync(
    kind: ResponseKind,
    status_code: int,
    body: bytes | str | None,
    headers: Mapping[str, str] | None = None,
) -> SyncResult:
    """A sync answer as outputs: audio bytes, a JSON document, or decoded voice previews."""
    if not 200 <= status_code < 300:
        raise to_error("sync", status_code, body, headers)
    request_id = _header(headers, *_REQUEST_ID_HEADERS)
    if kind == "audio":
        content = body.encode() if isinstance(body, str) else body
        content_type = (_header(headers, "content-type") or "audio/mpeg").split(";")[0].strip()
        if not content or content_type == "application/json":
            raise to_error("sync", status_code, body, headers)
        return SyncResult((Output(data=content, media_type=content_type),), request_id)
    data, _ = unwrap_sdk(_json(body))
    if not isinstance(data, Mapping):
        raise to_error("sync", status_code, body, headers)
    if kind == "json":
        return SyncResult(
            (Output(text=json.dumps(data), media_type="application/json"),), request_id, raw=data
        )
    try:
        design = VoiceDesign.model_validate(data)
        outputs = tuple(
            Output(data=base64.b64decode(p.audio_base_64), media_type=p.media_type or "audio/mpeg")
            for p in design.previews
        )
    except (ValidationError, binascii.Error, ValueError):
        raise to_error("sync", status_code, body, headers) from None
    # Keep the generated voice ids for the platform, without megabytes of base64 on the row.
    raw = {**data, "previews": [p.model_dump(exclude={"audio_base_64"}) for p in design.previews]}
    return SyncResult(outputs, request_id, raw=raw)


# --- I/O --------------------------------------------------------------------------------------


def _http(
    settings: Settings,
    session: requests.Session | None,
    read_timeout: float,
    sleep: Callable[[float], None],
    read_retries: int,
) -> HttpClient:
    return HttpClient(
        settings.elevenlabs_base_url,
        headers={"xi-api-key": settings.elevenlabs_api_key},
        session=session,
        connect_timeout=settings.connect_timeout,
        read_timeout=read_timeout,
        read_retries=read_retries,
        sleep=sleep,
    )


class ElevenLabsAsyncClient:
    """Dubbing and webhook-mode speech-to-text (an :class:`AsyncProvider`)."""

    name = "elevenlabs-async"

    def __init__(
        self,
        settings: Settings,
        session: requests.Session | None = None,
        *,
        sleep: Callable[[float], None] = time.sleep,
        read_retries: int = 3,
    ) -> None:
        self.api_key = settings.elevenlabs_api_key
        self.max_bytes = settings.media_max_bytes
        self.http = _http(settings, session, settings.read_timeout, sleep, read_retries)

    def create(self, request: CreateRequest) -> Created:
        operation, _ = async_operation(request.model)
        path, parts = build_create(request)
        try:
            response = self.http.send_once("POST", path, files=parts)
        except requests.RequestException as exc:
            raise to_error("create", exc=exc) from exc
        return parse_create(
            response.status_code, response.content, response.headers, operation=operation
        )

    def poll(self, task_id: str, *, model: str | None = None) -> PollResult:
        operation, _ = async_operation(model)
        quoted = quote(task_id, safe="")
        if operation == "speech-to-text":
            response = self.http.read("GET", f"/v1/speech-to-text/transcripts/{quoted}")
            return parse_transcript(response.status_code, response.content, response.headers)
        response = self.http.read("GET", f"/v1/dubbing/{quoted}")
        return parse_dubbing(
            response.status_code,
            response.content,
            response.headers,
            base_url=self.http.base_url,
            task_id=task_id,
        )

    def cancel(self, task_id: str, *, model: str | None = None) -> bool:
        # Dubbing v1 only has DELETE (which destroys the project) and STT has nothing: no cancel.
        return False

    def find_created(self, job_id: str, created_after: datetime) -> ListedTask | None:
        return None  # no listing we can match a job id against

    def media_headers(self, url: str | None = None) -> dict[str, str]:
        """Headers the media fetcher must send for a dubbing download URL.

        Given a ``url``, the key is returned only for this client's own API host, so it never
        leaks to another host.
        """
        if url is not None and not url.startswith(self.http.base_url + "/"):
            return {}
        return {"xi-api-key": self.api_key}

    def download_audio(self, dubbing_id: str, language: str) -> bytes:
        """The dubbed media of one language.

        Raises MediaFetchFailed (retryable) on 425 Too Early — the dubbing is not finished yet,
        so retrying later is right — and MediaExpired on 403/404 (gone, or no such language).
        """
        url = audio_url(self.http.base_url, dubbing_id, language)
        try:
            response = self.http.read("GET", url, stream=True)
        except ReadFailed as exc:
            raise MediaFetchFailed(str(exc)) from exc
        with response:
            if response.status_code == 425:
                raise MediaFetchFailed("dubbing not finished yet (425 Too Early)")
            if response.status_code in (403, 404):
                raise MediaExpired(f"dubbing audio unavailable (HTTP {response.status_code})")
            if not 200 <= response.status_code < 300:
                raise MediaFetchFailed(
                    f"dubbing audio download answered HTTP {response.status_code}"
                )
            chunks, size = [], 0
            for chunk in response.iter_content(64 * 1024):
                size += len(chunk)
                if size > self.max_bytes:
                    raise MediaTooLarge(f"dubbing audio exceeds {self.max_bytes} bytes")
                chunks.append(chunk)
            return b"".join(chunks)


class ElevenLabsSyncClient:
    """TTS, sound effects, STT, voice clone/design, forced alignment (a :class:`SyncProvider`)."""

    name = "elevenlabs-sync"

    def __init__(
        self,
        settings: Settings,
        session: requests.Session | None = None,
        *,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.http = _http(settings, session, settings.sync_read_timeout, sleep, 0)
        self.deadline = deadline.sync_seconds(settings)  # connect + every read (DESIGN §5.8)
        deadline.prepare(self.http.session, self.http.base_url)

    def call(self, model: str, input: Mapping[str, Any]) -> SyncResult:
        request = build_sync(model, input)
        try:
            # Sync calls are billed work: one attempt; the platform's request decides on retries.
            with deadline.bounded(self.deadline):
                response = self.http.send_once(
                    "POST",
                    request.path,
                    json=request.json,
                    files=request.form,
                    params=request.params or None,
                )
        except requests.RequestException as exc:
            raise to_error("sync", exc=exc) from exc
        return parse_sync(request.kind, response.status_code, response.content, response.headers)


def async_client(
    settings: Settings, session: requests.Session | None = None
) -> ElevenLabsAsyncClient:
    """Factory for the ``elevenlabs-async`` kind."""
    return ElevenLabsAsyncClient(settings, session)


def sync_client(
    settings: Settings, session: requests.Session | None = None
) -> ElevenLabsSyncClient:
    """Factory for the ``elevenlabs-sync`` kind."""
    return ElevenLabsSyncClient(settings, session)
