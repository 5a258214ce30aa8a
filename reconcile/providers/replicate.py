"""Replicate predictions and trainings (PROVIDERS.md §2).

Model strings (``CreateRequest.model``):

* ``owner/name:version`` — ``POST /v1/predictions`` with ``{"version": <version>, ...}``;
* ``owner/name`` — an official model: ``POST /v1/models/{owner}/{name}/predictions``;
* ``deployment:owner/name`` — ``POST /v1/deployments/{owner}/{name}/predictions``;
* trainings always need ``owner/name:version`` and ``extra["destination"]`` (``owner/model``).

The job id rides in the ``webhook`` URL's query (``?job_id=…``, already on
``CreateRequest.webhook_url``), never in ``input``: Replicate echoes ``webhook`` back on every
prediction, which is what :meth:`ReplicateClient.find_created` matches on after an uncertain
create. Creates go out once (``send_once``); reads are retried by :class:`HttpClient`.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal
from urllib.parse import parse_qs, quote, urlsplit

import requests
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..errors import (
    InvalidParam,
    ProviderError,
)
from ..settings import Settings
from .base import Created, CreateRequest, ListedTask, Output, PollResult, PollStatus, unwrap_sdk
from .http import HttpClient, parse_retry_after
from .http import body_json as _json
from .http import body_text as _text
from .http import header_value as _header
from .outcome import Op, status_error, transport_error
from .outputs import ANY as ANY_OUTPUT
from .outputs import (
    Expect,
    OutputSpec,
    data_uri_output,
    declared_output,
    document_output,
    text_output,
)

__all__ = [
    "MAX_LIST_PAGES",
    "ListPage",
    "Prediction",
    "Problem",
    "ReplicateClient",
    "build_create",
    "extract_outputs",
    "parse_create",
    "parse_list",
    "parse_status",
    "planted_job_id",
    "prediction_client",
    "to_error",
    "training_client",
]

Resource = Literal["predictions", "trainings"]

_RUNNING = frozenset({"starting", "processing"})
_CANCELED = frozenset({"canceled", "aborted"})  # aborted = deadline hit before it started
MAX_LIST_PAGES = 10  # find_created is evidence, not a crawl: bound the cost of one search
_MAX_DEPTH = 32  # outputs are model-defined JSON; never recurse without a bound
_THROTTLE_HINT = re.compile(r"resets in ~?(\d+(?:\.\d+)?)\s*s")


class Prediction(BaseModel):
    """A prediction or training as Replicate returns it (only the fields we read)."""

    model_config = ConfigDict(extra="allow")

    id: str = Field(min_length=1)
    status: str | None = None
    model: str | None = None
    version: str | None = None
    output: Any = None
    error: Any = None
    webhook: str | None = None
    created_at: datetime | None = None


class Problem(BaseModel):
    """An RFC 7807 error body: ``{type?, title, status, detail}`` (+ ``invalid_fields`` on 422)."""

    model_config = ConfigDict(extra="allow")

    title: str | None = None
    detail: Any = None
    type: str | None = None


@dataclass(frozen=True)
class ListPage:
    """One page of ``GET /v1/predictions``: the tasks on it and the next page's URL."""

    tasks: tuple[ListedTask, ...]
    next: str | None


# --- pure helpers -----------------------------------------------------------------------------




def planted_job_id(webhook: Any) -> str | None:
    """The ``job_id`` query parameter of a webhook URL, or None."""
    if not isinstance(webhook, str):
        return None
    try:
        values = parse_qs(urlsplit(webhook).query).get("job_id")
    except ValueError:
        return None
    return values[0] if values else None


def _is_url(value: str) -> bool:
    return value.startswith(("https://", "http://", "data:"))


def _urls(node: Any, depth: int = 0) -> Iterator[str]:
    if depth > _MAX_DEPTH:
        return
    if isinstance(node, str):
        if _is_url(node):
            yield node
    elif isinstance(node, Mapping):
        for value in node.values():
            yield from _urls(value, depth + 1)
    elif isinstance(node, list):
        for item in node:
            yield from _urls(item, depth + 1)


