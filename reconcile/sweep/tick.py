"""Internal: the sweep tick — the keyset walk over its phases in locked batches, the fan-out past
its time budget, late completions, the outbox and idempotency chores, and the per-job
:func:`reconcile_job`."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta
from functools import partial
from typing import Any

from sqlalchemy import Select, select, text, tuple_

from .. import idempotency, jobstore
from ..db.models import COMPLETED_AFTER_FAILURE, Job
from ..jobstore.events import publish
from ..runtime import Runtime
from .carry import _run
from .claims import (
    BATCH_SIZE as BATCH_SIZE,
    _anomaly_once,
    _Plan,
    _plan,
    _settle_cutoff,
    hand_over,
)
from .liveness import reap
from .report import SweepReport, _Tally, record
from .table import _ERROR, Action

log = logging.getLogger("reconcile.sweep")

EVENT_REPUBLISH_AGE = timedelta(seconds=30)
LATE_BATCH = 100  # late completions checked per transaction


_Cursor = tuple[Any, ...] | None


def _phases(settle_cutoff: datetime
            ) -> Iterator[tuple[str, Callable[[_Cursor], Select[Job]]]]:
    """Keyset-paged candidate queries: in-flight rows through ``jobs_inflight_keyset_idx``
    (those with no provider call yet, then by ``provider_call_started_at``), then unsettled
    failures due
    by ``settle_cutoff`` through ``jobs_unsettled_idx``."""
    def unstarted(after: _Cursor) -> Select[Job]:
        stmt = select(Job).where(jobstore.in_flight(), Job.provider_call_started_at.is_(None))
        if after is not None:
            stmt = stmt.where(Job.id > after[-1])
        return stmt.order_by(Job.id)

    def started(after: _Cursor) -> Select[Job]:
        stmt = select(Job).where(jobstore.in_flight(), Job.provider_call_started_at.is_not(None))
        if after is not None:
            stmt = stmt.where(tuple_(Job.provider_call_started_at, Job.id) > tuple_(*after))
        return stmt.order_by(Job.provider_call_started_at, Job.id)

    def unsettled(after: _Cursor) -> Select[Job]:
        stmt = select(Job).where(jobstore.settlement_due(settle_cutoff))
        if after is not None:
            stmt = stmt.where(tuple_(Job.next_poll_at, Job.id) > tuple_(*after))
        return stmt.order_by(Job.next_poll_at, Job.id)

    yield "unstarted", unstarted
    yield "started", started
    yield "unsettled", unsettled


def _cursor_of(phase: str, job: Job) -> tuple[Any, ...]:
    if phase == "unstarted":
        return (job.id,)
    if phase == "started":
        return (job.provider_call_started_at, job.id)
    return (job.next_poll_at, job.id)


def sweep(rt: Runtime, *, dry_run: bool = False, now: datetime | None = None,
          budget: float | None = None, fan_out: Callable[[uuid.UUID], None] | None = None,
          timer: Callable[[], float] = time.monotonic, threads: int = 1) -> SweepReport:
    """One tick of the decision table over every candidate row; logs and returns the report.

    ``now`` (default ``rt.now()``) is the tick's decision time. ``budget`` is the seconds handled
    inline (default ``sweep_time_budget``, scaled); past it, actionable rows go to ``fan_out``
    (None: keep going inline). ``dry_run`` and observe-only kinds only log what would happen.
    ``threads``: the claimed rows of one page carried out that many at once (each in its own
    transactions, as the batch poller's outcomes: :func:`carry_out_all`); 1, the default,
    one after the other (the Celery task passes ``sweep_threads``).
    """
    started_at = timer()
    now = now or rt.now()
    limit = budget if budget is not None else rt.settings.scaled(
        timedelta(seconds=rt.settings.sweep_time_budget)).total_seconds()
    tally = _Tally()
    if not dry_run:  # workers whose heartbeat lapsed: their claims end now, not at their lease
        try:
            reap(rt)
        except Exception:
            log.exception("sweep_reap_failed")
            tally.errors += 1
    for phase, query in _phases(_settle_cutoff(rt, now)):
        cursor: _Cursor = None
        while True:
            over = fan_out is not None and not dry_run and timer() - started_at >= limit
            try:
                plans, errors, cursor = _batch(rt, phase, query, cursor, now, dry_run=dry_run,
                                               claim=not over)
            except Exception:
                log.exception("sweep_batch_failed phase=%s", phase)
                tally.errors += 1
                break
            for job_id in errors:
                tally.add(job_id, _ERROR, "error")
            # past the budget each row only goes to fan_out: one after the other
            out = fan_out if over else None
            outcomes = carry_out_all(
                [partial(_run, rt, plan, out if plan.outcome is None else None)
                 for plan in plans], 1 if over else threads)
            for plan, outcome in zip(plans, outcomes, strict=True):
                tally.add(plan.job.id, plan.decision, outcome)
            if cursor is None:
                break
    try:
        late = _late_completions(rt, dry_run=dry_run)
    except Exception:
        log.exception("sweep_late_completions_failed")
        tally.errors += 1
        late = 0
    if not dry_run:
        try:
            republished = publish(rt, older_than=rt.settings.scaled(EVENT_REPUBLISH_AGE))
            if republished:
                log.info("sweep_events_republished count=%d", republished)
        except Exception:
            log.exception("sweep_events_failed")
            tally.errors += 1
        try:  # idempotency keys past their retention (a bounded batch per tick)
            with rt.sessions.begin() as session:
                idempotency.purge(session, now)
        except Exception:
            log.exception("sweep_idempotency_purge_failed")
            tally.errors += 1
    report = SweepReport(
        scanned=tally.scanned, recovered=tally.recovered, failed=tally.failed,
        still_running=tally.still_running, errors=tally.errors,
        elapsed_ms=int((timer() - started_at) * 1000), fanned_out=tally.fanned_out,
        actions=tuple(tally.actions), dry_run=dry_run, observed=tally.observed,
        observed_would_fail=tally.observed_would_fail, would=tuple(sorted(tally.would.items())),
        late_completions=late)
    log.info(report.line())
    if not dry_run:
        record(rt.sessions, report, now)
    return report


def _late_completions(rt: Runtime, *, dry_run: bool) -> int:
    """A job the library failed and settled, returning credits (a refund, or the released rest
    of a partial one: ``Ledger.refunded``), that something else then completed (an old
    worker finishing a legacy row): one ``completed_after_refund`` anomaly, so the operator
    decides — keep the refund, or re-charge it (README: "Adopting on a live platform"). The
    candidates come from a partial index holding only such completions, so the cost follows
    the anomalies, never the history. Returns the anomalies recorded (dry run: found)."""
    from ..ledger import COMPLETED_AFTER_REFUND, anomaly_recorded

    found = 0
    stmt = (select(Job).where(text(COMPLETED_AFTER_FAILURE)).order_by(Job.id)
            .limit(LATE_BATCH))
    if not dry_run:
        stmt = stmt.with_for_update(skip_locked=True)
    after: uuid.UUID | None = None
    while True:
        page = stmt if after is None else stmt.where(Job.id > after)
        with rt.sessions.begin() as session:
            jobs = list(session.execute(page).scalars())
            for job in jobs:
                if anomaly_recorded(session, job.id, COMPLETED_AFTER_REFUND):
                    continue
                refunded = rt.ledger.refunded(session, job.id)
                if refunded <= 0:
                    continue
                found += 1
                log.warning("completed_after_refund job_id=%s refunded=%s error_code=%s",
                            job.id, refunded, job.error_code)
                if not dry_run:
                    _anomaly_once(session, job, COMPLETED_AFTER_REFUND, rt.now(),
                                  {"refunded": refunded, "error_code": job.error_code,
                                   "completed_at": job.completed_at.isoformat()
                                   if job.completed_at else None})
        if len(jobs) < LATE_BATCH:
            return found
        after = jobs[-1].id


def _batch(rt: Runtime, phase: str, query: Callable[[_Cursor], Select[Job]],
           cursor: _Cursor, now: datetime, *, dry_run: bool,
           claim: bool) -> tuple[list[_Plan], list[uuid.UUID], _Cursor]:
    """Lock one batch (skipping rows another sweep holds), decide and claim each row, commit.
    Returns the plans, the ids whose decision failed, and the next cursor (None: done)."""
    stmt = query(cursor).limit(BATCH_SIZE)
    if not dry_run:
        stmt = stmt.with_for_update(skip_locked=True)
    plans: list[_Plan] = []
    errors: list[uuid.UUID] = []
    with rt.sessions.begin() as session:
        jobs = list(session.execute(stmt).scalars())
        for job in jobs:
            try:
                plans.append(_plan(rt, session, job, now, dry_run=dry_run, claim=claim))
            except Exception:
                log.exception("sweep_row_failed job_id=%s", job.id)
                errors.append(job.id)
        if not claim and not dry_run:  # past the budget: dead chains to the batch poller
            hand_over(rt, session, plans, now)
        last = _cursor_of(phase, jobs[-1]) if jobs else None
    return plans, errors, (last if len(jobs) == BATCH_SIZE else None)


def carry_out_all(steps: Sequence[Callable[[], str]], threads: int) -> list[str]:
    """Run each step (one row's carry-out, which catches its own errors) and return their
    outcomes in order: ``threads`` at a time in a bounded pool (the status reads, media
    downloads and each row's own transactions overlap), or one after the other when 1. Rows are
    independent: each was claimed on its own, and one's failure never touches another's."""
    if threads <= 1 or len(steps) <= 1:
        return [step() for step in steps]
    with ThreadPoolExecutor(max_workers=min(threads, len(steps)),
                            thread_name_prefix="reconcile-sweep") as pool:
        return list(pool.map(lambda step: step(), steps))


# a fanned-out chunk's row not started before its time ran short (the caller sends it again)
DEFERRED = "deferred"


def row_bound(rt: Runtime) -> timedelta:
    """How long one row of a fanned-out chunk may take: a status read's deadline, then storing
    one output (:func:`reconcile.lifecycle.storing_hold`), both scaled."""
    from ..lifecycle import storing_hold
    from ..lifecycle.batch import claim_lease_of

    return claim_lease_of(rt.settings) + storing_hold(rt.settings, 1)


def reconcile_jobs(rt: Runtime, job_ids: Sequence[uuid.UUID], *, threads: int = 1,
                   start_by: float | None = None,
                   clock: Callable[[], float] = time.monotonic) -> list[str]:
    """:func:`reconcile_job` for each of ``job_ids`` (a fanned-out chunk), ``threads`` at a
    time; the outcomes in order. A row's error is its own outcome (``error``).

    ``start_by`` (a ``clock`` time): a row past the first ``threads`` that would start after it
    is not started (:data:`DEFERRED`): the first round always runs, as a chunk of one round
    did, and a later row starts only while a row's whole bound still fits the caller's time
    (the Celery task's soft time limit less :func:`row_bound`)."""
    def one(n: int, job_id: uuid.UUID) -> Callable[[], str]:
        def step() -> str:
            if start_by is not None and n >= threads and clock() >= start_by:
                return DEFERRED
            try:
                return reconcile_job(rt, job_id)
            except Exception:
                log.exception("reconcile_job_failed job_id=%s", job_id)
                return "error"
        return step

    return carry_out_all([one(n, job_id) for n, job_id in enumerate(job_ids)], threads)


def reconcile_job(rt: Runtime, job_id: uuid.UUID, *, now: datetime | None = None,
                  dry_run: bool = False) -> str:
    """Apply the decision table to one job (the per-job task of a fanned-out tick); returns the
    outcome (``completed``, ``failed``, ``in_flight``, ``left``, ``busy``, ``missing`` …)."""
    now = now or rt.now()
    stmt = select(Job).where(Job.id == job_id)
    if not dry_run:
        stmt = stmt.with_for_update(skip_locked=True)
    with rt.sessions.begin() as session:
        job = session.execute(stmt).scalar_one_or_none()
        if job is None:
            exists = session.execute(select(Job.id).where(Job.id == job_id)).first()
            outcome, plan = ("busy" if exists else "missing"), None
        else:
            plan = _plan(rt, session, job, now, dry_run=dry_run, alone=True)
    if plan is not None:
        outcome = _run(rt, plan, None)
    action = plan.decision.action if plan is not None else Action.LEAVE
    log.info("reconcile_job_outcome job_id=%s action=%s outcome=%s", job_id, action, outcome)
    return outcome
