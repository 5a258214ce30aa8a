"""KIE.ai clients: the market jobs API, Veo, Suno, Flux Kontext, Luma modify, Runway and the
KIE-proxied LLM (PROVIDERS.md §1, DESIGN.md §3–§4).

One shape throughout: pydantic models of the upstream records, PURE parse functions
(:func:`parse_create`, ``parse_record_*``, :func:`parse_chat`) that turn one HTTP answer into our
types or the library's errors, and thin I/O (:class:`KieClient`, :class:`KieLlmClient`).

KIE answers in an envelope ``{code, msg|message, data}`` whose ``code`` is an application code that
can disagree with the HTTP status (an error inside HTTP 200), so :func:`classify` decides by the
envelope and falls back to the HTTP status only without a usable envelope; :func:`error_for` is
the one place an answer becomes an error. The job id travels only in ``callBackUrl`` (some models
reject unknown ``input`` keys) and comes back in the record's ``param`` JSON string, which is how
the sweep proves an uncertain submission was ours (:func:`planted_job_id`).
"""

from __future__ import annotations

import json
import mimetypes
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Annotated, Any, Literal
from urllib.parse import parse_qs, quote, urlsplit

import requests
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, TypeAdapter, ValidationError

from ..errors import (
    CreateRateLimited,
    CreateRejected,
    CreateUncertain,
    ErrorCode,
    InvalidParam,
    MalformedResponse,
    ProviderError,
    ReadFailed,
    SyncCallFailed,
    bounded,
)
from ..settings import Settings
from . import deadline
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
from .http import HttpClient, parse_retry_after

__all__ = [
    "KieApi", "KieClient", "KieLlmClient", "Verdict", "classify", "error_for", "parse_create",
    "parse_record_market", "parse_record_veo", "parse_record_suno", "parse_record_kontext",
    "parse_record_luma", "parse_record_runway", "parse_chat", "planted_job_id", "market_client",
    "veo_client", "suno_client", "kontext_client", "luma_client", "runway_client", "llm_client",
]

PLANT_PARAM = "job_id"  # the callBackUrl query parameter that carries our job id
REQUEST_ID_HEADERS = ("x-request-id", "request-id")  # KIE documents none; kept when present
# kie-llm: KIE serves each chat model under its own path, ``POST /{model}/v1/chat/completions``
# (docs.kie.ai/market/chat/gemini: ``https://api.kie.ai/gemini-3-pro/v1/chat/completions``), with
# an OpenAI-style body and ``choices[0].message.content`` in the answer. The model stays in the
# body too: OpenAI-compatible gateways read it there, and KIE ignores it.
LLM_CHAT_PATH = "/{model}/v1/chat/completions"


# ---------------------------------------------------------------- lenient field types
# Upstream JSON is untrusted: fields that only describe (messages, progress, times) never fail a
# read; fields that carry media are strict, because "success without media" refunds the user.


def _text(value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))  # successFlag 1.0 is still "1"
    if isinstance(value, int | float):
        return str(value)
    return bounded(json.dumps(value, default=str), 200)  # keep an odd status visible, not crash


def _progress(value: Any) -> int | None:
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        return None
    if isinstance(value, bool) or number != number or number in (float("inf"), float("-inf")):
        return None
    return max(0, min(100, round(number)))


def _to_datetime(value: Any) -> datetime | None:
    """Epoch milliseconds (int or digits) or ``YYYY-MM-DD HH:MM:SS`` (zone undocumented: UTC)."""
    try:
        if isinstance(value, str) and value.strip().isdigit():
            value = int(value.strip())
        if isinstance(value, int | float) and not isinstance(value, bool):
            return datetime.fromtimestamp(value / 1000, UTC)
        if isinstance(value, str):
            parsed = datetime.fromisoformat(value.strip())
            return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)
    except (ValueError, OverflowError, OSError):
        pass
    return None


def _urls(value: Any) -> tuple[str, ...]:
    if value is None or value == "":
        return ()
    if isinstance(value, str):
        return (value,)
    if not isinstance(value, list):
        raise ValueError("expected a list of URLs")
    if not all(item is None or isinstance(item, str) for item in value):
        raise ValueError("expected URL strings")
    return tuple(item for item in value if item)


def _code(value: Any) -> Any:
    if isinstance(value, bool):
        raise ValueError("a boolean is not an envelope code")
    return value


