"""Internal: the writes of batch polling (``RECONCILE_POLL_MODE=batch``, :mod:`reconcile.lifecycle.batch`).

A claim is the row's (poll_generation, poll_seq) after the claim bumped poll_seq: every write of
the claim's result is guarded by it, so a claim taken over after its lease (or a new
generation: a webhook, the sweep) fences it.
"""

from __future__ import annotations

import uuid
from collections.abc import Collection, Sequence
from datetime import UTC, datetime, timedelta
from functools import cache, partial
from typing import Any

from sqlalchemy import and_, bindparam, func, or_, select, text, update
from sqlalchemy.orm import Session

from ..db.models import Job, table_of
from ..db.session import rowcount
from ..states import IN_FLIGHT
from .cas import _cas, _cas_prepared, _update_prepared, bound
from .predicates import stored_status

# a claimed row's still-running write: (id, generation, seq, next due, progress), optionally
# with the provider's status the read saw (None: the row keeps its own)
Rescheduled = (tuple[uuid.UUID, int, int, datetime, int | None]
               | tuple[uuid.UUID, int, int, datetime, int | None, object])


def claim_due(session: Session, now: datetime, lease: timedelta, limit: int, *,
              kinds: Sequence[str] | None = None, worker: str | None = None) -> list[Job]:
    """Up to ``limit`` in-flight rows due at ``now``, oldest due first, skipping rows another
    claimer holds locked; each moves one lease ahead with ``poll_seq + 1`` (its claim).
    ``kinds``: only rows of those provider kinds (the ones the claimer can read); ``worker``:
    the live worker process claiming (``claimed_by``)."""
    return [job for job, _ in claim_due_with_times(session, now, lease, limit, kinds=kinds,
                                                   worker=worker)]


def claim_due_with_times(session: Session, now: datetime, lease: timedelta, limit: int, *,
                         kinds: Sequence[str] | None = None, worker: str | None = None
                         ) -> list[tuple[Job, datetime]]:
    """:func:`claim_due`, each row with the due time it had before the claim moved it (the
    batch poller schedules the next read from it: no drift of one tick per read). On
    PostgreSQL one statement (:func:`_claim_statement`), elsewhere a locking read then the
    update."""
    if session.get_bind().dialect.name == "postgresql":
        found = session.execute(
            _claim_statement(kinds is not None),
            {"d_now": now, "d_limit": limit, "d_until": now + lease,
             "d_lease_until": now + lease, "d_worker": worker,
             **({} if kinds is None else {"d_kinds": list(kinds)})},
            execution_options={"populate_existing": True}).all()
        return [(job, _aware(was)) for job, was, _ in sorted(found, key=lambda row: row[2])]
    due = (select(Job.id, Job.poll_due_at).where(*_due_by(now, kinds))
           .order_by(Job.poll_due_at).limit(limit).with_for_update(skip_locked=True))
    # poll_due_at IS NOT NULL in the query
    was: dict[uuid.UUID, datetime] = {job_id: due_at for job_id, due_at in session.execute(due).all()
                                      if due_at is not None}
    if not was:
        return []
    ids = list(was)
    rows = session.execute(
        update(Job).where(Job.id.in_(ids)).values(
            poll_due_at=now + lease, poll_seq=Job.poll_seq + 1,
            poll_lease_expires_at=now + lease, claimed_by=worker).returning(Job),
        execution_options={"synchronize_session": False, "populate_existing": True},
    ).scalars().all()
    order = {job_id: n for n, job_id in enumerate(ids)}
    return [(job, _aware(was[job.id])) for job in sorted(rows, key=lambda j: order[j.id])]


