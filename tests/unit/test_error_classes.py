"""Retryable, uncertain and terminal are facts of the error classes (reconcile/errors.py)."""

from __future__ import annotations

import pytest

from reconcile import errors
from reconcile.api import error_response
from reconcile.errors import ErrorCode, ProviderError, ReconcileError

# class -> (retryable, outcome_unknown): every class of reconcile.errors, pinned
PINNED = {
    "ReconcileError": (False, False), "InvalidParam": (False, False),
    "InsufficientCredits": (False, False), "LedgerError": (False, False),
    "LegacyRefundRefused": (False, False), "BadUsageMetadata": (False, False),
    "JobNotFound": (False, False), "Conflict": (False, False), "ProviderError": (False, False),
    "CreateRejected": (False, False), "CreateRateLimited": (True, False),
    "CreateUncertain": (False, True), "SyncCallFailed": (False, False),
    "ReadFailed": (True, False), "MalformedResponse": (True, False), "MediaError": (False, False),
    "UnsafeMediaURL": (False, False), "MediaTooLarge": (False, False),
    "MediaExpired": (True, False), "MediaFetchFailed": (True, False),
    "WebhookError": (False, False), "WebhookSignatureError": (False, False),
    "WebhookTimestampError": (False, False), "WebhookPayloadError": (False, False),
}


def test_every_error_class_is_pinned() -> None:
    classes = {n for n in errors.__all__ if isinstance(getattr(errors, n), type)
               and issubclass(getattr(errors, n), ReconcileError)}
    assert classes == set(PINNED)


@pytest.mark.parametrize("name", sorted(PINNED))
def test_retryable_and_uncertain_per_class(name: str) -> None:
    cls = getattr(errors, name)
    retryable, unknown = PINNED[name]
    assert cls.retryable is retryable
    assert cls.outcome_unknown is unknown
    exc = cls(ErrorCode.INTERNAL) if cls is errors.Conflict else cls()
    assert exc.uncertain is unknown
    assert exc.terminal is (not retryable and not unknown)


def test_the_uncertain_code_makes_any_provider_error_uncertain() -> None:
    exc = ProviderError("lost", code=ErrorCode.UPSTREAM_SUBMISSION_UNCERTAIN)
    assert exc.uncertain and not exc.terminal
    assert not ProviderError("no").uncertain


@pytest.mark.parametrize(("exc", "code"), [
    (errors.CreateUncertain(), "UPSTREAM_SUBMISSION_UNCERTAIN"),
    (ProviderError(code=ErrorCode.UPSTREAM_SUBMISSION_UNCERTAIN), "UPSTREAM_SUBMISSION_UNCERTAIN"),
    (errors.CreateRejected(), "UPSTREAM_SUBMISSION_FAILED"),
    (errors.CreateRateLimited(), "UPSTREAM_SUBMISSION_FAILED"),
    (errors.SyncCallFailed(), "UPSTREAM_SUBMISSION_FAILED"),
])
def test_gateway_502_reads_the_property(exc: ProviderError, code: str) -> None:
    status, body = error_response(exc, job_id="j")
    assert status == 502
    assert body["error"]["code"] == code


# Codes a request is refused with (an HTTP error body, never stored on a job): no customer
# message for a failed job is needed. Every other code can end a job, and a job's snapshot
# shows it through api.CUSTOMER_MESSAGES — without an entry a customer sees only
# "The job failed.".
REQUEST_ONLY = {
    ErrorCode.INSUFFICIENT_CREDITS, ErrorCode.JOB_NOT_FOUND,
    ErrorCode.SUBMISSION_RECONCILIATION_REQUIRED, ErrorCode.JOB_NOT_CANCELABLE,
    ErrorCode.IDEMPOTENCY_KEY_REUSED,
}


def test_every_code_a_job_can_end_with_has_a_customer_message() -> None:
    from reconcile.api import CUSTOMER_MESSAGES

    missing = sorted(str(c) for c in ErrorCode if c not in REQUEST_ONLY and c not in CUSTOMER_MESSAGES)
    assert missing == [], f"add a customer message to api.CUSTOMER_MESSAGES (or list the code " \
                          f"in REQUEST_ONLY if no job can end with it): {missing}"
    assert sorted(str(c) for c in REQUEST_ONLY if c in CUSTOMER_MESSAGES) == []
