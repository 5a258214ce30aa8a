"""Exceptions and the stable error codes stored on ``jobs.error_code``.

::

    ReconcileError                      code: INTERNAL
    ├── InvalidParam                    INVALID_PARAM (400)
    ├── InsufficientCredits             INSUFFICIENT_CREDITS (402)
    ├── LedgerError                     a ledger invariant was about to break (``reason``)
    │   ├── LegacyRefundRefused         an import that would create money (after the library's
    │   │                               refund or a commit, above what is held, reserved id)
    │   └── BadUsageMetadata            a usage log whose pools cannot be read (bad_usage_metadata)
    ├── JobNotFound                     JOB_NOT_FOUND (404)
    ├── Conflict                        SUBMISSION_RECONCILIATION_REQUIRED | JOB_NOT_CANCELABLE |
    │                                   IDEMPOTENCY_KEY_REUSED (409)
    ├── ProviderError                   any upstream answer we cannot use as success
    │   ├── CreateRejected              the provider confirmed it did NOT create (terminal)
    │   ├── CreateRateLimited           429 / KIE 455: documented as not created; retry later
    │   ├── CreateUncertain             transport error, timeout, 5xx, unparseable 2xx: unknown
    │   ├── SyncCallFailed              a sync call failed; nothing to look up later
    │   ├── ReadFailed                  a status/result read failed (retryable)
    │   └── MalformedResponse           a 2xx we cannot parse
    ├── MediaError                      fetching or storing an output
    │   ├── UnsafeMediaURL              scheme / address refused (SSRF guard)
    │   ├── MediaTooLarge
    │   ├── MediaExpired                403/404 on a result URL
    │   └── MediaFetchFailed            other fetch failures (retryable)
    └── WebhookError                    a delivery we refuse (HTTP 400/401)
        ├── WebhookSignatureError
        ├── WebhookTimestampError
        └── WebhookPayloadError

Dashboards read ``code``, never message text.

Retryable, uncertain, terminal
------------------------------
Whether an error may be retried is a fact of its class, not of the call site:

* ``retryable`` (class attribute): the same call may simply be made again later and may then
  succeed, with no risk of doing the upstream work twice — a rate-limited create (documented as
  not created), a failed or unparseable status read, an expired result URL (the next read
  returns fresh ones), a failed media download. The lifecycle bounds how often (attempts,
  exhaustion), the class only says that it may.
* ``outcome_unknown`` (class attribute): the call may or may not have taken effect upstream
  (:class:`CreateUncertain`). Never retried and never refunded blindly; it waits for evidence
  or an operator.
* :attr:`ReconcileError.uncertain` is ``outcome_unknown`` or an error whose ``code`` is
  ``UPSTREAM_SUBMISSION_UNCERTAIN``; :attr:`ReconcileError.terminal` is neither retryable nor
  uncertain: the answer is final (a rejection, a failed sync call, bad input, no credits).

``tests/unit/test_error_classes.py`` pins the value of every class.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any, ClassVar

from .core.redact import text as _redacted

__all__ = [
    "RAW_BODY_LIMIT", "BadUsageMetadata", "Conflict", "CreateRateLimited", "CreateRejected",
    "CreateUncertain", "ErrorCode", "InsufficientCredits", "InvalidParam", "JobNotFound",
    "LedgerError", "LegacyRefundRefused", "MalformedResponse", "MediaError", "MediaExpired",
    "MediaFetchFailed", "MediaTooLarge", "ProviderError", "ReadFailed", "ReconcileError",
    "SyncCallFailed", "UnsafeMediaURL", "WebhookError", "WebhookPayloadError",
    "WebhookSignatureError", "WebhookTimestampError", "bounded",
]


class ErrorCode(StrEnum):
    INVALID_PARAM = "INVALID_PARAM"
    INSUFFICIENT_CREDITS = "INSUFFICIENT_CREDITS"
    UPSTREAM_INVALID_INPUT = "UPSTREAM_INVALID_INPUT"
    UPSTREAM_SUBMISSION_FAILED = "UPSTREAM_SUBMISSION_FAILED"
    UPSTREAM_RATE_LIMITED = "UPSTREAM_RATE_LIMITED"
    UPSTREAM_SUBMISSION_UNCERTAIN = "UPSTREAM_SUBMISSION_UNCERTAIN"
    UPSTREAM_TIMEOUT = "UPSTREAM_TIMEOUT"
    UPSTREAM_FAILED = "UPSTREAM_FAILED"
    UPSTREAM_WEBHOOK_ERROR = "UPSTREAM_WEBHOOK_ERROR"
    UPSTREAM_EMPTY_RESULT = "UPSTREAM_EMPTY_RESULT"
    UPSTREAM_UNKNOWN_STATUS = "UPSTREAM_UNKNOWN_STATUS"
    UPSTREAM_TASK_NOT_FOUND = "UPSTREAM_TASK_NOT_FOUND"
    UPSTREAM_MEDIA_EXPIRED = "UPSTREAM_MEDIA_EXPIRED"
    UPSTREAM_OUTPUT_LIMIT = "UPSTREAM_OUTPUT_LIMIT"
    RECONCILE_NO_RECOVERY = "RECONCILE_NO_RECOVERY"
    CANCELED = "CANCELED"
    JOB_NOT_FOUND = "JOB_NOT_FOUND"
    SUBMISSION_RECONCILIATION_REQUIRED = "SUBMISSION_RECONCILIATION_REQUIRED"
    JOB_NOT_CANCELABLE = "JOB_NOT_CANCELABLE"
    IDEMPOTENCY_KEY_REUSED = "IDEMPOTENCY_KEY_REUSED"
    INTERNAL = "INTERNAL"


RAW_BODY_LIMIT = 4096  # bytes of a provider body kept for evidence


def bounded(text: str | bytes | None, limit: int = RAW_BODY_LIMIT) -> str | None:
    """A provider body cut to ``limit`` characters, safe to store on the row."""
    if text is None:
        return None
    if isinstance(text, bytes):
        text = text.decode("utf-8", errors="replace")
    text = text if len(text) <= limit else text[:limit] + "…[truncated]"
    return _redacted(text)  # a result body may carry presigned URLs: never store their signatures


class ReconcileError(Exception):
    """Internal error."""

    code: ErrorCode = ErrorCode.INTERNAL
    #: the same call may be made again later and may succeed, never doing upstream work twice
    retryable: ClassVar[bool] = False
    #: the call may or may not have taken effect upstream: neither retry nor refund blindly
    outcome_unknown: ClassVar[bool] = False

    def __init__(self, message: str | None = None) -> None:
        # messages are stored and logged: a presigned URL in one loses its signature here
        super().__init__(_redacted(message) if message else
                         (self.__doc__ or self.code).strip().splitlines()[0])

    @property
    def message(self) -> str:
        return str(self.args[0]) if self.args else ""

    @property
    def uncertain(self) -> bool:
        """The outcome upstream is unknown: the class says so, or the code is
        ``UPSTREAM_SUBMISSION_UNCERTAIN`` (a :class:`ProviderError` given that code)."""
        return self.outcome_unknown or self.code == ErrorCode.UPSTREAM_SUBMISSION_UNCERTAIN

    @property
    def terminal(self) -> bool:
        """Final: neither worth retrying nor waiting on evidence for."""
        return not self.retryable and not self.uncertain


class InvalidParam(ReconcileError):
    """The request is invalid."""

    code = ErrorCode.INVALID_PARAM

    def __init__(self, message: str | None = None, *, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class InsufficientCredits(ReconcileError):
    """The balance is too low for this job."""

    code = ErrorCode.INSUFFICIENT_CREDITS


class LedgerError(ReconcileError):
    """The credit ledger refused an operation that would unbalance it."""

    reason: str = "ledger_error"  # stable, for logs, anomalies and tests (never parse the text)

    def __init__(self, message: str | None = None, *, reason: str | None = None) -> None:
        super().__init__(message)
        if reason is not None:
            self.reason = reason


class LegacyRefundRefused(LedgerError):
    """A legacy refund would create money; nothing was written.

    ``reason``: ``legacy_refund_after_refund`` (the library already refunded the job),
    ``legacy_refund_after_commit`` (the job's reservation was committed),
    ``legacy_refund_exceeds_held`` (more than the reservation still holds),
    ``legacy_refund_reserved_id`` (an id under the library's own ``job-…:`` prefixes),
    ``legacy_refund_lot_id_taken`` (another transaction, a grant ``x:sub``, has the lot id
    ``x:sub`` or ``x:topup`` this refund ``x`` would write),
    ``legacy_refund_not_in_ledger`` (the job has no USAGE row: import its reservation first).
    """

    reason = "legacy_refund_refused"


class BadUsageMetadata(LedgerError):
    """A usage log's ``metadata`` gives no usable pools and the ledger has no USAGE row to read
    them from; an operator sets them (``credits.repair_usage_metadata``)."""

    reason = "bad_usage_metadata"


class JobNotFound(ReconcileError):
    """No such job."""

    code = ErrorCode.JOB_NOT_FOUND


class Conflict(ReconcileError):
    """The job cannot change that way now."""

    def __init__(self, code: ErrorCode, message: str | None = None) -> None:
        super().__init__(message)
        self.code = code


class ProviderError(ReconcileError):
    """The provider's answer cannot be used as a success."""

    code = ErrorCode.UPSTREAM_FAILED

    def __init__(
        self,
        message: str | None = None,
        *,
        code: ErrorCode | None = None,
        status: int | None = None,
        provider_code: str | None = None,
        request_id: str | None = None,
        body: str | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code
        self.status = status
        self.provider_code = provider_code
        self.request_id = request_id
        self.body = bounded(body)
        self.retry_after = retry_after

    def detail(self) -> dict[str, Any]:
        """What is stored in ``jobs.error_detail`` (never invented: absent keys stay absent)."""
        out: dict[str, Any] = {}
        for key in ("status", "provider_code", "request_id", "body", "retry_after"):
            value = getattr(self, key)
            if value is not None:
                out[key] = value
        out["message"] = self.message
        return out


class CreateRejected(ProviderError):
    """The provider rejected the submission; nothing was created."""

    code = ErrorCode.UPSTREAM_SUBMISSION_FAILED


class CreateRateLimited(ProviderError):
    """The provider rate-limited the submission; it is documented as not created."""

    retryable = True  # documented as not created: create again after Retry-After
    code = ErrorCode.UPSTREAM_RATE_LIMITED


class CreateUncertain(ProviderError):
    """The submission's outcome is unknown; never resubmit it blindly."""

    outcome_unknown = True  # never resubmitted, never refunded blindly
    code = ErrorCode.UPSTREAM_SUBMISSION_UNCERTAIN


class SyncCallFailed(ProviderError):
    """A synchronous provider call failed."""

    code = ErrorCode.UPSTREAM_FAILED


class ReadFailed(ProviderError):
    """A status or result read failed; it may be retried."""

    retryable = True  # a read has no side effect upstream
    code = ErrorCode.UPSTREAM_FAILED


class MalformedResponse(ProviderError):
    """The provider answered with a body we cannot parse."""

    retryable = True  # raised for reads only: the next read may parse
    code = ErrorCode.UPSTREAM_UNKNOWN_STATUS


class MediaError(ReconcileError):
    """An output could not be fetched or stored."""


class UnsafeMediaURL(MediaError):
    """The media URL is not allowed (scheme or resolved address)."""


class MediaTooLarge(MediaError):
    """The media body exceeds the size bound."""


class MediaExpired(MediaError):
    """The media URL has expired (403/404)."""

    retryable = True  # the next status read returns fresh result URLs
    code = ErrorCode.UPSTREAM_MEDIA_EXPIRED


class MediaFetchFailed(MediaError):
    """The media could not be fetched; it may be retried."""

    retryable = True


class WebhookError(ReconcileError):
    """The webhook delivery was refused."""


class WebhookSignatureError(WebhookError):
    """The webhook signature is missing or wrong."""


class WebhookTimestampError(WebhookError):
    """The webhook timestamp is missing or outside the tolerance."""


class WebhookPayloadError(WebhookError):
    """The webhook body is not a payload we understand."""
