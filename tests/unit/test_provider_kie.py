"""KIE.ai clients: create classification, every record shape, the endpoints they read.

What every provider family does alike (``run`` reporting the task before the first poll,
transport failures on create, read retries, ReadFailed) is ``tests/integration/
test_provider_contract.py``, once for every family; this file keeps what only this provider does.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import pytest
import requests
import responses
from hypothesis import given, settings, strategies as st
from responses import matchers

from reconcile import Settings
from reconcile.errors import (
    CreateRateLimited,
    CreateRejected,
    CreateUncertain,
    ErrorCode,
    InvalidParam,
    MalformedResponse,
    ReadFailed,
    ReconcileError,
    SyncCallFailed,
)
from reconcile.kinds import get_kind
from reconcile.providers import AsyncProvider, CreateRequest, PollStatus, SyncProvider, kie

BASE = "https://kie.test"
HOOK = "https://platform.test/hooks/kie?job_id=job-42"
SETTINGS = Settings(kie_base_url=BASE, kie_api_key="sk-kie", connect_timeout=3.0,
                    read_timeout=11.0, sync_read_timeout=99.0)


def ok(data: Any, key: str = "msg") -> dict[str, Any]:
    return {"code": 200, key: "success", "data": data}


def param(url: str = HOOK) -> str:
    return json.dumps({"model": "m", "callBackUrl": url, "input": {"prompt": "p"}})


def request(model: str = "seedream/4.5-edit", **input: Any) -> CreateRequest:
    return CreateRequest(model=model, input=input or {"prompt": "a cat"}, job_id="job-42",
                         webhook_url=HOOK)


def client(api: kie.KieApi = kie.MARKET, delays: list[float] | None = None) -> kie.KieClient:
    sink = delays if delays is not None else []
    return kie.KieClient(api, SETTINGS, requests.Session(), sleep=sink.append)


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


# ------------------------------------------------------------------ market records


def market(state: str, **extra: Any) -> dict[str, Any]:
    return ok({"taskId": "task_1", "model": "m", "state": state, "param": param(),
               "resultJson": "", "failCode": "", "failMsg": "", "createTime": 1698765400000,
               **extra})


@pytest.mark.parametrize("state", ["waiting", "queuing", "generating"])
def test_market_running_states(state: str) -> None:
    """waiting/queuing/generating are running, with the progress when KIE sends one."""
    result = kie.parse_record_market(market(state, progress=92))
    assert result.status is PollStatus.RUNNING
    assert result.progress == 92
    assert result.raw_status == state


def test_market_success_reads_resultjson_string_and_keeps_every_url() -> None:
    """resultJson is a JSON string; every URL of resultUrls becomes an output."""
    urls = ["https://cdn.test/a.jpg", "https://cdn.test/b.png", "https://cdn.test/c"]
    result = kie.parse_record_market(
        market("success", resultJson=json.dumps({"resultUrls": urls}), completeTime=1698765432000))
    assert result.status is PollStatus.SUCCEEDED
    assert [o.url for o in result.outputs] == urls
    assert [o.media_type for o in result.outputs] == ["image/jpeg", "image/png", None]


def test_market_success_with_result_object_is_a_text_output() -> None:
    """Text models answer resultJson.resultObject: an output with text."""
    result = kie.parse_record_market(
        market("success", resultJson=json.dumps({"resultObject": {"caption": "a cat"}})))
    assert result.status is PollStatus.SUCCEEDED
    assert json.loads(result.outputs[0].text or "") == {"caption": "a cat"}


def test_market_success_with_unreadable_resultjson_is_malformed_not_empty() -> None:
    """A success whose resultJson cannot be parsed is malformed, never an empty success."""
    with pytest.raises(MalformedResponse):
        kie.parse_record_market(market("success", resultJson="{not json"))
    with pytest.raises(MalformedResponse):
        kie.parse_record_market(market("success", resultJson=json.dumps({"resultUrls": [{}]})))


def test_market_fail_keeps_fail_code_and_message() -> None:
    """fail → FAILED with failCode/failMsg as returned."""
    result = kie.parse_record_market(market("fail", failCode="422", failMsg="prohibited"))
    assert (result.status, result.error_code, result.error_message) == (
        PollStatus.FAILED, "422", "prohibited")


def test_market_unknown_state_is_preserved() -> None:
    """A state the adapter does not know is UNKNOWN with the raw status kept."""
    result = kie.parse_record_market(market("paused-by-ops"))
    assert (result.status, result.raw_status) == (PollStatus.UNKNOWN, "paused-by-ops")


@pytest.mark.parametrize("key", ["msg", "message"])
def test_market_task_not_found(key: str) -> None:
    """Envelope 404 "Task not found" (msg or message) is NOT_FOUND, not an error."""
    result = kie.parse_record_market({"code": 404, key: "Task not found", "data": None})
    assert result.status is PollStatus.NOT_FOUND
    assert result.error_message == "Task not found"


def test_market_record_with_message_key_envelope_is_read() -> None:
    """The prose example's `message` envelope reads like the `msg` one."""
    result = kie.parse_record_market(market("generating") | {"message": "success"})
    assert result.status is PollStatus.RUNNING


