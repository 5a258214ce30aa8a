"""The reconcile sweep (DESIGN.md §6): one tick over in-flight and unsettled jobs.

A tick reads candidate rows in batches with ``SELECT … FOR UPDATE SKIP LOCKED`` (on SQLite a
plain select: ``BEGIN IMMEDIATE`` serialises writers). Inside that short transaction it decides
each row's action with the §6 table (:func:`decide`, rows in order, first match wins) and writes
the action's *claim* — a compare-and-set that makes the row this tick's to handle:

=================  ==========================================================================
action             claim written under the row lock
=================  ==========================================================================
fail               the failure itself (``mark_failed`` from in flight), refund after commit
reenqueue          ``create_enqueue_count + 1``, ``create_enqueued_at = now`` (2-min spacing)
mark_uncertain     ``submitting`` → ``uncertain`` (the transition is the whole action)
poll, evidence     the attempt (``count_attempt``: at most once per 5 scaled minutes)
resume             a new poll generation and lease (``start_new_chain``)
anomaly            the anomaly row, once per job
settle             ``next_poll_at`` pushed on by a short lease; the ledger refunds once
=================  ==========================================================================

A second sweep either skips the locked row or, after the commit, finds the claim taken (the row
is terminal, its attempt or re-enqueue is not due, its lease is alive) and leaves it — so
overlapping ticks never handle a row twice. Slow I/O (provider reads, media, listings) happens
after the commit. Each row is isolated: an error is logged with the job id and counted, and the
tick goes on. Past its time budget a tick hands the remaining actionable rows to ``fan_out``
(the per-job task, which runs :func:`reconcile_job`) and counts them as still running.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from sqlalchemy import Select, select, text, tuple_
from sqlalchemy.orm import Session

from . import adoption, batch_poll, evidence, idempotency, jobstore, lifecycle
from .db.models import COMPLETED_AFTER_FAILURE, Job, WebhookDelivery
from .errors import ErrorCode, ProviderError
from .events import add_event, publish
from .kinds import Kind
from .providers.base import AsyncProvider
from .runtime import Runtime
from .settlement import SettleOutcome
from .states import (
    ATTEMPT_SPACING,
    IN_FLIGHT,
    LEGACY_AGE,  # row 2's age (an unknown kind that never reached a provider): 5 minutes
    MAX_ATTEMPTS,
    MAX_CREATE_REENQUEUES,
    NOT_STARTED_AGE,
    SETTLE_BACKOFF_BASE,
    Status,
    Submission,
)

__all__ = ["Action", "Decision", "SweepAction", "SweepReport", "decide", "reconcile_job", "sweep"]

log = logging.getLogger("reconcile.sweep")

BATCH_SIZE = 25  # rows decided per locking transaction (not a cap: batches loop until done)
EVENT_REPUBLISH_AGE = timedelta(seconds=30)
# whoever persists a failure settles it right after; the sweep steps in only once a due
# settlement has waited this long (so it never races a live settler, its own included)
SETTLE_GRACE = timedelta(seconds=30)
# clock skew allowed between us and a provider when listing tasks "created after" our claim
LISTING_SLACK = timedelta(minutes=2)
LATE_BATCH = 100  # late completions checked per transaction


class Action(StrEnum):
    LEAVE = "leave"
    FAIL = "fail"
    REENQUEUE = "reenqueue"
    MARK_UNCERTAIN = "mark_uncertain"
    POLL = "poll"
    RESUME = "resume"
    EVIDENCE = "evidence"
    ANOMALY = "anomaly"
    SETTLE = "settle"


# actions that try to bring a job to its result (a dry run's would_recover)
RECOVERING = ("poll", "resume", "evidence", "reenqueue")


@dataclass(frozen=True)
class Decision:
    """Which §6 row matched (``row``) and what to do; ``resume``: poll, then a new chain."""

    row: str
    action: Action
    resume: bool = False


@dataclass(frozen=True)
class SweepAction:
    """What a tick did to one job (rows it merely looked at are not listed)."""

    job_id: uuid.UUID
    row: str
    action: str
    outcome: str


@dataclass(frozen=True)
class SweepReport:
    """One tick's counts. ``recovered``/``failed``: settled inside the tick (a retried refund
    counts as failed); rows left in flight, or handed to workers, count as ``still_running``."""

    scanned: int
    recovered: int
    failed: int
    still_running: int
    errors: int
    elapsed_ms: int
    fanned_out: int = 0
    actions: tuple[SweepAction, ...] = ()
    dry_run: bool = False
    # what observe-only rows (LEGACY_SWEEP=observe, OBSERVE_ONLY_KINDS) would have had done
    observed: int = 0
    observed_would_fail: int = 0
    # dry run: the decided actions that would run (observe-only rows excluded)
    would: tuple[tuple[str, int], ...] = ()
    late_completions: int = 0  # completed_after_refund anomalies found this tick

    def line(self) -> str:
        if self.dry_run:
            return self._dry_line()
        observed = (f"observed={self.observed} would_fail={self.observed_would_fail} "
                    if self.observed else "")
        return (f"[reconcile] scanned={self.scanned} recovered={self.recovered} "
                f"failed={self.failed} stillRunning={self.still_running} "
                f"errors={self.errors} {observed}({self.elapsed_ms}ms)")

    def _dry_line(self) -> str:
        would = dict(self.would)
        recover = sum(would.get(a, 0) for a in RECOVERING)
        other = sum(would.get(a, 0) for a in (Action.MARK_UNCERTAIN, Action.ANOMALY))
        return (f"[reconcile] DRY RUN scanned={self.scanned} would_recover={recover} "
                f"would_fail={would.get(Action.FAIL, 0)} would_settle={would.get(Action.SETTLE, 0)} "
                f"would_other={other} observed={self.observed} "
                f"observed_would_fail={self.observed_would_fail} errors={self.errors} "
                f"({self.elapsed_ms}ms)")


# ----------------------------------------------------------------------------- the §6 table


@dataclass(frozen=True)
class _Row:
    """One job as the table sees it: the row, its kind (None: unknown) and the tick's time."""

    rt: Runtime
    job: Job
    kind: Kind | None
    now: datetime

    def aged(self, since: datetime | None, age: timedelta) -> bool:
        return since is not None and self.now - since >= self.rt.settings.scaled(age)

    def past_threshold(self) -> bool:
        return self.kind is not None and lifecycle.past_threshold(self.rt, self.job, self.kind, self.now)

    def attempt_due(self) -> bool:
        last = self.job.reconcile_last_attempt_at
        return last is None or self.aged(last, ATTEMPT_SPACING)

    def lease_expired(self) -> bool:
        if self.job.poll_due_at is not None and self.rt.settings.poll_mode == "batch":
            # a batch-polled row is never resumed: it is due, or claimed until its batch lease
            # ends and then due again (a dead poller costs one lease, not a new chain)
            return False
        lease = self.job.poll_lease_expires_at
        return lease is None or lease <= self.now

    def fail_if_stale(self, row: str) -> Decision:
        return Decision(row, Action.FAIL if self.past_threshold() else Action.LEAVE)


