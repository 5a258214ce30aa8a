"""KIE.ai clients: the market jobs API, Veo, Suno, Flux Kontext, Luma modify, Runway and the
KIE-proxied LLM (PROVIDERS.md §1, DESIGN.md §3–§4).

The same shape throughout: pydantic models of the upstream records, PURE parse functions
(``parse_create``, ``parse_record_*``, ``parse_chat``) that turn one HTTP answer into our types or
the library's errors, and thin I/O (:class:`KieClient`, :class:`KieLlmClient`).

KIE answers in an envelope ``{code, msg|message, data}`` whose ``code`` is an application code
that can disagree with the HTTP status (an error inside HTTP 200), so :func:`classify` decides by
the envelope and falls back to the HTTP status only when there is no usable envelope. The job id
travels only in ``callBackUrl`` (some models reject unknown ``input`` keys) and comes back in the
record's ``param`` JSON string, which is how the sweep proves an uncertain submission was ours.
"""

from __future__ import annotations

import json
import mimetypes
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Literal
from urllib.parse import parse_qs, urlsplit

import requests
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..errors import (
    CreateRateLimited,
    CreateRejected,
    CreateUncertain,
    ErrorCode,
    MalformedResponse,
    ProviderError,
    ReadFailed,
    SyncCallFailed,
)
from ..settings import Settings
from ._kie_fields import Flag, Progress, Text, Timestamp, Urls, bounded_text
from .base import (
    Created,
    CreateRequest,
    ListedTask,
    Output,
    PollResult,
    PollStatus,
    SyncResult,
    unwrap_sdk,
)
from .http import HttpClient, header, parse_retry_after

__all__ = [
    "KieApi", "KieClient", "KieLlmClient", "Verdict", "classify", "error_for", "parse_create",
    "parse_record_market", "parse_record_veo", "parse_record_suno", "parse_record_kontext",
    "parse_record_luma", "parse_record_runway", "parse_chat", "planted_job_id", "market_client",
    "veo_client", "suno_client", "kontext_client", "luma_client", "runway_client", "llm_client",
]

PLANT_PARAM = "job_id"  # the query parameter of callBackUrl that carries our job id
REQUEST_ID_HEADERS = ("x-request-id", "request-id")  # KIE documents none; kept if present
# ASSUMPTION: KIE documents its chat models as OpenAI-style ``POST /{model}/v1/chat/completions``
# (docs.kie.ai/market/chat/gemini); the exact path per model family is not pinned down, so it is
# one template here and ``model`` is also sent in the body, OpenAI-style.
LLM_CHAT_PATH = "/{model}/v1/chat/completions"


# ---------------------------------------------------------------- upstream models


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)


class Envelope(_Model):
    code: int
    msg: Text = None
    message: Text = None  # market recordInfo's prose example says ``message``; accept both
    data: Any = None

    @property
    def text(self) -> str | None:
        return self.msg or self.message


class MarketRecord(_Model):
    task_id: Text = Field(None, alias="taskId")
    state: Text = None
    param: Any = None
    result_json: Any = Field(None, alias="resultJson")  # a JSON string to parse again
    fail_code: Text = Field(None, alias="failCode")
    fail_msg: Text = Field(None, alias="failMsg")
    progress: Progress = None
    create_time: Timestamp = Field(None, alias="createTime")
    complete_time: Timestamp = Field(None, alias="completeTime")


class FlagResponse(_Model):
    result_urls: Urls = Field((), alias="resultUrls")
    result_image_url: Urls = Field((), alias="resultImageUrl")  # Flux Kontext: one image


class FlagRecord(_Model):
    """Veo, Flux Kontext and Luma share ``successFlag`` + ``response`` + ``errorCode``."""

    task_id: Text = Field(None, alias="taskId")
    param: Any = Field(None, alias="paramJson")
    success_flag: Flag = Field(None, alias="successFlag")
    response: FlagResponse | None = None
    error_code: Text = Field(None, alias="errorCode")
    error_message: Text = Field(None, alias="errorMessage")
    create_time: Timestamp = Field(None, alias="createTime")
    complete_time: Timestamp = Field(None, alias="completeTime")


