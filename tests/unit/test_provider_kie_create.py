"""KIE.ai creates: the request body each API gets (the job id only in callBackUrl, never
replaced by the input's), and the classification of every answer — the envelope code decides
even under HTTP 200, the HTTP status without an envelope; rate limits carry Retry-After; a 2xx
without a task id is uncertain; a create is never retried; request ids and SDK wrappers.

What every provider family does alike is ``tests/integration/test_provider_contract.py``, once
for every family; these files keep what only this provider does.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
import requests
import responses

from reconcile.errors import CreateRateLimited, CreateRejected, CreateUncertain, ErrorCode
from reconcile.providers import CreateRequest, kie
from tests.unit._kie_helpers import BASE, HOOK, SETTINGS, client, ok, request

# ------------------------------------------------------------------ create: request body


@responses.activate
def test_market_create_plants_the_job_id_only_in_callbackurl() -> None:
    """The market body is {model, callBackUrl, input}; the job id is nowhere in input."""
    responses.post(f"{BASE}/api/v1/jobs/createTask", json=ok({"taskId": "task_1"}))
    created = client().create(request(prompt="a cat", image_urls=["https://x/i.png"]))
    sent = responses.calls[0].request
    body = json.loads(sent.body)
    assert created.task_id == "task_1"
    assert body == {"model": "seedream/4.5-edit", "callBackUrl": HOOK,
                    "input": {"prompt": "a cat", "image_urls": ["https://x/i.png"]}}
    assert "job-42" not in json.dumps(body["input"])
    assert sent.headers["Authorization"] == "Bearer sk-kie"
    assert sent.req_kwargs["timeout"] == (3.0, 11.0)


@pytest.mark.parametrize(
    ("factory", "path", "has_model"),
    [
        (kie.veo_client, "/api/v1/veo/generate", True),
        (kie.suno_client, "/api/v1/generate", True),
        (kie.kontext_client, "/api/v1/flux/kontext/generate", True),
        (kie.luma_client, "/api/v1/modify/generate", False),
        (kie.runway_client, "/api/v1/runway/generate", True),
    ],
)
@responses.activate
def test_dedicated_apis_take_input_fields_at_top_level(
    factory: Callable[..., kie.KieClient], path: str, has_model: bool
) -> None:
    """Non-market APIs get the input's fields at top level, plus model where the API has one."""
    responses.post(f"{BASE}{path}", json=ok({"taskId": "t"}))
    factory(SETTINGS, None).create(request("veo3_fast", prompt="waves", aspectRatio="16:9"))
    body = json.loads(responses.calls[0].request.body)
    expected = {"prompt": "waves", "aspectRatio": "16:9", "callBackUrl": HOOK}
    if has_model:
        expected["model"] = "veo3_fast"
    assert body == expected


@responses.activate
def test_an_input_callbackurl_is_replaced_by_ours() -> None:
    """A callBackUrl smuggled in the input never replaces the one carrying our job id."""
    responses.post(f"{BASE}/api/v1/veo/generate", json=ok({"taskId": "t"}))
    client(kie.VEO).create(request("veo3", prompt="p", callBackUrl="https://evil.test/cb"))
    assert json.loads(responses.calls[0].request.body)["callBackUrl"] == HOOK


# ------------------------------------------------------------------ create: classification

ENVELOPE_OUTCOMES = [
    (400, CreateRejected, ErrorCode.UPSTREAM_INVALID_INPUT),
    (422, CreateRejected, ErrorCode.UPSTREAM_INVALID_INPUT),
    (401, CreateRejected, ErrorCode.UPSTREAM_SUBMISSION_FAILED),
    (402, CreateRejected, ErrorCode.UPSTREAM_SUBMISSION_FAILED),
    (404, CreateRejected, ErrorCode.UPSTREAM_SUBMISSION_FAILED),
    (501, CreateRejected, ErrorCode.UPSTREAM_SUBMISSION_FAILED),
    (505, CreateRejected, ErrorCode.UPSTREAM_SUBMISSION_FAILED),
    (429, CreateRateLimited, ErrorCode.UPSTREAM_RATE_LIMITED),
    (455, CreateRateLimited, ErrorCode.UPSTREAM_RATE_LIMITED),
    (500, CreateUncertain, ErrorCode.UPSTREAM_SUBMISSION_UNCERTAIN),
]


@pytest.mark.parametrize(("code", "exc", "error_code"), ENVELOPE_OUTCOMES)
@pytest.mark.parametrize("key", ["msg", "message"])
def test_envelope_code_decides_even_under_http_200(
    code: int, exc: type[Exception], error_code: ErrorCode, key: str
) -> None:
    """An error inside an HTTP 200 envelope is classified by its code (msg or message)."""
    body = json.dumps({"code": code, key: "nope", "data": None})
    with pytest.raises(exc) as info:
        kie.parse_create(200, body, {})
    assert info.value.code is error_code
    assert info.value.provider_code == str(code)
    assert "nope" in info.value.message
    assert info.value.body == body


@pytest.mark.parametrize(("code", "exc", "error_code"), ENVELOPE_OUTCOMES)
def test_envelope_code_decides_under_matching_http_status(
    code: int, exc: type[Exception], error_code: ErrorCode
) -> None:
    """An error envelope under the same HTTP status gets the same outcome."""
    with pytest.raises(exc) as info:
        kie.parse_create(code, json.dumps({"code": code, "msg": "x"}), {})
    assert info.value.code is error_code