def test_planted_job_id_is_read_back_from_param() -> None:
    """param's callBackUrl yields the job id the sweep uses as evidence."""
    assert kie.parse_record_market(market("waiting")).planted_job_id == "job-42"
    no_hook = market("waiting")
    no_hook["data"]["param"] = json.dumps({"model": "m"})
    assert kie.parse_record_market(no_hook).planted_job_id is None
    assert kie.planted_job_id("{broken") is None


@pytest.mark.parametrize("stamp", [1698765432000, "1698765432000", "2025-06-06 10:30:00",
                                   "garbage", None, 1e300, -5, True])
def test_timestamps_of_either_shape_never_crash(stamp: Any) -> None:
    """Times may be ms ints or "YYYY-MM-DD HH:MM:SS" strings (or junk): reads never crash."""
    assert kie.parse_record_market(market("waiting", completeTime=stamp)).status is (
        PollStatus.RUNNING)
    veo = ok({"successFlag": 0, "completeTime": stamp, "createTime": stamp})
    assert kie.parse_record_veo(veo).status is PollStatus.RUNNING


def test_sdk_wrapper_around_a_record_is_read_as_success_with_media() -> None:
    """A {data: <record>, requestId} wrapper is a success with its media, not an empty one."""
    record = market("success", resultJson=json.dumps({"resultUrls": ["https://cdn.test/v.mp4"]}))
    wrapped = {"data": record["data"], "requestId": "req-9"}
    result = kie.parse_record_market(json.dumps(wrapped).encode())
    assert result.status is PollStatus.SUCCEEDED
    assert [o.url for o in result.outputs] == ["https://cdn.test/v.mp4"]
    assert result.request_id == "req-9"


@pytest.mark.parametrize("code", [400, 401, 500])
def test_read_errors_inside_http_200_raise_read_failed(code: int) -> None:
    """An error envelope on a read (other than not found) is a retryable ReadFailed."""
    with pytest.raises(ReadFailed) as info:
        kie.parse_record_market({"code": code, "msg": "x"})
    assert info.value.provider_code == str(code)


def test_unparseable_2xx_read_is_malformed() -> None:
    """A 2xx read that is not JSON is MalformedResponse."""
    with pytest.raises(MalformedResponse):
        kie.parse_record_market(b"<html>", 200, {})


# ------------------------------------------------------------------ Veo / Kontext / Luma


def flagged(flag: Any, **response: Any) -> dict[str, Any]:
    return ok({"taskId": "veo_1", "paramJson": param(), "successFlag": flag,
               "response": response or None, "errorCode": None, "errorMessage": None,
               "completeTime": "2025-06-06 10:30:00", "createTime": "2025-06-06 10:25:00"})