class SunoTrack(_Model):
    audio_url: Urls = Field((), alias="audioUrl")


class SunoResponse(_Model):
    suno_data: list[SunoTrack] | None = Field(None, alias="sunoData")


class SunoRecord(_Model):
    task_id: Text = Field(None, alias="taskId")
    param: Any = None
    status: Text = None
    response: SunoResponse | None = None
    error_code: Text = Field(None, alias="errorCode")
    error_message: Text = Field(None, alias="errorMessage")


class RunwayVideo(_Model):
    video_url: Urls = Field((), alias="videoUrl")


class RunwayRecord(_Model):
    task_id: Text = Field(None, alias="taskId")
    param: Any = Field(None, alias="generateParam")
    state: Text = None
    video_info: RunwayVideo | None = Field(None, alias="videoInfo")
    fail_code: Text = Field(None, alias="failCode")
    fail_msg: Text = Field(None, alias="failMsg")
    generate_time: Timestamp = Field(None, alias="generateTime")


# ---------------------------------------------------------------- classification


class Verdict(StrEnum):
    OK = "ok"
    INVALID = "invalid"  # 400/422: the provider refused the input
    REJECTED = "rejected"  # a well-formed refusal: nothing was created
    RATE_LIMITED = "rate_limited"  # 429 / 455 maintenance: documented as not created
    UNCERTAIN = "uncertain"  # 500, other 5xx, unknown: it may exist upstream


def classify(status_code: int, envelope_code: int | None) -> Verdict:
    """DESIGN §4's KIE rows: the envelope ``code`` decides even under HTTP 200; the HTTP status
    decides only without a usable envelope (or when an envelope 200 contradicts a failing HTTP)."""
    http_ok = 200 <= status_code < 300
    code = envelope_code if envelope_code is not None and (envelope_code != 200 or http_ok) else None
    if code is None:
        code = status_code
    if 200 <= code < 300:
        return Verdict.OK
    if code in (400, 422):
        return Verdict.INVALID
    if code in (429, 455):
        return Verdict.RATE_LIMITED
    # 401/402/404/501/505 are KIE's documented refusals; an unlisted 4xx is still a well-formed
    # refusal, except 408 (a timeout says nothing about whether the task exists).
    if code in (401, 402, 404, 501, 505) or (400 <= code < 500 and code != 408):
        return Verdict.REJECTED
    return Verdict.UNCERTAIN


_UNPARSEABLE: Any = object()


@dataclass(frozen=True)
class _Answer:
    """One HTTP answer, decoded once: what every parse function starts from."""

    status: int
    payload: Any  # the JSON after unwrap_sdk, or _UNPARSEABLE
    raw: str | None
    envelope: Envelope | None
    request_id: str | None
    retry_after: float | None


def _answer(status_code: int, body: Any, headers: Mapping[str, str] | None) -> _Answer:
    if isinstance(body, bytes | bytearray | str):
        raw = bounded_text(body)
        try:
            payload = json.loads(body)
        except (ValueError, RecursionError):
            payload = _UNPARSEABLE
    else:
        payload, raw = body, bounded_text(json.dumps(body, default=str))
    payload, wrapper_id = unwrap_sdk(payload) if payload is not _UNPARSEABLE else (payload, None)
    envelope = None
    if isinstance(payload, Mapping) and "code" in payload:
        try:
            envelope = Envelope.model_validate(payload)
        except ValidationError:
            envelope = None  # a "code" that is not a number is no envelope we can trust
    lowered = {str(k).lower(): v for k, v in (headers or {}).items()}
    return _Answer(
        status=status_code,
        payload=payload,
        raw=raw,
        envelope=envelope,
        request_id=header_value(lowered, *REQUEST_ID_HEADERS) or wrapper_id,
        retry_after=parse_retry_after(lowered.get("retry-after")),
    )


