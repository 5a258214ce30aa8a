"""Internal: the library's own mechanics, not an import path for platforms (may move).

User cancel (README, Design notes: Cancel): cancel + refund only where the upstream outcome is known.

* another user's job, or none → :class:`JobNotFound`;
* completed / failed / cancelled → 409 ``JOB_NOT_CANCELABLE``;
* ``not_started`` → cancelled + refund, by a CAS on ``not_started`` — the create claim needs
  that state too, so whichever lands first wins and a later create step exits upstream-free;
* ``submission_state`` NULL (a platform row) with no trace of a provider call (no
  ``provider_call_started_at``, no upstream id) → cancelled + refund; with one → 409
  ``SUBMISSION_RECONCILIATION_REQUIRED``;
* ``accepted`` with its task id → the provider's cancel where it has one (Replicate, fal; its
  errors are only logged), then cancelled + refund; elsewhere (KIE, ElevenLabs) cancelled +
  refund locally. The request is recorded first (a ``cancel_requested`` job event, while the
  job is in flight), so a poll, webhook or sweep that reads our own upstream cancel before the
  local CAS and fails the job ``UPSTREAM_FAILED`` settles it as the user's cancel
  (``cancel_refund``: :func:`reconcile.settlement.settlement_cause`); the cancel then rewrites
  that row to cancelled (:func:`jobstore.cancelled_over_failure`) and answers 200, not 409;
* ``submitting``, ``uncertain``, ``accepted`` without its id → 409
  ``SUBMISSION_RECONCILIATION_REQUIRED``.

A locally cancelled job can still finish upstream; its completion then loses the completion CAS
(only in-flight rows complete), so nothing is stored or charged. The row keeps
``error_code = CANCELED`` and, in ``error_detail``, what the upstream cancel did.
"""

from __future__ import annotations

import logging
import uuid
from enum import StrEnum
from typing import Any

from .. import jobstore, lifecycle
from ..db.models import Job
from ..errors import Conflict, ErrorCode, JobNotFound
from ..jobstore.events import record_cancel_request
from ..runtime import Runtime
from ..states import TERMINAL, Status, Submission

log = logging.getLogger("reconcile.cancel")

CANCELED_MESSAGE = "Canceled by the user."
RECONCILIATION_MESSAGE = (
    "The upstream submission outcome is not settled yet, so the job cannot be canceled into a "
    "refund. Read the job again later."
)
# A lost cancel CAS means the row moved on; each retry re-reads and decides again. Rows only
# move forward (a 429 release is the one step back), so a handful of rounds always suffices.
MAX_ROUNDS = 5
WITHDRAWN_MESSAGE = "Withdrawn: the request that submitted it did not complete."


def load_owned(rt: Runtime, user_id: uuid.UUID, job_id: uuid.UUID) -> Job:
    """The job if ``user_id`` owns it; another user's job is "not found" (no existence leak)."""
    with rt.sessions() as session:
        job = jobstore.load(session, job_id)
    if job is None or job.user_id != user_id:
        raise JobNotFound()
    return job


def cancel_job(rt: Runtime, user_id: uuid.UUID, job_id: uuid.UUID) -> Job:
    """Cancel the user's job and settle its refund; returns the cancelled row.

    Raises JobNotFound, or Conflict with ``JOB_NOT_CANCELABLE`` (terminal) or
    ``SUBMISSION_RECONCILIATION_REQUIRED`` (the upstream outcome is not known yet).
    """
    for _ in range(MAX_ROUNDS):
        job = load_owned(rt, user_id, job_id)
        where, detail = _decide(rt, job)
        if lifecycle.fail_job(rt, job_id, ErrorCode.CANCELED, CANCELED_MESSAGE, detail,
                              where=where, status=Status.CANCELLED):
            log.info("job_canceled job_id=%s submission_state=%s", job_id, job.submission_state)
            return load_owned(rt, user_id, job_id)
        if detail.get("upstream_cancel") == "requested" and _own_cancel_seen(rt, job, detail):
            return load_owned(rt, user_id, job_id)
        log.info("cancel_cas_lost job_id=%s", job_id)  # the row moved on: decide again
    raise Conflict(ErrorCode.SUBMISSION_RECONCILIATION_REQUIRED, RECONCILIATION_MESSAGE)


def _own_cancel_seen(rt: Runtime, job: Job, detail: dict[str, Any]) -> bool:
    """The upstream cancel we just requested was read first: a poll or a webhook between it and
    our CAS saw the task ``canceled`` and failed the job ``UPSTREAM_FAILED`` (refunded). The job
    is the user's cancel, not a provider failure: rewrite the status (the refund stays the one
    that was settled) and answer 200, not 409. False: the row moved on otherwise."""
    from ..jobstore.events import add_event, publish_events

    now = rt.now()
    with rt.sessions.begin() as session:
        moved = jobstore.cancelled_over_failure(
            session, job.id, job.provider_task_id or "", code=ErrorCode.CANCELED,
            message=CANCELED_MESSAGE, detail={**detail, "read_first_by": "a status read"})
        if moved is None:
            return False
        event = add_event(session, moved, "canceled", now, {"code": str(ErrorCode.CANCELED)}, rt=rt)
    log.info("job_canceled job_id=%s over_upstream_failed=true", job.id)
    lifecycle.settle(rt, job.id)  # a no-op when the failure's refund was settled already
    publish_events(rt, [event])
    return True