def _media_outputs(output: Any) -> tuple[Output, ...]:
    found = []
    for url in _urls(output):
        if url.startswith("data:"):  # a file inline (``Prefer: wait`` may answer data URLs)
            inline = data_uri_output(url)
            if inline is not None:
                found.append(inline)
        else:
            found.append(Output(url=url))
    return tuple(found)


def extract_outputs(output: Any, spec: OutputSpec | None = None) -> tuple[Output, ...]:
    """Every output of a prediction, in order, as the model's declared spec reads it.

    URLs (and ``data:`` URIs) anywhere in ``output`` become one Output each. By default (ANY,
    see :mod:`.outputs`) an output with no URL at all (an LLM's token list, a JSON answer) is kept
    as text rather than dropped: a succeeded, billed prediction must not be read as empty. A
    model declared MEDIA has only its files; TEXT its string or tokens; JSON the whole output.
    """
    spec = spec or ANY_OUTPUT
    if spec.expects is Expect.TEXT:
        text = text_output(output)
        return (text,) if text else ()
    if spec.expects is Expect.JSON:
        document = document_output(output)
        return (document,) if document else ()
    media = _media_outputs(output)
    if media or spec.expects is Expect.MEDIA:
        return media
    text = text_output(output)
    if text is not None:
        return (text,)
    document = document_output(output)
    return (document,) if document else ()


def _describe(body: Any) -> tuple[str | None, str | None, bool]:
    """(message, provider code, well-formed?) of a Replicate error body."""
    if not isinstance(body, Mapping) or not ({"detail", "title"} & set(body)):
        return None, None, False
    try:
        problem = Problem.model_validate(body)
    except ValidationError:
        return None, None, False
    detail = problem.detail if isinstance(problem.detail, str) else None
    message = detail or problem.title
    return message, problem.type or problem.title, True


def _retry_after(headers: Mapping[str, str] | None, message: str | None) -> float | None:
    seconds = parse_retry_after(_header(headers, "Retry-After"))
    if seconds is None and message:
        # Replicate's 429 body says "Your rate limit resets in ~30s." when the header is absent.
        match = _THROTTLE_HINT.search(message)
        seconds = float(match.group(1)) if match else None
    return seconds


def to_error(
    op: Op,
    status: int | None = None,
    body: str | bytes | None = None,
    headers: Mapping[str, str] | None = None,
    exc: BaseException | None = None,
) -> ProviderError:
    """The one place a Replicate answer (or a transport failure) becomes an exception.

    ``op`` decides the branch of the outcome table (DESIGN.md §4): a create that may have
    reached Replicate is *uncertain*, never rejected, because resubmitting could pay twice.
    """
    if exc is not None:
        return transport_error("replicate", op, exc)
    message, provider_code, well_formed = _describe(_json(body))
    kw: dict[str, Any] = {
        "status": status,
        "provider_code": provider_code,
        "request_id": _header(headers, "x-request-id", "request-id"),
        "body": _text(body),
    }
    return status_error(
        "replicate", op, status, kw, message=message, well_formed=well_formed,
        retry_after=_retry_after(headers, message),
    )