@pytest.mark.parametrize(
    ("status", "exc", "error_code"),
    [
        (400, CreateRejected, ErrorCode.UPSTREAM_INVALID_INPUT),
        (422, CreateRejected, ErrorCode.UPSTREAM_INVALID_INPUT),
        (403, CreateRejected, ErrorCode.UPSTREAM_SUBMISSION_FAILED),
        (429, CreateRateLimited, ErrorCode.UPSTREAM_RATE_LIMITED),
        (500, CreateUncertain, ErrorCode.UPSTREAM_SUBMISSION_UNCERTAIN),
        (502, CreateUncertain, ErrorCode.UPSTREAM_SUBMISSION_UNCERTAIN),
        (504, CreateUncertain, ErrorCode.UPSTREAM_SUBMISSION_UNCERTAIN),
        (408, CreateUncertain, ErrorCode.UPSTREAM_SUBMISSION_UNCERTAIN),
    ],
)
def test_http_status_decides_without_an_envelope(
    status: int, exc: type[Exception], error_code: ErrorCode
) -> None:
    """A non-2xx answer with no usable envelope is classified by its HTTP status."""
    with pytest.raises(exc) as info:
        kie.parse_create(status, b"<html>gateway</html>", {})
    assert info.value.code is error_code
    assert info.value.status == status


def test_an_envelope_200_under_a_failing_http_status_is_not_success() -> None:
    """An envelope saying 200 under HTTP 503 is decided by the HTTP status: uncertain."""
    with pytest.raises(CreateUncertain):
        kie.parse_create(503, json.dumps(ok({"taskId": "t"})), {})


@pytest.mark.parametrize("code", [429, 455])
@responses.activate
def test_rate_limits_carry_retry_after(code: int) -> None:
    """429 and 455 (maintenance) are rate limits that carry the Retry-After seconds."""
    responses.post(f"{BASE}/api/v1/jobs/createTask", status=200,
                   json={"code": code, "msg": "busy"}, headers={"Retry-After": "7"})
    with pytest.raises(CreateRateLimited) as info:
        client().create(request())
    assert info.value.retry_after == 7.0


@responses.activate
def test_http_429_without_envelope_is_rate_limited_with_retry_after() -> None:
    """A bare HTTP 429 (KIE's documented create limit) is a rate limit, Retry-After kept."""
    responses.post(f"{BASE}/api/v1/jobs/createTask", status=429, body="Too Many Requests",
                   headers={"Retry-After": "12"})
    with pytest.raises(CreateRateLimited) as info:
        client().create(request())
    assert info.value.retry_after == 12.0
    assert info.value.body == "Too Many Requests"


@pytest.mark.parametrize("body", [b"<html>ok</html>", b"", b"[1, 2]", b'"text"',
                                  json.dumps(ok(None)).encode(), json.dumps(ok({})).encode(),
                                  json.dumps(ok({"taskId": ""})).encode()])
def test_a_2xx_without_a_task_id_is_uncertain(body: bytes) -> None:
    """An unparseable 2xx, or an accepted envelope without data.taskId, is uncertain."""
    with pytest.raises(CreateUncertain) as info:
        kie.parse_create(200, body, {})
    assert info.value.code is ErrorCode.UPSTREAM_SUBMISSION_UNCERTAIN


@pytest.mark.parametrize("status", [500, 502, 503, 429])
@responses.activate
def test_create_is_never_retried(status: int) -> None:
    """A create is sent exactly once, whatever the answer (no blind resubmission)."""
    responses.post(f"{BASE}/api/v1/jobs/createTask", status=status, json={"code": status})
    delays: list[float] = []
    with pytest.raises((CreateUncertain, CreateRateLimited)):
        client(delays=delays).create(request())
    assert len(responses.calls) == 1
    assert delays == []


@responses.activate
def test_create_keeps_the_upstream_request_id_exactly() -> None:
    """The request id header is kept exactly as returned, on success and on error."""
    responses.post(f"{BASE}/api/v1/jobs/createTask", json=ok({"taskId": "t"}),
                   headers={"X-Request-Id": "Req-AbC_1"})
    responses.post(f"{BASE}/api/v1/jobs/createTask", json={"code": 402, "msg": "credits"},
                   headers={"X-Request-Id": "Req-XyZ_2"})
    assert client().create(request()).request_id == "Req-AbC_1"
    with pytest.raises(CreateRejected) as info:
        client().create(request())
    assert info.value.request_id == "Req-XyZ_2"


def test_create_reads_an_sdk_wrapper_as_success() -> None:
    """A {data, requestId} wrapper around the envelope or the data is a success with its id."""
    around_envelope = {"data": ok({"taskId": "t1"}), "requestId": "r1"}
    around_data = {"data": {"taskId": "t2"}, "requestId": "r2"}
    assert kie.parse_create(200, json.dumps(around_envelope), {}).task_id == "t1"
    created = kie.parse_create(200, around_data, {})
    assert (created.task_id, created.request_id) == ("t2", "r2")


def test_error_body_is_bounded() -> None:
    """The raw body kept as evidence is bounded."""
    huge = json.dumps({"code": 500, "msg": "x" * 20_000})
    with pytest.raises(CreateUncertain) as info:
        kie.parse_create(200, huge, {})
    assert info.value.body is not None and len(info.value.body) < 5000


@pytest.mark.parametrize("api", [kie.RUNWAY, kie.VEO])
@responses.activate
def test_runway_and_veo_creates_send_the_callback_url(api: kie.KieApi) -> None:
    """Both APIs document callBackUrl: the client plants the job id there all the same."""
    responses.post(f"{BASE}{api.create_path}", json={"code": 200, "msg": "success",
                                                      "data": {"taskId": "t1"}})
    client = kie.KieClient(api, SETTINGS, requests.Session())
    client.create(CreateRequest(model="m", input={"prompt": "x"}, job_id="job-9",
                                webhook_url="https://platform.test/hooks/kie?job_id=job-9"))
    sent = json.loads(responses.calls[0].request.body)
    assert kie.planted_job_id(sent) == "job-9"
