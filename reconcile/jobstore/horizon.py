"""Internal: a job's exhaustion horizon — the one home of the rule (README, Design notes:
Attempts and exhaustion).

A job in flight starts counting attempts once its kind's stale threshold has passed since its
start (its provider call, else its start, else its creation); an attempt counts at most once
per ``ATTEMPT_SPACING``, and at ``MAX_ATTEMPTS`` it is exhausted (failed). A sync kind has no
attempts: it may be failed once past its threshold and the claim its call holds. Every
duration is scaled by ``TIME_SCALE``.

For a query over many rows, :func:`past_threshold_sql` and :func:`may_be_past_deadline_sql` are
the rules' SQL twins (the operator lists' WHERE): the first exact, the second a necessary
condition that narrows the rows :func:`exhaustion_deadline` then decides.

Callers: the poll chain (:func:`past_threshold`, :func:`exhausted`); the sweep's table and
executor (the same two, and :func:`call_deadline` for a call with no upstream handle); the
audit's in-flight horizon, the create step's rate-limit wait (capped below it) and the chaos
run's settle wait (:func:`exhaustion_deadline`); adoption's legacy age and the chaos cap
(:func:`kind_horizon`); the explorer's quiescence. Pure: it reads the row and the settings,
never the database.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from ..kinds import Kind, get_kind
from ..states import ATTEMPT_SPACING, MAX_ATTEMPTS, Submission

__all__ = [
    "attempts_from", "call_deadline", "exhausted", "exhaustion_deadline", "job_start",
    "kind_horizon", "may_be_past_deadline_sql", "past_threshold", "past_threshold_sql",
]


def kind_horizon(kind: Kind) -> timedelta:
    """How long after its start a job of ``kind`` can still be in flight legitimately when its
    attempts run on schedule (unscaled): a sync kind its threshold; an async kind its threshold
    then ``MAX_ATTEMPTS`` spacings."""
    if kind.sync:
        return kind.stale_threshold
    return kind.stale_threshold + MAX_ATTEMPTS * ATTEMPT_SPACING


# every column of a job that exhaustion_deadline reads (with call_deadline, attempts_from and
# job_start): a caller holding only some of a row's columns (the create step's claim) holds these
DEADLINE_COLUMNS = ("provider_kind", "submission_state", "provider_call_started_at", "started_at",
                    "created_at", "claim_expires_at", "reconcile_last_attempt_at",
                    "poll_lease_expires_at", "reconcile_attempts", "storing_until",
                    "storing_count")


def job_start(job: Any) -> datetime:
    """Where a job's threshold counts from: its provider call, else its start, else its creation."""
    start: datetime = job.provider_call_started_at or job.started_at or job.created_at
    return start


def attempts_from(settings: Any, job: Any, kind: Kind) -> datetime:
    """When the job's kind's stale threshold has passed (scaled): attempts count from then."""
    threshold: timedelta = settings.scaled(kind.stale_threshold)
    return job_start(job) + threshold


def past_threshold(settings: Any, job: Any, kind: Kind, now: datetime) -> bool:
    return now >= attempts_from(settings, job, kind)


def call_deadline(settings: Any, job: Any, kind: Kind) -> datetime:
    """When a call with no upstream handle (a sync kind's call, a platform row's call) may be
    failed: past its kind's threshold and past the claim the call holds, whichever is later
    (``sync.claim_lease``: the call's whole deadline plus the finish; a library row and a
    platform row through ``sync_call`` alike). A row with no claim: its threshold."""
    base = attempts_from(settings, job, kind)
    claim = job.claim_expires_at
    return base if claim is None else max(base, claim)


def exhausted(job: Any) -> bool:
    """Every attempt spent: the job is to be failed (an async kind)."""
    return (job.reconcile_attempts or 0) >= MAX_ATTEMPTS


def beyond_last_attempt(attempts: int) -> bool:
    """An attempt counted after the last one (:data:`MAX_ATTEMPTS`): whoever held the job when
    its last attempt was counted has had a whole attempt spacing since to finish or fail it."""
    return attempts > MAX_ATTEMPTS


