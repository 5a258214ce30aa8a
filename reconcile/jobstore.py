"""Internal: the library's own mechanics, not an import path for platforms (may move).

Every guarded write to ``jobs``: one compare-and-set UPDATE each, returning whether it won.

``False`` (or ``None``) always means "someone else got there first, or the row is no longer in
the state this step expects" — the caller then does nothing more. No other module inserts,
updates or deletes ``jobs`` rows, nor inserts ``credit_anomalies`` rows (:func:`record_anomaly`);
``tests/unit/test_single_writer.py`` enforces it. The shared predicates over ``jobs`` (in flight,
settlement pending or due, uncertain with its claim gone) live here too, as SQL expressions
with a Python twin where a caller decides on a loaded row.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from typing import Any

from sqlalchemy import (
    Connection,
    and_,
    bindparam,
    case,
    func,
    insert,
    literal,
    or_,
    select,
    text,
    update,
)
from sqlalchemy.orm import Session

from . import redact
from .db.models import CreditAnomaly, Job
from .states import IN_FLIGHT, Status, Submission

# ----------------------------------------------------------------------------- predicates
# Literal text where a partial index must match it (migrations 0019/0020 and models.Job): the
# sweep's keyset walk reads through jobs_inflight_idx / jobs_inflight_keyset_idx and
# jobs_unsettled_idx, and PostgreSQL matches a partial index only on the predicate's own text
# under generic plans.
_IN_FLIGHT_SQL = text("jobs.status IN ('pending', 'processing')")
_UNSETTLED_SQL = text("jobs.status IN ('failed', 'cancelled')")
_SETTLED_STATES = (Status.FAILED, Status.CANCELLED)


def in_flight() -> Any:
    """SQL: the job is pending or processing (the in-flight partial indexes' predicate)."""
    return _IN_FLIGHT_SQL


def settlement_pending() -> Any:
    """SQL: a failed/cancelled job the library failed whose refund has not settled
    (``credits_actual`` NULL, ``next_poll_at`` set — never a platform's old row)."""
    return and_(_UNSETTLED_SQL, Job.credits_actual.is_(None), Job.next_poll_at.is_not(None))


def settlement_due(cutoff: datetime) -> Any:
    """SQL: :func:`settlement_pending` with its retry time reached by ``cutoff``."""
    return and_(settlement_pending(), Job.next_poll_at <= cutoff)


def is_settlement_pending(job: Job) -> bool:
    """:func:`settlement_pending` on a loaded row."""
    return (job.status in _SETTLED_STATES and job.credits_actual is None
            and job.next_poll_at is not None)


def is_settlement_due(job: Job, cutoff: datetime) -> bool:
    """:func:`settlement_due` on a loaded row."""
    return is_settlement_pending(job) and job.next_poll_at is not None \
        and job.next_poll_at <= cutoff


def claim_expired(now: datetime) -> Any:
    """SQL: no live create claim (none, or its lease ended before ``now``)."""
    return or_(Job.claim_expires_at.is_(None), Job.claim_expires_at < now)


def uncertain_expired(now: datetime) -> Any:
    """SQL: a submission whose outcome is unknown: ``uncertain``, or ``submitting`` with its
    claim gone (nobody is creating it now). Evidence adopts it; an operator resolves it."""
    return or_(Job.submission_state == Submission.UNCERTAIN,
               and_(Job.submission_state == Submission.SUBMITTING, claim_expired(now)))


def load(session: Session, job_id: uuid.UUID, *, lock: bool = False) -> Job | None:
    stmt = select(Job).where(Job.id == job_id)
    if lock:
        stmt = stmt.with_for_update()
    return session.execute(stmt).scalar_one_or_none()


def insert_job(session: Session, **values: Any) -> Job:
    """A new ``jobs`` row (added to the session; the caller's flush or commit writes it)."""
    job = Job(**values)
    session.add(job)
    return job


def mark_platform_call(session: Session, job_id: uuid.UUID, kind_name: str, now: datetime) -> bool:
    """A platform row (no ``submission_state``) still in flight takes its kind and the call's
    start (issue 11 hole 6): a job cancelled (and refunded) or finished meanwhile must not be
    called for; the user cancel's CAS needs the call start NULL, so the two never both win."""
    result = session.execute(update(Job).where(
        Job.id == job_id, Job.submission_state.is_(None), Job.status.in_(IN_FLIGHT),
    ).values(provider_kind=kind_name, provider_call_started_at=now))
    return result.rowcount == 1  # type: ignore[attr-defined]


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


def claim_settlement(session: Session, job_id: uuid.UUID, cutoff: datetime,
                     retry_at: datetime) -> Job | None:
    """Move a due settlement's ``next_poll_at`` to ``retry_at`` (a short lease: if this process
    dies before settling, the retry is due again then). None: settled or claimed meanwhile."""
    return _cas(session, Job.id == job_id, Job.credits_actual.is_(None),
                Job.next_poll_at.is_not(None), Job.next_poll_at <= cutoff,
                next_poll_at=retry_at)


def record_recharge(session: Session, job_id: uuid.UUID, amount: int) -> bool:
    """An operator's re-charge of a refunded job: its final cost is ``amount``."""
    result = session.execute(update(Job).where(Job.id == job_id)
                             .values(credits_actual=amount, display_cost=amount))
    return result.rowcount == 1  # type: ignore[attr-defined]


def record_anomaly(session: Session | Connection, *, job_id: uuid.UUID | None,
                   user_id: uuid.UUID | None, kind: str, detail: Any, now: datetime,
                   once: bool = False) -> bool:
    """The one writer of ``credit_anomalies``. ``once``: only if the job has no anomaly of
    ``kind`` yet (one SELECT first; the caller holds what serialises it, usually the job's row
    lock). A Session adds the row (its flush writes it, as before); a Connection inserts it.
    False: ``once`` and the anomaly exists."""
    if once:
        seen = session.execute(select(CreditAnomaly.id).where(
            CreditAnomaly.job_id == job_id, CreditAnomaly.kind == kind).limit(1)).first()
        if seen is not None:
            return False
    if isinstance(session, Session):
        session.add(CreditAnomaly(job_id=job_id, user_id=user_id, kind=kind, detail=detail,
                                  created_at=now))
    else:
        session.execute(insert(CreditAnomaly.__table__).values(
            job_id=job_id, user_id=user_id, kind=kind, detail=detail, created_at=now))
    return True


def _cas(session: Session, *where: Any, **values: Any) -> Job | None:
    """UPDATE jobs SET values WHERE where RETURNING the row (None: lost)."""
    stmt = update(Job).where(*where).values(**values).returning(Job)
    # populate_existing: the returned object carries the values just written, even when the
    # session had loaded the row before the UPDATE
    row = session.execute(
        stmt, execution_options={"synchronize_session": False, "populate_existing": True}
    ).scalar_one_or_none()
    return row


def claim_create(session: Session, job_id: uuid.UUID, token: str, now: datetime,
                 lease: timedelta, *, kinds: Sequence[str] | None = None) -> Job | None:
    """not_started → submitting, only for a pending row past its not-before time (and, with
    ``kinds``, only for a row of one of those provider kinds): the claim and the load in one."""
    where: list[Any] = [] if kinds is None else [Job.provider_kind.in_(list(kinds))]
    return _cas(
        session,
        Job.id == job_id,
        Job.status == Status.PENDING,
        Job.submission_state == Submission.NOT_STARTED,
        or_(Job.create_not_before.is_(None), Job.create_not_before <= now),
        *where,
        submission_state=Submission.SUBMITTING,
        claim_token=token,
        claim_expires_at=now + lease,
        provider_call_started_at=_coalesce(Job.provider_call_started_at, now),
        started_at=now,
    )


def _coalesce(column: Any, value: datetime) -> Any:
    return func.coalesce(column, value)


def _owner(job_id: uuid.UUID, token: str) -> tuple[Any, ...]:
    """The owner's CAS: still pending, still submitting/uncertain, same claim token."""
    return (
        Job.id == job_id,
        Job.status == Status.PENDING,
        Job.submission_state.in_([Submission.SUBMITTING, Submission.UNCERTAIN]),
        Job.claim_token == token,
    )


def save_task_id(session: Session, job_id: uuid.UUID, token: str, task_id: str, now: datetime,
                 poll_lease: timedelta, *, poll_due_at: datetime | None = None) -> Job | None:
    """``on_task_created``: persist the upstream id, accepted, processing, a new poll chain.

    Works after the claim lease expired (even from ``uncertain``) as long as the token matches,
    but never revives a job completed, failed or cancelled meanwhile.
    """
    return _cas(
        session, *_owner(job_id, token),
        provider_task_id=task_id,
        submission_state=Submission.ACCEPTED,
        status=Status.PROCESSING,
        claim_expires_at=None,
        error_code=None,
        error_detail=None,
        poll_generation=Job.poll_generation + 1,
        poll_seq=0,
        poll_lease_expires_at=now + poll_lease,
        poll_due_at=poll_due_at,  # batch mode: the first read's due time (chain mode: NULL)
        reconcile_attempts=0,
        reconcile_last_attempt_at=None,
    )


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
        error_detail=redact.detail(detail),
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
                error_detail=redact.detail(detail), reconcile_attempts=0, reconcile_last_attempt_at=now)