Text = Annotated[str | None, BeforeValidator(_text)]
Progress = Annotated[int | None, BeforeValidator(_progress)]
Timestamp = Annotated[datetime | None, BeforeValidator(_to_datetime)]
Urls = Annotated[tuple[str, ...], BeforeValidator(_urls)]
_URLS: TypeAdapter[tuple[str, ...]] = TypeAdapter(Urls)


# ---------------------------------------------------------------- upstream models


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)


class Envelope(_Model):
    code: Annotated[int, BeforeValidator(_code)]
    msg: Text = None
    message: Text = None  # market recordInfo's prose example says ``message``: accept both
    data: Any = None

    @property
    def text(self) -> str | None:
        return self.msg or self.message


class MarketRecord(_Model):
    task_id: Text = Field(None, alias="taskId")
    state: Text = None
    param: Any = None  # a JSON string holding the create body (and our callBackUrl)
    result_json: Any = Field(None, alias="resultJson")  # a JSON string to parse again
    fail_code: Text = Field(None, alias="failCode")
    fail_msg: Text = Field(None, alias="failMsg")
    progress: Progress = None  # third-party code reads it; not documented
    create_time: Timestamp = Field(None, alias="createTime")
    complete_time: Timestamp = Field(None, alias="completeTime")


class FlagResponse(_Model):
    result_urls: Urls = Field((), alias="resultUrls")  # Veo, Luma
    result_image_url: Urls = Field((), alias="resultImageUrl")  # Flux Kontext: one image


class FlagRecord(_Model):
    """Veo, Flux Kontext and Luma share ``successFlag`` + ``response`` + ``errorCode``."""

    task_id: Text = Field(None, alias="taskId")
    param: Any = Field(None, alias="paramJson")
    success_flag: Text = Field(None, alias="successFlag")
    response: Any = None  # read only on success: a running task's odd shape must not fail
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
    response: Any = None  # read only on SUCCESS
    error_code: Text = Field(None, alias="errorCode")
    error_message: Text = Field(None, alias="errorMessage")


class RunwayVideo(_Model):
    video_url: Urls = Field((), alias="videoUrl")


class RunwayRecord(_Model):
    task_id: Text = Field(None, alias="taskId")
    param: Any = Field(None, alias="generateParam")
    state: Text = None
    video_info: Any = Field(None, alias="videoInfo")  # read only on success
    fail_code: Text = Field(None, alias="failCode")
    fail_msg: Text = Field(None, alias="failMsg")
    generate_time: Timestamp = Field(None, alias="generateTime")


# ---------------------------------------------------------------- classification


class Verdict(StrEnum):
    OK = "ok"
    INVALID = "invalid"  # 400/422: the provider refused the input
    REJECTED = "rejected"  # a well-formed refusal: nothing was created
    RATE_LIMITED = "rate_limited"  # 429 / 455 maintenance: documented as not created
    UNCERTAIN = "uncertain"  # 500, other 5xx, anything unknown: it may exist upstream


def classify(status_code: int, envelope_code: int | None) -> Verdict:
    """DESIGN §4's KIE rows: the envelope ``code`` decides even under HTTP 200; the HTTP status
    decides without a usable envelope, or when an envelope 200 contradicts a failing HTTP."""
    http_ok = 200 <= status_code < 300
    code = status_code
    if envelope_code is not None and (envelope_code != 200 or http_ok):
        code = envelope_code
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
class Answer:
    """One HTTP answer decoded once: what every parse function starts from."""

    status: int
    payload: Any  # the JSON after unwrap_sdk, or _UNPARSEABLE
    raw: str | None  # the bounded body, kept as evidence
    envelope: Envelope | None
    request_id: str | None
    retry_after: float | None

    @property
    def mapping(self) -> Mapping[str, Any] | None:
        return self.payload if isinstance(self.payload, Mapping) else None