@cache
def _claim_statement(by_kind: bool) -> Any:
    """The claim as ONE statement: ``WITH locked AS MATERIALIZED (SELECT id, poll_due_at …
    ORDER BY poll_due_at LIMIT n FOR UPDATE SKIP LOCKED), due AS (… row_number() OVER () …)
    UPDATE jobs … FROM due RETURNING <the mapped columns>, due.was_due, due.place``, mapped onto
    ``Job`` with each row's due time before the claim and its place in the read. The locking
    read is a materialized CTE, so it runs once (a subquery rescanned by the join could lock
    and return other rows), and the update writes exactly the rows it locked."""
    jobs = table_of(Job)
    when = bindparam("d_now", type_=jobs.c.poll_due_at.type)
    kinds = (Job.provider_kind.in_(bindparam("d_kinds", expanding=True)),) if by_kind else ()
    locked = (select(jobs.c.id, jobs.c.poll_due_at.label("was_due"))
              .where(*_due_by(when, None), *kinds).order_by(jobs.c.poll_due_at)
              .limit(bindparam("d_limit"))
              .with_for_update(skip_locked=True).cte("locked").prefix_with("MATERIALIZED"))
    # each row's place in the locking read's order (a window cannot sit beside FOR UPDATE, so
    # it numbers the materialized read's rows): the claims come back in that order, rows due
    # at the same time as the read found them, as the two-statement claim returns them
    due = select(locked.c.id, locked.c.was_due,
                 func.row_number().over().label("place")).cte("due")
    # the lease's end once per column it is written to: each binds as its own column does (a
    # platform's naive column beside the library's timestamptz one)
    claim = (update(jobs).where(jobs.c.id == due.c.id)
             .values(poll_due_at=bindparam("d_until", type_=jobs.c.poll_due_at.type),
                     poll_seq=jobs.c.poll_seq + 1,
                     poll_lease_expires_at=bindparam("d_lease_until",
                                                     type_=jobs.c.poll_lease_expires_at.type),
                     claimed_by=bindparam("d_worker", type_=jobs.c.claimed_by.type))
             .returning(*jobs.c, due.c.was_due, due.c.place))
    return select(Job, due.c.was_due, due.c.place).from_statement(claim)


def _due_by(when: Any, kinds: Sequence[str] | None) -> tuple[Any, ...]:
    """A row the batch poller claims at ``when``: in flight with a task id, due by then (the
    partial index ``jobs_poll_due_idx``), of one of ``kinds`` (None: any)."""
    from ..db.models import IN_FLIGHT as IN_FLIGHT_SQL

    only = () if kinds is None else (Job.provider_kind.in_(list(kinds)),)
    return (IN_FLIGHT_SQL, Job.poll_due_at.is_not(None), Job.poll_due_at <= when,
            Job.provider_task_id.is_not(None), *only)


def oldest_unclaimed_due(session: Session, before: datetime, *,
                         kinds: Sequence[str] | None = None) -> datetime | None:
    """The oldest due time of a row the batch poller would claim that was due before ``before``
    and is still unclaimed (a claim moves ``poll_due_at`` one lease ahead): None when there is
    none. One row from the partial index ``jobs_poll_due_idx``."""
    due = session.execute(select(Job.poll_due_at).where(*_due_by(before, kinds))
                          .order_by(Job.poll_due_at).limit(1)).scalar()
    return None if due is None else _aware(due)


def _aware(value: datetime) -> datetime:
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)  # SQLite: naive


_ANY = object()

# a reader without a turn of its own (:func:`claim_of`): (poll_generation, poll_seq,
# poll_resumes, the time no poller may hold the row at — None: not asked)
ReaderClaim = tuple[int, int, int | None, datetime | None]


def under_claim(generation: Any, seq: Any, resumes: Any = _ANY,
                unheld_at: datetime | None = None) -> tuple[Any, ...]:
    """A write made under a poller's claim or turn ``(generation, seq)``: it applies only while
    the row still carries that claim (a claim taken over — a new generation, another poller's
    claim or turn — moved one of them). Added to a CAS's own conditions.

    ``resumes``: also while the row's resume count is that (:func:`claim_of`, a reader holding
    no turn of its own). A poller needs none: its turn or claim moved ``poll_seq`` past 0, so a
    resume after it starts a new generation. ``unheld_at``: also only while no poller holds the
    row at that time (:func:`unheld`)."""
    held: tuple[Any, ...] = (Job.poll_generation == generation, Job.poll_seq == seq)
    if resumes is not _ANY:
        held = (*held, Job.poll_resumes.is_not_distinct_from(resumes))
    if unheld_at is not None:
        held = (*held, unheld(unheld_at))
    return held


def unheld(now: datetime) -> Any:
    """No poller holds the row at ``now``: a chain row (``poll_due_at`` NULL) whose turn's lease
    has ended, or a batch row that is due (a claim, its hold and a poller's reschedule all put
    ``poll_due_at`` ahead). A poller that holds the row may be storing the success it read: a
    reader without a turn of its own leaves the job's exhaustion to it."""
    return or_(and_(Job.poll_due_at.is_(None),
                    or_(Job.poll_lease_expires_at.is_(None), Job.poll_lease_expires_at <= now)),
               Job.poll_due_at <= now)