def mark_failed(session: Session, job_id: uuid.UUID, *, now: datetime, code: str, message: str,
                detail: dict[str, Any] | None, where: tuple[Any, ...] = (),
                submission_state: str | None = None, status: str = Status.FAILED) -> Job | None:
    """In flight → failed (or cancelled), with ``next_poll_at = now`` so the refund is settled
    even if this process dies before it."""
    values: dict[str, Any] = dict(
        status=status, error_code=code, error_message=redact.signed(message),
        error_detail=redact.detail(detail),
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
    touched (a failed and a cancelled job settle the same refund, once); only the status, the
    code and the detail say what happened. Guarded on the same upstream task and on that code,
    so a completion, an exhaustion or another task's failure is never rewritten."""
    return _cas(session, Job.id == job_id, Job.status == Status.FAILED,
                Job.error_code == "UPSTREAM_FAILED", Job.provider_task_id == task_id,
                status=Status.CANCELLED, error_code=code, error_message=redact.signed(message),
                error_detail=redact.detail(detail))


def mark_completed(session: Session, job_id: uuid.UUID, **values: Any) -> Job | None:
    """Completion is allowed only from pending/processing (README, Design notes: Completion).
    Clearing the last error's text clears its code too."""
    if "reconcile_last_error" in values and values["reconcile_last_error"] is None:
        values.setdefault("reconcile_last_error_code", None)
    return _cas(session, Job.id == job_id, Job.status.in_(IN_FLIGHT), status=Status.COMPLETED,
                next_poll_at=None, poll_lease_expires_at=None, claim_expires_at=None, **values)


def record_cost(session: Session, job_id: uuid.UUID, credits_actual: int) -> bool:
    """A completed job's final cost, when it was not known at the completion CAS."""
    return _cas(session, Job.id == job_id, Job.status == Status.COMPLETED,
                credits_actual=credits_actual, display_cost=credits_actual) is not None


# kind name → [(age, lease)]: the first step whose age the job has reached wins; an age of None
# always matches (the kind's base interval, last). The lease is a duration: the turn writes
# ``now + lease``.
LeaseSteps = Mapping[str, Sequence[tuple[timedelta | None, timedelta]]]


def take_poll_turn(session: Session, job_id: uuid.UUID, generation: int, seq: int,
                   lease_until: datetime | LeaseSteps, *, now: datetime | None = None) -> Job | None:
    """Fence a poll run: move ``poll_seq`` from ``seq`` to ``seq + 1`` for this generation.

    A duplicate run, a stale chain or a terminal job loses and must not call the provider.
    ``lease_until`` is a time, or (with ``now``) the lease by kind and age: then the turn is
    also the step's load (one ``UPDATE … RETURNING``), and a row of a kind not named loses.
    That statement is built once per distinct set of steps (:func:`_turn_by_kind`); each poll
    only binds its values.
    """
    if not isinstance(lease_until, Mapping):
        return _cas(
            session,
            Job.id == job_id,
            Job.status.in_(IN_FLIGHT),
            Job.provider_task_id.is_not(None),
            Job.poll_generation == generation,
            Job.poll_seq == seq,
            poll_seq=seq + 1,
            poll_lease_expires_at=lease_until,
        )
    if now is None:
        raise ValueError("a lease by kind needs now")
    turn = _turn_by_kind(tuple((name, tuple(steps)) for name, steps in lease_until.items()))
    params: dict[str, Any] = {"turn_job": job_id, "turn_generation": generation,
                              "turn_seq": seq, "turn_next": seq + 1, "turn_now": now}
    for name, delta in turn.offsets:
        params[name] = now + delta
    return session.execute(
        turn.statement, params, execution_options={"populate_existing": True},
    ).scalar_one_or_none()


@dataclass(frozen=True)
class _Turn:
    statement: Any
    offsets: tuple[tuple[str, timedelta], ...]  # bind name → its value's offset from now


@lru_cache(maxsize=16)
def _turn_by_kind(steps: tuple[tuple[str, tuple[tuple[timedelta | None, timedelta], ...]], ...]
                  ) -> _Turn:
    """The poll turn's ``UPDATE … RETURNING`` for these lease steps, built once: the lease for
    the row's kind and age (``now − provider_call_started_at``, 0 when unset) is a ``CASE`` over
    the kinds (kinds with the same steps share their branches) whose times are bound per poll as
    ``now ± a fixed offset``. Building and compiling it per poll cost more CPU than the rest of
    the turn (issue 16)."""
    offsets: dict[timedelta, str] = {}

    def at(delta: timedelta) -> Any:
        if delta not in offsets:
            offsets[delta] = f"turn_at_{len(offsets)}"
        return bindparam(offsets[delta], type_=Job.poll_lease_expires_at.type)

    now = bindparam("turn_now", type_=Job.poll_lease_expires_at.type)
    groups: dict[tuple[tuple[timedelta | None, timedelta], ...], list[str]] = {}
    for name, kind_steps in steps:
        groups.setdefault(kind_steps, []).append(name)
    started = func.coalesce(Job.provider_call_started_at, now)
    whens: list[Any] = []
    for kind_steps, names in groups.items():
        of_kind = Job.provider_kind.in_(names)
        for age, lease in kind_steps:
            whens.append((of_kind if age is None else and_(of_kind, started <= at(-age)),
                          at(lease)))
    lease_sql: Any = case(*whens, else_=Job.poll_lease_expires_at) if whens \
        else Job.poll_lease_expires_at
    table = Job.__table__
    core = (
        update(table)
        .where(
            Job.id == bindparam("turn_job"),
            Job.status.in_(IN_FLIGHT),
            Job.provider_task_id.is_not(None),
            Job.poll_generation == bindparam("turn_generation"),
            Job.poll_seq == bindparam("turn_seq"),
            Job.provider_kind.in_([name for name, _ in steps]),
        )
        .values({table.c.poll_seq: bindparam("turn_next"),
                 table.c.poll_lease_expires_at: lease_sql})
        .returning(*table.c)
    )
    # a Core UPDATE … RETURNING mapped onto Job: the same one statement and the same row object
    # as an ORM-enabled update(Job), without the ORM bulk-update bookkeeping run per execution
    # (about a fifth of the turn's CPU, measured in bench.poll_modes' chain mode)
    statement = select(Job).from_statement(core)
    return _Turn(statement, tuple((name, delta) for delta, name in offsets.items()))


def start_new_chain(session: Session, job_id: uuid.UUID, now: datetime,
                    lease: timedelta, *, poll_due_at: datetime | None = None) -> Job | None:
    """Resume polling under a new generation (the old chain, if alive, loses its next turn).

    ``poll_due_at``: batch mode — the new generation is due then (no message is sent); chain
    mode leaves NULL, so a row scheduled by an earlier batch mode goes back to its chain.
    """
    return _cas(
        session, Job.id == job_id, Job.status.in_(IN_FLIGHT), Job.provider_task_id.is_not(None),
        poll_generation=Job.poll_generation + 1, poll_seq=0, poll_lease_expires_at=now + lease,
        poll_due_at=poll_due_at,
    )


# ----------------------------------------------------------------------------- batch polling
# (RECONCILE_POLL_MODE=batch, reconcile.batch_poll). A claim is the row's (poll_generation,
# poll_seq) after the claim bumped poll_seq: every write of the claim's result is guarded by it,
# so a claim taken over after its lease (or a new generation: a webhook, the sweep) fences it.


def claim_due(session: Session, now: datetime, lease: timedelta, limit: int) -> list[Job]:
    """Up to ``limit`` in-flight rows due at ``now``, oldest due first, skipping rows another
    claimer holds locked; each moves one lease ahead with ``poll_seq + 1`` (its claim)."""
    return [job for job, _ in claim_due_with_times(session, now, lease, limit)]


def claim_due_with_times(session: Session, now: datetime, lease: timedelta, limit: int
                         ) -> list[tuple[Job, datetime]]:
    """:func:`claim_due`, each row with the due time it had before the claim moved it (the
    batch poller schedules the next read from it: no drift of one tick per read)."""
    from .db.models import IN_FLIGHT as IN_FLIGHT_SQL

    due = (select(Job.id, Job.poll_due_at)
           .where(IN_FLIGHT_SQL, Job.poll_due_at.is_not(None), Job.poll_due_at <= now,
                  Job.provider_task_id.is_not(None))
           .order_by(Job.poll_due_at).limit(limit).with_for_update(skip_locked=True))
    was = {job_id: due_at for job_id, due_at in session.execute(due).all()}
    if not was:
        return []
    ids = list(was)
    rows = session.execute(
        update(Job).where(Job.id.in_(ids)).values(
            poll_due_at=now + lease, poll_seq=Job.poll_seq + 1,
            poll_lease_expires_at=now + lease).returning(Job),
        execution_options={"synchronize_session": False, "populate_existing": True},
    ).scalars().all()
    order = {job_id: n for n, job_id in enumerate(ids)}
    return [(job, _aware(was[job.id])) for job in sorted(rows, key=lambda j: order[j.id])]


def _aware(value: datetime) -> datetime:
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)  # SQLite: naive