@pytest.mark.parametrize(
    ("parser", "flag", "status"),
    [
        (kie.parse_record_veo, 0, PollStatus.RUNNING),
        (kie.parse_record_veo, 2, PollStatus.FAILED),
        (kie.parse_record_veo, 3, PollStatus.FAILED),
        (kie.parse_record_veo, 4, PollStatus.UNKNOWN),
        (kie.parse_record_kontext, 0, PollStatus.RUNNING),
        (kie.parse_record_kontext, 2, PollStatus.FAILED),
        (kie.parse_record_kontext, 3, PollStatus.FAILED),
        (kie.parse_record_luma, 0, PollStatus.RUNNING),
        (kie.parse_record_luma, 2, PollStatus.FAILED),
        (kie.parse_record_luma, 3, PollStatus.FAILED),
        (kie.parse_record_luma, 9, PollStatus.UNKNOWN),
    ],
)
def test_success_flag_values(parser: Callable[..., Any], flag: int, status: PollStatus) -> None:
    """successFlag 0 runs, 2/3 fail, anything undocumented is UNKNOWN (raw kept)."""
    result = parser(flagged(flag))
    assert result.status is status
    assert result.raw_status == str(flag)
    assert result.planted_job_id == "job-42"


def test_veo_failure_keeps_error_code_and_message() -> None:
    """A failed Veo task carries errorCode/errorMessage."""
    record = flagged(3)
    record["data"].update(errorCode=501, errorMessage="generation failed")
    result = kie.parse_record_veo(record)
    assert (result.error_code, result.error_message) == ("501", "generation failed")


def test_veo_success_keeps_every_result_url_even_with_string_flag() -> None:
    """successFlag 1 (int or "1") → every response.resultUrls entry is an output."""
    urls = ["https://cdn.test/1.mp4", "https://cdn.test/2.mp4"]
    for flag in (1, "1"):
        result = kie.parse_record_veo(flagged(flag, resultUrls=urls, originUrls=["o"]))
        assert result.status is PollStatus.SUCCEEDED
        assert [o.url for o in result.outputs] == urls
        assert result.outputs[0].media_type == "video/mp4"


def test_kontext_success_reads_result_image_url() -> None:
    """Flux Kontext's media is response.resultImageUrl."""
    result = kie.parse_record_kontext(flagged(1, resultImageUrl="https://cdn.test/k.png",
                                              originImageUrl="https://cdn.test/in.png"))
    assert [o.url for o in result.outputs] == ["https://cdn.test/k.png"]


@pytest.mark.parametrize("flag", [1, 4])
def test_luma_success_including_callback_failed(flag: int) -> None:
    """Luma 4 (callback failed, generation succeeded) is a success with every URL."""
    urls = ["https://cdn.test/l1.mp4", "https://cdn.test/l2.mp4"]
    result = kie.parse_record_luma(flagged(flag, resultUrls=urls))
    assert result.status is PollStatus.SUCCEEDED
    assert [o.url for o in result.outputs] == urls


def test_an_odd_response_shape_does_not_fail_a_running_read() -> None:
    """While running, an empty-string or odd `response` is ignored (only success reads media)."""
    for odd in ("", [], "pending"):
        record = flagged(0)
        record["data"]["response"] = odd
        assert kie.parse_record_veo(record).status is PollStatus.RUNNING
    assert kie.parse_record_suno(suno("PENDING") | {"data": {"status": "PENDING",
                                                             "response": ""}}).status is (
        PollStatus.RUNNING)


def test_veo_success_with_garbage_media_is_malformed() -> None:
    """A success whose media field has the wrong shape is malformed, never empty."""
    with pytest.raises(MalformedResponse):
        kie.parse_record_veo(flagged(1, resultUrls={"url": "x"}))


# ------------------------------------------------------------------ Suno


