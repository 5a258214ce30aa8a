"""Internal: the terminal writes — failed, cancelled over a failure, completed, the final cost,
the settlement (claimed, settled, retried), an operator's re-charge — and the one writer of
``credit_anomalies`` (recorded open; closed by the operator action that answers them)."""

from __future__ import annotations

import json
import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, insert, select, text, update
from sqlalchemy.orm import Session
from sqlalchemy.orm.attributes import set_committed_value

from ..core import redact
from ..db.models import Asset, CreditAnomaly, Job, JobEvent, table_of
from ..db.session import rowcount
from ..settlement import CANCEL_READ_CODE
from ..states import IN_FLIGHT, Status
from .cas import _cas


def claim_settlement(session: Session, job_id: uuid.UUID, cutoff: datetime,
                     retry_at: datetime) -> Job | None:
    """Move a due settlement's ``next_poll_at`` to ``retry_at`` (a short lease: if this process
    dies before settling, the retry is due again then). None: settled or claimed meanwhile."""
    return _cas(session, Job.id == job_id, Job.credits_actual.is_(None),
                Job.next_poll_at.is_not(None), Job.next_poll_at <= cutoff,
                next_poll_at=retry_at)


def record_recharge(session: Session, job_id: uuid.UUID, amount: int) -> bool:
    """An operator's re-charge of a job its settlement returned credits to: its final cost is
    ``amount`` (what the settlement kept plus the re-charge)."""
    result = session.execute(update(Job).where(Job.id == job_id)
                             .values(credits_actual=amount, display_cost=amount))
    return rowcount(result) == 1


def record_anomaly(session: Session | Connection, *, job_id: uuid.UUID | None,
                   user_id: uuid.UUID | None, kind: str, detail: Any, now: datetime,
                   once: bool = False) -> bool:
    """The one writer of ``credit_anomalies``. ``once``: only if the job has no anomaly of
    ``kind`` yet (one SELECT first; the caller holds what serialises it, usually the job's row
    lock). A Session adds the row (its flush writes it, as before); a Connection inserts it.
    False: ``once`` and the anomaly exists. Its detail is redacted (:func:`redact.value`)."""
    detail = redact.value(detail)
    if once:
        seen = session.execute(select(CreditAnomaly.id).where(
            CreditAnomaly.job_id == job_id, CreditAnomaly.kind == kind).limit(1)).first()
        if seen is not None:
            return False
    if isinstance(session, Session):
        session.add(CreditAnomaly(job_id=job_id, user_id=user_id, kind=kind, detail=detail,
                                  created_at=now))
    else:
        session.execute(insert(table_of(CreditAnomaly)).values(
            job_id=job_id, user_id=user_id, kind=kind, detail=detail, created_at=now))
    return True


def resolve_anomalies(session: Session | Connection, job_id: uuid.UUID, kinds: Any, *,
                      now: datetime, by: str, action: str) -> int:
    """Close the job's open anomalies of ``kinds`` (the operator action ``action`` answered
    them; ``by``: who, through which surface). Returns how many were closed; a closed anomaly
    is never reopened."""
    kinds = sorted(kinds)
    if not kinds:
        return 0
    table = table_of(CreditAnomaly)
    result = session.execute(
        update(table)
        .where(table.c.job_id == job_id, table.c.kind.in_(kinds), table.c.resolved_at.is_(None))
        .values(resolved_at=now, resolved_by=redact.text(by)[:200], resolved_action=action))
    return rowcount(result)


def mark_failed(session: Session, job_id: uuid.UUID, *, now: datetime, code: str, message: str,
                detail: dict[str, Any] | None, where: tuple[Any, ...] = (),
                submission_state: str | None = None, status: str = Status.FAILED) -> Job | None:
    """In flight → failed (or cancelled), with ``next_poll_at = now`` so the refund is settled
    even if this process dies before it."""
    values: dict[str, Any] = dict(
        status=status, error_code=code, error_message=redact.text(message),
        error_detail=redact.value(detail),
        next_poll_at=now, completed_at=now, claim_expires_at=None, poll_lease_expires_at=None,
        credits_actual=None,
    )
    if submission_state is not None:
        values["submission_state"] = submission_state
    return _cas(session, Job.id == job_id, Job.status.in_(IN_FLIGHT), *where, **values)


def cancelled_over_failure(session: Session, job_id: uuid.UUID, task_id: str, *, code: str,
                           message: str, detail: dict[str, Any] | None) -> Job | None:
    """failed → cancelled, for the user's cancel whose own upstream cancel a poll (or a webhook)
    read first: the task failed ``UPSTREAM_FAILED`` *because* we cancelled it. Money is not
    touched (the failure's settlement already read the cancel request and settled it as the
    user's cancel: ``settlement.CANCEL_READ_CODE``, the same code); only the status, the
    code and the detail say what happened. Guarded on the same upstream task and on that code,
    so a completion, an exhaustion or another task's failure is never rewritten."""
    return _cas(session, Job.id == job_id, Job.status == Status.FAILED,
                Job.error_code == CANCEL_READ_CODE, Job.provider_task_id == task_id,
                status=Status.CANCELLED, error_code=code, error_message=redact.text(message),
                error_detail=redact.value(detail))