def claim_of(job: Job, *, unheld_at: datetime | None = None) -> ReaderClaim:
    """The claim a reader without a turn of its own (the sweep, the heartbeat reaper, a
    webhook's confirming read) reads under: the row's ``(poll_generation, poll_seq,
    poll_resumes)`` as it loaded it — a resume of a generation that never took a turn keeps the
    first two, it moves the third — and ``unheld_at``: the time at which no poller may hold the
    row for the reader's no-verdict outcome to count (None: not asked; when to ask is
    ``lifecycle.reader_claim``'s rule). A poller's turn or claim taken
    before the reader loaded the row moves none of the three while it stores a success; its
    live lease is what shows it."""
    return (job.poll_generation, job.poll_seq, job.poll_resumes, unheld_at)


def _claimed(job_id: uuid.UUID, generation: int, seq: int) -> tuple[Any, ...]:
    return (Job.id == job_id, Job.status.in_(IN_FLIGHT), *under_claim(generation, seq))


def hold_claim(session: Session, job_id: uuid.UUID, generation: int, seq: int,
               until: datetime, *, status: object = None,
               storing: datetime | None = None) -> Job | None:
    """The claim still holds (same generation and seq, in flight): extend it to ``until`` and
    return the current row; None: it was taken over (or the job finished) — the result is
    refused. ``status``: the provider's status the claim's read saw, stored with it
    (:func:`~.predicates.stored_status`; None keeps the row's). ``storing``: the hold of a
    success whose outputs are about to be stored, at that time: ``until`` is also its storing
    mark, and the storer is counted (:func:`hold_while_storing`)."""
    stored = stored_status(status)
    keep: dict[str, Any] = {} if stored is None else {"provider_status": stored}
    if storing is not None:  # a success about to be stored: marked, and counted at ``storing``
        keep["storing_until"] = _new_mark(storing, _at(until))
        keep["storing_count"] = _one_more(storing)
    return _cas(session, *_claimed(job_id, generation, seq), poll_due_at=until,
                poll_lease_expires_at=until, **keep)


_HOLD_ALL = text("""
UPDATE jobs SET poll_due_at = :until, poll_lease_expires_at = :until
FROM unnest(CAST(:ids AS uuid[]), CAST(:gens AS int[]), CAST(:seqs AS int[])) AS v(id, gen, seq)
WHERE jobs.id = v.id AND jobs.status IN ('pending', 'processing')
  AND jobs.poll_generation = v.gen AND jobs.poll_seq = v.seq
RETURNING jobs.id""")


def hold_claims(session: Session, rows: list[tuple[uuid.UUID, int, int]], until: datetime
                ) -> set[uuid.UUID]:
    """:func:`hold_claim` for many rows at once, ``(id, generation, seq)`` each: every claim
    that still holds is extended to ``until`` (its identity unchanged); returns the ids held.
    One ``UPDATE … FROM unnest(…)`` on PostgreSQL; one CAS each on SQLite."""
    if not rows:
        return set()
    if session.get_bind().dialect.name != "postgresql":
        return {job_id for job_id, generation, seq in rows
                if rowcount(session.execute(update(Job).where(*_claimed(job_id, generation, seq))
                                            .values(poll_due_at=until,
                                                    poll_lease_expires_at=until)))}
    held = session.execute(_HOLD_ALL, {"ids": [r[0] for r in rows], "gens": [r[1] for r in rows],
                                       "seqs": [r[2] for r in rows], "until": until})
    return {row[0] for row in held}


def _hold_reads_statement() -> Any:
    """``UPDATE jobs … FROM unnest(ids, gens, seqs, statuses, untils) … RETURNING jobs`` as an
    ORM statement (the rows come back as :class:`Job`); its text is fixed whatever the number
    of rows (six array parameters), so it is built once."""
    from sqlalchemy import TIMESTAMP, Boolean, Integer, Text, bindparam, case, cast, func
    from sqlalchemy.dialects.postgresql import ARRAY, UUID

    v = func.unnest(cast(bindparam("ids"), ARRAY(UUID(as_uuid=True))),
                    cast(bindparam("gens"), ARRAY(Integer)),
                    cast(bindparam("seqs"), ARRAY(Integer)),
                    cast(bindparam("statuses"), ARRAY(Text)),
                    cast(bindparam("untils"), ARRAY(TIMESTAMP(timezone=True))),
                    cast(bindparam("storing"), ARRAY(Boolean))
                    ).table_valued("id", "gen", "seq", "status", "until", "storing"
                                   ).render_derived(name="v")
    return (update(Job).where(Job.id == v.c.id, Job.status.in_(IN_FLIGHT),
                              *under_claim(v.c.gen, v.c.seq))
            .values(poll_due_at=v.c.until, poll_lease_expires_at=v.c.until,
                    provider_status=func.coalesce(v.c.status, Job.provider_status),
                    storing_until=case((v.c.storing, _new_mark(bindparam("now"), v.c.until)),
                                       else_=Job.storing_until),
                    storing_count=case((v.c.storing, _one_more(bindparam("now"))),
                                       else_=Job.storing_count))
            .returning(Job))


