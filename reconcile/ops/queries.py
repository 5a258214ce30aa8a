"""Internal: the operator reads — the lists of jobs that need a person (uncertain, stuck, past
their horizon, unsettled), the open anomalies, and one job with everything that names it.

The one home of these reads: the ``reconcile`` CLI (``stuck``, ``uncertain``, ``unsettled``,
``show``) and the operator console call them. Each list is filterable by kind, age and user and
paged with a keyset (:class:`Page`: ``after`` is the previous page's ``next``), and reads
through a partial index: the in-flight rows (``jobs_inflight_keyset_idx``), the uncertain ones
(``jobs_uncertain_idx``), pending settlements (``jobs_unsettled_idx``), open anomalies
(``reconcile_credit_anomalies_open_idx``). Nothing here writes.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import func, select, true, tuple_
from sqlalchemy.orm import Session

from .. import jobstore
from ..db.models import (
    Asset,
    CreditAnomaly,
    CreditTransaction,
    Job,
    JobEvent,
    UsageLog,
    WebhookDelivery,
)
from ..runtime import Runtime
from ..states import LEGACY_AGE

LEGACY = "legacy"  # the kind filter's name for rows without a provider_kind
# the bound of an operator read's minutes parameter (an age filter, the audit's grace): ten
# years back; a time further back does not exist
MAX_MINUTES = 10 * 366 * 24 * 60
LISTS = ("uncertain", "stuck", "past_horizon", "unsettled", "anomalies")
DELIVERIES = 50  # a job's webhook deliveries shown: the newest (count them with deliveries_of)


@dataclass(frozen=True)
class Filters:
    """A list's filters: the provider kind (``legacy``: rows without one), at least this old,
    this user."""

    kind: str | None = None
    older_than: timedelta | None = None
    user: uuid.UUID | None = None


@dataclass(frozen=True)
class Page:
    rows: list[dict[str, Any]]
    next: str | None  # the cursor of the next page; None: this is the last


def _cursor(at: datetime | None, row_id: Any) -> str:
    return f"{at.isoformat() if at else ''}|{row_id}"


def _uncursor(value: str | None) -> tuple[datetime, uuid.UUID] | None:
    """A keyset cursor back to ``(time, id)``; None for no cursor (ValueError: a bad one)."""
    if not value:
        return None
    at, _, row_id = value.partition("|")
    when = datetime.fromisoformat(at)
    return (when if when.tzinfo else when.replace(tzinfo=UTC)), uuid.UUID(row_id)


def _filtered(stmt: Any, f: Filters, age_col: Any, now: datetime) -> Any:
    if f.kind == LEGACY:
        stmt = stmt.where(Job.provider_kind.is_(None))
    elif f.kind:
        stmt = stmt.where(Job.provider_kind == f.kind)
    if f.user is not None:
        stmt = stmt.where(Job.user_id == f.user)
    if f.older_than is not None:
        stmt = stmt.where(age_col < now - f.older_than)
    return stmt


def reserved(session: Session, job_ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, tuple[int, datetime]]:
    """Credits each job still holds in a ``reserved`` usage log, and since when."""
    if not job_ids:
        return {}
    rows = session.execute(
        select(UsageLog.job_id, func.sum(UsageLog.credits), func.min(UsageLog.created_at))
        .where(UsageLog.job_id.in_(job_ids), UsageLog.status == "reserved")
        .group_by(UsageLog.job_id))
    return {job_id: (int(total), since) for job_id, total, since in rows if job_id is not None}


def started() -> Any:
    """What the sweep ages a row by: the provider call, else (legacy rows) the dequeue or insert."""
    return func.coalesce(Job.provider_call_started_at, Job.started_at, Job.created_at)


def threshold(rt: Runtime, job: Job) -> timedelta:
    kind = rt.kind(job.provider_kind)
    return rt.settings.scaled(kind.stale_threshold if kind is not None else LEGACY_AGE)


def _floor(rt: Runtime) -> timedelta:
    from ..kinds import all_kinds

    return rt.settings.scaled(min([LEGACY_AGE] + [k.stale_threshold for k in all_kinds()]))


# ----------------------------------------------------------------------------- the lists


def uncertain(rt: Runtime, session: Session, *, now: datetime, limit: int,
              after: str | None = None, filters: Filters = Filters()) -> Page:
    """Submissions whose outcome is unknown (``uncertain``, or ``submitting`` with its claim
    gone), oldest first, with the credits they hold and since when (the reservation's age)."""
    stmt = select(Job).where(jobstore.unknown_outcome_in_flight(), jobstore.uncertain_expired(now))
    stmt = _filtered(stmt, filters, Job.created_at, now)
    cursor = _uncursor(after)
    if cursor:
        stmt = stmt.where(tuple_(Job.created_at, Job.id) > tuple_(*cursor))
    jobs = list(session.execute(stmt.order_by(Job.created_at, Job.id).limit(limit + 1)).scalars())
    more, jobs = len(jobs) > limit, jobs[:limit]
    ids = [j.id for j in jobs]
    held = reserved(session, ids)
    evidence = dict(session.execute(
        select(WebhookDelivery.job_id, func.count()).where(WebhookDelivery.job_id.in_(ids))
        .group_by(WebhookDelivery.job_id)).all()) if ids else {}
    rows = []
    for j in jobs:
        credits, since = held.get(j.id, (None, None))
        rows.append({
            "id": j.id, "user_id": j.user_id, "kind": j.provider_kind, "status": j.status,
            "submission": j.submission_state, "since": j.provider_call_started_at or j.created_at,
            "age": now - (j.provider_call_started_at or j.created_at),
            "attempts": j.reconcile_attempts, "error_code": j.error_code,
            "reserved": credits, "reserved_age": now - since if since else None,
            "deliveries": evidence.get(j.id, 0),
        })
    return Page(rows, _cursor(jobs[-1].created_at, jobs[-1].id) if more and jobs else None)


def _walk_in_flight(rt: Runtime, session: Session, *, now: datetime, limit: int,
                    after: str | None, filters: Filters, floor: timedelta, narrow: Any,
                    keep: Any) -> Page:
    """In-flight rows older than ``floor`` that the SQL ``narrow`` admits, oldest start first,
    that ``keep(job, since)`` accepts (a dict row, or None to skip: the rule itself decides),
    read a chunk at a time until the page is full."""
    since_col = started().label("started")
    cursor = _uncursor(after)
    rows: list[dict[str, Any]] = []
    chunk = max(4 * limit, 200)
    last: tuple[datetime, uuid.UUID] | None = None
    while True:
        stmt = select(Job, since_col).where(jobstore.in_flight(), since_col < now - floor, narrow)
        stmt = _filtered(stmt, filters, since_col, now)
        if cursor:
            stmt = stmt.where(tuple_(since_col, Job.id) > tuple_(*cursor))
        batch = session.execute(stmt.order_by(since_col, Job.id).limit(chunk)).all()
        for job, since in batch:
            cursor = (since, job.id)
            row = keep(job, since)
            if row is None:
                continue
            if len(rows) == limit:  # one more exists: the page ends at the last kept row
                return Page(rows, _cursor(*last) if last else None)
            rows.append(row)
            last = (since, job.id)
        if len(batch) < chunk:
            return Page(rows, None)


def stuck(rt: Runtime, session: Session, *, now: datetime, limit: int, after: str | None = None,
          filters: Filters = Filters()) -> Page:
    """In-flight jobs past their kind's stale threshold (legacy rows: past 5 minutes); with
    ``filters.older_than``, every in-flight job older than that instead."""
    from ..jobstore.horizon import past_threshold_sql
    from ..kinds import all_kinds

    floor = filters.older_than if filters.older_than is not None else _floor(rt)
    narrow = true() if filters.older_than is not None else past_threshold_sql(
        rt.settings, now, all_kinds(), LEGACY_AGE)

    def keep(job: Job, since: datetime) -> dict[str, Any] | None:
        limit_ = filters.older_than if filters.older_than is not None else threshold(rt, job)
        if now - since < limit_:
            return None
        return {"id": job.id, "user_id": job.user_id, "job_type": job.job_type,
                "kind": job.provider_kind, "status": job.status,
                "submission": job.submission_state, "task_id": job.provider_task_id,
                "age": now - since, "threshold": limit_, "attempts": job.reconcile_attempts,
                "last_error": job.reconcile_last_error or job.error_code}

    return _walk_in_flight(rt, session, now=now, limit=limit, after=after,
                           filters=Filters(filters.kind, None, filters.user), floor=floor,
                           narrow=narrow, keep=keep)


def past_horizon(rt: Runtime, session: Session, *, now: datetime, limit: int,
                 after: str | None = None, filters: Filters = Filters()) -> Page:
    """In-flight jobs past their exhaustion deadline (``jobstore.horizon``, the one rule): the
    library should have failed them by now. ``uncertain`` jobs (held on purpose) and kinds this
    process does not know have no deadline and are never listed."""
    from ..jobstore.horizon import exhaustion_deadline, may_be_past_deadline_sql
    from ..kinds import all_kinds

    # no age floor: attempts counted past the maximum move a deadline back before the threshold
    floor = filters.older_than or timedelta(0)
    narrow = may_be_past_deadline_sql(rt.settings, now, all_kinds(),
                                      session.get_bind().dialect.name)

    def keep(job: Job, since: datetime) -> dict[str, Any] | None:
        deadline = exhaustion_deadline(rt.settings, job)
        if deadline is None or deadline >= now:
            return None
        return {"id": job.id, "user_id": job.user_id, "kind": job.provider_kind,
                "status": job.status, "submission": job.submission_state,
                "age": now - since, "deadline": deadline, "late": now - deadline,
                "attempts": job.reconcile_attempts}

    return _walk_in_flight(rt, session, now=now, limit=limit, after=after,
                           filters=Filters(filters.kind, None, filters.user), floor=floor,
                           narrow=narrow, keep=keep)


def unsettled(rt: Runtime, session: Session, *, now: datetime, limit: int,
              after: str | None = None, filters: Filters = Filters()) -> Page:
    """Failed or cancelled jobs the library failed whose refund has not settled yet, by their
    settlement's retry time (a platform's own failed rows are the audit's business)."""
    stmt = _filtered(select(Job).where(jobstore.settlement_pending()), filters,
                     Job.completed_at, now)
    cursor = _uncursor(after)
    if cursor:
        stmt = stmt.where(tuple_(Job.next_poll_at, Job.id) > tuple_(*cursor))
    jobs = list(session.execute(stmt.order_by(Job.next_poll_at, Job.id).limit(limit + 1))
                .scalars())
    more, jobs = len(jobs) > limit, jobs[:limit]
    held = reserved(session, [j.id for j in jobs])
    rows = [{
        "id": j.id, "user_id": j.user_id, "kind": j.provider_kind, "status": j.status,
        "error_code": j.error_code, "completed_at": j.completed_at,
        "next_poll_at": j.next_poll_at, "due_in": max(j.next_poll_at - now, timedelta(0)),
        "settle_attempts": j.settle_attempts, "reserved": held.get(j.id, (None,))[0],
    } for j in jobs]
    return Page(rows, _cursor(jobs[-1].next_poll_at, jobs[-1].id) if more and jobs else None)


def anomalies(session: Session, *, now: datetime, limit: int, after: str | None = None,
              filters: Filters = Filters()) -> Page:
    """Open anomalies (not closed by an operator action), newest first; ``filters.kind`` is
    the anomaly's kind here."""
    a = CreditAnomaly
    stmt = select(a).where(a.resolved_at.is_(None))
    if filters.kind:
        stmt = stmt.where(a.kind == filters.kind)
    if filters.user is not None:
        stmt = stmt.where(a.user_id == filters.user)
    if filters.older_than is not None:
        stmt = stmt.where(a.created_at < now - filters.older_than)
    if after:
        before = int(after)
        if not 0 < before < 2**63:  # an anomaly id is a positive bigint
            raise ValueError(f"anomaly cursor {after!r} out of range")
        stmt = stmt.where(a.id < before)
    found = list(session.execute(stmt.order_by(a.id.desc()).limit(limit + 1)).scalars())
    more, found = len(found) > limit, found[:limit]
    rows = [{"id": r.id, "job_id": r.job_id, "user_id": r.user_id, "kind": r.kind,
             "detail": r.detail, "created_at": r.created_at, "age": now - r.created_at}
            for r in found]
    return Page(rows, str(found[-1].id) if more and found else None)


# ----------------------------------------------------------------------------- one job


SHOW_FIELDS = (
    "id", "user_id", "job_type", "status", "submission_state", "provider_kind", "provider_model",
    "provider_task_id", "provider", "progress", "created_at", "started_at",
    "provider_call_started_at", "completed_at", "claim_expires_at", "poll_generation", "poll_seq",
    "poll_lease_expires_at", "reconcile_attempts", "reconcile_last_attempt_at",
    "reconcile_last_error", "reconcile_last_error_code", "create_enqueue_count",
    "create_not_before", "error_code", "error_message", "error_detail", "credits_actual",
    "next_poll_at", "settle_attempts", "provider_cost", "display_cost", "workflow_execution_id",
    "node_id",
)


def _row(obj: Any, fields: Sequence[str]) -> dict[str, Any]:
    return {f: getattr(obj, f) for f in fields}


def evidence_notes(settings: Any, session: Session, job: Job,
                   deliveries: Sequence[WebhookDelivery]) -> list[str]:
    """What the sweep may do with each delivery for this job (``jobstore.evidence``); where it
    may not, the operator decides with ``resolve --upstream-id``. One query for them all."""
    from ..jobstore import evidence
    from ..kinds import get_kind

    kind = get_kind(job.provider_kind)
    if kind is None or job.provider_task_id:
        return [""] * len(deliveries)
    held = evidence.holders(session, [d.upstream_id or "" for d in deliveries], job.id)
    notes = []
    for delivery in deliveries:
        if delivery.upstream_id and delivery.upstream_id in held:
            notes.append(f"never: the task of job {held[delivery.upstream_id]}")
            continue
        judged = evidence.assess(delivery, str(job.id), kind, settings)
        notes.append(f"operator only: {judged.reason}" if not judged.usable else
                     "adoptable once a read confirms it" if judged.needs_read else
                     "adoptable (signed)")
    return notes


def deliveries_of(job: Job) -> Any:
    """SQL: the webhook deliveries that name the job (its planted id, or its upstream id)."""
    match = WebhookDelivery.job_id == job.id
    if job.provider_task_id:
        match = match | (WebhookDelivery.upstream_id == job.provider_task_id)
    return match


def job_detail(rt: Runtime, session: Session, job: Job) -> dict[str, Any]:
    """One job: its row (with ``credits_returned``: what its settlement gave back, a partial
    refund included), usage logs, ledger transactions, anomalies, webhook deliveries (the newest
    :data:`DELIVERIES`, with what each may prove), assets — what ``reconcile show`` prints and
    the console's story draws."""
    job_id = job.id
    returned = rt.ledger.refunded(session, job_id) if job.credits_actual is not None else None

    def rows(stmt: Any) -> list[Any]:
        return list(session.execute(stmt).scalars())

    # the newest DELIVERIES (anyone holding a provider's signature can store more), oldest first
    deliveries = rows(select(WebhookDelivery).where(deliveries_of(job))
                      .order_by(WebhookDelivery.received_at.desc(), WebhookDelivery.id.desc())
                      .limit(DELIVERIES))[::-1]

    return {
        "job": {**_row(job, SHOW_FIELDS), "credits_returned": returned},
        "usage_logs": [
            {**_row(u, ("id", "status", "credits", "created_at")), "metadata": u.metadata_}
            for u in rows(select(UsageLog).where(UsageLog.job_id == job_id)
                          .order_by(UsageLog.created_at))],
        "transactions": [
            _row(t, ("id", "type", "amount", "from_sub", "from_topup", "created_at"))
            for t in rows(select(CreditTransaction).where(CreditTransaction.job_id == job_id)
                          .order_by(CreditTransaction.created_at, CreditTransaction.id))],
        "anomalies": [
            _row(a, ("id", "kind", "detail", "created_at", "resolved_at", "resolved_by",
                     "resolved_action"))
            for a in rows(select(CreditAnomaly).where(CreditAnomaly.job_id == job_id)
                          .order_by(CreditAnomaly.id))],
        "webhook_deliveries": [
            {**_row(w, ("provider", "delivery_id", "upstream_id", "status", "received_at")),
             "evidence": note}
            for w, note in zip(deliveries, evidence_notes(rt.settings, session, job, deliveries),
                               strict=True)],
        "assets": [
            _row(a, ("index", "storage_key", "media_type", "is_public", "watermarked"))
            for a in rows(select(Asset).where(Asset.job_id == job_id).order_by(Asset.index))],
    }


def events(session: Session, job_id: uuid.UUID, limit: int = 500) -> list[JobEvent]:
    """The job's newest ``limit`` events (the customer's stream), oldest first."""
    return list(session.execute(select(JobEvent).where(JobEvent.job_id == job_id)
                                .order_by(JobEvent.id.desc()).limit(limit)).scalars())[::-1]


def parse_since(value: str | None, now: datetime) -> datetime | None:
    """``--since``: an ISO 8601 time (UTC if naive) or a duration back from now (90s, 15m, 2h,
    1d). ValueError for anything else."""
    if value is None or not value.strip():
        return None
    value = value.strip()
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    try:
        if value[-1:] in units and value[:-1].isdigit():
            return now - timedelta(seconds=int(value[:-1]) * units[value[-1]])
        at = datetime.fromisoformat(value)
        # in UTC: a time whose UTC is out of range (0001-01-01T00:00+14:00) is refused here
        return (at if at.tzinfo is not None else at.replace(tzinfo=UTC)).astimezone(UTC)
    except (ValueError, OverflowError) as exc:  # OverflowError: a duration past year 1
        raise ValueError(f"--since {value!r}: an ISO 8601 time or a duration such as 15m, "
                         "2h") from exc