def mark_completed(session: Session, job_id: uuid.UUID, **values: Any) -> Job | None:
    """Completion is allowed only from pending/processing (README, Design notes: Completion).
    Clearing the last error's text clears its code too."""
    if "reconcile_last_error" in values and values["reconcile_last_error"] is None:
        values.setdefault("reconcile_last_error_code", None)
    return _cas(session, Job.id == job_id, Job.status.in_(IN_FLIGHT), status=Status.COMPLETED,
                next_poll_at=None, poll_lease_expires_at=None, claim_expires_at=None, **values)


# a won completion's other rows in ONE statement (PostgreSQL): the final cost when it was not
# known at the completion CAS, every asset (unnest of the arrays: a fixed text, nothing to
# compile per job) and the outbox event, whose id comes back for the publisher
_COMPLETION_ROWS = text("""
WITH cost AS (
  UPDATE jobs SET credits_actual = CAST(:cost AS bigint), display_cost = CAST(:cost AS bigint)
  WHERE jobs.id = CAST(:job_id AS uuid) AND jobs.status = 'completed'
    AND CAST(:set_cost AS boolean)
), assets AS (
  INSERT INTO reconcile_assets (id, job_id, user_id, "index", storage_key, media_type,
                                is_public, watermarked, created_at)
  SELECT a.id, CAST(:job_id AS uuid), CAST(:user_id AS uuid), a.idx, a.skey, a.mtype,
         CAST(:is_public AS boolean), CAST(:watermarked AS boolean), CAST(:now AS timestamptz)
  FROM unnest(CAST(:asset_ids AS uuid[]), CAST(:indexes AS int[]), CAST(:keys AS text[]),
              CAST(:types AS text[])) AS a(id, idx, skey, mtype)
)
INSERT INTO reconcile_job_events (event_id, job_id, user_id, type, payload, created_at,
                                  published_at)
VALUES (CAST(:event_id AS text), CAST(:job_id AS uuid), CAST(:user_id AS uuid),
        CAST(:type AS text), CAST(:payload AS jsonb), CAST(:now AS timestamptz),
        CAST(:published_at AS timestamptz))
RETURNING id""")


def write_completion(session: Session, job: Job, *, cost: int | None,
                     assets: list[tuple[int, str, str | None]], is_public: bool,
                     watermarked: bool, event: JobEvent, now: datetime) -> JobEvent:
    """A won completion's other rows, after its CAS and its ledger commit, in the same
    transaction: the final cost (``cost``; None: the CAS wrote it already), the assets
    ``(index, storage key, media type)`` and the ``event`` (built by ``events.new_event``, not in
    any session; its id is set here). One statement on PostgreSQL; the ORM's rows elsewhere. A
    second completion's assets break ``uq_reconcile_assets_job_id_index`` (IntegrityError), as
    the ORM's flush would."""
    if session.get_bind().dialect.name != "postgresql":
        if cost is not None:
            record_cost(session, job.id, cost)
        for index, key, media_type in assets:
            session.add(Asset(id=uuid.uuid4(), job_id=job.id, user_id=job.user_id, index=index,
                              storage_key=key, media_type=media_type, is_public=is_public,
                              watermarked=watermarked, created_at=now))
        session.add(event)
        return event
    event.id = session.execute(_COMPLETION_ROWS, {
        "cost": cost, "set_cost": cost is not None, "job_id": job.id, "user_id": job.user_id,
        "is_public": is_public, "watermarked": watermarked, "now": now,
        "asset_ids": [uuid.uuid4() for _ in assets], "indexes": [a[0] for a in assets],
        "keys": [a[1] for a in assets], "types": [a[2] for a in assets],
        "event_id": event.event_id, "type": event.type, "payload": json.dumps(event.payload),
        "published_at": event.published_at,
    }).scalar_one()
    if cost is not None:  # the caller's row object says what was written (no flush: committed)
        set_committed_value(job, "credits_actual", cost)
        set_committed_value(job, "display_cost", cost)
    return event


def record_cost(session: Session, job_id: uuid.UUID, credits_actual: int) -> bool:
    """A completed job's final cost, when it was not known at the completion CAS."""
    return _cas(session, Job.id == job_id, Job.status == Status.COMPLETED,
                credits_actual=credits_actual, display_cost=credits_actual) is not None


def settled(session: Session, job_id: uuid.UUID, credits_actual: int) -> bool:
    return _cas(session, Job.id == job_id, Job.credits_actual.is_(None),
                credits_actual=credits_actual, next_poll_at=None) is not None


def settle_failed(session: Session, job_id: uuid.UUID, retry_at: datetime) -> bool:
    """A settlement attempt failed: retry at ``retry_at``, one more attempt counted. False: the
    job is settled already (or gone)."""
    result = session.execute(update(Job).where(Job.id == job_id, Job.credits_actual.is_(None))
                             .values(next_poll_at=retry_at, settle_attempts=Job.settle_attempts + 1))
    return rowcount(result) == 1