def decode(status_code: int, body: Any, headers: Mapping[str, str] | None = None) -> Answer:
    """Decode a body (bytes, text or already-parsed JSON) and the headers we keep."""
    if isinstance(body, bytes | bytearray | str):
        raw = bounded(bytes(body) if isinstance(body, bytearray) else body)
        try:
            payload = json.loads(body)
        except (ValueError, RecursionError):
            payload = _UNPARSEABLE
    else:
        payload, raw = body, bounded(json.dumps(body, default=str))
    wrapper_id = None
    if payload is not _UNPARSEABLE:
        payload, wrapper_id = unwrap_sdk(payload)
    envelope = None
    if isinstance(payload, Mapping) and "code" in payload:
        try:
            envelope = Envelope.model_validate(payload)
        except ValidationError:
            envelope = None  # a non-numeric "code" is no envelope we can trust
    lowered = {str(k).lower(): v for k, v in (headers or {}).items()}
    request_id = next((v for n in REQUEST_ID_HEADERS if isinstance(v := lowered.get(n), str) and v),
                      None)
    retry_after = lowered.get("retry-after")
    return Answer(
        status=status_code, payload=payload, raw=raw, envelope=envelope,
        request_id=request_id or wrapper_id,
        retry_after=parse_retry_after(retry_after if isinstance(retry_after, str) else None),
    )


Phase = Literal["create", "read", "sync"]
_SYNC_CODES = {
    Verdict.INVALID: ErrorCode.UPSTREAM_INVALID_INPUT,
    Verdict.REJECTED: ErrorCode.UPSTREAM_SUBMISSION_FAILED,
    Verdict.RATE_LIMITED: ErrorCode.UPSTREAM_RATE_LIMITED,
    Verdict.UNCERTAIN: ErrorCode.UPSTREAM_FAILED,  # sync kinds are never uncertain
}


def error_for(answer: Answer, phase: Phase) -> ProviderError | None:
    """THE one place a KIE answer becomes an error; None when the answer is usable."""
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


def parse_create(status_code: int, body: Any, headers: Mapping[str, str] | None = None) -> Created:
    """A create answer → :class:`Created`; else CreateRejected / CreateRateLimited / CreateUncertain."""
    answer = decode(status_code, body, headers)
    error = error_for(answer, "create")
    if error is not None:
        raise error
    # OK: an envelope 200 carries data.taskId; a bare (SDK-unwrapped) 2xx may carry taskId itself.
    data, _ = unwrap_sdk(answer.envelope.data if answer.envelope else answer.payload)
    task_id = data.get("taskId") if isinstance(data, Mapping) else None
    if isinstance(task_id, int) and not isinstance(task_id, bool):
        task_id = str(task_id)
    if not isinstance(task_id, str) or not task_id:
        # Accepted (or an unparseable 2xx) without an id: it may exist upstream, never resubmit.
        raise CreateUncertain(f"KIE create: HTTP {status_code} without data.taskId",
                              status=status_code, request_id=answer.request_id, body=answer.raw)
    return Created(task_id=task_id, request_id=answer.request_id, raw=answer.mapping)


def planted_job_id(param: Any) -> str | None:
    """The job id planted in ``callBackUrl``, read back from a record's ``param`` (JSON string)."""
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


def _not_found(env: Envelope) -> bool:
    # KIE answers an unknown taskId with code 404 "Task not found" (sometimes only the text).
    # DECISION (recordInfo, unknown or expired task): the record endpoints' docs list 422 among
    # their codes without saying when; KIE's other endpoints document ``422 "record is null"``
    # for an id they have no record of. That exact text is read as not found (never terminal by
    # itself: the lifecycle counts it and fails TASK_NOT_FOUND only at exhaustion); any other 422
    # stays a read failure.
    text = (env.text or "").lower()
    return env.code == 404 or (env.code == 422 and "record is null" in text) or (
        (env.code != 200 or env.data is None) and "task not found" in text
    )


def _media_type(url: str) -> str | None:
    """A hint from the URL's extension; the fetch's Content-Type has the last word."""
    try:
        return mimetypes.guess_type(urlsplit(url).path)[0]
    except ValueError:  # e.g. "http://[" — the media fetch will refuse it, not the read
        return None


def _outputs(urls: tuple[str, ...]) -> tuple[Output, ...]:
    return tuple(Output(url=u, media_type=_media_type(u)) for u in urls)