def _legacy(r: _Row) -> Decision | None:
    """1: a row nobody submitted through the library (seed phase 2's catch-all), bounded by
    the legacy cutoff, age and job types (``adoption``; DESIGN.md §10.11). In ``observe`` mode
    the FAIL is only logged and counted (:func:`_observed`)."""
    j = r.job
    if not adoption.is_foreign(j):
        return None
    if r.rt.settings.legacy_sweep == "off":
        return Decision("legacy_off", Action.LEAVE)
    why_not = adoption.legacy_candidate(r.rt, j, r.now)
    if why_not == "after_cutoff":  # another subsystem's row: never touched, in any mode
        return Decision("foreign_after_cutoff", Action.LEAVE)
    if why_not is not None:
        return Decision("legacy", Action.LEAVE)
    return Decision("legacy", Action.FAIL)


def _unknown_kind_stale(r: _Row) -> Decision | None:
    """2: an unknown kind that never reached a provider we could ask: the sync sweep."""
    j = r.job
    if j.provider_kind is None or r.kind is not None:
        return None
    if j.provider_task_id or j.submission_state is not None:
        return None
    if not r.aged(j.provider_call_started_at or j.started_at or j.created_at, LEGACY_AGE):
        return None
    return Decision("unknown_kind_stale", Action.FAIL)