# the create claim needs not_started too: whichever CAS lands first wins, never both
_NOT_STARTED_GUARD = (Job.submission_state == Submission.NOT_STARTED,)


def withdraw(rt: Runtime, job_id: uuid.UUID, why: str) -> bool:
    """Cancel a job whose create was never sent, refunded in full (never accepted): the
    platform's request that submitted it did not complete (its database transaction rolled
    back, so no row of its own names the job). The same CAS on ``not_started`` as a user's
    cancel: False when the row moved on (a create claimed it) — the job then runs and settles
    as any other."""
    return lifecycle.fail_job(rt, job_id, ErrorCode.CANCELED, WITHDRAWN_MESSAGE,
                              {"canceled_by": why, "submission_state": Submission.NOT_STARTED},
                              where=_NOT_STARTED_GUARD, status=Status.CANCELLED)


class Verdict(StrEnum):
    """Cancel's decision for a job as read (:func:`decide`)."""

    NOT_CANCELABLE = "not_cancelable"  # terminal: 409 JOB_NOT_CANCELABLE
    RECONCILIATION_REQUIRED = "reconciliation_required"  # 409 SUBMISSION_RECONCILIATION_REQUIRED
    NOT_STARTED = "not_started"  # cancel by a CAS on not_started (races the create claim)
    PLATFORM_ROW = "platform_row"  # no submission_state and no trace of a provider call
    ACCEPTED = "accepted"  # the upstream id is known: the provider's cancel, then cancel locally


def decide(status: str, submission_state: str | None, *, call_started: bool,
           task_id: str | None) -> Verdict:
    """Pure: what a cancel does with a job in ``status`` / ``submission_state``;
    ``call_started``: ``provider_call_started_at`` is set; ``task_id``: the upstream id."""
    if status in TERMINAL:
        return Verdict.NOT_CANCELABLE
    if submission_state == Submission.NOT_STARTED:
        return Verdict.NOT_STARTED
    if jobstore.is_outcome_unknown(submission_state, call_started=call_started, task_id=task_id):
        return Verdict.RECONCILIATION_REQUIRED  # `reconcile fail` refuses the same rows
    if submission_state is None:
        # a platform row: only the absence of any provider-call trace proves nothing ran (an
        # upstream id without the start marker still means the provider was called)
        return Verdict.RECONCILIATION_REQUIRED if task_id else Verdict.PLATFORM_ROW
    if submission_state == Submission.ACCEPTED and task_id:
        return Verdict.ACCEPTED
    return Verdict.RECONCILIATION_REQUIRED


def _decide(rt: Runtime, job: Job) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The CAS guard and detail for cancelling ``job`` now, or raise the Conflict."""
    verdict = decide(job.status, job.submission_state,
                     call_started=job.provider_call_started_at is not None,
                     task_id=job.provider_task_id)
    if verdict is Verdict.NOT_CANCELABLE:
        raise Conflict(ErrorCode.JOB_NOT_CANCELABLE,
                       f"The job is already {job.status} and cannot be canceled.")
    if verdict is Verdict.RECONCILIATION_REQUIRED:
        raise Conflict(ErrorCode.SUBMISSION_RECONCILIATION_REQUIRED, RECONCILIATION_MESSAGE)
    detail: dict[str, Any] = {"canceled_by": "user", "submission_state": job.submission_state}
    if verdict is Verdict.NOT_STARTED:
        return _NOT_STARTED_GUARD, detail
    if verdict is Verdict.PLATFORM_ROW:
        return (jobstore.platform_row_uncalled(),), detail
    # recorded first: whichever reader then writes the terminal state, it settles as a cancel
    if not record_cancel_request(rt, job.id):
        raise Conflict(ErrorCode.JOB_NOT_CANCELABLE, "The job is no longer in flight.")
    detail["upstream_cancel"] = _cancel_upstream(rt, job)
    return (Job.submission_state == Submission.ACCEPTED,
            Job.provider_task_id == job.provider_task_id), detail


def _cancel_upstream(rt: Runtime, job: Job) -> str:
    """Ask the provider to stop the task: ``requested``; ``unconfirmed`` (no cancel endpoint, or
    the provider refused); ``unsupported`` (no async client); ``error`` (the call raised).

    Best effort: whatever the provider answers, the local cancel goes ahead (the user is not
    charged for a job they cancelled; a late result is refused by the completion CAS).
    """
    kind = rt.kind(job.provider_kind)
    if kind is None or kind.sync:
        return "unsupported"
    try:
        client = rt.client(kind)
        cancel = getattr(client, "cancel", None)
        if cancel is None:
            return "unsupported"
        done = bool(cancel(job.provider_task_id or "", model=job.provider_model))
    except Exception:
        log.warning("upstream_cancel_failed job_id=%s task_id=%s", job.id, job.provider_task_id,
                    exc_info=True)
        return "error"
    log.info("upstream_cancel job_id=%s task_id=%s requested=%s", job.id, job.provider_task_id,
             done)
    return "requested" if done else "unconfirmed"
