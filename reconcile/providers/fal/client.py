"""Internal: the library's own mechanics, not an import path for platforms (may move).

fal.ai queue (docs.fal.ai/model-endpoints/queue, fal-js ``queue.ts``).

``CreateRequest.model`` is the fal model id, e.g. ``fal-ai/flux/dev``. Submit is
``POST {fal_base_url}/{model_id}?fal_webhook=<webhook_url>`` with the model input as the JSON
body; the job id rides in the webhook URL's query. Status, result and cancel live under the
app, which DROPS the model subpath (``fal-ai/flux/dev`` → ``fal-ai/flux``) — that is why
``poll``/``cancel`` need the model:

* status ``GET {base}/{owner}/{app}/requests/{id}/status``
* result ``GET {base}/{owner}/{app}/requests/{id}``
* cancel ``PUT {base}/{owner}/{app}/requests/{id}/cancel``

``workflows`` and ``comfy`` are namespaces, not owners (fal_client's ``APP_NAMESPACES``):
``workflows/fal-ai/my-flow/…`` keeps all three segments.

fal has no FAILED status: a failed request still ends ``COMPLETED``, and only the result fetch
tells success from failure, so ``COMPLETED`` costs one more read — unless the status itself
carries ``error``/``error_type`` (fal_client's ``Completed(error, error_type)``: an
infrastructure failure such as ``runner_disconnected``), which is the verdict.

DECISION (the returned URLs): fal's docs say to use the ``status_url``/``response_url``/
``cancel_url`` of the submit answer instead of building them. A crash-safe poll has only what the
job row keeps (the task id and the model), so the URLs are built from the model exactly as
fal_client's ``get_handle(application, request_id)`` does for a request resumed by id
(``AppId.from_endpoint_id``, namespaces included). At submit the returned URLs are compared with
the built ones; a difference is logged (``fal_urls_differ``) with both, so a new URL scheme shows
up at the first create instead of as 404s until the timeout.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Mapping
from datetime import datetime
from typing import Any
from urllib.parse import quote, urlsplit

import requests
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ...errors import (
    InvalidParam,
)
from ...settings import Settings
from ..base import Created, CreateRequest, ListedTask, Output, PollResult, PollStatus, unwrap_sdk
from ..http import (
    body_json as _json,
    cancel_once,
    header_value as _header,
    provider_http,
    send_create,
)
from ..outcome import make_to_error, validated
from ..outputs import (
    Expect,
    OutputSpec,
    data_uri_output,
    declared_output,
    document_output,
    text_output,
)

__all__ = [
    "MEDIA_KEYS",
    "FalQueueClient",
    "QueueStatus",
    "Submitted",
    "app_path",
    "extract_media",
    "extract_outputs",
    "parse_create",
    "parse_result",
    "parse_status",
    "queue_client",
    "to_error",
]


_RUNNING = frozenset({"IN_QUEUE", "IN_PROGRESS"})
# Keys under which fal models put media objects ({"url", "content_type", …}).
MEDIA_KEYS = frozenset(
    {"image", "images", "video", "videos", "audio", "audio_file", "file", "files"}
)
_MAX_DEPTH = 32
_REQUEST_ID_HEADERS = ("x-fal-request-id",)
APP_NAMESPACES = frozenset({"workflows", "comfy"})  # fal_client.client.APP_NAMESPACES
log = logging.getLogger(__package__)  # "reconcile.providers.fal", as before the package


class Submitted(BaseModel):
    """The submit answer: ``{request_id, response_url, status_url, cancel_url, …}``."""

    model_config = ConfigDict(extra="allow")

    request_id: str = Field(min_length=1)
    status_url: str | None = None
    response_url: str | None = None
    cancel_url: str | None = None


class QueueStatus(BaseModel):
    model_config = ConfigDict(extra="allow")

    status: str  # queue_position / logs / metrics are kept in ``raw`` via extra="allow"
    error: Any = None  # COMPLETED with an infrastructure failure (fal_client's Completed.error)
    error_type: str | None = None


# --- pure helpers -----------------------------------------------------------------------------




def app_path(model: str | None) -> str:
    """``[namespace/]owner/app`` of a model id (status/result/cancel drop the subpath)."""
    segments = (model or "").strip("/").split("/")
    keep = 3 if segments[0] in APP_NAMESPACES else 2
    if len(segments) < keep or not all(segments[:keep]) or any(s in (".", "..") for s in segments):
        raise InvalidParam(
            f"fal model must look like [workflows/|comfy/]owner/app[/path], got {model!r}",
            param="model",
        )
    return "/".join(quote(s, safe="") for s in segments[:keep])


def _describe(
    body: Any, headers: Mapping[str, str] | None
) -> tuple[str | None, str | None, None, bool]:
    """(message, error type, no body request id, well-formed?) of a fal error body.

    Shapes: ``{"detail": [{loc, msg, type}]}`` (422), ``{"detail": "…", "error_type": "…"}``
    (infra, with ``X-Fal-Error-Type``), and ``{"error": "…"}``.
    """
    error_type = _header(headers, "x-fal-error-type")
    if not isinstance(body, Mapping) or not ({"detail", "error", "error_type"} & set(body)):
        return None, error_type, None, False
    if isinstance(body.get("error_type"), str):
        error_type = body["error_type"]
    detail = body.get("detail", body.get("error"))
    if isinstance(detail, list):
        items = [d for d in detail if isinstance(d, Mapping)]
        parts = []
        for item in items:
            loc = item.get("loc")
            where = ".".join(str(x) for x in loc) if isinstance(loc, list) else None
            parts.append(f"{where}: {item.get('msg')}" if where else str(item.get("msg")))
        message = "; ".join(parts) or None
        if error_type is None and items and isinstance(items[0].get("type"), str):
            error_type = items[0]["type"]
        return message, error_type, None, True
    return (detail if isinstance(detail, str) else None), error_type, None, True


# The one place a fal answer (or a transport failure) becomes an exception; fal's 499
# (client_disconnected/cancelled): may have gone through.
to_error = make_to_error("fal", describe=_describe, request_id_headers=_REQUEST_ID_HEADERS,
                         maybe_sent=frozenset({408, 499}))


def _media(node: Any, in_media: bool, depth: int) -> Iterator[Output]:
    if depth > _MAX_DEPTH:
        return
    if isinstance(node, Mapping):
        url = node.get("url")
        content_type = node.get("content_type")
        content_type = content_type if isinstance(content_type, str) else None
        if isinstance(url, str) and (in_media or "content_type" in node):
            if url.startswith(("https://", "http://")):
                yield Output(url=url, media_type=content_type)
                return  # a media object's own fields (thumbnails…) are not separate outputs
            if url.startswith("data:"):  # sync_mode: the file inline, as a data URI
                inline = data_uri_output(url)
                if inline is not None:
                    yield Output(data=inline.data, media_type=content_type or inline.media_type)
                return
        for key, value in node.items():
            yield from _media(value, key in MEDIA_KEYS, depth + 1)
    elif isinstance(node, list):
        for item in node:
            yield from _media(item, True, depth + 1)


def extract_media(payload: Any) -> tuple[Output, ...]:
    """Every media object of a result, in document order.

    Finds ``images[].url``, ``image.url``, ``video.url``, ``audio.url`` and, generally, any
    ``url`` of a dict that has a ``content_type`` or sits in a list; ``data:`` URIs are decoded.
    """
    return tuple(_media(payload, False, 0))


def extract_outputs(payload: Any, spec: OutputSpec | None = None) -> tuple[Output, ...]:
    """The outputs the endpoint declared (:mod:`.outputs`); () when the declared one is missing.

    MEDIA: media objects only, so ``{"images": [], "seed": 1}`` is empty. TEXT: the declared
    field (``text`` by default) plus any media. JSON: the declared field, or the whole result.
    """
    spec = spec or OutputSpec(Expect.MEDIA)
    media = extract_media(payload)
    if spec.expects is Expect.MEDIA or not isinstance(payload, Mapping):
        return media
    if spec.expects is Expect.TEXT:
        text = text_output(payload.get(spec.key or "text"))
        return (text, *media) if text else ()
    if spec.expects is Expect.JSON:
        document = document_output(payload.get(spec.key) if spec.key else payload)
        return (document,) if document else ()
    return media or tuple(o for o in (document_output(payload),) if o)


def parse_create(
    status_code: int, body: str | bytes | None, headers: Mapping[str, str] | None = None
) -> Created:
    """The queued request's id (kept exactly), or the submit's outcome as an exception."""
    submitted, data, _ = validated("create", Submitted, status_code, body, headers, to_error)
    return Created(submitted.request_id, _header(headers, *_REQUEST_ID_HEADERS), data)


def parse_status(
    status_code: int, body: str | bytes | None, headers: Mapping[str, str] | None = None
) -> PollResult | None:
    """One status read; None means ``COMPLETED`` without an error — the result fetch decides.

    ``COMPLETED`` with ``error``/``error_type`` (e.g. ``runner_disconnected``,
    ``request_timeout``) is FAILED with fal's error: its result read would only answer a 5xx.
    """
    if status_code == 404:
        return PollResult(status=PollStatus.NOT_FOUND, raw_status="404")
    if not 200 <= status_code < 300:
        raise to_error("read", status_code, body, headers)
    data = _json(body)
    try:
        status = QueueStatus.model_validate(data)
    except ValidationError:
        raise to_error("read", status_code, body, headers) from None
    if status.status == "COMPLETED":
        if status.error is None and not status.error_type:
            return None
        error = status.error if isinstance(status.error, str) else None
        return PollResult(
            status=PollStatus.FAILED,
            raw_status="COMPLETED",
            error_code=status.error_type,
            error_message=error or status.error_type or "fal reported an error",
            request_id=_header(headers, *_REQUEST_ID_HEADERS),
            raw=data,
        )
    kind = PollStatus.RUNNING if status.status in _RUNNING else PollStatus.UNKNOWN
    return PollResult(
        status=kind,
        raw_status=status.status,
        request_id=_header(headers, *_REQUEST_ID_HEADERS),
        raw=data,
    )


def parse_result(
    status_code: int,
    body: str | bytes | None,
    headers: Mapping[str, str] | None = None,
    *,
    spec: OutputSpec | None = None,
) -> PollResult:
    """The result of a ``COMPLETED`` request.

    2xx → SUCCEEDED with the declared outputs (none: the lifecycle's UPSTREAM_EMPTY_RESULT);
    a 4xx with an error body → FAILED; a 5xx → FAILED only when fal names an ``error_type``
    (a bare gateway 5xx says nothing about the request, so it is a retryable read failure).
    """
    if status_code == 404:
        return PollResult(status=PollStatus.NOT_FOUND, raw_status="COMPLETED")
    if 200 <= status_code < 300:
        data = _json(body)
        if data is None:
            raise to_error("read", status_code, body, headers)
        payload, wrapped_id = unwrap_sdk(data)
        return PollResult(
            status=PollStatus.SUCCEEDED,
            outputs=extract_outputs(payload, spec),
            raw_status="COMPLETED",
            request_id=wrapped_id or _header(headers, *_REQUEST_ID_HEADERS),
            raw=payload if isinstance(payload, Mapping) else {"result": payload},
        )
    message, error_type, _, well_formed = _describe(_json(body), headers)
    failed = well_formed and 400 <= status_code < 500 and status_code != 429
    if failed or (status_code >= 500 and error_type):
        return PollResult(
            status=PollStatus.FAILED,
            raw_status="COMPLETED",
            error_code=error_type,
            error_message=message or f"HTTP {status_code}",
            request_id=_header(headers, *_REQUEST_ID_HEADERS),
        )
    raise to_error("read", status_code, body, headers)


# --- I/O --------------------------------------------------------------------------------------


class FalQueueClient:
    """The fal queue (an :class:`AsyncProvider`)."""

    name = "fal-queue"

    def __init__(
        self,
        settings: Settings,
        session: requests.Session | None = None,
        *,
        sleep: Callable[[float], None] = time.sleep,
        read_retries: int = 3,
    ) -> None:
        self.http = provider_http(settings.fal_base_url,
                                  {"Authorization": f"Key {settings.fal_api_key}"}, settings,
                                  session, read_retries=read_retries, sleep=sleep)

    def create(self, request: CreateRequest) -> Created:
        app_path(request.model)  # refuse an unusable model id before anything is sent
        path = "/".join(quote(s, safe="") for s in request.model.strip("/").split("/"))
        params = {"fal_webhook": request.webhook_url} if request.webhook_url else None
        response = send_create(self.http, to_error, "POST", path, json=dict(request.input),
                               params=params)
        created = parse_create(response.status_code, response.content, response.headers)
        self._check_urls(request, created)
        return created

    def _check_urls(self, request: CreateRequest, created: Created) -> None:
        """Log when the URLs fal returned are not the ones ``poll``/``cancel`` will build."""
        base = f"{app_path(request.model)}/requests/{quote(created.task_id, safe='')}"
        built = {"response_url": base, "status_url": f"{base}/status",
                 "cancel_url": f"{base}/cancel"}
        raw = created.raw or {}
        for name, path in built.items():
            returned = raw.get(name)
            if isinstance(returned, str) and not urlsplit(returned).path.endswith("/" + path):
                log.warning("fal_urls_differ job_id=%s field=%s returned=%s built=%s",
                            request.job_id, name, returned, path)

    def poll(self, task_id: str, *, model: str | None = None) -> PollResult:
        base = f"{app_path(model)}/requests/{quote(task_id, safe='')}"
        response = self.http.read("GET", f"{base}/status")
        result = parse_status(response.status_code, response.content, response.headers)
        if result is not None:
            return result
        response = self.http.read("GET", base)
        return parse_result(response.status_code, response.content, response.headers,
                            spec=declared_output("fal", model))

    def cancel(self, task_id: str, *, model: str | None = None) -> bool:
        path = f"{app_path(model)}/requests/{quote(task_id, safe='')}/cancel"
        return cancel_once(self.http, "PUT", path)

    def find_created(self, job_id: str, created_after: datetime) -> ListedTask | None:
        return None  # fal has no request listing to search


def queue_client(settings: Settings, session: requests.Session | None = None) -> FalQueueClient:
    """Factory for the ``fal-queue`` kind."""
    return FalQueueClient(settings, session)