def suno(status: str, tracks: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return ok({"taskId": "s1", "param": param(), "status": status, "type": "chirp",
               "response": {"taskId": "s1", "sunoData": tracks or []},
               "errorCode": None, "errorMessage": None})


@pytest.mark.parametrize(
    ("status", "expected"),
    [("PENDING", PollStatus.RUNNING), ("TEXT_SUCCESS", PollStatus.RUNNING),
     ("FIRST_SUCCESS", PollStatus.RUNNING), ("CREATE_TASK_FAILED", PollStatus.FAILED),
     ("GENERATE_AUDIO_FAILED", PollStatus.FAILED), ("CALLBACK_EXCEPTION", PollStatus.FAILED),
     ("SENSITIVE_WORD_ERROR", PollStatus.FAILED), ("MYSTERY", PollStatus.UNKNOWN)],
)
def test_suno_statuses(status: str, expected: PollStatus) -> None:
    """Every documented Suno status maps to ours; an unknown one is kept raw."""
    result = kie.parse_record_suno(suno(status))
    assert (result.status, result.raw_status, result.planted_job_id) == (expected, status, "job-42")


def test_suno_success_keeps_every_track() -> None:
    """SUCCESS → one output per sunoData[].audioUrl."""
    tracks = [{"id": "a", "audioUrl": "https://cdn.test/a.mp3", "duration": 120.5},
              {"id": "b", "audioUrl": "https://cdn.test/b.mp3"}]
    result = kie.parse_record_suno(suno("SUCCESS", tracks))
    assert result.status is PollStatus.SUCCEEDED
    assert [o.url for o in result.outputs] == ["https://cdn.test/a.mp3", "https://cdn.test/b.mp3"]
    assert result.outputs[0].media_type == "audio/mpeg"


# ------------------------------------------------------------------ Runway


def runway(state: str, **extra: Any) -> dict[str, Any]:
    return ok({"taskId": "r1", "state": state, "generateTime": "2025-06-06 10:30:00",
               "generateParam": {"prompt": "p"}, "expireFlag": 0, **extra})


@pytest.mark.parametrize("state", ["wait", "queueing", "generating"])
def test_runway_running_states(state: str) -> None:
    """wait/queueing (Runway's spelling)/generating are running."""
    assert kie.parse_record_runway(runway(state)).status is PollStatus.RUNNING


def test_runway_success_and_failure() -> None:
    """success → videoInfo.videoUrl; fail → failCode/failMsg; unknown kept raw."""
    done = kie.parse_record_runway(runway("success", videoInfo={
        "videoId": "v", "videoUrl": "https://cdn.test/r.mp4", "imageUrl": "https://cdn.test/c.jpg"}))
    assert [o.url for o in done.outputs] == ["https://cdn.test/r.mp4"]
    failed = kie.parse_record_runway(runway("fail", failCode=400, failMsg="policy"))
    assert (failed.status, failed.error_code, failed.error_message) == (
        PollStatus.FAILED, "400", "policy")
    assert kie.parse_record_runway(runway("odd")).status is PollStatus.UNKNOWN


# ------------------------------------------------------------------ poll I/O, the kinds

POLL_ENDPOINTS = [
    (kie.market_client, "/api/v1/jobs/recordInfo", market("waiting")),
    (kie.veo_client, "/api/v1/veo/record-info", flagged(0)),
    (kie.suno_client, "/api/v1/generate/record-info", suno("PENDING")),
    (kie.kontext_client, "/api/v1/flux/kontext/record-info", flagged(0)),
    (kie.luma_client, "/api/v1/modify/record-info", flagged(0)),
    (kie.runway_client, "/api/v1/runway/record-detail", runway("wait")),
]


@pytest.mark.parametrize(("factory", "path", "body"), POLL_ENDPOINTS)
@responses.activate
def test_each_client_reads_its_record_endpoint(
    factory: Callable[..., kie.KieClient], path: str, body: dict[str, Any]
) -> None:
    """poll GETs the API's record endpoint with ?taskId= and the bearer key."""
    responses.get(f"{BASE}{path}", json=body,
                  match=[matchers.query_param_matcher({"taskId": "abc"})])
    c = factory(SETTINGS, None)
    assert isinstance(c, AsyncProvider)
    assert c.poll("abc").status is PollStatus.RUNNING
    assert responses.calls[0].request.headers["Authorization"] == "Bearer sk-kie"


def test_cancel_and_listing_are_unsupported() -> None:
    """KIE has no cancel endpoint and no listing."""
    c = client()
    assert c.cancel("t") is False
    assert c.find_created("job-42", created_after=None) is None  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kind", "name"),
    [("kie-standard", "kie-market"), ("kie-kling3", "kie-market"), ("kie-lip-sync", "kie-market"),
     ("kie-veo", "kie-veo"), ("kie-suno", "kie-suno"), ("kie-kontext", "kie-kontext"),
     ("kie-luma", "kie-luma"), ("kie-runway", "kie-runway"), ("kie-llm", "kie-llm")],
)
def test_registry_builds_every_kie_kind(kind: str, name: str) -> None:
    """Every KIE kind resolves to a client of this module."""
    registered = get_kind(kind)
    assert registered is not None
    built = registered.build(SETTINGS, None)
    assert built.name == name
    assert isinstance(built, SyncProvider if registered.sync else AsyncProvider)


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


