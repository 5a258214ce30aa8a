"""Gateway helpers: framework-agnostic, each returns ``(http_status, body)``.

A platform's web layer calls these and serialises ``body`` as JSON unchanged; the shapes are the
customer contract (README, Design notes: The customer contract), so tests compare them key for key::

    202 {"job_id", "state": "queued"}                              submit accepted (inline or queued)
    502 {"error": {"type": "upstream_error", "code": "UPSTREAM_SUBMISSION_FAILED" | …UNCERTAIN,
                   "message", "job_id"[, "upstream_request_id"]}}
    400 / 402 / 404 / 409 / 500 {"error": {"type", "code", "message", …}}
    409 IDEMPOTENCY_KEY_REUSED                                    a key reused for another request
    200 {"id", "state", "outputs", "error", "credits_actual", "credits_returned",
         "next_poll_at"}                                          a snapshot

Choices written down here (the design is silent on them):

* A submit's 202 always says ``"state": "queued"`` — even when the inline create was already
  accepted: the answer means "taken", and the snapshot is where the live state is read.
* A snapshot's ``error`` is present when the row has an ``error_code`` (an ``uncertain`` job
  still queued included), or the job failed / was cancelled; a platform row that failed without
  a code reports ``INTERNAL`` (cancelled: ``CANCELED``) rather than inventing a cause.
* Timestamps are ISO-8601 UTC to the second with a ``Z`` (``2026-12-01T10:05:00Z``).
* A job id that is not a UUID is "not found", like another user's job.
* An unexpected exception is a 500 with no internals in the body, logged — but only before the
  job is committed. After the commit (a database blip saving the task id, the broker down at the
  first poll, a hook) a submit still names the job: 202, or 502 ``UPSTREAM_SUBMISSION_FAILED`` /
  ``…UNCERTAIN`` as its row says (``_committed_answer``); a client retrying a 500 would pay twice.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import select

from . import credits as ledger, idempotency, jobstore, lifecycle
from .db.models import Asset, Job
from .errors import (
    Conflict,
    CreateRejected,
    CreateUncertain,
    ErrorCode,
    InsufficientCredits,
    InvalidParam,
    JobNotFound,
    ProviderError,
)
from .jobstore import events
from .lifecycle.cancel import cancel_job, load_owned
from .lifecycle.submit import enqueue_create_after_commit
from .runtime import Runtime, Validator
from .states import PUBLIC_STATE, Status, Submission

__all__ = [
    "Response", "cancel", "credit_history", "error_response", "events_after", "follow",
    "snapshot", "snapshot_body", "submit",
]

log = logging.getLogger("reconcile.api")

Response = tuple[int, dict[str, Any]]

SUBMISSION_FAILED_MESSAGE = "Upstream submission failed. Check the job for credit reconciliation."
SUBMISSION_UNCERTAIN_MESSAGE = "Upstream submission outcome is unknown. Do not resubmit; check the job."
NOT_FOUND_MESSAGE = "No such job."
INTERNAL_MESSAGE = "Internal error. Keep the job id and request details when reporting it."

# what a snapshot says when the row has a code but no message of its own
_DEFAULT_MESSAGES = {
    ErrorCode.UPSTREAM_SUBMISSION_UNCERTAIN.value: SUBMISSION_UNCERTAIN_MESSAGE,
    ErrorCode.UPSTREAM_SUBMISSION_FAILED.value: SUBMISSION_FAILED_MESSAGE,
    ErrorCode.CANCELED.value: "Canceled.",
    ErrorCode.INTERNAL.value: "The job failed.",
}
# What a customer reads for a library job: the code's own message, never the operator's
# detail (hosts, addresses, presigned URLs, raw exception text). For these two codes the
# provider's own message follows, scrubbed of URLs, host names and addresses (the
# customer fixes the payload from it).
CUSTOMER_MESSAGES = {
    ErrorCode.INVALID_PARAM.value: "The request is invalid.",
    ErrorCode.UPSTREAM_INVALID_INPUT.value: "The provider rejected the input.",
    ErrorCode.UPSTREAM_SUBMISSION_FAILED.value: SUBMISSION_FAILED_MESSAGE,
    ErrorCode.UPSTREAM_SUBMISSION_UNCERTAIN.value: SUBMISSION_UNCERTAIN_MESSAGE,
    ErrorCode.UPSTREAM_RATE_LIMITED.value: "The provider is rate limiting requests.",
    ErrorCode.UPSTREAM_TIMEOUT.value: "The provider did not finish in time.",
    ErrorCode.UPSTREAM_FAILED.value: "The provider failed to produce a result.",
    ErrorCode.UPSTREAM_WEBHOOK_ERROR.value: "The provider's webhook reported a failure.",
    ErrorCode.UPSTREAM_EMPTY_RESULT.value: "The provider reported success but returned no media.",
    ErrorCode.UPSTREAM_UNKNOWN_STATUS.value: "The provider answered with an unknown status.",
    ErrorCode.UPSTREAM_TASK_NOT_FOUND.value: "The provider no longer knows the task.",
    ErrorCode.UPSTREAM_MEDIA_EXPIRED.value: "The provider's result expired before it was stored.",
    ErrorCode.UPSTREAM_OUTPUT_LIMIT.value: "The provider returned more outputs than allowed.",
    ErrorCode.RECONCILE_NO_RECOVERY.value: "The job could not be recovered; credits were refunded.",
    ErrorCode.CANCELED.value: "Canceled.",
    ErrorCode.INTERNAL.value: "The job failed.",
}
_WITH_PROVIDER_MESSAGE = (ErrorCode.UPSTREAM_INVALID_INPUT.value, ErrorCode.UPSTREAM_FAILED.value)
_SETTLED_STATES = (Status.FAILED.value, Status.CANCELLED.value)
_NOT_PLAINLY_ACCEPTED = (Submission.REJECTED.value, Submission.UNCERTAIN.value)


# ----------------------------------------------------------------------------- errors


def error_response(exc: BaseException, *, job_id: uuid.UUID | str | None = None,
                   upstream_request_id: str | None = None) -> Response:
    """The one mapping from an exception to ``(status, {"error": {...}})``.

    ``job_id`` is echoed for 409 and 502 only; ``upstream_request_id`` (502 only) defaults to
    the provider error's own and is omitted when unknown — never invented.
    """
    if isinstance(exc, InvalidParam):
        return 400, _error("invalid_request_error", exc.code, exc.message, param=exc.param)
    if isinstance(exc, InsufficientCredits):
        return 402, _error("invalid_request_error", exc.code, exc.message)
    if isinstance(exc, JobNotFound):
        return 404, _error("not_found_error", exc.code, NOT_FOUND_MESSAGE)
    if isinstance(exc, Conflict):
        return 409, _error("conflict_error", exc.code, exc.message, job_id=_str(job_id))
    if isinstance(exc, ProviderError):
        uncertain = exc.uncertain  # the class's outcome_unknown, or the uncertain code
        code = (ErrorCode.UPSTREAM_SUBMISSION_UNCERTAIN if uncertain
                else ErrorCode.UPSTREAM_SUBMISSION_FAILED)
        body = _error("upstream_error", code,
                      SUBMISSION_UNCERTAIN_MESSAGE if uncertain else SUBMISSION_FAILED_MESSAGE,
                      job_id=_str(job_id))
        request_id = upstream_request_id or exc.request_id
        if request_id:
            body["error"]["upstream_request_id"] = request_id
        return 502, body
    log.error("gateway_internal_error job_id=%s", job_id, exc_info=exc)
    return 500, _error("internal_error", ErrorCode.INTERNAL, INTERNAL_MESSAGE)


def _error(type_: str, code: str, message: str, **extra: Any) -> dict[str, Any]:
    return {"error": {"type": type_, "code": str(code), "message": message, **extra}}


def _str(value: uuid.UUID | str | None) -> str | None:
    return None if value is None else str(value)


# ----------------------------------------------------------------------------- submit


def submit(
    rt: Runtime,
    user_id: uuid.UUID,
    provider_kind: str,
    model: str,
    input: Mapping[str, Any] | str | bytes,
    credits: int,
    *,
    job_type: str,
    inline: bool = False,
    should_watermark: bool | None = None,
    is_public: bool | None = None,
    workflow_execution_id: uuid.UUID | None = None,
    node_id: str | None = None,
    validator: Validator | None = None,
    idempotency_key: str | None = None,
) -> Response:
    """Validate, reserve and insert the job; ``inline`` async kinds also run the create now.

    202 queued | 502 UPSTREAM_SUBMISSION_FAILED (any rejection; the job's own ``error.code``
    names the cause) | 502 UPSTREAM_SUBMISSION_UNCERTAIN | 400 | 402 | 409
    IDEMPOTENCY_KEY_REUSED | 500. A 429 is not waited out in the request: it answers 202 and the
    create step has re-enqueued itself. ``input`` may be the raw JSON text of the request body.
    A broker that is down still answers 202 with the ``job_id`` (the sweep enqueues the create,
    or resumes the poll chain of an inline create it accepted). Once the job is committed, no
    answer is a 500: whatever raises after, the answer names the job (:func:`_committed_answer`).

    ``idempotency_key`` (a client's ``Idempotency-Key`` header, unique per user, kept 24 h): a
    retry with the same key and request gets the original answer and job, never a second job
    or reservation; the same key with another request is a 409 IDEMPOTENCY_KEY_REUSED.
    """
    job_id: uuid.UUID | None = None
    try:
        submitted = lifecycle.submit_job(
            rt, _user_uuid(user_id), provider_kind, model, _parse_input(input), credits,
            job_type=job_type, should_watermark=should_watermark, is_public=is_public,
            workflow_execution_id=workflow_execution_id, node_id=node_id, validator=validator,
            enqueue=not inline, idempotency_key=idempotency_key,
        )
        job_id = submitted.job_id
        if submitted.replay is not None:
            replay = submitted.replay
            if replay.status is not None and isinstance(replay.body, dict):
                return replay.status, replay.body
            return _queued(job_id)
        if inline and not submitted.kind.sync:  # sync kinds run in the platform's sync helper
            try:
                answer = _create_answer(job_id, lifecycle.create_step(rt, job_id))
            except Exception as exc:
                answer = _committed_answer(rt, job_id, exc)
        else:
            answer = _queued(job_id)
        if idempotency_key is not None:
            _remember(rt, user_id, idempotency_key, job_id, answer)
        return answer
    except Exception as exc:
        if job_id is not None:  # committed (or a replay's): the answer names the job
            return _committed_answer(rt, job_id, exc)
        return error_response(exc)


def _committed_answer(rt: Runtime, job_id: uuid.UUID, exc: BaseException) -> Response:
    """The answer once the job and its reservation are committed and something raised after
    (a database blip saving the task id, the broker down at the first poll's enqueue, a hook).

    Never a 500 without the job id: a client retries that and pays a second job. The answer
    says what the job's row says: an upstream id saved (accepted; the sweep resumes a lost poll
    chain) or a create never claimed (the sweep enqueues it) is 202; a confirmed rejection is
    502 ``UPSTREAM_SUBMISSION_FAILED``; anything else — a claim held with no id saved (the
    create may have been accepted: the claim expires into ``uncertain``), an uncertain row, or a
    row that cannot be read — is 502 ``UPSTREAM_SUBMISSION_UNCERTAIN``: never retried blindly.
    """
    log.error("submit_raised_after_commit job_id=%s", job_id, exc_info=exc)
    try:
        with rt.sessions() as session:
            job = jobstore.load(session, job_id)
    except Exception:
        log.warning("submit_answer_row_unreadable job_id=%s", job_id, exc_info=True)
        job = None
    if job is not None:
        if job.provider_task_id:
            return _queued(job_id)
        if job.submission_state == Submission.NOT_STARTED:
            enqueue_create_after_commit(rt, job_id)  # else the sweep's not-started row
            return _queued(job_id)
        if job.submission_state == Submission.REJECTED:
            return error_response(CreateRejected(), job_id=job_id)
    return error_response(CreateUncertain(), job_id=job_id)


def _remember(rt: Runtime, user_id: uuid.UUID, key: str, job_id: uuid.UUID,
              answer: Response) -> None:
    """Best effort: without it a replay answers 202 with the same job id."""
    try:
        with rt.sessions.begin() as session:
            idempotency.record_answer(session, user_id, key, job_id, answer[0], answer[1])
    except Exception:
        log.warning("idempotency_answer_not_recorded job_id=%s", job_id, exc_info=True)


def _parse_input(input: Any) -> Any:
    if isinstance(input, str | bytes | bytearray):
        try:
            return json.loads(input)
        except ValueError as exc:
            raise InvalidParam(f"input is not JSON: {exc}", param="input") from exc
        except RecursionError:  # nested deeper than the parser's stack: bad input, not a 500
            raise InvalidParam("input is not JSON: nested too deeply", param="input") from None
    return input


def _queued(job_id: uuid.UUID) -> Response:
    return 202, {"job_id": str(job_id), "state": "queued"}


def _create_answer(job_id: uuid.UUID, outcome: lifecycle.CreateOutcome) -> Response:
    if outcome.action == "rejected":
        return error_response(outcome.error or CreateRejected(), job_id=job_id)
    if outcome.action == "uncertain":
        return error_response(outcome.error or CreateUncertain(), job_id=job_id)
    # accepted; rate_limited (re-enqueued by the create step); busy/resumed/lost: the job is
    # someone else's to move now, and its snapshot tells the outcome
    return _queued(job_id)


# ----------------------------------------------------------------------------- reads


def snapshot(rt: Runtime, user_id: uuid.UUID, job_id: uuid.UUID | str) -> Response:
    """200 with the job's snapshot, or 404. A failed/cancelled job whose settlement is pending
    (``credits_actual`` NULL and ``next_poll_at`` set — never a platform's old row) gets one
    settlement attempt first."""
    try:
        job = load_owned(rt, user_id, _job_uuid(job_id))
        if settlement_pending(job):
            lifecycle.settle(rt, job.id)
            job = load_owned(rt, user_id, job.id)
        return 200, snapshot_body(rt, job)
    except Exception as exc:
        return error_response(exc, job_id=_str(job_id))


def settlement_pending(job: Job) -> bool:
    return jobstore.is_settlement_pending(job)


def cancel(rt: Runtime, user_id: uuid.UUID, job_id: uuid.UUID | str) -> Response:
    """200 with the cancelled job's snapshot, 404, or 409 (README, Design notes: Cancel)."""
    try:
        job = cancel_job(rt, user_id, _job_uuid(job_id))
        return 200, snapshot_body(rt, job)
    except Exception as exc:
        return error_response(exc, job_id=_str(job_id))


def credit_history(rt: Runtime, user_id: uuid.UUID) -> Response:
    """200 ``{"data": [...]}``: the user's own ledger transactions, oldest first."""
    try:
        with rt.sessions() as session:
            rows = ledger.history(session, _user_uuid(user_id))
        return 200, {"data": [{
            "id": row.id, "type": row.type, "amount": row.amount, "job_id": _str(row.job_id),
            "from_sub": row.from_sub, "from_topup": row.from_topup,
            "created_at": iso(row.created_at),
        } for row in rows]}
    except Exception as exc:
        return error_response(exc)


def follow(rt: Runtime, user_id: uuid.UUID, job_id: uuid.UUID | str,
           **options: Any) -> Iterator[dict[str, str]]:
    """The job's events as SSE fields (``id``, ``event``, ``data`` = the JSON message) until the
    job is terminal; another user's (or an unknown) job yields nothing. ``options`` go to
    :func:`reconcile.jobstore.events.follow_job` (``interval``, ``timeout``, ``sleep``)."""
    try:
        job_uuid = _job_uuid(job_id)
    except JobNotFound:
        return
    for message in events.follow_job(rt, user_id, job_uuid, **options):
        yield _sse_fields(message)


def events_after(rt: Runtime, user_id: uuid.UUID, job_id: uuid.UUID | str,
                 after: int = 0) -> tuple[list[dict[str, str]], int, bool]:
    """One short, non-blocking step of :func:`follow`: the job's events after the cursor
    ``after`` as SSE fields, the next cursor, and whether the stream is over (terminal, or not
    this user's job). An async server awaits it in a worker thread and sleeps on its event loop
    between steps, so a waiting stream holds no thread (the example gateway)."""
    try:
        job_uuid = _job_uuid(job_id)
    except JobNotFound:
        return [], after, True
    messages, cursor, over = events.read_since(rt, user_id, job_uuid, after)
    return [_sse_fields(m) for m in messages], cursor, over


def _sse_fields(message: dict[str, Any]) -> dict[str, str]:
    return {"id": message["event_id"], "event": message["type"],
            "data": json.dumps(message, separators=(",", ":"))}


def snapshot_body(rt: Runtime, job: Job) -> dict[str, Any]:
    """The 200 body of a job read (README, Design notes: The customer contract).
    ``credits_returned``: what the job's settlement gave back to the user (a refund, a partial
    one, the rest of a commit for less: ``Ledger.refunded``); None until it is settled."""
    outputs: list[dict[str, Any]] | None = None
    returned: int | None = None
    if job.status == Status.COMPLETED or job.credits_actual is not None:
        with rt.sessions() as session:
            if job.credits_actual is not None:
                returned = rt.ledger.refunded(session, job.id)
            if job.status == Status.COMPLETED:
                assets = session.execute(select(Asset).where(Asset.job_id == job.id)
                                         .order_by(Asset.index)).scalars().all()
                outputs = [{"url": rt.storage.url(a.storage_key), "media_type": a.media_type}
                           for a in assets]
    return {
        "id": str(job.id),
        "state": PUBLIC_STATE.get(job.status, job.status),
        "outputs": outputs,
        "error": _snapshot_error(job),
        "credits_actual": job.credits_actual,
        "credits_returned": returned,
        "next_poll_at": iso(job.next_poll_at),
    }


def _snapshot_error(job: Job) -> dict[str, Any] | None:
    code = job.error_code
    if code is None:
        if job.status not in _SETTLED_STATES:
            return None
        code = ErrorCode.CANCELED if job.status == Status.CANCELLED else ErrorCode.INTERNAL
    detail = job.error_detail if isinstance(job.error_detail, Mapping) else {}
    if job.provider_kind is None:  # a platform's own row: its message is the platform's
        detail_message = detail.get("message")
        message = (job.error_message
                   or (detail_message if isinstance(detail_message, str) else None)
                   or _DEFAULT_MESSAGES.get(str(code), "The job failed."))
    else:
        message = customer_message(str(code), detail, job.error_message)
    error: dict[str, Any] = {"code": str(code), "message": message}
    request_id = detail.get("upstreamRequestId") or detail.get("request_id")
    if isinstance(request_id, str) and request_id:
        error["upstreamRequestId"] = request_id
    if job.submission_state in _NOT_PLAINLY_ACCEPTED:
        error["submissionOutcome"] = job.submission_state
    return error


def customer_message(code: str, detail: Mapping[str, Any], stored: str | None) -> str:
    """The library's message for ``code`` (+ the provider's own, scrubbed, where it helps)."""
    from .core.redact import for_customer

    message = CUSTOMER_MESSAGES.get(code, "The job failed.")
    if code not in _WITH_PROVIDER_MESSAGE:
        return message
    provider = detail.get("provider_message")
    if not isinstance(provider, str) and code == ErrorCode.UPSTREAM_INVALID_INPUT.value:
        provider = stored  # a rejected create keeps the provider's words as its message
    if isinstance(provider, str) and provider.strip():
        return f"{message} {for_customer(provider.strip())[:500]}"
    return message


def iso(value: datetime | None) -> str | None:
    """ISO-8601 UTC to the second with a ``Z``, or None."""
    if value is None:
        return None
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _user_uuid(user_id: uuid.UUID | str) -> uuid.UUID:
    """A user id from the platform: a UUID (or its text), else a 400 — never a 500."""
    if isinstance(user_id, uuid.UUID):
        return user_id
    try:
        return uuid.UUID(str(user_id))
    except ValueError:
        raise InvalidParam("user id is not a UUID", param="user_id") from None


def _job_uuid(job_id: uuid.UUID | str) -> uuid.UUID:
    if isinstance(job_id, uuid.UUID):
        return job_id
    try:
        return uuid.UUID(str(job_id))
    except ValueError:
        raise JobNotFound() from None