def _read(model: type[_Model], decide: Callable[[Any], PollResult], body: Any, status_code: int,
          headers: Mapping[str, str] | None) -> PollResult:
    """Envelope → record → model → decision, the same for every KIE record endpoint."""
    answer = decode(status_code, body, headers)
    env = answer.envelope
    if env is not None and _not_found(env):
        return PollResult(PollStatus.NOT_FOUND, raw_status=str(env.code), error_message=env.text,
                          request_id=answer.request_id, raw=answer.mapping)
    error = error_for(answer, "read")
    if error is not None:
        raise error
    evidence = {"status": status_code, "request_id": answer.request_id, "body": answer.raw}
    data, wrapper_id = unwrap_sdk(env.data if env is not None else answer.payload)
    if not isinstance(data, Mapping):  # also the unparseable 2xx
        raise MalformedResponse("KIE read: no record in the answer", **evidence)
    try:
        record = model.model_validate(data)
        result = decide(record)
    except ValidationError as exc:
        raise MalformedResponse(f"KIE read: unexpected record ({exc.error_count()} errors)",
                                **evidence) from None
    except MalformedResponse as exc:
        raise MalformedResponse(exc.message, **evidence) from None
    return PollResult(
        status=result.status, progress=result.progress, outputs=result.outputs,
        raw_status=result.raw_status, error_code=result.error_code or None,
        error_message=result.error_message or None,
        request_id=answer.request_id or wrapper_id,
        planted_job_id=planted_job_id(getattr(record, "param", None)), raw=answer.mapping,
    )


_MARKET_RUNNING = {"waiting", "queuing", "queueing", "generating"}  # KIE spells it both ways
_RUNWAY_RUNNING = {"wait", "waiting", "queueing", "queuing", "generating"}


def _market_outputs(result_json: Any) -> tuple[Output, ...]:
    if isinstance(result_json, str):
        try:
            result_json = json.loads(result_json) if result_json.strip() else None
        except (ValueError, RecursionError):
            # A success whose result we cannot read must not pass as "no media" (that refunds).
            raise MalformedResponse("KIE market: resultJson is not JSON") from None
    result_json, _ = unwrap_sdk(result_json)
    if result_json is None:
        return ()
    if not isinstance(result_json, Mapping):
        raise MalformedResponse("KIE market: resultJson is not an object")
    outputs = _outputs(_URLS.validate_python(result_json.get("resultUrls")))
    obj = result_json.get("resultObject")
    if obj is not None:  # text models answer with an object instead of URLs
        text = obj if isinstance(obj, str) else json.dumps(obj, ensure_ascii=False)
        kind = "text/plain" if isinstance(obj, str) else "application/json"
        outputs += (Output(text=text, media_type=kind),)
    return outputs


def _decide_market(r: MarketRecord) -> PollResult:
    state = (r.state or "").lower()
    if state in _MARKET_RUNNING:
        return PollResult(PollStatus.RUNNING, progress=r.progress, raw_status=r.state)
    if state == "success":
        return PollResult(PollStatus.SUCCEEDED, progress=100, raw_status=r.state,
                          outputs=_market_outputs(r.result_json))
    if state == "fail":
        return PollResult(PollStatus.FAILED, raw_status=r.state, error_code=r.fail_code,
                          error_message=r.fail_msg)
    return PollResult(PollStatus.UNKNOWN, raw_status=r.state)


def _flag_decider(succeeded: frozenset[str]) -> Callable[[FlagRecord], PollResult]:
    def decide(r: FlagRecord) -> PollResult:
        flag = (r.success_flag or "").strip()
        if flag == "0":
            return PollResult(PollStatus.RUNNING, raw_status=flag)
        if flag in succeeded:
            resp = FlagResponse.model_validate(r.response or {})
            return PollResult(PollStatus.SUCCEEDED, progress=100, raw_status=flag,
                              outputs=_outputs(resp.result_urls + resp.result_image_url))
        if flag in ("2", "3"):
            return PollResult(PollStatus.FAILED, raw_status=flag, error_code=r.error_code,
                              error_message=r.error_message)
        return PollResult(PollStatus.UNKNOWN, raw_status=r.success_flag)

    return decide


_SUNO_RUNNING = {"PENDING", "TEXT_SUCCESS", "FIRST_SUCCESS"}
_SUNO_FAILED = {"CREATE_TASK_FAILED", "GENERATE_AUDIO_FAILED", "CALLBACK_EXCEPTION",
                "SENSITIVE_WORD_ERROR"}


def _suno_urls(r: SunoRecord) -> tuple[str, ...]:
    tracks = SunoResponse.model_validate(r.response or {}).suno_data or []
    return tuple(url for track in tracks for url in track.audio_url)


