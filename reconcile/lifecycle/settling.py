"""Internal: fail and settle — persist a failure, then settle it as the settlement policy decides
(the ledger executes; a refused settlement backs off, one ``ledger_error`` anomaly per job).
"""

from __future__ import annotations

import logging
import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from .. import jobstore
from ..db.models import Job
from ..jobstore.events import add_event, cancel_requested, publish_events
from ..runtime import Runtime
from ..settlement import SettleOutcome, decide, refund_share, settlement_cause
from ..states import Status, settle_backoff

log = logging.getLogger("reconcile.lifecycle")


def fail_job(rt: Runtime, job_id: uuid.UUID, code: str, message: str,
             detail: dict[str, Any] | None, *, submission_state: str | None = None,
             where: tuple[Any, ...] = (), anomaly: str | None = None,
             status: str = Status.FAILED) -> bool:
    """Persist the failure (and ``next_poll_at = now``) first, then settle the refund."""
    from ..core import redact

    detail = redact.value(detail)  # the anomaly below stores it too
    now = rt.now()
    with rt.sessions.begin() as session:
        failed = jobstore.mark_failed(session, job_id, now=now, code=str(code), message=message,
                                      detail=detail, where=where,
                                      submission_state=submission_state, status=status)
        if failed is None:
            return False
        event = add_event(session, failed, "canceled" if status == Status.CANCELLED else "failed",
                          now, {"code": str(code)}, rt=rt)
        if anomaly:
            jobstore.record_anomaly(session, job_id=job_id, user_id=failed.user_id, kind=anomaly,
                                    detail={"code": str(code), **(detail or {})}, now=now)
    log.info("job_failed job_id=%s code=%s", job_id, code)
    rt.crash_point("before_refund")
    settle(rt, job_id)
    publish_events(rt, [event])
    return True


def settle(rt: Runtime, job_id: uuid.UUID) -> SettleOutcome:
    """Settle a failed/cancelled job as ``rt.settlement_policy`` decides (by default: refund
    everything held) and record ``credits_actual``; on error back off.

    Returns a :class:`~reconcile.settlement.SettleOutcome` (never test it for truthiness).
    Repeating never adds a second refund (the ledger's CAS); legacy refunds count.

    Only a row the library must settle is settled (:func:`reconcile.jobstore.must_settle`: the
    library persisted its failure); any other — a platform's own failed row, never failed by the
    library — is ``NOT_DUE`` and untouched, whoever calls (README, Design notes: Refunds need
    evidence).
    """
    now = rt.now()
    try:
        with rt.sessions.begin() as session:
            job = jobstore.load(session, job_id, lock=True)
            if job is None or job.status not in (Status.FAILED, Status.CANCELLED):
                return SettleOutcome.NOT_DUE
            if job.credits_actual is not None:
                return SettleOutcome.ALREADY_SETTLED
            if not jobstore.must_settle(job):
                log.warning("settle_refused_not_the_librarys job_id=%s status=%s", job_id,
                            job.status)
                return SettleOutcome.NOT_DUE
            _execute_settlement(rt, session, job, now)
            rt.crash_point("mid_refund")
            actual = rt.ledger.settled_amount(session, job_id)
            jobstore.settled(session, job_id, actual if actual is not None else 0)
        log.info("job_settled job_id=%s", job_id)
        return SettleOutcome.SETTLED
    except Exception as exc:
        log.exception("settle_failed job_id=%s", job_id)
        with rt.sessions.begin() as session:
            job = jobstore.load(session, job_id)
            if job is not None:
                jobstore.settle_failed(session, job_id, now + settle_backoff(job.settle_attempts))
                if not isinstance(exc, DBAPIError):  # the ledger refused: one anomaly per job
                    _ledger_error_once(session, job, exc, now)
        return SettleOutcome.BACKED_OFF


def _execute_settlement(rt: Runtime, session: Session, job: Job, now: datetime) -> None:
    """The ledger executes the policy's decision for a failed/cancelled job: the share is
    :func:`~reconcile.settlement.refund_share` of the row's (cause, accepted)
    (:func:`~reconcile.settlement.settlement_cause`). A full refund is the ledger's ``refund``
    (nothing read first); a partial one is a commit of the kept part of what is held, read
    under the user's balance lock (:func:`_held`), the ledger releasing the rest to its pools
    and recording the decision (the refund share, the kept amount) with that commit."""
    from ..ledger import commit_settled

    policy = rt.settlement_policy
    # the cancel request matters only where a cancel's share differs from a failure's (the
    # default policy reads nothing extra)
    asked = policy.cancel_refund != policy.failure_refund and job.status != Status.CANCELLED \
        and cancel_requested(session, job.id)
    cause, accepted = settlement_cause(job, kind=rt.kind(job.provider_kind),
                                       cancel_requested=asked)
    share = refund_share(cause, accepted, policy)
    reserved = None if share == 1 else _held(session, job.id)
    decision = decide(job.status, reserved=reserved, policy=policy, cause=cause,
                      accepted=accepted)
    if decision.full_refund:
        rt.ledger.refund(session, job.id, now=now)
    else:
        # the decision's record (status, refund share) is written by the ledger's own CAS, in
        # this transaction: the audit accepts this commit after a policy change because of it
        commit_settled(rt.ledger, session, job.id, decision.commit, now=now,
                       record=decision.record)


def _held(session: Session, job_id: uuid.UUID) -> int:
    """What the job's reservation still holds: its reserved usage log net of legacy refunds
    (0: nothing reserved any more) — read under its user's balance lock, which the ledger's
    commit and a legacy refund's import (``credits.import_legacy_refund``) both take, so what
    is held cannot change between this read and the commit of the kept part (finding 6: an
    import in between made it keep a share of the credits already given back)."""
    from .. import credits
    from ..db.models import UsageLog

    found = session.execute(
        select(UsageLog.credits, UsageLog.user_id)
        .where(UsageLog.job_id == job_id, UsageLog.status == "reserved")
        .order_by(UsageLog.created_at).limit(1)).first()
    if found is None:
        return 0
    # the ledger's lock (its balance row), never created here: a platform's own ledger leaves
    # the built-in tables untouched
    credits.lock_balance(session, found.user_id, create=False)
    reserved = session.execute(
        select(UsageLog.credits).where(UsageLog.job_id == job_id, UsageLog.status == "reserved")
        .order_by(UsageLog.created_at).limit(1)).scalar_one_or_none()
    if reserved is None:
        return 0
    return max(0, int(reserved) - credits.legacy_refunded(session, job_id))


def _ledger_error_once(session: Session, job: Job, exc: Exception, now: datetime) -> None:
    """One ``ledger_error`` anomaly per job whose settlement the ledger refused (the failure is
    already saved; settlement retries with capped backoff and shows in ``reconcile unsettled``)."""
    jobstore.record_anomaly(session, job_id=job.id, user_id=job.user_id, kind="ledger_error",
                            detail={"error": f"{type(exc).__name__}: {exc}"[:1000],
                                    "status": job.status}, now=now, once=True)
