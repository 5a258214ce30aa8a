"""What ElevenLabs' async and sync calls share: the error body and :func:`to_error` (the one place
an answer becomes an exception), multipart form parts, and the HTTP plumbing."""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable, Mapping
from typing import Any

import requests
from pydantic import BaseModel, ConfigDict, ValidationError

from ...errors import InvalidParam
from ...settings import Settings
from ..base import JOB_REF_PREFIX
from ..http import HttpClient, provider_http
from ..outcome import make_to_error

JOB_NAME_PREFIX = JOB_REF_PREFIX  # a dubbing is named reconcile-job:<job id>
_QUERY_KEYS = ("output_format", "enable_logging", "optimize_streaming_latency")
_REQUEST_ID_HEADERS = ("request-id", "x-request-id")
FormParts = list[tuple[str, tuple[str | None, bytes | str]]]


class ApiErrorDetail(BaseModel):
    """``detail``: ``{type, code, message, request_id}`` or legacy ``{status, message}``."""

    model_config = ConfigDict(extra="allow")

    type: str | None = None
    code: str | None = None
    status: str | None = None
    message: str | None = None
    request_id: str | None = None


def _describe(body: Any, headers: Mapping[str, str] | None = None) -> tuple[str | None, str | None, str | None, bool]:
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


# The one place an ElevenLabs answer (or a transport failure) becomes an exception.
to_error = make_to_error("elevenlabs", describe=_describe, request_id_headers=_REQUEST_ID_HEADERS)


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


def http_client(
    settings: Settings,
    session: requests.Session | None,
    read_timeout: float,
    sleep: Callable[[float], None],
    read_retries: int,
) -> HttpClient:
    return provider_http(settings.elevenlabs_base_url, {"xi-api-key": settings.elevenlabs_api_key},
                         settings, session, read_timeout=read_timeout, read_retries=read_retries,
                         sleep=sleep)