def build_create(
    request: CreateRequest, resource: Resource = "predictions"
) -> tuple[str, dict[str, Any]]:
    """The path and JSON body of a create; raises InvalidParam for a model string we can't use."""
    model = request.model.strip()
    deployment = model.startswith("deployment:")
    ref, _, version = model.removeprefix("deployment:").partition(":")
    owner, _, name = ref.partition("/")
    if not owner or not name or "/" in name:
        raise InvalidParam(
            f"replicate model must look like owner/name[:version], got {model!r}", param="model"
        )
    body: dict[str, Any] = {"input": dict(request.input)}
    if request.webhook_url:
        body["webhook"] = request.webhook_url
        # "completed" is the event that carries the outcome; callers may ask for more.
        body["webhook_events_filter"] = list(
            request.extra.get("webhook_events_filter", ["completed"])
        )
    base = f"/v1/models/{quote(owner)}/{quote(name)}"
    if resource == "trainings":
        destination = request.extra.get("destination")
        if not version or deployment:
            raise InvalidParam("a replicate training needs owner/name:version", param="model")
        if not isinstance(destination, str) or "/" not in destination:
            raise InvalidParam(
                "a replicate training needs extra['destination'] = 'owner/model'",
                param="destination",
            )
        return f"{base}/versions/{quote(version)}/trainings", {"destination": destination, **body}
    if deployment:
        if version:
            raise InvalidParam("a deployment takes no :version", param="model")
        return f"/v1/deployments/{quote(owner)}/{quote(name)}/predictions", body
    if version:
        return "/v1/predictions", {"version": version, **body}
    return f"{base}/predictions", body


def parse_create(
    status_code: int, body: str | bytes | None, headers: Mapping[str, str] | None = None
) -> Created:
    """The created prediction's id, or the create's outcome as an exception."""
    if not 200 <= status_code < 300:
        raise to_error("create", status_code, body, headers)
    data, wrapped_id = unwrap_sdk(_json(body))
    try:
        prediction = Prediction.model_validate(data)
    except ValidationError:
        raise to_error("create", status_code, body, headers) from None
    return Created(
        task_id=prediction.id,
        request_id=wrapped_id or _header(headers, "x-request-id", "request-id"),
        raw=data,
    )


def parse_status(
    status_code: int,
    body: str | bytes | None,
    headers: Mapping[str, str] | None = None,
    *,
    spec: OutputSpec | None = None,
) -> PollResult:
    """One ``GET /v1/predictions/{id}`` (or trainings) answer, normalised."""
    if status_code == 404:
        return PollResult(status=PollStatus.NOT_FOUND, raw_status="404")
    if not 200 <= status_code < 300:
        raise to_error("read", status_code, body, headers)
    data, wrapped_id = unwrap_sdk(_json(body))
    try:
        prediction = Prediction.model_validate(data)
    except ValidationError:
        raise to_error("read", status_code, body, headers) from None
    raw_status = prediction.status
    common: dict[str, Any] = {
        "raw_status": raw_status,
        "planted_job_id": planted_job_id(prediction.webhook),
        "request_id": wrapped_id or _header(headers, "x-request-id", "request-id"),
        "raw": data,
    }
    if raw_status in _RUNNING:
        return PollResult(status=PollStatus.RUNNING, **common)
    if raw_status == "succeeded":
        return PollResult(
            status=PollStatus.SUCCEEDED, outputs=extract_outputs(prediction.output, spec),
            **common
        )
    if raw_status == "failed":
        error = prediction.error
        message = error if isinstance(error, str) else (json.dumps(error) if error else None)
        return PollResult(status=PollStatus.FAILED, error_message=message, **common)
    if raw_status in _CANCELED:
        return PollResult(status=PollStatus.CANCELED, **common)
    return PollResult(status=PollStatus.UNKNOWN, **common)


def _aware(value: datetime) -> datetime:
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def parse_list(
    status_code: int, body: str | bytes | None, headers: Mapping[str, str] | None = None
) -> ListPage:
    """One page of a listing; items we cannot parse are skipped (this is evidence, not truth)."""
    if not 200 <= status_code < 300:
        raise to_error("read", status_code, body, headers)
    data = _json(body)
    if not isinstance(data, Mapping) or not isinstance(data.get("results"), list):
        raise to_error("read", status_code, body, headers)
    tasks = []
    for item in data["results"]:
        try:
            prediction = Prediction.model_validate(item)
        except ValidationError:
            continue
        created = _aware(prediction.created_at) if prediction.created_at else None
        tasks.append(ListedTask(prediction.id, created, planted_job_id(prediction.webhook)))
    next_url = data.get("next")
    return ListPage(tuple(tasks), next_url if isinstance(next_url, str) and next_url else None)