def _unknown_kind(r: _Row) -> Decision | None:
    """3: an unknown kind with upstream state: report once, touch nothing (another process
    may have registered the kind)."""
    j = r.job
    if j.provider_kind is None or r.kind is not None:
        return None
    if not (j.provider_task_id or j.submission_state is not None):
        return None
    return Decision("unknown_kind", Action.ANOMALY)


def _platform_untracked(r: _Row) -> Decision | None:
    """4: a platform row with a known kind and no upstream handle: as a sync kind."""
    j = r.job
    if j.submission_state is not None or r.kind is None:
        return None
    if j.provider_task_id and not r.kind.sync:
        return None
    return r.fail_if_stale("platform_untracked")


def _platform_task(r: _Row) -> Decision | None:
    """5: a platform row with a task id: as ``accepted`` once past the threshold (a NULL poll
    lease is not expired before it: the library never starts a chain on it earlier)."""
    j = r.job
    if j.submission_state is not None or r.kind is None or not j.provider_task_id:
        return None
    if not r.past_threshold():
        return Decision("platform_task", Action.LEAVE)
    return _accepted_action(r, "platform_task")


def _not_started(r: _Row) -> Decision | None:
    """6 and 7: the create never ran (async: re-enqueue, bounded) or the sync request died."""
    j, kind = r.job, r.kind
    if j.submission_state != Submission.NOT_STARTED or kind is None:
        return None
    if kind.sync:
        stale = r.aged(j.created_at, kind.stale_threshold)
        return Decision("not_started_sync", Action.FAIL if stale else Action.LEAVE)
    due = (r.aged(j.created_at, NOT_STARTED_AGE)
           and (j.create_not_before is None or j.create_not_before <= r.now)
           and (j.create_enqueued_at is None or r.aged(j.create_enqueued_at, NOT_STARTED_AGE)))
    if not due:
        return Decision("not_started", Action.LEAVE)
    if (j.create_enqueue_count or 0) >= MAX_CREATE_REENQUEUES:
        return Decision("not_started_exhausted", Action.FAIL)
    return Decision("not_started", Action.REENQUEUE)


def _submitting(r: _Row) -> Decision | None:
    """8 and 9: a create in progress; once its lease is gone nobody knows whether it landed."""
    j, kind = r.job, r.kind
    if j.submission_state != Submission.SUBMITTING or kind is None:
        return None
    if j.claim_expires_at is not None and j.claim_expires_at > r.now:
        return Decision("submitting", Action.LEAVE)
    if not kind.sync:
        return Decision("submitting_expired", Action.MARK_UNCERTAIN)
    return r.fail_if_stale("submitting_sync_expired")  # seed D2


def _accepted(r: _Row) -> Decision | None:
    """10 and 11: an accepted task: poll once when an attempt is due, resume a dead chain."""
    j, kind = r.job, r.kind
    if j.submission_state != Submission.ACCEPTED or kind is None:
        return None
    if kind.sync:  # a sync call holds no upstream handle: nothing to poll
        return r.fail_if_stale("accepted_sync")
    if not j.provider_task_id:
        return Decision("accepted", Action.LEAVE)
    return _accepted_action(r, "accepted")


def _accepted_action(r: _Row, row: str) -> Decision:
    if r.past_threshold() and r.attempt_due():
        return Decision(row, Action.POLL, resume=r.lease_expired())
    if r.lease_expired():
        return Decision(row, Action.RESUME)
    return Decision(row, Action.LEAVE)


