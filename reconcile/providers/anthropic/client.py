"""Internal: the library's own mechanics, not an import path for platforms (may move).

Anthropic Messages API as a :class:`~reconcile.providers.base.SyncProvider` (Anthropic's API docs).

A sync kind: the answer arrives in one request and nothing can be looked up later, so every
failure is a :class:`SyncCallFailed` with the outcome table's sync code, and the call is never retried
here (the platform's request decides). :func:`error_for` is the one place an answer becomes an
error; :func:`parse_message` is pure.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import requests
from pydantic import BaseModel, ConfigDict, ValidationError

from ...errors import ErrorCode, SyncCallFailed, bounded
from ...settings import Settings
from .. import deadline
from ..base import Output, SyncResult
from ..http import HttpClient, _chat_body, parse_retry_after

__all__ = ["AnthropicClient", "Message", "code_for", "error_for", "parse_message", "sync_client"]

ANTHROPIC_VERSION = "2023-06-01"
MESSAGES_PATH = "/v1/messages"
# The API requires max_tokens; a platform that cares passes its own in the input.
DEFAULT_MAX_TOKENS = 4096
# An error body can arrive under HTTP 200 (a proxy, or a mid-stream error event): its type says
# which HTTP status it stands for.
ERROR_TYPE_STATUS = {
    "invalid_request_error": 400, "authentication_error": 401, "billing_error": 402,
    "permission_error": 403, "not_found_error": 404, "request_too_large": 413,
    "rate_limit_error": 429, "api_error": 500, "timeout_error": 504, "overloaded_error": 529,
}


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore")


class ContentBlock(_Model):
    type: str | None = None
    text: str | None = None


class Message(_Model):
    id: str | None = None
    type: str | None = None
    model: str | None = None
    content: list[ContentBlock]
    stop_reason: str | None = None


class ApiError(_Model):
    type: str | None = None
    message: str | None = None


class ErrorBody(_Model):
    type: str | None = None
    error: ApiError | None = None
    request_id: str | None = None


def code_for(status_code: int) -> ErrorCode:
    """The outcome table's sync rows for an HTTP status (transport failures: the client)."""
    if status_code in (400, 422):
        return ErrorCode.UPSTREAM_INVALID_INPUT
    if status_code == 429:
        return ErrorCode.UPSTREAM_RATE_LIMITED
    if 400 <= status_code < 500:
        return ErrorCode.UPSTREAM_SUBMISSION_FAILED
    return ErrorCode.UPSTREAM_FAILED  # 5xx, 529 overloaded, anything else


def _decode(body: Any) -> tuple[Any, str | None]:
    if isinstance(body, bytes | bytearray | str):
        raw = bounded(bytes(body) if isinstance(body, bytearray) else body)
        try:
            return json.loads(body), raw
        except (ValueError, RecursionError):
            return None, raw
    return body, bounded(json.dumps(body, default=str))


def _lower(headers: Mapping[str, str] | None) -> dict[str, Any]:
    return {str(k).lower(): v for k, v in (headers or {}).items()}


def error_for(status_code: int, body: Any, headers: Mapping[str, str] | None = None
              ) -> SyncCallFailed | None:
    """THE one place an Anthropic answer becomes an error; None for a usable 2xx message."""
    payload, raw = _decode(body)
    lowered = _lower(headers)
    error_body = None
    if isinstance(payload, Mapping) and (payload.get("type") == "error" or "error" in payload):
        try:
            error_body = ErrorBody.model_validate(payload)
        except ValidationError:
            error_body = None
    status = status_code
    if 200 <= status_code < 300:
        if error_body is None or error_body.error is None:
            return None
        status = ERROR_TYPE_STATUS.get(error_body.error.type or "", 500)
    header_id = lowered.get("request-id")
    request_id = header_id if isinstance(header_id, str) and header_id else (
        error_body.request_id if error_body else None)
    api_error = error_body.error if error_body else None
    retry_after = lowered.get("retry-after")
    return SyncCallFailed(
        f"Anthropic: HTTP {status_code}"
        + (f", {api_error.type}: {api_error.message}" if api_error else ""),
        code=code_for(status), status=status_code,
        provider_code=api_error.type if api_error else None, request_id=request_id, body=raw,
        retry_after=parse_retry_after(retry_after) if isinstance(retry_after, str) else None,
    )


def parse_message(status_code: int, body: Any, headers: Mapping[str, str] | None = None
                  ) -> SyncResult:
    """A ``POST /v1/messages`` answer → SyncResult with the text; else SyncCallFailed."""
    error = error_for(status_code, body, headers)
    if error is not None:
        raise error
    payload, raw = _decode(body)
    header_id = _lower(headers).get("request-id")
    body_id = payload.get("request_id") if isinstance(payload, Mapping) else None
    request_id = next((v for v in (header_id, body_id) if isinstance(v, str) and v), None)
    try:
        message = Message.model_validate(payload)
    except ValidationError:
        # A 2xx we cannot read: the call may have been billed, but a sync kind has nothing to
        # look up later, so it fails (and refunds) like any other failed call.
        raise SyncCallFailed(f"Anthropic: HTTP {status_code} is not a message",
                             status=status_code, request_id=request_id, body=raw) from None
    texts = [block.text for block in message.content if block.type == "text" and block.text]
    outputs = (Output(text="".join(texts), media_type="text/plain"),) if texts else ()
    # Usage is in tokens; the platform prices the job, so no USD cost is invented here.
    return SyncResult(outputs=outputs, request_id=request_id, raw=payload)


class AnthropicClient:
    """One ``POST /v1/messages`` per call: explicit timeouts, never retried."""

    name = "anthropic"

    def __init__(self, settings: Settings, session: requests.Session | None = None) -> None:
        self.http = HttpClient(
            settings.anthropic_base_url,
            headers={"x-api-key": settings.anthropic_api_key,
                     "anthropic-version": ANTHROPIC_VERSION, "content-type": "application/json"},
            session=session, connect_timeout=settings.connect_timeout,
            read_timeout=settings.sync_read_timeout,
        )
        self.deadline = deadline.sync_seconds(settings)  # connect + every read (threshold − 60 s)
        deadline.prepare(self.http.session, self.http.base_url)

    def call(self, model: str, input: Mapping[str, Any]) -> SyncResult:
        body = _chat_body(model, input, max_tokens=DEFAULT_MAX_TOKENS)
        response = deadline.send_sync(self.http, "Anthropic", self.deadline, "POST",
                                      MESSAGES_PATH, json=body)
        return parse_message(response.status_code, response.content, response.headers)


def sync_client(settings: Settings, session: requests.Session | None = None) -> AnthropicClient:
    return AnthropicClient(settings, session)