def header_value(lowered: Mapping[str, Any], *names: str) -> str | None:
    for name in names:
        value = lowered.get(name)
        if isinstance(value, str) and value:
            return value
    return None


Phase = Literal["create", "read", "sync"]
_SYNC_CODES = {
    Verdict.INVALID: ErrorCode.UPSTREAM_INVALID_INPUT,
    Verdict.REJECTED: ErrorCode.UPSTREAM_SUBMISSION_FAILED,
    Verdict.RATE_LIMITED: ErrorCode.UPSTREAM_RATE_LIMITED,
    Verdict.UNCERTAIN: ErrorCode.UPSTREAM_FAILED,  # sync kinds are never uncertain
}


def error_for(answer: _Answer, phase: Phase) -> ProviderError | None:
    """THE one place a KIE answer becomes an error (None: the answer is usable)."""
    env = answer.envelope
    verdict = classify(answer.status, env.code if env else None)
    if verdict is Verdict.OK:
        return None
    detail: dict[str, Any] = {
        "status": answer.status,
        "provider_code": str(env.code) if env else None,
        "request_id": answer.request_id,
        "body": answer.raw,
        "retry_after": answer.retry_after if verdict is Verdict.RATE_LIMITED else None,
    }
    message = f"KIE {phase}: HTTP {answer.status}" + (f", code {env.code}: {env.text}" if env else "")
    if phase == "read":
        return ReadFailed(message, **detail)
    if phase == "sync":
        return SyncCallFailed(message, code=_SYNC_CODES[verdict], **detail)
    if verdict is Verdict.INVALID:
        return CreateRejected(message, code=ErrorCode.UPSTREAM_INVALID_INPUT, **detail)
    if verdict is Verdict.REJECTED:
        return CreateRejected(message, **detail)
    if verdict is Verdict.RATE_LIMITED:
        return CreateRateLimited(message, **detail)
    return CreateUncertain(message, **detail)


# ---------------------------------------------------------------- pure parsers


def parse_create(
    status_code: int, body: Any, headers: Mapping[str, str] | None = None
) -> Created:
    """A create answer → :class:`Created`, or CreateRejected / CreateRateLimited / CreateUncertain."""
    answer = _answer(status_code, body, headers)
    error = error_for(answer, "create")
    if error is not None:
        raise error
    # OK: an envelope 200 carries data.taskId; a bare (SDK-unwrapped) 2xx may carry taskId itself.
    data = answer.envelope.data if answer.envelope else answer.payload
    data, _ = unwrap_sdk(data)
    task_id = data.get("taskId") if isinstance(data, Mapping) else None
    if isinstance(task_id, int) and not isinstance(task_id, bool):
        task_id = str(task_id)
    if not isinstance(task_id, str) or not task_id:
        # Accepted (or an unparseable 2xx) without an id: it may exist upstream — never resubmit.
        raise CreateUncertain(
            f"KIE create: HTTP {status_code} without data.taskId", status=status_code,
            request_id=answer.request_id, body=answer.raw,
        )
    raw = answer.payload if isinstance(answer.payload, Mapping) else None
    return Created(task_id=task_id, request_id=answer.request_id, raw=raw)


def planted_job_id(param: Any) -> str | None:
    """The job id planted in ``callBackUrl``, read back from a record's ``param`` JSON string."""
    if isinstance(param, str):
        try:
            param = json.loads(param)
        except (ValueError, RecursionError):
            return None
    url = param.get("callBackUrl") if isinstance(param, Mapping) else None
    if not isinstance(url, str):
        return None
    try:
        values = parse_qs(urlsplit(url).query).get(PLANT_PARAM)
    except ValueError:
        return None
    return values[0] if values else None


_Record = Mapping[str, Any]


