"""Internal: the writes of a poll chain — a new chain, attempts (counted, or claimed by the
sweep), the last error noted, progress."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import and_, case, func, or_, update
from sqlalchemy.orm import Session

from ..core import redact
from ..db.models import Job
from ..db.session import rowcount
from ..states import IN_FLIGHT
from .cas import _cas, _cas_prepared, bound
from .predicates import _last_error


def start_new_chain(session: Session, job_id: uuid.UUID, now: datetime,
                    lease: timedelta, *, poll_due_at: datetime | None = None) -> Job | None:
    """Resume polling under a new generation (the old chain, if alive, loses its next turn),
    with a fresh lease; the caller sends the returned generation's first turn (sequence 0).

    A generation that never took a turn (``poll_seq`` 0) is kept instead: no step of it ever
    ran, so there is no chain to fence — only its first message, late in the queue or lost. The
    caller sends that first turn again and the copy that runs first takes it (the turn's CAS on
    the sequence fences the others). A new generation there would fence the late message, and
    on a queue slower than the lease every resumed chain would arrive fenced and none would
    ever poll (the chaos run's livelock: a job resumed 17 times before any poll ran).

    ``poll_due_at``: batch mode — the generation is due then (no message is sent); chain
    mode leaves NULL, so a row scheduled by an earlier batch mode goes back to its chain.

    Either way ``poll_resumes`` counts the resume: the mark a reader without a turn of its own
    fences on (:func:`~.batch.claim_of`), since a kept generation moves nothing else.
    """
    turnless = and_(Job.poll_seq == 0, Job.poll_generation > 0)
    return _cas(
        session, Job.id == job_id, Job.status.in_(IN_FLIGHT), Job.provider_task_id.is_not(None),
        poll_generation=case((turnless, Job.poll_generation), else_=Job.poll_generation + 1),
        poll_seq=0, poll_lease_expires_at=now + lease, poll_due_at=poll_due_at,
        poll_resumes=func.coalesce(Job.poll_resumes, 0) + 1,
    )


def _attempt(session: Session, job_id: uuid.UUID, now: datetime, spacing: timedelta,
             *where: Any, **values: Any) -> Job | None:
    """The attempt CAS: at most one attempt per ``spacing`` per in-flight job (``where``: the
    caller's further conditions)."""
    terms, written = _attempt_terms(job_id, now, now - spacing, *where, **values)
    return _cas(session, *terms, **written)


def _attempt_terms(job_id: Any, now: Any, since: Any, *where: Any,
                   **values: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """:func:`_attempt`'s condition and values (no attempt counted after ``since``)."""
    return ((Job.id == job_id,
             Job.status.in_(IN_FLIGHT),
             or_(Job.reconcile_last_attempt_at.is_(None),
                 Job.reconcile_last_attempt_at <= since),
             *where),
            dict(reconcile_attempts=Job.reconcile_attempts + 1,
                 reconcile_last_attempt_at=now,
                 **values))


def _claim_attempt_shape() -> tuple[tuple[Any, ...], dict[str, Any]]:
    return _attempt_terms(bound("a_job_id", "id"), bound("a_now", "reconcile_last_attempt_at"),
                          bound("a_since", "reconcile_last_attempt_at"))


def count_attempt(session: Session, job_id: uuid.UUID, now: datetime, spacing: timedelta,
                  last_error: str | None, *, verdict: bool = True, code: str | None = None,
                  where: tuple[Any, ...] = ()) -> Job | None:
    """One attempt, at most once per ``spacing`` per job, whoever observes it, recording what
    it observed and its ``code`` (``verdict=False``: an error that is no verdict keeps an
    upstream one). ``where``: further conditions (a poller's claim, :func:`under_claim`)."""
    last_error = redact.text(last_error) if last_error else last_error
    return _attempt(session, job_id, now, spacing, *where,
                    **_last_error(last_error, code, verdict))


def claim_attempt(session: Session, job_id: uuid.UUID, now: datetime,
                  spacing: timedelta) -> Job | None:
    """The sweep's claim of an attempt (``count_attempt``'s CAS) before it observes: the claim
    is no observation, so ``reconcile_last_error`` is kept (issue 11 hole 11)."""
    return _cas_prepared(session, _claim_attempt_shape,
                         {"a_job_id": job_id, "a_now": now, "a_since": now - spacing})


def note_error(session: Session, job_id: uuid.UUID, last_error: str, *,
               verdict: bool = True, code: str | None = None) -> bool:
    """Record an in-flight job's last error (text and ``code``) with no attempt counted.
    False: the job is no longer in flight."""
    last_error = redact.text(last_error)
    result = session.execute(update(Job).where(Job.id == job_id, Job.status.in_(IN_FLIGHT))
                             .values(**_last_error(last_error, code, verdict)))
    return rowcount(result) == 1


def set_progress(session: Session, job_id: uuid.UUID, progress: int) -> bool:
    return _cas(session, Job.id == job_id, Job.status.in_(IN_FLIGHT), Job.progress < progress,
                progress=progress) is not None
