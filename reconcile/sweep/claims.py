"""Internal: the sweep's claims — each decided row's compare-and-set, written under its row lock.

:func:`decide` is the runtime-facing wrapper of the pure table (:func:`.table.decide`): it looks
the kind up and reads the legacy cutoff only where the table needs it. :func:`_plan` decides one
locked row and, unless it is left, observed only or a dry run, writes the action's claim
(:func:`_claim`); the work left for after the commit is the plan's.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session

from .. import jobstore, lifecycle
from ..db.models import Job
from ..errors import ErrorCode
from ..jobstore import adoption
from ..jobstore.events import add_event
from ..kinds import Kind
from ..lifecycle import batch as batch_poll
from ..runtime import Runtime
from ..states import (
    ATTEMPT_SPACING,
    IN_FLIGHT,
    NOT_STARTED_AGE,
    SETTLE_BACKOFF_BASE,
    Submission,
)
from . import table
from .table import Action, Decision

log = logging.getLogger("reconcile.sweep")

BATCH_SIZE = 25  # rows decided per locking transaction (not a cap: batches loop until done)


def decide(rt: Runtime, job: Job, now: datetime) -> Decision:
    """The decision-table action for one row (reads nothing but the row, the kind, settings and the
    adoption time, which the runtime reads from the database once): :func:`.table.decide` with
    the runtime's kind registry and legacy cutoff."""
    kind = rt.kind(job.provider_kind) if job.status in IN_FLIGHT else None
    needs = table.needs_legacy_cutoff(rt.settings, job, kind)
    cutoff = adoption.legacy_cutoff(rt) if needs else None
    return table.decide(rt.settings, job, kind, now, legacy_cutoff=cutoff)


@dataclass
class _Plan:
    """A decided row: ``outcome`` is final when set, else the work left for after commit."""

    job: Job
    decision: Decision
    kind: Kind | None = None
    outcome: str | None = None
    generation: int | None = None  # a new poll chain to enqueue
    # decided by the heartbeat reaper, after it ended the claims of a worker whose heartbeat
    # lapsed: a resume here does not show that no poller holds the row (a slow worker may still
    # be storing the success it read), so the reader leaves the job's exhaustion to its poller
    reaped: bool = False


def _plan(rt: Runtime, session: Session, job: Job, now: datetime, *, dry_run: bool,
          claim: bool = True, alone: bool = False) -> _Plan:
    """Decide ``job``'s row and claim its action. Each row's claim is a SAVEPOINT of the page's
    transaction, so a bad row rolls back alone; ``alone``: the transaction holds this row only
    (a per-job task), so an error rolls it all back and no SAVEPOINT is needed."""
    decision = decide(rt, job, now)
    plan = _Plan(job, decision, rt.kind(job.provider_kind))
    if decision.action is Action.LEAVE:
        plan.outcome = "left"
    elif _observed(rt, job, decision) or dry_run:
        # observe wins over dry run: a dry run reports what the real tick would do
        plan.outcome = "observe_only" if _observed(rt, job, decision) else "dry_run"
        log.info("sweep_would job_id=%s row=%s action=%s mode=%s", job.id, decision.row,
                 decision.action, plan.outcome)
    elif not claim:
        plan.outcome = None  # fanned out: the per-job task claims it itself
    elif alone:
        _claim(rt, session, plan, now)
    else:
        with session.begin_nested():  # a bad row rolls back alone
            _claim(rt, session, plan, now)
    return plan


def _observed(rt: Runtime, job: Job, decision: Decision) -> bool:
    """Only logged: a legacy FAIL under ``LEGACY_SWEEP=observe``, or an observe-only kind.
    Observe-only governs decisions about the upstream, never a settlement the library already
    owes (the ``unsettled`` row: its failure is saved, its refund is not): that one is always carried out."""
    if decision.action is Action.SETTLE:
        return False
    if decision.observable and rt.settings.legacy_sweep == "observe":
        return True
    return adoption.observe_only(rt.settings, job)