def _record(status_code: int, body: Any, headers: Mapping[str, str] | None) -> _Record | PollResult:
    """The record inside a read answer, a NOT_FOUND result, or a raised ReadFailed/Malformed."""
    answer = _answer(status_code, body, headers)
    env = answer.envelope
    raw = answer.payload if isinstance(answer.payload, Mapping) else None
    if env is not None and env.code != 200 or (env is not None and env.data is None):
        if env.code == 404 or "task not found" in (env.text or "").lower():
            return PollResult(PollStatus.NOT_FOUND, raw_status=str(env.code),
                              error_message=env.text, request_id=answer.request_id, raw=raw)
    if answer.payload is _UNPARSEABLE and 200 <= status_code < 300:
        raise MalformedResponse(f"KIE read: HTTP {status_code} body is not JSON",
                                status=status_code, request_id=answer.request_id, body=answer.raw)
    if env is None and not (200 <= status_code < 300):
        env_less = _Answer(answer.status, None, answer.raw, None, answer.request_id, None)
        raise error_for(env_less, "read") or ReadFailed(f"KIE read: HTTP {status_code}")
    error = error_for(answer, "read")
    if error is not None:
        raise error
    data, wrapper_id = unwrap_sdk(env.data if env is not None else answer.payload)
    if not isinstance(data, Mapping):
        raise MalformedResponse("KIE read: no record in the answer", status=status_code,
                                request_id=answer.request_id, body=answer.raw)
    return {"__record__": data, "__request_id__": answer.request_id or wrapper_id, "__raw__": raw}


def _outputs(urls: tuple[str, ...]) -> tuple[Output, ...]:
    return tuple(Output(url=url, media_type=mimetypes.guess_type(urlsplit(url).path)[0])
                 for url in urls)


def _parse(model: type[_Model], status_code: int, body: Any,
           headers: Mapping[str, str] | None,
           decide: Callable[[Any], PollResult]) -> PollResult:
    found = _record(status_code, body, headers)
    if isinstance(found, PollResult):
        return found
    try:
        record = model.model_validate(found["__record__"])
        result = decide(record)
    except ValidationError as exc:
        raise MalformedResponse(f"KIE read: unexpected record: {exc.error_count()} errors",
                                status=status_code, body=bounded_text(str(exc))) from None
    return PollResult(
        status=result.status, progress=result.progress, outputs=result.outputs,
        raw_status=result.raw_status, error_code=result.error_code or None,
        error_message=result.error_message or None, request_id=found["__request_id__"],
        planted_job_id=planted_job_id(getattr(record, "param", None)), raw=found["__raw__"],
    )


_MARKET_RUNNING = {"waiting", "queuing", "queueing", "generating"}  # both spellings occur
_RUNWAY_RUNNING = {"wait", "waiting", "queueing", "queuing", "generating"}


def _market_success_outputs(result_json: Any) -> tuple[Output, ...]:
    if isinstance(result_json, str):
        try:
            result_json = json.loads(result_json) if result_json.strip() else {}
        except (ValueError, RecursionError):
            # Success with an unreadable result must not read as "no media" (that refunds).
            raise MalformedResponse("KIE market: resultJson is not JSON",
                                    body=bounded_text(result_json)) from None
    result_json, _ = unwrap_sdk(result_json)
    if result_json is None:
        return ()
    if not isinstance(result_json, Mapping):
        raise MalformedResponse("KIE market: resultJson is not an object")
    outputs = _outputs(Urls_of(result_json.get("resultUrls")))
    obj = result_json.get("resultObject")
    if obj is not None:  # text models answer with an object, not URLs
        text = obj if isinstance(obj, str) else json.dumps(obj, ensure_ascii=False)
        outputs += (Output(text=text, media_type="text/plain" if isinstance(obj, str)
                           else "application/json"),)
    return outputs


def Urls_of(value: Any) -> tuple[str, ...]:  # noqa: N802 - mirrors the Urls field type
    return FlagResponse.model_validate({"resultUrls": value}).result_urls