def _uncertain(r: _Row) -> Decision | None:
    """12: look for evidence every 5 minutes; never refunded or resubmitted automatically."""
    j, kind = r.job, r.kind
    if j.submission_state != Submission.UNCERTAIN or kind is None:
        return None
    if kind.sync:  # never made by the library today; an old stray create message did (hole 12)
        return r.fail_if_stale("uncertain_sync")
    if not r.attempt_due():
        return Decision("uncertain", Action.LEAVE)
    return Decision("uncertain", Action.EVIDENCE)


_TABLE: tuple[Callable[[_Row], Decision | None], ...] = (
    _legacy, _unknown_kind_stale, _unknown_kind, _platform_untracked, _platform_task,
    _not_started, _submitting, _accepted, _uncertain,
)
_NO_MATCH = Decision("none", Action.LEAVE)
_ERROR = Decision("error", Action.LEAVE)


def decide(rt: Runtime, job: Job, now: datetime) -> Decision:
    """The §6 action for one row (reads nothing but the row, the kind, settings and the
    adoption time, which the runtime reads from the database once)."""
    if job.status in (Status.FAILED, Status.CANCELLED):
        due = jobstore.is_settlement_due(job, _settle_cutoff(rt, now))
        return Decision("unsettled", Action.SETTLE) if due else _NO_MATCH  # 13
    if job.status not in IN_FLIGHT:
        return _NO_MATCH
    row = _Row(rt, job, rt.kind(job.provider_kind), now)
    for check in _TABLE:
        decision = check(row)
        if decision is not None:
            return decision
    return _NO_MATCH


# ----------------------------------------------------------------------------- claims


@dataclass
class _Plan:
    """A decided row: ``outcome`` is final when set, else the work left for after commit."""

    job: Job
    decision: Decision
    kind: Kind | None = None
    outcome: str | None = None
    generation: int | None = None  # a new poll chain to enqueue


def _plan(rt: Runtime, session: Session, job: Job, now: datetime, *, dry_run: bool,
          claim: bool = True) -> _Plan:
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
    else:
        with session.begin_nested():  # a bad row rolls back alone
            _claim(rt, session, plan, now)
    return plan


def _observed(rt: Runtime, job: Job, decision: Decision) -> bool:
    """Only logged: a legacy FAIL under ``LEGACY_SWEEP=observe``, or an observe-only kind."""
    if decision.row == "legacy" and rt.settings.legacy_sweep == "observe":
        return True
    return adoption.observe_only(rt.settings, job)


def _claim(rt: Runtime, session: Session, plan: _Plan, now: datetime) -> None:
    job, action, kind = plan.job, plan.decision.action, plan.kind
    spacing = rt.settings.scaled(ATTEMPT_SPACING)
    claimed: Job | None = job
    if action is Action.FAIL:
        where = ((Job.submission_state == Submission.NOT_STARTED,)
                 if plan.decision.row == "not_started_exhausted" else ())
        claimed = _persist_failure(rt, session, job, now, plan.decision.row, where)
    elif action is Action.REENQUEUE:
        claimed = jobstore.claim_reenqueue(session, job.id, now,
                                           rt.settings.scaled(NOT_STARTED_AGE))
    elif action is Action.MARK_UNCERTAIN:
        claimed = jobstore.mark_uncertain(
            session, job.id, token=None, now=now, code=ErrorCode.UPSTREAM_SUBMISSION_UNCERTAIN,
            detail={"reason": "submission claim expired before the id was saved", "via": "sweep",
                    "submissionOutcome": "uncertain"})
        plan.outcome = "uncertain" if claimed is not None else "lost"
    elif action in (Action.POLL, Action.EVIDENCE):
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


def _persist_failure(rt: Runtime, session: Session, job: Job, now: datetime, row: str,
                     where: tuple[Any, ...]) -> Job | None:
    """The persist half of ``lifecycle.fail_job`` (the refund settles after commit)."""
    failed = jobstore.mark_failed(
        session, job.id, now=now, code=ErrorCode.RECONCILE_NO_RECOVERY,
        message="reconcile_no_recovery", detail={"reason": row, "via": "sweep"}, where=where)
    if failed is not None:
        add_event(session, failed, "failed", now, {"code": str(ErrorCode.RECONCILE_NO_RECOVERY)},
                  rt=rt)
    return failed