# ------------------------------------------------------------------ arbitrary JSON

# Scalars include the values that steer the parsers deeper (states, flags, odd URLs).
STEERING = ["success", "fail", "generating", "SUCCESS", "FIRST_SUCCESS", "wait", "1", "4",
            "http://[bad", "https://cdn.test/a.mp4", '{"resultUrls": ["https://c.test/x"]}',
            '{"callBackUrl": "https://h.test/?job_id=j"}', "Task not found", "2025-06-06 10:30:00"]
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20)
    | st.sampled_from(STEERING),
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
)
FIELDS = ["taskId", "state", "param", "paramJson", "resultJson", "failCode", "failMsg", "progress",
          "completeTime", "createTime", "successFlag", "response", "errorCode", "errorMessage",
          "status", "sunoData", "audioUrl", "resultUrls", "resultImageUrl", "videoInfo",
          "videoUrl", "generateParam", "choices", "message", "content"]
leaf = st.sampled_from(STEERING) | st.integers(0, 5) | json_values
url_lists = st.lists(st.sampled_from(STEERING) | st.none() | json_values, max_size=3)
inner = st.dictionaries(st.sampled_from(FIELDS), leaf | url_lists, max_size=4)
# Records shaped like KIE's, so the fuzz reaches the state/flag/media code, not just the envelope.
records = st.dictionaries(st.sampled_from(FIELDS),
                          leaf | inner | url_lists | st.lists(inner, max_size=3), max_size=8)
bodies = st.one_of(
    json_values,
    records,
    st.builds(lambda data, key: {"code": 200, key: "success", "data": data},
              records, st.sampled_from(["msg", "message"])),
    st.builds(lambda code, data, key: {"code": code, key: "m", "data": data},
              st.sampled_from([200, 400, 404, 429, 455, 500, "200", 200.0]) | json_values,
              json_values | records, st.sampled_from(["msg", "message"])),
    st.builds(lambda data: {"data": data, "requestId": "r"}, json_values | records),
    json_values.map(lambda v: json.dumps(v).encode()),
    st.binary(max_size=40),
)
PARSERS = [kie.parse_record_market, kie.parse_record_veo, kie.parse_record_suno,
           kie.parse_record_kontext, kie.parse_record_luma, kie.parse_record_runway]


@settings(deadline=None, max_examples=300)
@given(body=bodies, status=st.sampled_from([200, 201, 400, 404, 429, 500, 503]))
def test_parsers_raise_only_library_errors_on_arbitrary_json(body: Any, status: int) -> None:
    """Every parse function either returns or raises a ReconcileError, whatever the JSON."""
    for parse in PARSERS:
        try:
            parse(body, status, {"Retry-After": "x"})
        except ReconcileError:
            pass
    for parse_two in (kie.parse_create, kie.parse_chat):
        try:
            parse_two(status, body, {})
        except ReconcileError:
            pass


# ------------------------------------------------------------------ issue 15: documented shapes


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