def _claimed(job_id: uuid.UUID, generation: int, seq: int) -> tuple[Any, ...]:
    return (Job.id == job_id, Job.status.in_(IN_FLIGHT), Job.poll_generation == generation,
            Job.poll_seq == seq)


def hold_claim(session: Session, job_id: uuid.UUID, generation: int, seq: int,
               until: datetime) -> Job | None:
    """The claim still holds (same generation and seq, in flight): extend it to ``until`` and
    return the current row; None: it was taken over (or the job finished) — the result is
    refused."""
    return _cas(session, *_claimed(job_id, generation, seq), poll_due_at=until,
                poll_lease_expires_at=until)


_RESCHEDULE = text("""
UPDATE jobs SET poll_due_at = v.due,
       progress = CASE WHEN v.progress > jobs.progress THEN v.progress ELSE jobs.progress END
FROM unnest(CAST(:ids AS uuid[]), CAST(:gens AS int[]), CAST(:seqs AS int[]),
            CAST(:dues AS timestamptz[]), CAST(:progress AS int[])) AS v(id, gen, seq, due, progress)
WHERE jobs.id = v.id AND jobs.status IN ('pending', 'processing')
  AND jobs.poll_generation = v.gen AND jobs.poll_seq = v.seq""")


def reschedule_claimed(session: Session, rows: list[tuple[uuid.UUID, int, int, datetime, int | None]]
                       ) -> int:
    """The set-based write of a batch's still-running rows: ``(id, generation, seq, due,
    progress)`` each; a row is written only while its claim holds; progress only rises
    (``None``: unchanged). One ``UPDATE … FROM unnest(…)`` on PostgreSQL. Returns rows won."""
    from sqlalchemy import case

    if not rows:
        return 0
    if session.get_bind().dialect.name != "postgresql":  # SQLite (embedded): one CAS each
        won = 0
        for job_id, generation, seq, due, progress in rows:
            extra: dict[str, Any] = {}
            if progress is not None:
                extra["progress"] = case((Job.progress < progress, progress), else_=Job.progress)
            result = session.execute(update(Job).where(*_claimed(job_id, generation, seq))
                                     .values(poll_due_at=due, **extra))
            won += result.rowcount or 0  # type: ignore[attr-defined]
        return won
    # one statement over five arrays (unnest: a relation like VALUES, but a fixed text with five
    # parameters — nothing to compile per batch, where VALUES binds 5 × n); -1 stands for
    # "progress unchanged" (progress is >= 0)
    result = session.execute(_RESCHEDULE, {
        "ids": [r[0] for r in rows], "gens": [r[1] for r in rows], "seqs": [r[2] for r in rows],
        "dues": [r[3] for r in rows], "progress": [-1 if r[4] is None else r[4] for r in rows]})
    return result.rowcount or 0  # type: ignore[attr-defined]


