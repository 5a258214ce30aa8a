"""What every KIE endpoint shares: the envelope, the lenient field types, the classification
(:func:`classify`, :func:`error_for`: the one place an answer becomes an error), the create
answer, the record read (``_read``: envelope → record → model → decision) and the HTTP
plumbing.

KIE answers in an envelope ``{code, msg|message, data}`` whose ``code`` is an application code that
can disagree with the HTTP status (an error inside HTTP 200), so :func:`classify` decides by the
envelope and falls back to the HTTP status only without a usable envelope. The job id travels only
in ``callBackUrl`` (some models reject unknown ``input`` keys) and comes back in the record's
``param`` JSON string, which is how the sweep proves an uncertain submission was ours
(:func:`planted_job_id`).
"""

from __future__ import annotations

import json
import mimetypes
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Annotated, Any, Literal
from urllib.parse import parse_qs, urlsplit

import requests
from pydantic import BaseModel, BeforeValidator, ConfigDict, TypeAdapter, ValidationError

from ...errors import (
    CreateRateLimited,
    CreateRejected,
    CreateUncertain,
    ErrorCode,
    MalformedResponse,
    ProviderError,
    ReadFailed,
    SyncCallFailed,
    bounded,
)
from ...settings import Settings
from ..base import Created, CreateRequest, Output, PollResult, PollStatus, unwrap_sdk
from ..http import HttpClient, parse_retry_after, provider_http

PLANT_PARAM = "job_id"  # the callBackUrl query parameter that carries our job id
REQUEST_ID_HEADERS = ("x-request-id", "request-id")  # KIE documents none; kept when present


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


# ---------------------------------------------------------------- classification


class Verdict(StrEnum):
    OK = "ok"
    INVALID = "invalid"  # 400/422: the provider refused the input
    REJECTED = "rejected"  # a well-formed refusal: nothing was created
    RATE_LIMITED = "rate_limited"  # 429 / 455 maintenance: documented as not created
    UNCERTAIN = "uncertain"  # 500, other 5xx, anything unknown: it may exist upstream


def classify(status_code: int, envelope_code: int | None) -> Verdict:
    """The outcome table's KIE rows (README, Design notes: The outcome table): the envelope ``code`` decides even under HTTP 200; the HTTP status
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
    def malformed(message: str) -> MalformedResponse:
        return MalformedResponse(message, status=status_code, request_id=answer.request_id,
                                 body=answer.raw)

    data, wrapper_id = unwrap_sdk(env.data if env is not None else answer.payload)
    if not isinstance(data, Mapping):  # also the unparseable 2xx
        raise malformed("KIE read: no record in the answer")
    try:
        record = model.model_validate(data)
        result = decide(record)
    except ValidationError as exc:
        raise malformed(f"KIE read: unexpected record ({exc.error_count()} errors)") from None
    except MalformedResponse as exc:
        raise malformed(exc.message) from None
    return PollResult(
        status=result.status, progress=result.progress, outputs=result.outputs,
        raw_status=result.raw_status, error_code=result.error_code or None,
        error_message=result.error_message or None,
        request_id=answer.request_id or wrapper_id,
        planted_job_id=planted_job_id(getattr(record, "param", None)), raw=answer.mapping,
    )


Headers = Mapping[str, str] | None


def top_level_body(request: CreateRequest) -> dict[str, Any]:
    """Veo / Suno / Kontext / Runway: the input's fields at top level plus ``model``."""
    return {**request.input, "model": request.model} if request.model else dict(request.input)


@dataclass(frozen=True)
class KieApi:
    """One KIE task API: where to create and read, how to build the body, how to parse."""

    name: str
    create_path: str
    record_path: str
    build: Callable[[CreateRequest], dict[str, Any]]
    parse: Callable[[Any, int, Headers], PollResult]


def http_client(settings: Settings, session: requests.Session | None, *, read_timeout: float,
                sleep: Callable[[float], None]) -> HttpClient:
    return provider_http(
        settings.kie_base_url,
        {"Authorization": f"Bearer {settings.kie_api_key}",
         "Content-Type": "application/json", "Accept": "application/json"},
        settings, session, read_timeout=read_timeout, sleep=sleep,
    )


def state_decider(running: frozenset[str] | set[str],
                  outputs: Callable[[Any], tuple[Output, ...]]) -> Callable[[Any], PollResult]:
    """The decision of a ``state`` record (market, Runway): ``running`` states, ``success`` (its
    ``outputs``), ``fail`` (``failCode``/``failMsg``); anything else is UNKNOWN, never guessed."""

    def decide(r: Any) -> PollResult:
        state = (r.state or "").lower()
        if state in running:
            return PollResult(PollStatus.RUNNING, progress=getattr(r, "progress", None),
                              raw_status=r.state)
        if state == "success":
            return PollResult(PollStatus.SUCCEEDED, progress=100, raw_status=r.state,
                              outputs=outputs(r))
        if state == "fail":
            return PollResult(PollStatus.FAILED, raw_status=r.state, error_code=r.fail_code,
                              error_message=r.fail_msg)
        return PollResult(PollStatus.UNKNOWN, raw_status=r.state)

    return decide