_HOLD_READS: list[Any] = []  # the statement, built at first use


def hold_claims_with_status(session: Session, rows: Sequence[tuple[uuid.UUID, int, int, object]],
                            until: datetime | Sequence[datetime], *,
                            storing: Collection[uuid.UUID] = (),
                            now: datetime | None = None) -> dict[uuid.UUID, Job]:
    """:func:`hold_claim` for many rows in one statement, ``(id, generation, seq, status)``
    each: every claim that still holds is extended to ``until`` (one time for all, or one per
    row, in the order of ``rows``) with the status its read saw stored
    (:func:`~.predicates.stored_status`; None keeps the row's), and its current row is
    returned by id; a claim taken over (or a job finished) is absent. ``storing``: the ids
    whose hold is that of a success about to be stored: their time is also their storing mark,
    and each is counted as a storer at ``now`` (:func:`hold_while_storing`). Each row is its
    own compare-and-set: one row fenced never keeps another from being held. One statement on
    PostgreSQL; one CAS each on SQLite."""
    if not rows:
        return {}
    untils = [until] * len(rows) if isinstance(until, datetime) else list(until)
    if len(untils) != len(rows):
        raise ValueError(f"{len(rows)} rows, {len(untils)} times to hold them until")
    if storing and now is None:
        raise ValueError("counting storers needs now")
    if session.get_bind().dialect.name != "postgresql":
        held = ((job_id, hold_claim(session, job_id, generation, seq, each, status=status,
                                    storing=now if job_id in storing else None))
                for (job_id, generation, seq, status), each in zip(rows, untils, strict=True))
        return {job_id: job for job_id, job in held if job is not None}
    if not _HOLD_READS:
        _HOLD_READS.append(_hold_reads_statement())
    found = session.execute(_HOLD_READS[0], {
        "ids": [r[0] for r in rows], "gens": [r[1] for r in rows], "seqs": [r[2] for r in rows],
        "statuses": [stored_status(r[3]) for r in rows], "untils": untils,
        "storing": [r[0] in storing for r in rows], "now": now},
        execution_options={"synchronize_session": False, "populate_existing": True})
    return {job.id: job for job in found.scalars().all()}


def hold_while_storing(session: Session, job_id: uuid.UUID, until: datetime, *,
                       claim: tuple[int, int] | None = None, now: datetime,
                       counted: bool = False) -> bool:
    """Whoever read "succeeded" marks the row before it stores the outputs, so no read that is
    no verdict fails the job at its exhaustion horizon meanwhile (:func:`not_storing`,
    ``lifecycle.exhaust``): the storer is counted (``storing_count``; the first after the mark
    ended at ``now`` starts again at one) under the mark that lasts, or a new one to ``until``
    where none lasts. A storing that fails takes its count back (:func:`end_storing`).
    ``counted``: the storer is counted already (a batch round's grouped hold): its mark only
    moves later, to ``until``. ``claim``: the poller's own turn or claim; while the row still
    carries it, its hold moves to ``until`` too — the turn's lease on a chain row (``poll_due_at`` NULL, which stays NULL), the claim's
    due time and lease on a batch row — so no sweep resumes it and no poller claims it
    meanwhile (a duplicate read and download). False: the job is no longer in flight."""
    params: dict[str, Any] = {"h_job_id": job_id, "h_until": until, "h_now": now}
    if claim is not None:
        params.update(h_generation=claim[0], h_seq=claim[1])
    return bool(_update_prepared(session, _HOLD_SHAPES[bool(counted), claim is not None], params))