def _decide_market(r: MarketRecord) -> PollResult:
    state = (r.state or "").lower()
    if state in _MARKET_RUNNING:
        return PollResult(PollStatus.RUNNING, progress=r.progress, raw_status=r.state)
    if state == "success":
        return PollResult(PollStatus.SUCCEEDED, progress=100, raw_status=r.state,
                          outputs=_market_success_outputs(r.result_json))
    if state == "fail":
        return PollResult(PollStatus.FAILED, raw_status=r.state, error_code=r.fail_code,
                          error_message=r.fail_msg)
    return PollResult(PollStatus.UNKNOWN, raw_status=r.state)


def _decide_flag(r: FlagRecord, *, succeeded: frozenset[str]) -> PollResult:
    flag = r.success_flag
    if flag == "0":
        return PollResult(PollStatus.RUNNING, raw_status=flag)
    if flag in succeeded:
        resp = r.response or FlagResponse()
        return PollResult(PollStatus.SUCCEEDED, progress=100, raw_status=flag,
                          outputs=_outputs(resp.result_urls + resp.result_image_url))
    if flag in ("2", "3"):
        return PollResult(PollStatus.FAILED, raw_status=flag, error_code=r.error_code,
                          error_message=r.error_message)
    return PollResult(PollStatus.UNKNOWN, raw_status=flag)


_SUNO_RUNNING = {"PENDING", "TEXT_SUCCESS", "FIRST_SUCCESS"}
_SUNO_FAILED = {"CREATE_TASK_FAILED", "GENERATE_AUDIO_FAILED", "CALLBACK_EXCEPTION",
                "SENSITIVE_WORD_ERROR"}


def _decide_suno(r: SunoRecord) -> PollResult:
    status = (r.status or "").upper()
    if status in _SUNO_RUNNING:
        return PollResult(PollStatus.RUNNING, raw_status=r.status)
    if status == "SUCCESS":
        tracks = (r.response.suno_data if r.response else None) or []
        urls = tuple(url for track in tracks for url in track.audio_url)
        return PollResult(PollStatus.SUCCEEDED, progress=100, raw_status=r.status,
                          outputs=_outputs(urls))
    if status in _SUNO_FAILED:
        return PollResult(PollStatus.FAILED, raw_status=r.status, error_code=r.error_code,
                          error_message=r.error_message)
    return PollResult(PollStatus.UNKNOWN, raw_status=r.status)


def _decide_runway(r: RunwayRecord) -> PollResult:
    state = (r.state or "").lower()
    if state in _RUNWAY_RUNNING:
        return PollResult(PollStatus.RUNNING, raw_status=r.state)
    if state == "success":
        urls = r.video_info.video_url if r.video_info else ()
        return PollResult(PollStatus.SUCCEEDED, progress=100, raw_status=r.state,
                          outputs=_outputs(urls))
    if state == "fail":
        return PollResult(PollStatus.FAILED, raw_status=r.state, error_code=r.fail_code,
                          error_message=r.fail_msg)
    return PollResult(PollStatus.UNKNOWN, raw_status=r.state)


_OK1 = frozenset({"1"})
_LUMA_OK = frozenset({"1", "4"})  # Luma 4: the callback failed, the generation succeeded


def parse_record_market(body: Any, status_code: int = 200,
                        headers: Mapping[str, str] | None = None) -> PollResult:
    """A ``/api/v1/jobs/recordInfo`` answer → one normalised PollResult."""
    return _parse(MarketRecord, status_code, body, headers, _decide_market)


def parse_record_veo(body: Any, status_code: int = 200,
                     headers: Mapping[str, str] | None = None) -> PollResult:
    """A ``/api/v1/veo/record-info`` answer (successFlag 0/1/2/3, ``response.resultUrls``)."""
    return _parse(FlagRecord, status_code, body, headers,
                  lambda r: _decide_flag(r, succeeded=_OK1))


def parse_record_kontext(body: Any, status_code: int = 200,
                         headers: Mapping[str, str] | None = None) -> PollResult:
    """A Flux Kontext record (successFlag 0/1/2/3, ``response.resultImageUrl``)."""
    return _parse(FlagRecord, status_code, body, headers,
                  lambda r: _decide_flag(r, succeeded=_OK1))


