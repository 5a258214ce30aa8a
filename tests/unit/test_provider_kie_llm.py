"""The kie-llm sync client: an OpenAI-style completion posted to the model's own path is
the text output; every failed answer is a SyncCallFailed with the sync row's code, sent once; no
model is refused before sending.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
import requests
import responses

from reconcile.errors import ErrorCode, InvalidParam, SyncCallFailed
from reconcile.providers import kie
from tests.unit._kie_helpers import BASE, SETTINGS

# ------------------------------------------------------------------ kie-llm (sync)

# KIE serves each chat model under its own path (docs.kie.ai/market/chat/gemini)
CHAT = re.compile(re.escape(BASE) + r"/[^/]+/v1/chat/completions")


def llm() -> kie.KieLlmClient:
    return kie.llm_client(SETTINGS, requests.Session())


@responses.activate
def test_llm_call_returns_the_text() -> None:
    """An OpenAI-style completion's choices[0].message.content is the text output."""
    responses.post(CHAT, json={"id": "chatcmpl-1", "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "hello"}}]})
    result = llm().call("gemini-2.5-flash", {"prompt": "hi"})
    sent = responses.calls[0].request
    assert json.loads(sent.body) == {"model": "gemini-2.5-flash",
                                     "messages": [{"role": "user", "content": "hi"}]}
    assert sent.req_kwargs["timeout"] == (3.0, 99.0)
    assert result.outputs[0].text == "hello"
    assert result.outputs[0].media_type == "text/plain"


@pytest.mark.parametrize(
    ("status", "body", "code"),
    [
        (200, {"code": 422, "msg": "bad"}, ErrorCode.UPSTREAM_INVALID_INPUT),
        (200, {"code": 401, "msg": "key"}, ErrorCode.UPSTREAM_SUBMISSION_FAILED),
        (200, {"code": 429, "msg": "slow"}, ErrorCode.UPSTREAM_RATE_LIMITED),
        (200, {"code": 500, "msg": "boom"}, ErrorCode.UPSTREAM_FAILED),
        (400, {"error": {"message": "bad"}}, ErrorCode.UPSTREAM_INVALID_INPUT),
        (429, {"error": {"message": "slow"}}, ErrorCode.UPSTREAM_RATE_LIMITED),
        (503, "unavailable", ErrorCode.UPSTREAM_FAILED),
        (200, "not json", ErrorCode.UPSTREAM_FAILED),
        (200, {"choices": []}, ErrorCode.UPSTREAM_FAILED),
    ],
)
@responses.activate
def test_llm_failures_map_to_sync_codes_and_are_never_retried(
    status: int, body: Any, code: ErrorCode
) -> None:
    """Every failed LLM answer is a SyncCallFailed with the sync row's code, sent once."""
    kwargs = {"json": body} if isinstance(body, dict) else {"body": body}
    responses.post(CHAT, status=status, **kwargs)
    with pytest.raises(SyncCallFailed) as info:
        llm().call("gemini-2.5-flash", {"messages": [{"role": "user", "content": "x"}]})
    assert info.value.code is code
    assert len(responses.calls) == 1


@responses.activate
def test_llm_posts_to_the_models_own_path() -> None:
    """kie-llm calls ``POST /{model}/v1/chat/completions`` (docs.kie.ai/market/chat/gemini shows
    ``https://api.kie.ai/gemini-3-pro/v1/chat/completions``), not a shared chat path."""
    responses.post(f"{BASE}/gemini-3-pro/v1/chat/completions", json={"choices": [
        {"index": 0, "message": {"role": "assistant", "content": "hello,can i help you?"}}]})
    result = llm().call("gemini-3-pro", {"prompt": "hi"})
    assert responses.calls[0].request.url == f"{BASE}/gemini-3-pro/v1/chat/completions"
    assert result.outputs[0].text == "hello,can i help you?"


def test_llm_without_a_model_is_refused_before_sending() -> None:
    """No model, no path: refused as an invalid parameter, nothing is sent."""
    with pytest.raises(InvalidParam):
        llm().call("", {"prompt": "hi"})