def _hold_terms(counted: bool, held: bool) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """:func:`hold_while_storing`'s write, with bind parameters (``held``: under a claim)."""
    from sqlalchemy import bindparam, case

    at = bindparam("h_until", type_=Job.storing_until.type)  # as :func:`_at` binds
    now = bindparam("h_now", type_=Job.storing_until.type)
    # a storer counted already moves its own mark later; a new one starts a mark only where
    # none lasts (an ended one included): a mark is never stretched over another storer's, so
    # a storer that died (its count never taken back) is forgotten when the mark it joined ends
    values: dict[str, Any] = {"storing_until": _later(Job.storing_until, at) if counted
                              else _new_mark(now, at)}
    if not counted:
        values["storing_count"] = _one_more(now)
    if held:
        mine = and_(*under_claim(bound("h_generation", "poll_generation"),
                                 bound("h_seq", "poll_seq")))
        values["poll_lease_expires_at"] = case((mine, at), else_=Job.poll_lease_expires_at)
        values["poll_due_at"] = case((and_(mine, Job.poll_due_at.is_not(None)), at),
                                     else_=Job.poll_due_at)
    return (Job.id == bound("h_job_id", "id"), Job.status.in_(IN_FLIGHT)), values


_HOLD_SHAPES = {(counted, held): partial(_hold_terms, counted, held)
                for counted in (False, True) for held in (False, True)}


def end_storing(session: Session, job_id: uuid.UUID) -> bool:
    """A storing that failed takes its count back (never below none): the failure at the
    horizon may then go ahead once no other storer is counted."""
    from sqlalchemy import case, func

    done = session.execute(
        update(Job).where(Job.id == job_id, Job.status.in_(IN_FLIGHT))
        .values(storing_count=case((func.coalesce(Job.storing_count, 0) > 0,
                                    Job.storing_count - 1), else_=0)),
        execution_options={"synchronize_session": False})
    return bool(rowcount(done))


def not_storing(now: datetime) -> Any:
    """Nobody may still be storing a success of the row at ``now``: no mark, a mark ended, or
    no storer counted (:func:`hold_while_storing`). The condition of a failure at the
    exhaustion horizon."""
    from sqlalchemy import func

    return or_(_mark_ended(now), func.coalesce(Job.storing_count, 0) <= 0)


def _mark_ended(now: Any) -> Any:
    """No storing mark lasts at ``now`` (a time, or a bound expression): none, or an ended one."""
    at = _at(now) if isinstance(now, datetime) else now
    return or_(Job.storing_until.is_(None), Job.storing_until <= at)


def _one_more(now: Any) -> Any:
    """The storer count with one more: one when the mark had ended at ``now``."""
    from sqlalchemy import case, func

    return case((_mark_ended(now), 1), else_=func.coalesce(Job.storing_count, 0) + 1)


def _new_mark(now: Any, until: Any) -> Any:
    """A new storer's mark: ``until`` where no mark lasts at ``now``, else the lasting one."""
    from sqlalchemy import case

    return case((_mark_ended(now), until), else_=Job.storing_until)


def _later(column: Any, value: Any) -> Any:
    """The later of a nullable timestamp ``column`` and ``value`` (an expression)."""
    from sqlalchemy import case

    return case((column.is_(None), value), (column > value, column), else_=value)


def _at(value: datetime) -> Any:
    """``value`` bound as the job's timestamp columns are (UTC, on a naive column as on
    timestamptz, on SQLite as on PostgreSQL): a bare bind in a CASE gets no column type."""
    from sqlalchemy import literal

    return literal(value, type_=Job.storing_until.type)


_RESCHEDULE = text("""
UPDATE jobs SET poll_due_at = v.due,
       progress = CASE WHEN v.progress > jobs.progress THEN v.progress ELSE jobs.progress END,
       provider_status = COALESCE(v.status, jobs.provider_status)
FROM unnest(CAST(:ids AS uuid[]), CAST(:gens AS int[]), CAST(:seqs AS int[]),
            CAST(:dues AS timestamptz[]), CAST(:progress AS int[]), CAST(:statuses AS text[]))
     AS v(id, gen, seq, due, progress, status)
WHERE jobs.id = v.id AND jobs.status IN ('pending', 'processing')
  AND jobs.poll_generation = v.gen AND jobs.poll_seq = v.seq""")


