"""``kie-llm``: the KIE-proxied chat models, one synchronous OpenAI-style call."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

import requests

from ...errors import InvalidParam, SyncCallFailed
from ...settings import Settings
from .. import deadline
from ..base import Output, SyncResult
from ..http import _chat_body
from ._common import Headers, decode, error_for, http_client

# kie-llm: KIE serves each chat model under its own path, ``POST /{model}/v1/chat/completions``
# (docs.kie.ai/market/chat/gemini: ``https://api.kie.ai/gemini-3-pro/v1/chat/completions``), with
# an OpenAI-style body and ``choices[0].message.content`` in the answer. The model stays in the
# body too: OpenAI-compatible gateways read it there, and KIE ignores it.
LLM_CHAT_PATH = "/{model}/v1/chat/completions"


def parse_chat(status_code: int, body: Any, headers: Headers = None) -> SyncResult:
    """An OpenAI-style chat completion through KIE → SyncResult; else SyncCallFailed."""
    answer = decode(status_code, body, headers)
    payload = answer.mapping or {}
    if "choices" not in payload:  # an envelope error (even under HTTP 200) or an HTTP error
        error = error_for(answer, "sync")
        if error is not None:
            raise error
    choices = payload.get("choices")
    first = choices[0] if isinstance(choices, list) and choices else None
    message = first.get("message") if isinstance(first, Mapping) else None
    content = message.get("content") if isinstance(message, Mapping) else None
    if isinstance(content, list):  # content parts: keep every text part
        content = "".join(p["text"] for p in content
                          if isinstance(p, Mapping) and isinstance(p.get("text"), str))
    if not isinstance(content, str):
        raise SyncCallFailed(f"KIE chat: HTTP {status_code} without choices[0].message.content",
                             status=status_code, request_id=answer.request_id, body=answer.raw)
    return SyncResult(outputs=(Output(text=content, media_type="text/plain"),),
                      request_id=answer.request_id, raw=answer.mapping)


class KieLlmClient:
    """A SyncProvider for ``kie-llm``: one chat call, never retried (the request decides)."""

    name = "kie-llm"

    def __init__(self, settings: Settings, session: requests.Session | None = None) -> None:
        self.http = http_client(settings, session, read_timeout=settings.sync_read_timeout,
                          sleep=time.sleep)
        self.deadline = deadline.sync_seconds(settings)  # connect + every read (threshold − 60 s)
        deadline.prepare(self.http.session, self.http.base_url)

    def call(self, model: str, input: Mapping[str, Any]) -> SyncResult:
        # ``stream`` is dropped: a sync call reads one JSON body. ``prompt`` is a convenience.
        if not model.strip("/"):
            raise InvalidParam("kie-llm needs a model (it names the chat path)", param="model")
        body = _chat_body(model, input)
        path = LLM_CHAT_PATH.format(model=quote(model, safe=""))
        response = deadline.send_sync(self.http, "KIE chat", self.deadline, "POST", path,
                                      json=body)
        return parse_chat(response.status_code, response.content, response.headers)


def llm_client(settings: Settings, session: requests.Session | None = None) -> KieLlmClient:
    return KieLlmClient(settings, session)
