"""KIE.ai records, every shape: the market record's states, results, failures, not found,
planted job id, timestamps and read errors; the successFlag APIs (Veo, Kontext, Luma); Suno's
statuses and tracks; Runway's states; and the records as KIE documents them (Suno's
CALLBACK_EXCEPTION, ``record is null``, Runway and Veo records that echo no planted job).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from reconcile.errors import MalformedResponse, ReadFailed
from reconcile.providers import PollStatus, kie
from tests.unit._kie_helpers import flagged, market, ok, runway, suno

# ------------------------------------------------------------------ market records


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


# ------------------------------------------------------------------ documented records


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