def reschedule_claimed(session: Session, rows: Sequence[Rescheduled]) -> int:
    """The set-based write of a batch's still-running rows: ``(id, generation, seq, due,
    progress[, status])`` each; a row is written only while its claim holds; progress only
    rises (``None``: unchanged); the provider's status the read saw is stored
    (:func:`~.predicates.stored_status`; ``None`` or absent: the row keeps its own). One
    ``UPDATE … FROM unnest(…)`` on PostgreSQL. Returns rows won."""
    from sqlalchemy import case

    if not rows:
        return 0
    statuses = [stored_status(r[5]) if len(r) > 5 else None for r in rows]
    if session.get_bind().dialect.name != "postgresql":  # SQLite (embedded): one CAS each
        won = 0
        for (job_id, generation, seq, due, progress, *_), status in zip(rows, statuses,
                                                                          strict=True):
            extra: dict[str, Any] = {}
            if progress is not None:
                extra["progress"] = case((Job.progress < progress, progress), else_=Job.progress)
            if status is not None:
                extra["provider_status"] = status
            result = session.execute(update(Job).where(*_claimed(job_id, generation, seq))
                                     .values(poll_due_at=due, **extra))
            won += rowcount(result)
        return won
    # one statement over six arrays (unnest: a relation like VALUES, but a fixed text with six
    # parameters — nothing to compile per batch, where VALUES binds 6 × n); -1 stands for
    # "progress unchanged" (progress is >= 0), NULL for "status unchanged"
    result = session.execute(_RESCHEDULE, {
        "ids": [r[0] for r in rows], "gens": [r[1] for r in rows], "seqs": [r[2] for r in rows],
        "dues": [r[3] for r in rows], "progress": [-1 if r[4] is None else r[4] for r in rows],
        "statuses": statuses})
    return rowcount(result)


def make_due(session: Session, job_id: uuid.UUID, now: datetime, lease: timedelta) -> Job | None:
    """Batch mode, a row with no due time (its chain died, or it predates batch mode): a new
    generation (a live chain loses its next turn), due at once. None: it is scheduled already,
    finished, or has no task id."""
    return _cas_prepared(session, _make_due_shape,
                         {"d_job_id": job_id, "d_due": now, "d_until": now + lease})


def _make_due_shape() -> tuple[tuple[Any, ...], dict[str, Any]]:
    return _make_due_terms(Job.id == bound("d_job_id", "id"))


def _make_due_terms(which: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """:func:`make_due`'s write, for the rows ``which`` names (one id, or many)."""
    return ((which, Job.status.in_(IN_FLIGHT), Job.provider_task_id.is_not(None),
             Job.poll_due_at.is_(None)),
            dict(poll_generation=Job.poll_generation + 1, poll_seq=0,
                 poll_due_at=bound("d_due", "poll_due_at"),
                 poll_lease_expires_at=bound("d_until", "poll_lease_expires_at")))


def make_due_all(session: Session, job_ids: Collection[uuid.UUID], now: datetime,
                 lease: timedelta) -> dict[uuid.UUID, int]:
    """:func:`make_due` for many rows in one statement (the sweep's hand-over to the batch
    poller past its time budget): each row made due → its new generation. A row it does not
    write (scheduled already, finished, no task id) is not in the answer."""
    if not job_ids:
        return {}
    rows = session.connection().execute(_make_due_all_statement(), {
        "d_job_ids": list(job_ids), "d_due": now, "d_until": now + lease}).all()
    return {job_id: generation for job_id, generation in rows}


@cache
def _make_due_all_statement() -> Any:
    jobs = table_of(Job)
    where, values = _make_due_terms(Job.id.in_(bindparam("d_job_ids", expanding=True)))
    return update(jobs).where(*where).values(**values).returning(jobs.c.id,
                                                                 jobs.c.poll_generation)


def unschedule(session: Session, job_id: uuid.UUID, lease_end: datetime) -> bool:
    """An in-flight row with no due time, its poll lease ending at ``lease_end``: a chain that
    died before the deployment moved to batch mode (the interleaving explorer's setup; the
    sweep resumes such a row by making it due). False: not in flight."""
    result = session.execute(update(Job).where(Job.id == job_id, Job.status.in_(IN_FLIGHT))
                             .values(poll_due_at=None, poll_lease_expires_at=lease_end))
    return rowcount(result) == 1


def make_due_at(session: Session, job_id: uuid.UUID, due: datetime) -> bool:
    """Batch mode: an in-flight row's next read is due at ``due`` (the interleaving explorer's
    setup of a batch-polled row; library paths use :func:`make_due`). False: not in flight."""
    result = session.execute(update(Job).where(Job.id == job_id, Job.status.in_(IN_FLIGHT))
                             .values(poll_due_at=due))
    return rowcount(result) == 1