def _settle_cutoff(rt: Runtime, now: datetime) -> datetime:
    return now - rt.settings.scaled(SETTLE_GRACE)


def _anomaly_once(session: Session, job: Job, kind: str, now: datetime,
                  detail: dict[str, Any]) -> bool:
    """One ``credit_anomalies`` row of ``kind`` per job (the caller holds the job row lock)."""
    if not jobstore.record_anomaly(session, job_id=job.id, user_id=job.user_id, kind=kind,
                                   detail=detail, now=now, once=True):
        return False
    log.warning("sweep_anomaly job_id=%s kind=%s", job.id, kind)
    return True


# ----------------------------------------------------------------------------- after commit


def _carry_out(rt: Runtime, plan: _Plan, fan_out: Callable[[uuid.UUID], None] | None) -> str:
    if plan.outcome is not None:
        return plan.outcome
    job, action = plan.job, plan.decision.action
    if fan_out is not None:
        fan_out(job.id)
        return "fanned_out"
    if action is Action.FAIL:
        log.info("job_failed job_id=%s code=%s via=sweep row=%s", job.id,
                 ErrorCode.RECONCILE_NO_RECOVERY, plan.decision.row)
        lifecycle.settle(rt, job.id)
        publish(rt, job_id=job.id)
        return "failed"
    if action is Action.REENQUEUE:
        rt.enqueue_create(job.id)
        return "reenqueued"
    if action is Action.RESUME:
        return _enqueue_chain(rt, plan) or "lost"
    if action is Action.POLL:
        return _poll_once(rt, plan)
    if action is Action.EVIDENCE:
        return _evidence(rt, plan)
    if action is Action.SETTLE:
        if lifecycle.settle(rt, job.id) is SettleOutcome.SETTLED:
            publish(rt, job_id=job.id)
            return "settled"
        with rt.sessions() as session:
            current = jobstore.load(session, job.id)
        return "settle_failed" if current is not None and current.credits_actual is None else "lost"
    return "left"


def _enqueue_chain(rt: Runtime, plan: _Plan) -> str | None:
    if plan.generation is None:
        return None
    if rt.settings.poll_mode == "batch":  # made due in the claim: the batch poller reads it
        log.info("poll_made_due job_id=%s generation=%s via=sweep", plan.job.id, plan.generation)
        return "due"
    log.info("poll_chain_resumed job_id=%s generation=%s via=sweep", plan.job.id, plan.generation)
    rt.enqueue_poll(plan.job.id, plan.generation, 0, 0.0)
    return "resumed"


def _poll_once(rt: Runtime, plan: _Plan) -> str:
    """Row 10: one read through ``lifecycle.observe``. The attempt was counted by the claim,
    so observe's own count loses its spacing CAS: exhaustion is checked here."""
    job, kind = plan.job, plan.kind
    assert kind is not None
    outcome = lifecycle.observe(rt, job, kind, via="sweep")
    if outcome in ("in_flight", "error") and job.reconcile_attempts >= MAX_ATTEMPTS:
        with rt.sessions() as session:
            current = jobstore.load(session, job.id)
        if current is not None and current.status in IN_FLIGHT:
            outcome = lifecycle.exhaust(rt, current)
    if outcome in ("in_flight", "error"):
        _enqueue_chain(rt, plan)
    return outcome