def _claim(rt: Runtime, session: Session, plan: _Plan, now: datetime) -> None:
    job, action, kind = plan.job, plan.decision.action, plan.kind
    spacing = rt.settings.scaled(ATTEMPT_SPACING)
    claimed: Job | None = job
    if action is Action.FAIL:
        claimed = _persist_failure(rt, session, job, now, plan.decision,
                                   _GUARDS.get(plan.decision.guard, ()))
    elif action is Action.REENQUEUE:
        claimed = jobstore.claim_reenqueue(session, job.id, now,
                                           rt.settings.scaled(NOT_STARTED_AGE))
    elif action is Action.MARK_UNCERTAIN:
        claimed = jobstore.mark_uncertain(
            session, job.id, token=None, now=now, code=ErrorCode.UPSTREAM_SUBMISSION_UNCERTAIN,
            detail={"reason": "submission claim expired before the id was saved", "via": "sweep",
                    "submissionOutcome": "uncertain"})
        plan.outcome = "uncertain" if claimed is not None else "lost"
    elif plan.decision.counts_attempt:
        claimed = jobstore.claim_attempt(session, job.id, now, spacing)  # keeps the last error
    elif action is Action.SETTLE:
        claimed = jobstore.claim_settlement(session, job.id, _settle_cutoff(rt, now),
                                            now + rt.settings.scaled(SETTLE_BACKOFF_BASE))
    elif action is Action.ANOMALY:
        fresh = _anomaly_once(session, job, "unknown_provider_kind", now,
                              {"provider_kind": job.provider_kind,
                               "submission_state": job.submission_state,
                               "provider_task_id": job.provider_task_id})
        plan.outcome = "anomaly" if fresh else "left"
    if claimed is None:
        plan.outcome = "lost"
        return
    plan.job = claimed
    if kind is not None and (action is Action.RESUME or plan.decision.resume):
        age = now - (claimed.provider_call_started_at or now)
        if rt.settings.poll_mode == "batch":  # no chain: a new generation, due now (no message)
            fresh_chain = jobstore.make_due(session, job.id, now, batch_poll.claim_lease(rt))
        else:
            fresh_chain = jobstore.start_new_chain(session, job.id, now,
                                                   lifecycle.poll_lease(rt, kind, age))
        if fresh_chain is None:
            plan.outcome = "lost" if action is Action.RESUME else plan.outcome
        else:
            plan.job, plan.generation = fresh_chain, fresh_chain.poll_generation


def hand_over(rt: Runtime, session: Session, plans: list[_Plan], now: datetime) -> None:
    """Past the tick's time budget, in batch mode, a row the batch poller can read now goes to
    it instead of a fanned-out task, which would read it one job at a time (and race the
    poller for a due row). A dead chain's row (``RESUME``, or a ``POLL`` that resumes: in
    batch mode only a row with no due time, ``table._Row.lease_expired``) is made due now, the
    page's in one statement (:func:`jobstore.make_due_all`, :func:`jobstore.make_due`'s
    write), as a ``RESUME`` claim makes one; a ``POLL`` of a row due already is the poller's
    as it is. Either way its outcome is ``due``, and the poller's reads count its attempts
    past the stale threshold and exhaust it (``lifecycle.observe``), as the sweep's poll
    would. Any other row (another action, a due time still ahead, a row the write missed, the
    page's rows when its statement fails) is left to the fan-out. Runs in the page's
    transaction, its rows locked."""
    if rt.settings.poll_mode != "batch":
        return
    readable = [p for p in plans if p.outcome is None and p.kind is not None and not p.kind.sync
                and p.job.provider_task_id
                and p.decision.action in (Action.RESUME, Action.POLL)]
    undated = [p for p in readable if p.job.poll_due_at is None
               and (p.decision.action is Action.RESUME or p.decision.resume)]
    for plan in readable:
        due = plan.job.poll_due_at
        if due is not None and due <= now:  # compared as the table compares the lease
            plan.outcome = "due"
    try:  # one statement for the page; a row it cannot write (a platform's trigger or check)
        # fails it alone: the page's rows then fan out, as before this hand-over
        with session.begin_nested():
            made = jobstore.make_due_all(session, [p.job.id for p in undated], now,
                                         batch_poll.claim_lease(rt))
    except Exception:
        log.exception("sweep_hand_over_failed rows=%d: fanned out instead", len(undated))
        made = {}
    for plan in undated:
        generation = made.get(plan.job.id)
        if generation is not None:
            log.info("poll_made_due job_id=%s generation=%s via=sweep", plan.job.id, generation)
            plan.outcome, plan.generation = "due", generation


# the SQL each guard of the table (table.Guard) adds to a decision's write
_GUARDS: dict[table.Guard | None, tuple[Any, ...]] = {
    table.Guard.STILL_NOT_STARTED: (Job.submission_state == Submission.NOT_STARTED,),
}


def _persist_failure(rt: Runtime, session: Session, job: Job, now: datetime, decision: Decision,
                     where: tuple[Any, ...]) -> Job | None:
    """The persist half of ``lifecycle.fail_job`` (the refund settles after commit), with the
    decision's error code."""
    failed = jobstore.mark_failed(
        session, job.id, now=now, code=decision.code, message=str(decision.code).lower(),
        detail={"reason": decision.row, "via": "sweep"}, where=where)
    if failed is not None:
        add_event(session, failed, "failed", now, {"code": str(decision.code)}, rt=rt)
    return failed


def _settle_cutoff(rt: Runtime, now: datetime) -> datetime:
    return table.settle_cutoff(rt.settings, now)


def _anomaly_once(session: Session, job: Job, kind: str, now: datetime,
                  detail: dict[str, Any]) -> bool:
    """One ``credit_anomalies`` row of ``kind`` per job (the caller holds the job row lock)."""
    if not jobstore.record_anomaly(session, job_id=job.id, user_id=job.user_id, kind=kind,
                                   detail=detail, now=now, once=True):
        return False
    log.warning("sweep_anomaly job_id=%s kind=%s", job.id, kind)
    return True