def parse_record_luma(body: Any, status_code: int = 200,
                      headers: Mapping[str, str] | None = None) -> PollResult:
    """A Luma modify record (successFlag 0–4, where 4 is still a success)."""
    return _parse(FlagRecord, status_code, body, headers,
                  lambda r: _decide_flag(r, succeeded=_LUMA_OK))


def parse_record_suno(body: Any, status_code: int = 200,
                      headers: Mapping[str, str] | None = None) -> PollResult:
    """A Suno record (``status``; every ``sunoData[].audioUrl`` on SUCCESS)."""
    return _parse(SunoRecord, status_code, body, headers, _decide_suno)


def parse_record_runway(body: Any, status_code: int = 200,
                        headers: Mapping[str, str] | None = None) -> PollResult:
    """A Runway ``record-detail`` answer (``state``; ``videoInfo.videoUrl``)."""
    return _parse(RunwayRecord, status_code, body, headers, _decide_runway)


def parse_chat(status_code: int, body: Any, headers: Mapping[str, str] | None = None) -> SyncResult:
    """An OpenAI-style chat completion via KIE → SyncResult, or SyncCallFailed."""
    answer = _answer(status_code, body, headers)
    has_choices = isinstance(answer.payload, Mapping) and "choices" in answer.payload
    if not has_choices:  # an envelope error (even under HTTP 200), or an HTTP error
        error = error_for(answer, "sync")
        if error is not None:
            raise error
    choices = answer.payload.get("choices") if isinstance(answer.payload, Mapping) else None
    first = choices[0] if isinstance(choices, list) and choices else None
    message = first.get("message") if isinstance(first, Mapping) else None
    content = message.get("content") if isinstance(message, Mapping) else None
    if isinstance(content, list):  # content parts: keep every text part
        content = "".join(p.get("text", "") for p in content
                          if isinstance(p, Mapping) and isinstance(p.get("text"), str))
    if not isinstance(content, str):
        raise SyncCallFailed(f"KIE chat: HTTP {status_code} without choices[0].message.content",
                             status=status_code, request_id=answer.request_id, body=answer.raw)
    request_id = answer.request_id or (answer.payload.get("id") if isinstance(
        answer.payload.get("id"), str) else None)
    return SyncResult(outputs=(Output(text=content, media_type="text/plain"),),
                      request_id=request_id, raw=answer.payload)


# ---------------------------------------------------------------- I/O


def _input_top_level(request: CreateRequest, *, with_model: bool) -> dict[str, Any]:
    body = dict(request.input)
    if with_model and request.model:
        body["model"] = request.model
    return body


def market_body(request: CreateRequest) -> dict[str, Any]:
    return {"model": request.model, "input": dict(request.input)}


@dataclass(frozen=True)
class KieApi:
    """One KIE task API: where to create and read, how to build the body, how to parse."""

    name: str
    create_path: str
    record_path: str
    build: Callable[[CreateRequest], dict[str, Any]]
    parse: Callable[[Any, int, Mapping[str, str] | None], PollResult]


MARKET = KieApi("kie-market", "/api/v1/jobs/createTask", "/api/v1/jobs/recordInfo",
                market_body, parse_record_market)
VEO = KieApi("kie-veo", "/api/v1/veo/generate", "/api/v1/veo/record-info",
             lambda r: _input_top_level(r, with_model=True), parse_record_veo)
SUNO = KieApi("kie-suno", "/api/v1/generate", "/api/v1/generate/record-info",
              lambda r: _input_top_level(r, with_model=True), parse_record_suno)
KONTEXT = KieApi("kie-kontext", "/api/v1/flux/kontext/generate",
                 "/api/v1/flux/kontext/record-info",
                 lambda r: _input_top_level(r, with_model=True), parse_record_kontext)
LUMA = KieApi("kie-luma", "/api/v1/modify/generate", "/api/v1/modify/record-info",
              lambda r: _input_top_level(r, with_model=False), parse_record_luma)  # no model