# --- I/O --------------------------------------------------------------------------------------


class ReplicateClient:
    """Predictions or trainings against one Replicate account (an :class:`AsyncProvider`)."""

    def __init__(
        self,
        settings: Settings,
        session: requests.Session | None = None,
        *,
        resource: Resource = "predictions",
        sleep: Callable[[float], None] = time.sleep,
        read_retries: int = 3,
        max_pages: int = MAX_LIST_PAGES,
    ) -> None:
        self.resource = resource
        self.name = "replicate-prediction" if resource == "predictions" else "replicate-training"
        self.max_pages = max_pages
        self.http = HttpClient(
            settings.replicate_base_url,
            headers={"Authorization": f"Bearer {settings.replicate_api_key}"},
            session=session,
            connect_timeout=settings.connect_timeout,
            read_timeout=settings.read_timeout,
            read_retries=read_retries,
            sleep=sleep,
        )

    def create(self, request: CreateRequest) -> Created:
        path, body = build_create(request, self.resource)
        headers = {}
        if request.extra.get("cancel_after"):
            # Replicate's own deadline (e.g. "30m"): a forgotten prediction stops costing money.
            headers["Cancel-After"] = str(request.extra["cancel_after"])
        try:
            response = self.http.send_once("POST", path, json=body, headers=headers)
        except requests.RequestException as exc:
            raise to_error("create", exc=exc) from exc
        return parse_create(response.status_code, response.content, response.headers)

    def poll(self, task_id: str, *, model: str | None = None) -> PollResult:
        response = self.http.read("GET", f"/v1/{self.resource}/{quote(task_id, safe='')}")
        return parse_status(response.status_code, response.content, response.headers,
                            spec=declared_output("replicate", model))

    def cancel(self, task_id: str, *, model: str | None = None) -> bool:
        # Cancelling is idempotent upstream, but best-effort here: a transport error is "not
        # confirmed", which the caller treats like any refused cancel.
        try:
            response = self.http.send_once(
                "POST", f"/v1/{self.resource}/{quote(task_id, safe='')}/cancel"
            )
        except requests.RequestException:
            return False
        return 200 <= response.status_code < 300

    def find_created(self, job_id: str, created_after: datetime) -> ListedTask | None:
        """The task whose ``webhook`` carries ``job_id``, created after ``created_after``.

        Pages newest-first and stops at ``max_pages`` or once a page is entirely older than
        ``created_after`` (trainings have no documented ``created_after`` filter).
        """
        since = _aware(created_after)
        path: str = f"/v1/{self.resource}"
        params: dict[str, str] | None = None
        if self.resource == "predictions":
            params = {"created_after": since.isoformat().replace("+00:00", "Z")}
        for _ in range(self.max_pages):
            response = self.http.read("GET", path, params=params)
            page = parse_list(response.status_code, response.content, response.headers)
            for task in page.tasks:
                if task.planted_job_id == job_id and (
                    task.created_at is None or task.created_at >= since
                ):
                    return task
            dated = [t.created_at for t in page.tasks if t.created_at is not None]
            if not page.next or not self._same_origin(page.next) or (dated and max(dated) < since):
                return None
            path, params = page.next, None
        return None

    def _same_origin(self, url: str) -> bool:
        # ``next`` is a full URL; never send the bearer token to a host other than Replicate's.
        here, there = urlsplit(self.http.base_url), urlsplit(url)
        return (here.scheme, here.netloc) == (there.scheme, there.netloc)


def prediction_client(
    settings: Settings, session: requests.Session | None = None
) -> ReplicateClient:
    """Factory for the ``replicate-prediction`` kind."""
    return ReplicateClient(settings, session, resource="predictions")


def training_client(settings: Settings, session: requests.Session | None = None) -> ReplicateClient:
    """Factory for the ``replicate-training`` kind."""
    return ReplicateClient(settings, session, resource="trainings")
