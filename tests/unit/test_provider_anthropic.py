"""Anthropic Messages client: the text answer, the sync outcome rows, no retries.

What every provider family does alike (``run`` reporting the task before the first poll,
transport failures on create, read retries, ReadFailed) is ``tests/integration/
test_provider_contract.py``, once for every family; this file keeps what only this provider does.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import requests
import responses
from hypothesis import given, settings, strategies as st

from reconcile import Settings
from reconcile.errors import ErrorCode, ReconcileError, SyncCallFailed
from reconcile.providers import anthropic

BASE = "https://anthropic.test"
URL = f"{BASE}/v1/messages"
SETTINGS = Settings(anthropic_base_url=BASE, anthropic_api_key="sk-ant", connect_timeout=2.0,
                    sync_read_timeout=120.0)
MESSAGE = {
    "id": "msg_01", "type": "message", "role": "assistant", "model": "claude-x",
    "content": [{"type": "text", "text": "Hello"}, {"type": "text", "text": ", world"}],
    "stop_reason": "end_turn", "stop_sequence": None,
    "usage": {"input_tokens": 12, "output_tokens": 34},
}


def error(kind: str, message: str = "nope", request_id: str = "req_body") -> dict[str, Any]:
    return {"type": "error", "error": {"type": kind, "message": message}, "request_id": request_id}


def client() -> anthropic.AnthropicClient:
    return anthropic.sync_client(SETTINGS, requests.Session())


@responses.activate
def test_call_sends_the_documented_request_and_returns_the_text() -> None:
    """POST /v1/messages with x-api-key and anthropic-version; text blocks → one text output."""
    responses.post(URL, json=MESSAGE, headers={"request-id": "req_HdR_1"})
    result = client().call("claude-x", {"messages": [{"role": "user", "content": "hi"}],
                                        "max_tokens": 50, "stream": True})
    sent = responses.calls[0].request
    assert sent.headers["x-api-key"] == "sk-ant"
    assert sent.headers["anthropic-version"] == "2023-06-01"
    assert sent.req_kwargs["timeout"] == (2.0, 120.0)
    assert json.loads(sent.body) == {"model": "claude-x", "max_tokens": 50,
                                     "messages": [{"role": "user", "content": "hi"}]}
    assert [(o.text, o.media_type) for o in result.outputs] == [("Hello, world", "text/plain")]
    assert result.request_id == "req_HdR_1"
    assert result.cost_usd is None  # tokens are not dollars: the platform prices the job


@responses.activate
def test_prompt_shorthand_and_default_max_tokens() -> None:
    """A bare prompt becomes one user message, with the default max_tokens."""
    responses.post(URL, json=MESSAGE)
    client().call("claude-x", {"prompt": "hi", "system": "be brief"})
    body = json.loads(responses.calls[0].request.body)
    assert body == {"model": "claude-x", "system": "be brief",
                    "max_tokens": anthropic.DEFAULT_MAX_TOKENS,
                    "messages": [{"role": "user", "content": "hi"}]}


def test_non_text_blocks_are_not_outputs() -> None:
    """Only text blocks become the text output; a tool-only answer has no output."""
    tool_only = MESSAGE | {"content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]}
    assert anthropic.parse_message(200, tool_only, {}).outputs == ()


@pytest.mark.parametrize(
    ("status", "kind", "code"),
    [
        (400, "invalid_request_error", ErrorCode.UPSTREAM_INVALID_INPUT),
        (422, "invalid_request_error", ErrorCode.UPSTREAM_INVALID_INPUT),
        (401, "authentication_error", ErrorCode.UPSTREAM_SUBMISSION_FAILED),
        (402, "billing_error", ErrorCode.UPSTREAM_SUBMISSION_FAILED),
        (403, "permission_error", ErrorCode.UPSTREAM_SUBMISSION_FAILED),
        (404, "not_found_error", ErrorCode.UPSTREAM_SUBMISSION_FAILED),
        (413, "request_too_large", ErrorCode.UPSTREAM_SUBMISSION_FAILED),
        (429, "rate_limit_error", ErrorCode.UPSTREAM_RATE_LIMITED),
        (500, "api_error", ErrorCode.UPSTREAM_FAILED),
        (504, "timeout_error", ErrorCode.UPSTREAM_FAILED),
        (529, "overloaded_error", ErrorCode.UPSTREAM_FAILED),
    ],
)
@responses.activate
def test_error_answers_map_to_sync_codes_and_are_sent_once(
    status: int, kind: str, code: ErrorCode
) -> None:
    """Each documented error status is a SyncCallFailed with the sync row's code, never retried."""
    responses.post(URL, status=status, json=error(kind))
    with pytest.raises(SyncCallFailed) as info:
        client().call("claude-x", {"prompt": "x"})
    assert info.value.code is code
    assert info.value.status == status
    assert info.value.provider_code == kind
    assert info.value.request_id == "req_body"
    assert len(responses.calls) == 1


