"""Internal: the writes of a job's creation — the new row, the platform call mark, the create
claim and its outcomes (task id saved, rate-limited release, uncertain), evidence adoption and
the sweep's re-enqueue claim."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime, timedelta
from functools import lru_cache
from typing import Any, overload

from sqlalchemy import Row, bindparam, func, insert, or_, update
from sqlalchemy.orm import Session

from ..core import redact
from ..db.models import Job, JobEvent, table_of
from ..db.session import rowcount
from ..states import IN_FLIGHT, Status, Submission
from .cas import (
    _cas,
    _cas_columns,
    _cas_columns_with_event,
    _cas_prepared,
    _cas_with_event_prepared,
    bound,
    event_insert,
)
from .predicates import platform_row_uncalled, uncertain_expired


def insert_job(session: Session, **values: Any) -> Job:
    """A new ``jobs`` row (added to the session; the caller's flush or commit writes it)."""
    job = Job(**values)
    session.add(job)
    return job


def insert_job_with_event(session: Session, values: dict[str, Any], event: JobEvent) -> None:
    """A new ``jobs`` row and its first outbox ``event`` (built by ``events.new_event``, not in
    any session; its id is set here), written now. On PostgreSQL one statement (the event's
    ``INSERT … SELECT`` from the job's ``INSERT … RETURNING``); elsewhere the ORM's two rows,
    flushed. The job's row is written before anything that names it (the ledger's rows).

    A value None for a column the platform has NOT NULL with a default (``should_watermark``,
    say: :func:`reconcile.db.contract.defaulted_not_null`) is left out, so the default fills
    it; every other None is written NULL."""
    from ..db.contract import defaulted_not_null

    defaulted = defaulted_not_null(session.connection())
    if defaulted:
        values = {name: value for name, value in values.items()
                  if value is not None or name not in defaulted}
    if session.get_bind().dialect.name != "postgresql":
        # a Core insert: the ORM would write NULL for each column left out
        session.execute(insert(table_of(Job)).values(values))
        session.add(event)
        session.flush()
        return
    statement = _job_with_event(tuple(sorted(values)))
    params = {f"j_{name}": value for name, value in values.items()}
    params.update(e_event_id=event.event_id, e_type=event.type, e_payload=event.payload,
                  e_created_at=event.created_at, e_published_at=event.published_at)
    event.id = session.execute(statement, params).scalar_one()


@lru_cache(maxsize=32)  # the optional columns given or not
def _job_with_event(names: tuple[str, ...]) -> Any:
    """:func:`insert_job_with_event`'s statement for a job written with these columns."""
    jobs = table_of(Job)
    row = (insert(jobs).values({name: bindparam(f"j_{name}", type_=jobs.c[name].type)
                                for name in names})
           .returning(jobs.c.id, jobs.c.user_id).cte("job"))
    return event_insert(row).add_cte(row)


def mark_platform_call(session: Session, job_id: uuid.UUID, kind_name: str, now: datetime,
                       lease: timedelta) -> bool:
    """A platform row (no ``submission_state``) still in flight takes its kind, the call's
    start (issue 11 hole 6) and the call's claim lease, as a library row's claim (the sweep
    leaves the call alone until it ends): a job cancelled (and refunded) or finished meanwhile
    must not be called for, nor one whose call already started (issue 24 finding 8: a client's
    retry while the first call runs would pay a second call) — :func:`platform_row_uncalled`,
    which the user cancel's CAS needs too, so the two never both win."""
    result = session.execute(update(Job).where(
        Job.id == job_id, platform_row_uncalled(), Job.status.in_(IN_FLIGHT),
    ).values(provider_kind=kind_name, provider_call_started_at=now, claim_expires_at=now + lease))
    return rowcount(result) == 1


def adopt_task_id(session: Session, job_id: uuid.UUID, task_id: str, now: datetime, *,
                  poll_lease_until: datetime, poll_due_at: datetime | None,
                  source: str) -> Job | None:
    """Evidence found: an ``uncertain`` (or expired ``submitting``) job with no task id takes
    ``task_id``, becomes accepted/processing with attempts reset, under a new poll generation.
    None: the job is not waiting for evidence any more."""
    return _cas(
        session, Job.id == job_id, Job.status == Status.PENDING,
        Job.submission_state.in_([Submission.UNCERTAIN, Submission.SUBMITTING]),
        Job.provider_task_id.is_(None), uncertain_expired(now),
        provider_task_id=task_id, submission_state=Submission.ACCEPTED,
        status=Status.PROCESSING, claim_token=None, claim_expires_at=None,
        error_code=None, reconcile_attempts=0, reconcile_last_attempt_at=None,
        reconcile_last_error=None, reconcile_last_error_code=None,
        poll_generation=Job.poll_generation + 1, poll_seq=0,
        poll_lease_expires_at=poll_lease_until, poll_due_at=poll_due_at,
        error_detail={"adopted_from": source},
    )


def claim_reenqueue(session: Session, job_id: uuid.UUID, now: datetime,
                    spacing: timedelta) -> Job | None:
    """not_started, not re-enqueued within ``spacing``: count one more re-enqueue.

    None: the create was claimed meanwhile, or someone re-enqueued it just now.
    """
    return _cas(
        session, Job.id == job_id, Job.status == Status.PENDING,
        Job.submission_state == Submission.NOT_STARTED,
        or_(Job.create_enqueued_at.is_(None), Job.create_enqueued_at <= now - spacing),
        create_enqueue_count=Job.create_enqueue_count + 1, create_enqueued_at=now,
    )


@overload
def claim_create(session: Session, job_id: uuid.UUID, token: str, now: datetime,
                 lease: timedelta, *, kinds: Sequence[str] | None = None,
                 worker: str | None = None, columns: None = None) -> Job | None: ...


@overload
def claim_create(session: Session, job_id: uuid.UUID, token: str, now: datetime,
                 lease: timedelta, *, kinds: Sequence[str] | None = None,
                 worker: str | None = None, columns: tuple[str, ...]) -> Row[Any] | None: ...


def claim_create(session: Session, job_id: uuid.UUID, token: str, now: datetime,
                 lease: timedelta, *, kinds: Sequence[str] | None = None,
                 worker: str | None = None,
                 columns: tuple[str, ...] | None = None) -> Job | Row[Any] | None:
    """not_started → submitting, only for a pending row past its not-before time (and, with
    ``kinds``, only for a row of one of those provider kinds): the claim and the load in one.
    ``worker``: the live worker process claiming (recorded as ``claimed_by``: if its heartbeat
    lapses the claim ends then, not at its lease). ``columns``: return only those columns of
    the claimed row, as a Core row (:func:`.cas._cas_columns`: the session's unflushed changes
    are not flushed first), instead of the mapped ``Job``."""
    # "now" once per column it meets: each binds as its own column does (a platform's naive
    # column beside the library's timestamptz one)
    params = {"c_job_id": job_id, "c_token": token, "c_started": now, "c_not_before": now,
              "c_call_started": now, "c_until": now + lease, "c_worker": worker}
    shape = _claim_shape
    if kinds is not None:
        shape, params = _claim_kinds_shape, {**params, "c_kinds": list(kinds)}
    if columns is not None:
        return _cas_columns(session, shape, params, columns)
    return _cas_prepared(session, shape, params)


def _claim_shape(*where: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """:func:`claim_create`'s CAS, with bind parameters (``where``: the kinds' condition)."""
    return ((Job.id == bound("c_job_id", "id"),
             Job.status == Status.PENDING,
             Job.submission_state == Submission.NOT_STARTED,
             or_(Job.create_not_before.is_(None),
                 Job.create_not_before <= bound("c_not_before", "create_not_before")),
             *where),
            dict(submission_state=Submission.SUBMITTING,
                 claim_token=bound("c_token", "claim_token"),
                 claim_expires_at=bound("c_until", "claim_expires_at"),
                 provider_call_started_at=_coalesce(
                     Job.provider_call_started_at,
                     bound("c_call_started", "provider_call_started_at")),
                 started_at=bound("c_started", "started_at"),
                 claimed_by=bound("c_worker", "claimed_by")))


def _claim_kinds_shape() -> tuple[tuple[Any, ...], dict[str, Any]]:
    return _claim_shape(Job.provider_kind.in_(bindparam("c_kinds", expanding=True)))


def _coalesce(column: Any, value: Any) -> Any:
    return func.coalesce(column, value)


def _owner(job_id: Any, token: Any) -> tuple[Any, ...]:
    """The owner's CAS: still pending, still submitting/uncertain, same claim token."""
    return (
        Job.id == job_id,
        Job.status == Status.PENDING,
        Job.submission_state.in_([Submission.SUBMITTING, Submission.UNCERTAIN]),
        Job.claim_token == token,
    )


@overload
def save_task_id(session: Session, job_id: uuid.UUID, token: str, task_id: str, now: datetime,
                 poll_lease: timedelta, *, poll_due_at: datetime | None = None,
                 event: JobEvent | None = None, columns: None = None) -> Job | None: ...


@overload
def save_task_id(session: Session, job_id: uuid.UUID, token: str, task_id: str, now: datetime,
                 poll_lease: timedelta, *, poll_due_at: datetime | None = None,
                 event: JobEvent | None = None,
                 columns: tuple[str, ...]) -> Row[Any] | None: ...


def save_task_id(session: Session, job_id: uuid.UUID, token: str, task_id: str, now: datetime,
                 poll_lease: timedelta, *, poll_due_at: datetime | None = None,
                 event: JobEvent | None = None,
                 columns: tuple[str, ...] | None = None) -> Job | Row[Any] | None:
    """``on_task_created``: persist the upstream id, accepted, processing, a new poll chain.

    Works after the claim lease expired (even from ``uncertain``) as long as the token matches,
    but never revives a job completed, failed or cancelled meanwhile. ``event``: the outbox row
    written with it when it wins (one statement on PostgreSQL:
    :func:`.cas._cas_with_event_prepared`). The statement is built once (:func:`_save_shape`).
    ``columns``: as :func:`claim_create`'s (with an event, ``id`` and ``user_id`` come too).
    """
    params = {"s_job_id": job_id, "s_token": token, "s_task_id": task_id,
              "s_lease_until": now + poll_lease, "s_due_at": poll_due_at}
    if columns is not None:
        if event is None:
            return _cas_columns(session, _save_shape, params, columns)
        return _cas_columns_with_event(session, event, _save_shape, params, columns)
    if event is None:
        return _cas_prepared(session, _save_shape, params)
    return _cas_with_event_prepared(session, event, _save_shape, params)


def _saved(task_id: Any, lease_until: Any, due_at: Any) -> dict[str, Any]:
    """What :func:`save_task_id` writes (values, or bind parameters: :func:`_save_shape`)."""
    return dict(
        provider_task_id=task_id,
        submission_state=Submission.ACCEPTED,
        status=Status.PROCESSING,
        claim_expires_at=None,
        error_code=None,
        error_detail=None,
        poll_generation=Job.poll_generation + 1,
        poll_seq=0,
        poll_lease_expires_at=lease_until,
        poll_due_at=due_at,  # batch mode: the first read's due time (chain mode: NULL)
        reconcile_attempts=0,
        reconcile_last_attempt_at=None,
    )


def _save_shape() -> tuple[tuple[Any, ...], dict[str, Any]]:
    """:func:`save_task_id`'s CAS with bind parameters, so its statement is built once."""
    return (_owner(bound("s_job_id", "id"), bound("s_token", "claim_token")),
            _saved(bound("s_task_id", "provider_task_id"),
                   bound("s_lease_until", "poll_lease_expires_at"),
                   bound("s_due_at", "poll_due_at")))


def release_rate_limited(session: Session, job_id: uuid.UUID, token: str, not_before: datetime,
                         detail: dict[str, Any]) -> Job | None:
    """A 429 (documented as not created): back to not_started with a not-before time."""
    return _cas(
        session, *_owner(job_id, token),
        submission_state=Submission.NOT_STARTED,
        claim_token=None,
        claim_expires_at=None,
        create_not_before=not_before,
        create_rate_limit_count=Job.create_rate_limit_count + 1,
        error_detail=redact.value(detail),
    )


def mark_uncertain(session: Session, job_id: uuid.UUID, *, token: str | None, now: datetime,
                   code: str, detail: dict[str, Any] | None) -> Job | None:
    """submitting → uncertain (the job stays pending with its reservation)."""
    where: list[Any] = [Job.id == job_id, Job.status == Status.PENDING,
                        Job.submission_state == Submission.SUBMITTING,
                        Job.provider_task_id.is_(None)]
    if token is not None:
        where.append(Job.claim_token == token)
    else:  # the sweep: only once the owner's lease is gone
        where.append(or_(Job.claim_expires_at.is_(None), Job.claim_expires_at < now))
    return _cas(session, *where, submission_state=Submission.UNCERTAIN, error_code=code,
                error_detail=redact.value(detail), reconcile_attempts=0, reconcile_last_attempt_at=now)