def make_due(session: Session, job_id: uuid.UUID, now: datetime, lease: timedelta) -> Job | None:
    """Batch mode, a row with no due time (its chain died, or it predates batch mode): a new
    generation (a live chain loses its next turn), due at once. None: it is scheduled already,
    finished, or has no task id."""
    return _cas(session, Job.id == job_id, Job.status.in_(IN_FLIGHT),
                Job.provider_task_id.is_not(None), Job.poll_due_at.is_(None),
                poll_generation=Job.poll_generation + 1, poll_seq=0, poll_due_at=now,
                poll_lease_expires_at=now + lease)


def make_due_at(session: Session, job_id: uuid.UUID, due: datetime) -> bool:
    """Batch mode: an in-flight row's next read is due at ``due`` (the interleaving explorer's
    setup of a batch-polled row; library paths use :func:`make_due`). False: not in flight."""
    result = session.execute(update(Job).where(Job.id == job_id, Job.status.in_(IN_FLIGHT))
                             .values(poll_due_at=due))
    return result.rowcount == 1  # type: ignore[attr-defined]


def _attempt(session: Session, job_id: uuid.UUID, now: datetime, spacing: timedelta,
             **values: Any) -> Job | None:
    """The attempt CAS: at most one attempt per ``spacing`` per in-flight job."""
    return _cas(
        session,
        Job.id == job_id,
        Job.status.in_(IN_FLIGHT),
        or_(Job.reconcile_last_attempt_at.is_(None),
            Job.reconcile_last_attempt_at <= now - spacing),
        reconcile_attempts=Job.reconcile_attempts + 1,
        reconcile_last_attempt_at=now,
        **values,
    )