def _suno(status: str, tracks: list[dict[str, Any]] | None) -> dict[str, Any]:
    # Shape of docs.kie.ai/suno-api/get-music-details (its SUCCESS example), status varied.
    response = {"taskId": "5c79be8e", "sunoData": tracks} if tracks is not None else None
    return {"code": 200, "msg": "success", "data": {
        "taskId": "5c79be8e", "parentMusicId": "", "param": "{}", "response": response,
        "status": status, "type": "GENERATE", "errorCode": None, "errorMessage": None}}


def test_suno_callback_exception_with_tracks_is_a_success() -> None:
    """CALLBACK_EXCEPTION is "Error during callback process" (KIE's Suno docs): the callback
    failed, not the music. With tracks in the record it is a billed success, kept."""
    track = {"id": "e231", "audioUrl": "https://example.cn/a.mp3", "duration": 198.44}
    result = kie.parse_record_suno(_suno("CALLBACK_EXCEPTION", [track]))
    assert result.status is PollStatus.SUCCEEDED
    assert [o.url for o in result.outputs] == ["https://example.cn/a.mp3"]


def test_suno_callback_exception_without_tracks_is_a_failure() -> None:
    """No tracks: nothing was generated, so CALLBACK_EXCEPTION stays a failure."""
    assert kie.parse_record_suno(_suno("CALLBACK_EXCEPTION", None)).status is PollStatus.FAILED
    assert kie.parse_record_suno(_suno("CALLBACK_EXCEPTION", [])).status is PollStatus.FAILED


@pytest.mark.parametrize("parse", [kie.parse_record_market, kie.parse_record_suno,
                                   kie.parse_record_veo, kie.parse_record_runway])
def test_record_is_null_reads_as_not_found(parse: Callable[..., Any]) -> None:
    """KIE's documented ``422 "record is null"`` (an id it has no record of) is NOT_FOUND, not a
    retryable read failure; another 422 still raises."""
    assert parse({"code": 422, "msg": "record is null", "data": None}).status is PollStatus.NOT_FOUND
    with pytest.raises(ReadFailed):
        parse({"code": 422, "msg": "taskId is invalid", "data": None})


# Adapted from docs.kie.ai/runway-api/get-ai-video-details (ids shortened): generateParam has no
# callBackUrl in the documented record.
RUNWAY_RECORD = {"code": 200, "msg": "success", "data": {
    "taskId": "ee603959", "parentTaskId": "", "state": "success",
    "generateParam": {"prompt": "A fluffy orange cat", "imageUrl": "", "expandPrompt": True},
    "generateTime": "2023-08-15 14:30:45",
    "videoInfo": {"videoId": "485da89c", "taskId": "ee603959",
                  "videoUrl": "https://file.com/k/xxxxxxx.mp4", "imageUrl": "https://file.com/m/x.png"},
    "failCode": 0, "failMsg": "", "expireFlag": 0}}
# Adapted from docs.kie.ai/veo3-api/get-veo-3-video-details: paramJson without callBackUrl.
VEO_RECORD = {"code": 200, "msg": "success", "data": {
    "taskId": "veo_task_abc", "paramJson": "{\"prompt\":\"A dog playing in a park\"}",
    "completeTime": "2025-06-06 10:30:00", "createTime": "2025-06-06 10:25:00",
    "response": {"taskId": "veo_task_abc", "resultUrls": ["http://example.com/video1.mp4"]},
    "successFlag": 1, "errorCode": None, "errorMessage": ""}}


@pytest.mark.parametrize(("parse", "body"), [(kie.parse_record_runway, RUNWAY_RECORD),
                                             (kie.parse_record_veo, VEO_RECORD)])
def test_runway_and_veo_records_do_not_echo_the_planted_job(parse: Callable[..., Any],
                                                            body: dict[str, Any]) -> None:
    """The documented records carry no callBackUrl, so no planted job id: the record is no
    evidence for an uncertain create of these kinds (README, Provider notes)."""
    result = parse(body)
    assert result.status is PollStatus.SUCCEEDED and result.outputs
    assert result.planted_job_id is None


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