RUNWAY = KieApi("kie-runway", "/api/v1/runway/generate", "/api/v1/runway/record-detail",
                lambda r: _input_top_level(r, with_model=True), parse_record_runway)


def _http(settings: Settings, session: requests.Session | None, *, read_timeout: float,
          sleep: Callable[[float], None]) -> HttpClient:
    return HttpClient(
        settings.kie_base_url,
        headers={"Authorization": f"Bearer {settings.kie_api_key}",
                 "Content-Type": "application/json", "Accept": "application/json"},
        session=session, connect_timeout=settings.connect_timeout, read_timeout=read_timeout,
        sleep=sleep,
    )


class KieClient:
    """An AsyncProvider for one KIE task API (creates sent once, reads retried)."""

    def __init__(self, api: KieApi, settings: Settings, session: requests.Session | None = None,
                 *, sleep: Callable[[float], None] = time.sleep) -> None:
        self.api = api
        self.name = api.name
        self.http = _http(settings, session, read_timeout=settings.read_timeout, sleep=sleep)

    def create(self, request: CreateRequest) -> Created:
        body = self.api.build(request)
        body.pop("callBackUrl", None)  # only ours: the sweep trusts what comes back in it
        if request.webhook_url:
            body["callBackUrl"] = request.webhook_url
        try:
            response = self.http.send_once("POST", self.api.create_path, json=body)
        except requests.RequestException as exc:  # sent or not, we cannot know: uncertain
            raise CreateUncertain(f"KIE create: {exc.__class__.__name__}: {exc}") from exc
        return parse_create(response.status_code, response.content, response.headers)

    def poll(self, task_id: str, *, model: str | None = None) -> PollResult:
        response = self.http.read("GET", self.api.record_path, params={"taskId": task_id})
        return self.api.parse(response.content, response.status_code, response.headers)

    def cancel(self, task_id: str, *, model: str | None = None) -> bool:
        return False  # KIE has no cancel endpoint

    def find_created(self, job_id: str, created_after: Any) -> ListedTask | None:
        return None  # KIE has no task listing; evidence comes from webhooks and recordInfo


class KieLlmClient:
    """A SyncProvider for ``kie-llm``: one chat call, never retried (the request decides)."""

    name = "kie-llm"

    def __init__(self, settings: Settings, session: requests.Session | None = None) -> None:
        self.http = _http(settings, session, read_timeout=settings.sync_read_timeout,
                          sleep=time.sleep)

    def call(self, model: str, input: Mapping[str, Any]) -> SyncResult:
        body = {k: v for k, v in input.items() if k not in ("prompt", "stream")}
        body["model"] = model
        if "messages" not in body and isinstance(input.get("prompt"), str):
            body["messages"] = [{"role": "user", "content": input["prompt"]}]
        try:
            response = self.http.send_once("POST", LLM_CHAT_PATH.format(model=model), json=body)
        except requests.Timeout as exc:
            raise SyncCallFailed(f"KIE chat: timeout: {exc}", code=ErrorCode.UPSTREAM_TIMEOUT) from exc
        except requests.RequestException as exc:
            raise SyncCallFailed(f"KIE chat: {exc.__class__.__name__}: {exc}") from exc
        return parse_chat(response.status_code, response.content, response.headers)


def _factory(api: KieApi) -> Callable[[Settings, requests.Session | None], KieClient]:
    def build(settings: Settings, session: requests.Session | None = None) -> KieClient:
        return KieClient(api, settings, session)

    build.__name__ = f"{api.name.removeprefix('kie-')}_client"
    return build


market_client = _factory(MARKET)
veo_client = _factory(VEO)
suno_client = _factory(SUNO)
kontext_client = _factory(KONTEXT)
luma_client = _factory(LUMA)
runway_client = _factory(RUNWAY)


def llm_client(settings: Settings, session: requests.Session | None = None) -> KieLlmClient:
    return KieLlmClient(settings, session)