def count_attempt(session: Session, job_id: uuid.UUID, now: datetime, spacing: timedelta,
                  last_error: str | None, *, verdict: bool = True,
                  code: str | None = None) -> Job | None:
    """One attempt, at most once per ``spacing`` per job, whoever observes it, recording what
    it observed and its ``code`` (``verdict=False``: an error that is no verdict keeps an
    upstream one)."""
    last_error = redact.signed(last_error) if last_error else last_error
    return _attempt(session, job_id, now, spacing, **_last_error(last_error, code, verdict))


def claim_attempt(session: Session, job_id: uuid.UUID, now: datetime,
                  spacing: timedelta) -> Job | None:
    """The sweep's claim of an attempt (``count_attempt``'s CAS) before it observes: the claim
    is no observation, so ``reconcile_last_error`` is kept (issue 11 hole 11)."""
    return _attempt(session, job_id, now, spacing)


# ----------------------------------------------------------------------------- the last error
# ``reconcile_last_error`` is the text, ``reconcile_last_error_code`` its code (migration 0021):
# an ``UPSTREAM_…`` code is an upstream verdict (not found, expired media…), which an error that
# is no verdict (a failed read, a raising step) never overwrites.


def legacy_error_code(last_error: str | None) -> str | None:
    """The one fallback for rows written before migration 0021 (code NULL, text set): the code
    the text starts with, as the library wrote it then (``UPSTREAM_…: message`` or
    ``INTERNAL: …``); None for any other text. Never used when the column is set."""
    if last_error and last_error.startswith(("UPSTREAM_", "INTERNAL:")):
        return last_error.split(":", 1)[0]
    return None


