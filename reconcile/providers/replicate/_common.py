"""What Replicate's predictions, trainings and listings share: the records, the job id echoed
in ``webhook`` (:func:`planted_job_id`), the outputs, and the one place an answer becomes an
error (:func:`to_error`)."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from datetime import datetime
from typing import Any, Literal
from urllib.parse import parse_qs, urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..base import Output
from ..http import header_value as _header, parse_retry_after
from ..outcome import make_to_error
from ..outputs import (
    ANY as ANY_OUTPUT,
    Expect,
    OutputSpec,
    data_uri_output,
    document_output,
    text_output,
)

Resource = Literal["predictions", "trainings"]

_RUNNING = frozenset({"starting", "processing"})
_CANCELED = frozenset({"canceled", "aborted"})  # aborted = deadline hit before it started
_MAX_DEPTH = 32  # outputs are model-defined JSON; never recurse without a bound
REQUEST_ID_HEADERS = ("x-request-id", "request-id")
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


def _describe(
    body: Any, headers: Mapping[str, str] | None
) -> tuple[str | None, str | None, None, bool]:
    """(message, provider code, no body request id, well-formed?) of a Replicate error body."""
    if not isinstance(body, Mapping) or not ({"detail", "title"} & set(body)):
        return None, None, None, False
    try:
        problem = Problem.model_validate(body)
    except ValidationError:
        return None, None, None, False
    detail = problem.detail if isinstance(problem.detail, str) else None
    message = detail or problem.title
    return message, problem.type or problem.title, None, True


def _retry_after(headers: Mapping[str, str] | None, message: str | None) -> float | None:
    seconds = parse_retry_after(_header(headers, "Retry-After"))
    if seconds is None and message:
        # Replicate's 429 body says "Your rate limit resets in ~30s." when the header is absent.
        match = _THROTTLE_HINT.search(message)
        seconds = parse_retry_after(match.group(1)) if match else None
    return seconds


# The one place a Replicate answer (or a transport failure) becomes an exception. ``op`` decides
# the branch of the outcome table (README, Design notes: The outcome table): a create that may have reached Replicate is
# *uncertain*, never rejected, because resubmitting could pay twice.
to_error = make_to_error("replicate", describe=_describe, request_id_headers=REQUEST_ID_HEADERS,
                         retry_after=_retry_after)
