"""ElevenLabs' sync calls (a SyncProvider): TTS, sound effects, STT, voice clone/design/create,
forced alignment — one attempt each, the platform's request decides on retries."""

from __future__ import annotations

import base64
import binascii
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import quote

import requests
from pydantic import BaseModel, ConfigDict, ValidationError

from ...errors import InvalidParam
from ...settings import Settings
from .. import deadline
from ..base import Output, SyncResult, unwrap_sdk
from ..http import body_json as _json, header_value as _header
from ._common import (
    _QUERY_KEYS,
    _REQUEST_ID_HEADERS,
    FormParts,
    _form_value,
    form_parts,
    http_client,
    to_error,
)

ResponseKind = Literal["audio", "json", "previews"]


class Preview(BaseModel):
    model_config = ConfigDict(extra="allow")

    audio_base_64: str
    generated_voice_id: str | None = None
    media_type: str | None = None


class VoiceDesign(BaseModel):
    model_config = ConfigDict(extra="allow")

    previews: list[Preview]


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
        self.http = http_client(settings, session, settings.sync_read_timeout, sleep, 0)
        self.deadline = deadline.sync_seconds(settings)  # connect + every read (threshold − 60 s)
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


def sync_client(
    settings: Settings, session: requests.Session | None = None
) -> ElevenLabsSyncClient:
    """Factory for the ``elevenlabs-sync`` kind."""
    return ElevenLabsSyncClient(settings, session)