@responses.activate
def test_rate_limit_keeps_retry_after_and_header_request_id() -> None:
    """A 429 keeps Retry-After and the request-id header exactly as returned."""
    responses.post(URL, status=429, json=error("rate_limit_error"),
                   headers={"retry-after": "30", "request-id": "req_Hdr"})
    with pytest.raises(SyncCallFailed) as info:
        client().call("claude-x", {"prompt": "x"})
    assert info.value.retry_after == 30.0
    assert info.value.request_id == "req_Hdr"


def test_an_error_body_under_http_200_is_a_failure() -> None:
    """An error object under HTTP 200 is classified by its error type."""
    with pytest.raises(SyncCallFailed) as info:
        anthropic.parse_message(200, error("overloaded_error"), {})
    assert info.value.code is ErrorCode.UPSTREAM_FAILED
    with pytest.raises(SyncCallFailed) as info:
        anthropic.parse_message(200, error("invalid_request_error"), {})
    assert info.value.code is ErrorCode.UPSTREAM_INVALID_INPUT


@pytest.mark.parametrize("body", [b"<html>", b"", b"[]", json.dumps({"id": "msg"}).encode()])
def test_an_unreadable_2xx_is_a_failure(body: bytes) -> None:
    """A 2xx that is not a message fails (a sync kind has nothing to look up later)."""
    with pytest.raises(SyncCallFailed) as info:
        anthropic.parse_message(200, body, {})
    assert info.value.code is ErrorCode.UPSTREAM_FAILED


@pytest.mark.parametrize("status", [502, 503])
def test_a_non_json_5xx_is_upstream_failed(status: int) -> None:
    """A gateway 5xx without an error body is UPSTREAM_FAILED with the body kept."""
    with pytest.raises(SyncCallFailed) as info:
        anthropic.parse_message(status, b"<html>bad gateway</html>", {})
    assert info.value.code is ErrorCode.UPSTREAM_FAILED
    assert info.value.body == "<html>bad gateway</html>"


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
)
shaped = st.dictionaries(
    st.sampled_from(["type", "error", "content", "request_id", "id", "model", "text"]),
    json_values, max_size=5)
bodies = st.one_of(json_values, shaped, json_values.map(lambda v: json.dumps(v).encode()),
                   st.binary(max_size=40))


@settings(deadline=None, max_examples=300)
@given(body=bodies, status=st.sampled_from([200, 400, 429, 500, 529]))
def test_parse_raises_only_library_errors_on_arbitrary_json(body: Any, status: int) -> None:
    """parse_message and error_for either return or raise a ReconcileError, whatever the JSON."""
    for parse in (anthropic.parse_message, anthropic.error_for):
        try:
            parse(status, body, {"retry-after": "soon", "request-id": "r"})
        except ReconcileError:
            pass