def _evidence(rt: Runtime, plan: _Plan) -> str:
    """Row 12: adopt the upstream id on evidence; else the (claimed) attempt stands, and at
    MAX_ATTEMPTS one ``uncertain_unresolved`` anomaly — the reservation stays for an operator."""
    job, kind = plan.job, plan.kind
    assert kind is not None
    found = _find_evidence(rt, job, kind)
    if found is not None:
        task_id, source = found
        return "adopted" if lifecycle.adopt_upstream_id(rt, job.id, task_id, source=source) else "lost"
    if job.reconcile_attempts < MAX_ATTEMPTS:
        return "not_found"
    with rt.sessions.begin() as session:
        current = jobstore.load(session, job.id, lock=True)
        if current is None or current.submission_state != Submission.UNCERTAIN:
            return "lost"
        _anomaly_once(session, current, "uncertain_unresolved", rt.now(),
                      {"attempts": current.reconcile_attempts})
    return "unresolved"


def _find_evidence(rt: Runtime, job: Job, kind: Kind) -> tuple[str, str] | None:
    """(upstream id, source) from a stored webhook delivery naming this job, else a provider
    listing. A delivery counts only as :mod:`reconcile.evidence` allows: same provider family
    and kind, bound by a provider-signed field, and — where the provider has one — confirmed
    by a read echoing this job's planted id before anything changes."""
    client = rt.client(kind)
    if not isinstance(client, AsyncProvider):
        return None
    with rt.sessions() as session:
        rows = session.execute(
            select(WebhookDelivery).where(
                WebhookDelivery.job_id == job.id, WebhookDelivery.upstream_id.is_not(None))
            .order_by(WebhookDelivery.received_at)).scalars().all()
    tried: set[str] = set()
    for row in rows:
        upstream_id = row.upstream_id or ""
        if upstream_id in tried or not lifecycle.usable_task_id(upstream_id):
            continue
        tried.add(upstream_id)
        if _confirmed_evidence(rt, job, kind, client, row):
            return upstream_id, "webhook"
    since = (job.provider_call_started_at or job.created_at) - LISTING_SLACK
    try:
        listed = client.find_created(str(job.id), since)
    except ProviderError as exc:
        log.warning("evidence_listing_failed job_id=%s error=%s", job.id, exc.message)
        return None
    if listed is None or not lifecycle.usable_task_id(listed.task_id):
        return None  # an id no row can hold is no evidence (the operator gets the anomaly)
    return listed.task_id, "listing"


def _confirmed_evidence(rt: Runtime, job: Job, kind: Kind, client: AsyncProvider,
                        row: WebhookDelivery) -> bool:
    judged = evidence.assess(row, str(job.id), kind, rt.settings)
    if not judged.usable:
        log.warning("evidence_operator_only job_id=%s provider=%s upstream_id=%s reason=%s",
                    job.id, row.provider, row.upstream_id, judged.reason)
        return False
    echoed = None
    if judged.needs_read:
        try:
            echoed = client.poll(row.upstream_id or "", model=job.provider_model).planted_job_id
        except ProviderError as exc:
            log.warning("evidence_read_failed job_id=%s upstream_id=%s error=%s", job.id,
                        row.upstream_id, exc.message)
            return False
    if evidence.confirmed(judged, echoed, str(job.id)):
        return True
    log.warning("evidence_mismatch job_id=%s upstream_id=%s echoed=%s", job.id, row.upstream_id,
                echoed)
    return False


# ----------------------------------------------------------------------------- the tick


@dataclass
class _Tally:
    scanned: int = 0
    recovered: int = 0
    failed: int = 0
    still_running: int = 0
    errors: int = 0
    fanned_out: int = 0
    actions: list[SweepAction] = field(default_factory=list)
    observed: int = 0
    observed_would_fail: int = 0
    would: dict[str, int] = field(default_factory=dict)

    def add(self, job_id: uuid.UUID, decision: Decision, outcome: str) -> None:
        self.scanned += 1
        if outcome == "observe_only":
            self.observed += 1
            self.observed_would_fail += decision.action is Action.FAIL
        elif outcome == "dry_run":
            self.would[str(decision.action)] = self.would.get(str(decision.action), 0) + 1
        if outcome == "completed":
            self.recovered += 1
        elif outcome in ("failed", "settled"):
            self.failed += 1
        elif outcome in ("error", "settle_failed"):
            self.errors += 1
        elif outcome != "lost":
            self.still_running += 1
            self.fanned_out += outcome == "fanned_out"
        if outcome != "left":
            self.actions.append(SweepAction(job_id, decision.row, str(decision.action), outcome))
            log.info("sweep_action job_id=%s row=%s action=%s outcome=%s", job_id, decision.row,
                     decision.action, outcome)