def exhaustion_deadline(settings: Any, job: Any) -> datetime | None:
    """The latest an in-flight job may still be in flight: its kind's stale threshold after its
    start; a sync kind has no attempts after it, only its call's claim (:func:`call_deadline`);
    an async kind then has one attempt per spacing until ``MAX_ATTEMPTS`` — counted from its
    last attempt, or its new poll lease when attempts started over (adopted, resumed), when that
    is later. Attempts beyond the maximum move it back, not forward. A success still being
    stored (its storing mark, with a storer counted) moves it to the mark's end when later.
    None: no such bound (an unknown kind; ``uncertain``, which waits for evidence or an
    operator)."""
    kind = get_kind(job.provider_kind)
    if kind is None or job.submission_state == Submission.UNCERTAIN:
        return None
    if kind.sync:
        return call_deadline(settings, job, kind)
    base = attempts_from(settings, job, kind)
    last = job.reconcile_last_attempt_at
    if last is None and job.poll_lease_expires_at is not None:
        last = job.poll_lease_expires_at  # adopted or resumed: attempts start over
    if last is not None:
        base = max(base, last)
    spacing: timedelta = settings.scaled(ATTEMPT_SPACING)
    deadline: datetime = base + spacing * (MAX_ATTEMPTS - (job.reconcile_attempts or 0))
    # a success read of the task may still be being stored (a counted storer under a lasting
    # mark): no failure at the horizon before its mark ends (lifecycle.exhaust)
    marked = job.storing_until
    if marked is not None and (job.storing_count or 0) > 0 and marked > deadline:
        return marked  # type: ignore[no-any-return]
    return deadline


def _start_sql() -> Any:
    from sqlalchemy import func

    from ..db.models import Job

    return func.coalesce(Job.provider_call_started_at, Job.started_at, Job.created_at)


def past_threshold_sql(settings: Any, now: datetime, kinds: Sequence[Kind],
                       other: timedelta) -> Any:
    """SQL: :func:`past_threshold` over rows — the row's start (:func:`job_start`) is at least
    its kind's scaled stale threshold before ``now``; a row of no kind, or of a kind not among
    ``kinds``, by the scaled ``other``. The cut-offs are computed here and bound as times, so
    the expression is the same on PostgreSQL and SQLite."""
    from sqlalchemy import case, literal

    from ..db.models import Job
    from ..db.types import UTCDateTime

    def cutoff(threshold: timedelta) -> Any:
        return literal(now - settings.scaled(threshold), UTCDateTime())

    by_kind = {k.name: cutoff(k.stale_threshold) for k in kinds}
    limit = case(by_kind, value=Job.provider_kind, else_=cutoff(other)) if by_kind \
        else cutoff(other)
    return _start_sql() <= limit


def may_be_past_deadline_sql(settings: Any, now: datetime, kinds: Sequence[Kind],
                             dialect: str) -> Any:
    """SQL: a necessary condition of ``exhaustion_deadline(job) < now`` — a row of one of
    ``kinds`` (an unknown kind has no deadline), not ``uncertain``, whose deadline's lower bound
    has passed: its start + its kind's threshold, and for an async kind + the spacings its
    attempts have left (the deadline counts from its last attempt when later, so it is never
    earlier). Rows it keeps are decided by :func:`exhaustion_deadline`. SQLite has no interval
    arithmetic: there the bound is the threshold alone (looser, still necessary but for an
    async row counted past ``MAX_ATTEMPTS``, which it keeps too)."""
    from sqlalchemy import Interval, and_, case, func, literal, or_

    from ..db.models import Job

    known = [k.name for k in kinds]
    not_uncertain = or_(Job.submission_state.is_(None),
                        Job.submission_state != Submission.UNCERTAIN.value)
    if dialect != "postgresql":
        return and_(Job.provider_kind.in_(known), not_uncertain,
                    or_(past_threshold_sql(settings, now, kinds, timedelta(0)),
                        Job.reconcile_attempts > MAX_ATTEMPTS))

    def span(value: timedelta) -> Any:
        return literal(value, Interval())

    threshold = case({k.name: span(settings.scaled(k.stale_threshold)) for k in kinds},
                     value=Job.provider_kind, else_=span(timedelta(0)))
    # the spacings left, as seconds (PostgreSQL's make_interval): SQLAlchemy refuses to multiply
    # an Interval literal by a column in a future release
    left = literal(settings.scaled(ATTEMPT_SPACING).total_seconds()) \
        * (MAX_ATTEMPTS - func.coalesce(Job.reconcile_attempts, 0))
    tail = case((Job.provider_kind.in_([k.name for k in kinds if not k.sync]),
                 func.make_interval(0, 0, 0, 0, 0, 0, left, type_=Interval())),
                else_=span(timedelta(0)))
    return and_(Job.provider_kind.in_(known), not_uncertain,
                _start_sql() + threshold + tail < literal(now))
