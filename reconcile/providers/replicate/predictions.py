"""Replicate creates and reads (predictions, and trainings through :mod:`.trainings`):

* ``owner/name:version`` — ``POST /v1/predictions`` with ``{"version": <version>, ...}``;
* ``owner/name`` — an official model: ``POST /v1/models/{owner}/{name}/predictions``;
* ``deployment:owner/name`` — ``POST /v1/deployments/{owner}/{name}/predictions``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

from ...errors import InvalidParam
from ..base import Created, CreateRequest, PollResult, PollStatus
from ..http import header_value as _header
from ..outcome import validated
from ..outputs import OutputSpec
from ._common import (
    _CANCELED,
    _RUNNING,
    REQUEST_ID_HEADERS,
    Prediction,
    Resource,
    extract_outputs,
    planted_job_id,
    to_error,
)
from .trainings import training_create


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
        return training_create(request, base, version, deployment, body)
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
    prediction, data, wrapped_id = validated("create", Prediction, status_code, body, headers,
                                             to_error)
    return Created(
        task_id=prediction.id,
        request_id=wrapped_id or _header(headers, *REQUEST_ID_HEADERS),
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
    prediction, data, wrapped_id = validated("read", Prediction, status_code, body, headers,
                                             to_error)
    raw_status = prediction.status
    common: dict[str, Any] = {
        "raw_status": raw_status,
        "planted_job_id": planted_job_id(prediction.webhook),
        "request_id": wrapped_id or _header(headers, *REQUEST_ID_HEADERS),
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