def last_error_code(job: Job) -> str | None:
    """The code of the job's last error: the column, else (a legacy row) :func:`legacy_error_code`."""
    if job.reconcile_last_error_code is not None:
        return job.reconcile_last_error_code
    return legacy_error_code(job.reconcile_last_error)


def is_verdict(code: str | None) -> bool:
    """An upstream verdict's code (``UPSTREAM_…``)."""
    return code is not None and code.startswith("UPSTREAM_")


def _verdict_sql() -> Any:
    """SQL: the row's last error is an upstream verdict (:func:`is_verdict` of
    :func:`last_error_code`, the legacy text included)."""
    return or_(Job.reconcile_last_error_code.like("UPSTREAM\\_%", escape="\\"),
               and_(Job.reconcile_last_error_code.is_(None),
                    Job.reconcile_last_error.like("UPSTREAM\\_%", escape="\\")))


def _last_error(last_error: str | None, code: str | None, verdict: bool) -> dict[str, Any]:
    """The values writing a last error (text and code): ``verdict=False`` keeps the row's own
    when it is an upstream verdict."""
    if verdict:
        return {"reconcile_last_error": last_error, "reconcile_last_error_code": code}
    keep = _verdict_sql()
    return {"reconcile_last_error": case((keep, Job.reconcile_last_error),
                                         else_=literal(last_error)),
            "reconcile_last_error_code": case((keep, Job.reconcile_last_error_code),
                                              else_=literal(code))}


