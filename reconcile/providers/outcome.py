"""Internal: the library's own mechanics, not an import path for platforms (may move).

The outcome table (README, Design notes: The outcome table) for providers classified by HTTP status (Replicate, ElevenLabs,
fal): one mapping from (operation, status, is-it-a-provider-error) to the library's exceptions.

Each provider's ``to_error`` parses its own error body, then hands the verdict here; KIE (an
envelope ``code`` even under HTTP 200) and Anthropic keep their own tables.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Literal, Protocol, TypeVar

import requests
from pydantic import BaseModel, ValidationError

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
from .base import unwrap_sdk
from .http import body_json, body_text, header_value, parse_retry_after

Op = Literal["create", "read", "sync"]
Headers = Mapping[str, str] | None
# (the parsed error body, the headers) -> (message, provider code, request id in the body,
# well-formed: the body is the provider's own error shape)
Describe = Callable[[Any, Headers], tuple[str | None, str | None, str | None, bool]]


def retry_after_header(headers: Headers, message: str | None) -> float | None:
    """``Retry-After`` (seconds or an HTTP date), the default hint of a 429."""
    return parse_retry_after(header_value(headers, "Retry-After"))


def answer_error(
    provider: str,
    op: Op,
    status: int | None,
    body: str | bytes | None,
    headers: Headers,
    exc: BaseException | None,
    *,
    describe: Describe,
    request_id_headers: tuple[str, ...],
    retry_after: Callable[[Headers, str | None], float | None] = retry_after_header,
    maybe_sent: frozenset[int] = frozenset({408}),
) -> ProviderError:
    """What every status-classified provider's ``to_error`` does: a transport failure, or the
    answer's error body described by the provider (``describe``) and classified by
    :func:`status_error`. Each provider keeps only its body shape and its hints."""
    if exc is not None:
        return transport_error(provider, op, exc)
    message, provider_code, body_request_id, well_formed = describe(body_json(body), headers)
    kw: dict[str, Any] = {
        "status": status,
        "provider_code": provider_code,
        "request_id": header_value(headers, *request_id_headers) or body_request_id,
        "body": body_text(body),
    }
    return status_error(
        provider, op, status, kw, message=message, well_formed=well_formed,
        retry_after=retry_after(headers, message), maybe_sent=maybe_sent,
    )


class ToError(Protocol):
    """A provider's ``to_error(op, status, body, headers, exc)``: the one place its answer (or a
    transport failure) becomes an exception."""

    def __call__(self, op: Op, status: int | None = None, body: str | bytes | None = None,
                 headers: Headers = None, exc: BaseException | None = None) -> ProviderError: ...


def make_to_error(
    provider: str,
    *,
    describe: Describe,
    request_id_headers: tuple[str, ...],
    retry_after: Callable[[Headers, str | None], float | None] = retry_after_header,
    maybe_sent: frozenset[int] = frozenset({408}),
) -> ToError:
    """A provider's ``to_error``, given only what is its own (:func:`answer_error`)."""

    def to_error(op: Op, status: int | None = None, body: str | bytes | None = None,
                 headers: Headers = None, exc: BaseException | None = None) -> ProviderError:
        return answer_error(provider, op, status, body, headers, exc, describe=describe,
                            request_id_headers=request_id_headers, retry_after=retry_after,
                            maybe_sent=maybe_sent)

    to_error.__doc__ = f"The one place a {provider} answer (or a transport failure) becomes an exception."
    return to_error


M = TypeVar("M", bound=BaseModel)


def validated(op: Op, model: type[M], status_code: int, body: str | bytes | None,
              headers: Headers, to_error: ToError) -> tuple[M, Any, str | None]:
    """(record, JSON, SDK wrapper's request id) of a 2xx answer whose JSON (unwrapped from an
    SDK envelope) is a ``model``; any other answer is ``to_error(op, …)``."""
    if not 200 <= status_code < 300:
        raise to_error(op, status_code, body, headers)
    data, wrapped_id = unwrap_sdk(body_json(body))
    try:
        return model.model_validate(data), data, wrapped_id
    except ValidationError:
        raise to_error(op, status_code, body, headers) from None


def transport_error(provider: str, op: Op, exc: BaseException) -> ProviderError:
    """No HTTP answer: a create's outcome is unknown, a sync call failed (timeout or not), a
    read failed and may be retried."""
    text = f"{type(exc).__name__}: {exc}"
    if op == "create":
        return CreateUncertain(f"{provider} create outcome unknown: {text}")
    if op == "sync":
        timeout = isinstance(exc, requests.Timeout)
        return SyncCallFailed(text, code=ErrorCode.UPSTREAM_TIMEOUT if timeout else None)
    return ReadFailed(f"{provider} read failed: {text}")


def status_error(
    provider: str,
    op: Op,
    status: int | None,
    kw: dict[str, Any],
    *,
    message: str | None,
    well_formed: bool,
    retry_after: float | None,
    maybe_sent: frozenset[int] = frozenset({408}),
) -> ProviderError:
    """An HTTP answer that is not a usable success, per the outcome table.

    ``kw`` carries status / provider_code / request_id / body for the exception; ``well_formed``
    says the body is the provider's own error shape (a proxy's HTML 4xx is not a confirmed
    rejection); ``maybe_sent`` are 4xx statuses after which the request may still have gone
    through (408, and fal's 499).
    """
    text = f"{provider} {op} answered HTTP {status}" + (f": {message}" if message else "")
    ok = status is not None and 200 <= status < 300
    if op == "read":
        return MalformedResponse(text, **kw) if ok else ReadFailed(text, **kw)
    if status == 429:  # documented as not processed: retry later, bounded by the lifecycle
        kw["retry_after"] = retry_after
        if op == "create":
            return CreateRateLimited(text, **kw)
        return SyncCallFailed(text, code=ErrorCode.UPSTREAM_RATE_LIMITED, **kw)
    client_error = status is not None and 400 <= status < 500 and status not in maybe_sent
    if op == "create":
        if not (client_error and well_formed):
            return CreateUncertain(text, **kw)
        if status in (400, 422):
            return CreateRejected(text, code=ErrorCode.UPSTREAM_INVALID_INPUT, **kw)
        return CreateRejected(text, **kw)
    if status == 408:
        return SyncCallFailed(text, code=ErrorCode.UPSTREAM_TIMEOUT, **kw)
    if not client_error:
        return SyncCallFailed(text, code=ErrorCode.UPSTREAM_FAILED, **kw)
    if status in (400, 422):
        return SyncCallFailed(text, code=ErrorCode.UPSTREAM_INVALID_INPUT, **kw)
    return SyncCallFailed(text, code=ErrorCode.UPSTREAM_SUBMISSION_FAILED, **kw)