def _decide_suno(r: SunoRecord) -> PollResult:
    status = (r.status or "").upper()
    if status in _SUNO_RUNNING:
        return PollResult(PollStatus.RUNNING, raw_status=r.status)
    if status == "SUCCESS":
        return PollResult(PollStatus.SUCCEEDED, progress=100, raw_status=r.status,
                          outputs=_outputs(_suno_urls(r)))
    if status == "CALLBACK_EXCEPTION":
        # DECISION: docs.kie.ai/suno-api/get-music-details says only "Error during callback
        # process" — the delivery to our callBackUrl failed, not the generation (the same as
        # Luma's successFlag 4, "generation succeeded but callback failed"). With tracks in the
        # record the music exists and was billed: a success. Without tracks nothing was made.
        try:
            urls = _suno_urls(r)
        except ValidationError:
            urls = ()
        if urls:
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
        urls = RunwayVideo.model_validate(r.video_info or {}).video_url
        return PollResult(PollStatus.SUCCEEDED, progress=100, raw_status=r.state,
                          outputs=_outputs(urls))
    if state == "fail":
        return PollResult(PollStatus.FAILED, raw_status=r.state, error_code=r.fail_code,
                          error_message=r.fail_msg)
    return PollResult(PollStatus.UNKNOWN, raw_status=r.state)


_decide_flag = _flag_decider(frozenset({"1"}))  # Veo and Flux Kontext
_decide_luma = _flag_decider(frozenset({"1", "4"}))  # 4: callback failed, generation succeeded
Headers = Mapping[str, str] | None


def parse_record_market(body: Any, status_code: int = 200, headers: Headers = None) -> PollResult:
    """A ``/api/v1/jobs/recordInfo`` answer (``state``, ``resultJson`` string) → PollResult."""
    return _read(MarketRecord, _decide_market, body, status_code, headers)


def parse_record_veo(body: Any, status_code: int = 200, headers: Headers = None) -> PollResult:
    """A Veo record (successFlag 0/1/2/3, ``response.resultUrls``) → PollResult."""
    return _read(FlagRecord, _decide_flag, body, status_code, headers)


def parse_record_kontext(body: Any, status_code: int = 200, headers: Headers = None) -> PollResult:
    """A Flux Kontext record (successFlag 0/1/2/3, ``response.resultImageUrl``) → PollResult."""
    return _read(FlagRecord, _decide_flag, body, status_code, headers)


def parse_record_luma(body: Any, status_code: int = 200, headers: Headers = None) -> PollResult:
    """A Luma modify record (successFlag 0–4; 4 is still a success) → PollResult."""
    return _read(FlagRecord, _decide_luma, body, status_code, headers)


def parse_record_suno(body: Any, status_code: int = 200, headers: Headers = None) -> PollResult:
    """A Suno record (``status``; every ``sunoData[].audioUrl`` on SUCCESS) → PollResult."""
    return _read(SunoRecord, _decide_suno, body, status_code, headers)


def parse_record_runway(body: Any, status_code: int = 200, headers: Headers = None) -> PollResult:
    """A Runway ``record-detail`` answer (``state``; ``videoInfo.videoUrl``) → PollResult."""
    return _read(RunwayRecord, _decide_runway, body, status_code, headers)


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


# ---------------------------------------------------------------- I/O


def market_body(request: CreateRequest) -> dict[str, Any]:
    """Market: ``{"model", "input"}`` (+ ``callBackUrl``, added by the client)."""
    return {"model": request.model, "input": dict(request.input)}


def top_level_body(request: CreateRequest) -> dict[str, Any]:
    """Veo / Suno / Kontext / Runway: the input's fields at top level plus ``model``."""
    return {**request.input, "model": request.model} if request.model else dict(request.input)


def modelless_body(request: CreateRequest) -> dict[str, Any]:
    """Luma modify has no ``model`` parameter: the input's fields only."""
    return dict(request.input)


@dataclass(frozen=True)
class KieApi:
    """One KIE task API: where to create and read, how to build the body, how to parse."""

    name: str
    create_path: str
    record_path: str
    build: Callable[[CreateRequest], dict[str, Any]]
    parse: Callable[[Any, int, Headers], PollResult]


MARKET = KieApi("kie-market", "/api/v1/jobs/createTask", "/api/v1/jobs/recordInfo",
                market_body, parse_record_market)
VEO = KieApi("kie-veo", "/api/v1/veo/generate", "/api/v1/veo/record-info",
             top_level_body, parse_record_veo)