def note_error(session: Session, job_id: uuid.UUID, last_error: str, *,
               verdict: bool = True, code: str | None = None) -> bool:
    """Record an in-flight job's last error (text and ``code``) with no attempt counted.
    False: the job is no longer in flight."""
    last_error = redact.signed(last_error)
    result = session.execute(update(Job).where(Job.id == job_id, Job.status.in_(IN_FLIGHT))
                             .values(**_last_error(last_error, code, verdict)))
    return result.rowcount == 1  # type: ignore[attr-defined]


def set_progress(session: Session, job_id: uuid.UUID, progress: int) -> bool:
    return _cas(session, Job.id == job_id, Job.status.in_(IN_FLIGHT), Job.progress < progress,
                progress=progress) is not None


def settled(session: Session, job_id: uuid.UUID, credits_actual: int) -> bool:
    return _cas(session, Job.id == job_id, Job.credits_actual.is_(None),
                credits_actual=credits_actual, next_poll_at=None) is not None


def settle_failed(session: Session, job_id: uuid.UUID, retry_at: datetime) -> bool:
    """A settlement attempt failed: retry at ``retry_at``, one more attempt counted. False: the
    job is settled already (or gone)."""
    result = session.execute(update(Job).where(Job.id == job_id, Job.credits_actual.is_(None))
                             .values(next_poll_at=retry_at, settle_attempts=Job.settle_attempts + 1))
    return result.rowcount == 1  # type: ignore[attr-defined]