_Cursor = tuple[Any, ...] | None


def _phases(settle_cutoff: datetime
            ) -> Iterator[tuple[str, Callable[[_Cursor], Select[tuple[Job]]]]]:
    """Keyset-paged candidate queries: in-flight rows through ``jobs_inflight_idx`` (those with
    no provider call yet, then by ``provider_call_started_at``), then unsettled failures due
    by ``settle_cutoff`` through ``jobs_unsettled_idx``."""
    def unstarted(after: _Cursor) -> Select[tuple[Job]]:
        stmt = select(Job).where(jobstore.in_flight(), Job.provider_call_started_at.is_(None))
        if after is not None:
            stmt = stmt.where(Job.id > after[-1])
        return stmt.order_by(Job.id)

    def started(after: _Cursor) -> Select[tuple[Job]]:
        stmt = select(Job).where(jobstore.in_flight(), Job.provider_call_started_at.is_not(None))
        if after is not None:
            stmt = stmt.where(tuple_(Job.provider_call_started_at, Job.id) > tuple_(*after))
        return stmt.order_by(Job.provider_call_started_at, Job.id)

    def unsettled(after: _Cursor) -> Select[tuple[Job]]:
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
          timer: Callable[[], float] = time.monotonic) -> SweepReport:
    """One tick of the §6 table over every candidate row; logs and returns the report.

    ``now`` (default ``rt.now()``) is the tick's decision time. ``budget`` is the seconds handled
    inline (default ``sweep_time_budget``, scaled); past it, actionable rows go to ``fan_out``
    (None: keep going inline). ``dry_run`` and observe-only kinds only log what would happen.
    """
    started_at = timer()
    now = now or rt.now()
    limit = budget if budget is not None else rt.settings.scaled(
        timedelta(seconds=rt.settings.sweep_time_budget)).total_seconds()
    tally = _Tally()
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
            for plan in plans:
                tally.add(plan.job.id, plan.decision,
                          _run(rt, plan, fan_out if over and plan.outcome is None else None))
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
    return report


def _late_completions(rt: Runtime, *, dry_run: bool) -> int:
    """A job the library failed and refunded that something else then completed (an old
    worker finishing a legacy row): one ``completed_after_refund`` anomaly, so the operator
    decides — keep the refund, or re-charge it (README: "Adopting on a live platform"). The
    candidates come from a partial index holding only such completions, so the cost follows
    the anomalies, never the history. Returns the anomalies recorded (dry run: found)."""
    from .ledger import COMPLETED_AFTER_REFUND, anomaly_recorded

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


def _batch(rt: Runtime, phase: str, query: Callable[[_Cursor], Select[tuple[Job]]],
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
        last = _cursor_of(phase, jobs[-1]) if jobs else None
    return plans, errors, (last if len(jobs) == BATCH_SIZE else None)


def _run(rt: Runtime, plan: _Plan, fan_out: Callable[[uuid.UUID], None] | None) -> str:
    try:
        return _carry_out(rt, plan, fan_out)
    except Exception:
        log.exception("sweep_row_failed job_id=%s row=%s action=%s", plan.job.id,
                      plan.decision.row, plan.decision.action)
        return "error"


def reconcile_job(rt: Runtime, job_id: uuid.UUID, *, now: datetime | None = None,
                  dry_run: bool = False) -> str:
    """Apply the §6 table to one job (the per-job task of a fanned-out tick); returns the
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
            plan = _plan(rt, session, job, now, dry_run=dry_run)
    if plan is not None:
        outcome = _run(rt, plan, None)
    action = plan.decision.action if plan is not None else Action.LEAVE
    log.info("reconcile_job_outcome job_id=%s action=%s outcome=%s", job_id, action, outcome)
    return outcome
