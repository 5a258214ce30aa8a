"""ElevenLabs' async families: dubbing and webhook-mode speech-to-text (an AsyncProvider).

* ``dubbing`` (or empty) — ``POST /v1/dubbing`` (multipart) → ``dubbing_id``; poll
  ``GET /v1/dubbing/{id}``. ``name`` is always ``reconcile-job:<job_id>`` (the binding the
  webhook and the read echo; submit refuses an input that sets it).
* ``speech-to-text[:<model_id>]`` / ``stt[:<model_id>]`` — ``POST /v1/speech-to-text`` with
  ``webhook=true`` and ``webhook_metadata={"job_id": …}`` (the planted id the webhook echoes).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any, Literal
from urllib.parse import quote

import requests
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ...errors import InvalidParam, MediaExpired, MediaFetchFailed, MediaTooLarge, ReadFailed
from ...settings import Settings
from ..base import Created, CreateRequest, ListedTask, Output, PollResult, PollStatus, unwrap_sdk
from ..deadline import bounded
from ..http import body_json as _json, header_value as _header, send_create
from ..outcome import validated
from ._common import (
    _REQUEST_ID_HEADERS,
    JOB_NAME_PREFIX,
    FormParts,
    form_parts,
    http_client,
    to_error,
)

AsyncOperation = Literal["dubbing", "speech-to-text"]
_RUNNING = frozenset({"queued", "preparing", "dubbing"})


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
        fields["name"] = f"{JOB_NAME_PREFIX}{request.job_id}"  # ours, never the input's
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
    dubbing, data, wrapped_id = validated("read", Dubbing, status_code, body, headers, to_error)
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
        self.media_timeout = float(settings.media_timeout)
        self.http = http_client(settings, session, settings.read_timeout, sleep, read_retries)

    def create(self, request: CreateRequest) -> Created:
        operation, _ = async_operation(request.model)
        path, parts = build_create(request)
        response = send_create(self.http, to_error, "POST", path, files=parts)
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
        """The dubbed media of one language, within ``MEDIA_TIMEOUT`` from connect to the last
        byte (:mod:`..deadline`'s watchdog: a trickled body cannot stretch it).

        Raises MediaFetchFailed (retryable) on 425 Too Early — the dubbing is not finished yet,
        so retrying later is right — on a broken body or the deadline, and MediaExpired on
        403/404 (gone, or no such language).
        """
        url = audio_url(self.http.base_url, dubbing_id, language)
        try:
            with bounded(self.media_timeout):
                return self._download(url)
        except requests.RequestException as exc:  # the total deadline passed, or the body broke
            raise MediaFetchFailed(f"dubbing audio download failed: {exc}") from exc

    def _download(self, url: str) -> bytes:
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


def async_client(
    settings: Settings, session: requests.Session | None = None
) -> ElevenLabsAsyncClient:
    """Factory for the ``elevenlabs-async`` kind."""
    return ElevenLabsAsyncClient(settings, session)