SUNO = KieApi("kie-suno", "/api/v1/generate", "/api/v1/generate/record-info",
              top_level_body, parse_record_suno)
KONTEXT = KieApi("kie-kontext", "/api/v1/flux/kontext/generate",
                 "/api/v1/flux/kontext/record-info", top_level_body, parse_record_kontext)
LUMA = KieApi("kie-luma", "/api/v1/modify/generate", "/api/v1/modify/record-info",
              modelless_body, parse_record_luma)
# DECISION (Runway, Veo): both accept ``callBackUrl`` (KIE's callback pages; the OpenAPI callback
# ``{$request.body#/callBackUrl}`` of /api/v1/runway/generate), so the client sends it, but their
# documented records (``generateParam`` / ``paramJson``) do not echo it: planted_job_id may be
# None, and an uncertain create of these kinds waits for an operator (README, provider notes).
RUNWAY = KieApi("kie-runway", "/api/v1/runway/generate", "/api/v1/runway/record-detail",
                top_level_body, parse_record_runway)


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
    """An AsyncProvider for one KIE task API: creates are sent once, reads are retried."""

    def __init__(self, api: KieApi, settings: Settings, session: requests.Session | None = None,
                 *, sleep: Callable[[float], None] = time.sleep) -> None:
        self.api = api
        self.name = api.name
        self.http = _http(settings, session, read_timeout=settings.read_timeout, sleep=sleep)

    def create(self, request: CreateRequest) -> Created:
        body = self.api.build(request)
        # Only our callBackUrl: it carries the job id the sweep later trusts as evidence.
        body.pop("callBackUrl", None)
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

    def find_created(self, job_id: str, created_after: datetime) -> ListedTask | None:
        return None  # KIE has no task listing; evidence comes from webhooks and recordInfo


class KieLlmClient:
    """A SyncProvider for ``kie-llm``: one chat call, never retried (the request decides)."""

    name = "kie-llm"

    def __init__(self, settings: Settings, session: requests.Session | None = None) -> None:
        self.http = _http(settings, session, read_timeout=settings.sync_read_timeout,
                          sleep=time.sleep)
        self.deadline = deadline.sync_seconds(settings)  # connect + every read (DESIGN §5.8)
        deadline.prepare(self.http.session, self.http.base_url)

    def call(self, model: str, input: Mapping[str, Any]) -> SyncResult:
        # ``stream`` is dropped: a sync call reads one JSON body. ``prompt`` is a convenience.
        body = {k: v for k, v in input.items() if k not in ("prompt", "stream")}
        if not model.strip("/"):
            raise InvalidParam("kie-llm needs a model (it names the chat path)", param="model")
        body["model"] = model
        if "messages" not in body and isinstance(input.get("prompt"), str):
            body["messages"] = [{"role": "user", "content": input["prompt"]}]
        try:
            path = LLM_CHAT_PATH.format(model=quote(model, safe=""))
            with deadline.bounded(self.deadline):
                response = self.http.send_once("POST", path, json=body)
        except requests.Timeout as exc:
            raise SyncCallFailed(f"KIE chat: timeout: {exc}",
                                 code=ErrorCode.UPSTREAM_TIMEOUT) from exc
        except requests.RequestException as exc:
            raise SyncCallFailed(f"KIE chat: {exc.__class__.__name__}: {exc}") from exc
        return parse_chat(response.status_code, response.content, response.headers)


def market_client(settings: Settings, session: requests.Session | None = None) -> KieClient:
    """kie-standard, kie-kling3 and kie-lip-sync: the market jobs API."""
    return KieClient(MARKET, settings, session)


def veo_client(settings: Settings, session: requests.Session | None = None) -> KieClient:
    return KieClient(VEO, settings, session)


def suno_client(settings: Settings, session: requests.Session | None = None) -> KieClient:
    return KieClient(SUNO, settings, session)


def kontext_client(settings: Settings, session: requests.Session | None = None) -> KieClient:
    return KieClient(KONTEXT, settings, session)


def luma_client(settings: Settings, session: requests.Session | None = None) -> KieClient:
    return KieClient(LUMA, settings, session)


def runway_client(settings: Settings, session: requests.Session | None = None) -> KieClient:
    return KieClient(RUNWAY, settings, session)


def llm_client(settings: Settings, session: requests.Session | None = None) -> KieLlmClient:
    return KieLlmClient(settings, session)
