"""Internal: the explorer's invariants and quiescence (see :mod:`reconcile.testing.explorer`).

After the writers, and again once the job has been driven to quiescence the way production would
(queued messages run, time passes to the next deadline, the sweep ticks): at most one upstream
create and one completion; never completed after cancel; never cancel the polled task; at most
one settlement, exactly one once terminal and past the settle grace, and a failed or cancelled
job's exactly the one share rule's (``reconcile.settlement.refund_share`` of its
``settlement_cause`` under the deployment's policy, ``kept_of`` what was held: a full refund
when the share is 1, else a commit of the kept part); ``credits.audit`` clean; no
in-flight job left without a live path; no workflow execution failed solely by a node whose job
completed; no paid sync call for a cancelled job.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from fractions import Fraction
from typing import Any

from sqlalchemy import func, select

from ... import credits, jobstore, lifecycle
from ...db.models import CreditTransaction, Job, JobEvent, UsageLog, WorkflowExecution
from ...jobstore import horizon
from ...jobstore.events import cancel_requested
from ...lifecycle import batch as batch_poll
from ...settlement import kept_of, refund_share, settlement_cause, share_text
from ...states import (
    ATTEMPT_SPACING,
    IN_FLIGHT,
    NOT_STARTED_AGE,
    TERMINAL,
    Status,
    Submission,
)
from .common import SETTLE_GRACE, SYNC_KIND
from .model import Context, Scenario


def _events(session: Any, job_id: uuid.UUID) -> list[str]:
    return list(session.execute(select(JobEvent.type).where(JobEvent.job_id == job_id)
                                .order_by(JobEvent.id)).scalars())


def _txn_ids(session: Any, job_id: uuid.UUID) -> set[str]:
    return set(session.execute(select(CreditTransaction.id)
                               .where(CreditTransaction.job_id == job_id)).scalars())


def _upstream_calls(ctx: Context, job: Job) -> int:
    if job.provider_kind == SYNC_KIND or job.submission_state is None:
        return int(ctx.facts.get("paid_calls", 0))
    return int(ctx.sim.creates(str(ctx.job_id)))


def check(rt: Any, ctx: Context, scenario: Scenario, phase: str, *, final: bool = False) -> list[str]:
    """The invariants on the scenario's job (``final``: also settlement, liveness, audit)."""
    found: list[str] = []
    with rt.sessions() as session:
        job = jobstore.load(session, ctx.job_id)
        if job is None:
            return [f"job_missing ({phase})"]
        events = _events(session, ctx.job_id)
        txns = _txn_ids(session, ctx.job_id)
        execution = (session.get(WorkflowExecution, job.workflow_execution_id)
                     if job.workflow_execution_id else None)
        # the deployment's policy (the scenario's settings), as every process audits with it
        audit = credits.audit(session, now=ctx.clock.now, settings=rt.settings) if final else []
        rule = _rule(rt, ctx, session, job) if final and job.status in SETTLED_BY_RULE else None
        kept = _committed(session, ctx.job_id)
    calls = _upstream_calls(ctx, job)
    if calls > 1:
        found.append(f"two_creates: {calls} upstream creates/calls ({phase})")
    completions = events.count("completed")
    if completions > 1:
        found.append(f"two_completions: {completions} completed events ({phase})")
    if (job.status == Status.COMPLETED and "canceled" in events) or \
            (job.status == Status.CANCELLED and completions):
        found.append(f"completed_after_cancel: status {job.status}, events {events} ({phase})")
    for task in ctx.sim.tasks_for(str(ctx.job_id)):
        if task.forced and task.forced[1] == "canceled" and task.task_id == job.provider_task_id \
                and job.status != Status.CANCELLED:
            found.append(f"polled_task_cancelled: upstream {task.task_id} cancelled while the job "
                         f"polls it (job {job.status}) ({phase})")
    commit, refund = credits.commit_txn_id(ctx.job_id) in txns, credits.refund_txn_id(ctx.job_id) in txns
    if commit and refund:
        found.append(f"settled_twice: commit and refund ({phase})")
    if execution is not None and execution.status == "failed" and job.status == Status.COMPLETED \
            and _nodes(execution.failed_nodes) == [job.node_id]:
        found.append(f"node_failed_but_job_completed: execution failed {execution.failed_nodes} "
                     f"while job {job.node_id} completed ({phase})")
    if ctx.facts.get("paid_calls") and job.status == Status.CANCELLED:
        found.append(f"paid_call_for_cancelled_job ({phase})")
    if final:
        found += _final(job, commit, refund, kept, rule, audit, phase)
    for extra in scenario.extra_checks:
        found += extra(rt, ctx, phase)
    return found


# a failed or cancelled job: settled by the one share rule (reconcile.settlement.refund_share)
SETTLED_BY_RULE = (Status.FAILED, Status.CANCELLED)


@dataclass(frozen=True)
class _Rule:
    """What the one share rule gives a failed/cancelled job: its (cause, accepted), the share
    refunded, what the reservation held, and what the settlement must keep of it."""

    cause: str
    accepted: bool
    share: Fraction
    held: int
    kept: int

    def __str__(self) -> str:
        return (f"{self.cause}, accepted={self.accepted}: refund {share_text(self.share)} of "
                f"{self.held} held, keep {self.kept}")


def _rule(rt: Any, ctx: Context, session: Any, job: Job) -> _Rule:
    """The settlement the one rule gives ``job`` — :func:`settlement_cause`,
    :func:`refund_share` and :func:`kept_of` called, never re-derived — under the deployment's
    policy (``rt.settlement_policy``, the scenario's settings). What was held is the reservation
    net of legacy refunds (what the ledger writes from). The user asked to cancel when the
    library recorded it (its ``cancel_requested`` event) or when the provider shows the job's
    own task cancelled (only a user's cancel does that: ``polled_task_cancelled`` otherwise),
    so a cancel whose request was never recorded is still held to the cancel share."""
    asked = cancel_requested(session, job.id) or _own_task_cancelled(ctx, job)
    cause, accepted = settlement_cause(job, kind=rt.kind(job.provider_kind), cancel_requested=asked)
    share = refund_share(cause, accepted, rt.settlement_policy)
    reserved = session.execute(select(UsageLog.credits).where(UsageLog.job_id == job.id)
                               .order_by(UsageLog.created_at).limit(1)).scalar_one_or_none()
    held = max(0, int(reserved or 0) - credits.legacy_refunded(session, job.id))
    return _Rule(str(cause), accepted, share, held, kept_of(held, share))


def _own_task_cancelled(ctx: Context, job: Job) -> bool:
    return any(task.forced and task.forced[1] == "canceled" and task.task_id == job.provider_task_id
               for task in ctx.sim.tasks_for(str(ctx.job_id)))


def _committed(session: Any, job_id: uuid.UUID) -> int | None:
    """The library's settlement commit of the job (its amount), None without one."""
    txn = session.get(CreditTransaction, credits.commit_txn_id(job_id))
    return None if txn is None else int(txn.amount)


def _final(job: Job, commit: bool, refund: bool, kept: int | None, rule: _Rule | None,
           audit: Sequence[Any], phase: str) -> list[str]:
    found = []
    if job.status == Status.COMPLETED and not commit:
        found.append(f"unsettled: completed without a commit ({phase})")
    if rule is not None:
        found += _settled_by_rule(job, refund, kept, rule, phase)
    # only an async submission is held uncertain on purpose (evidence or an operator decides);
    # a sync call leaves nothing upstream to look up
    held = job.submission_state == Submission.UNCERTAIN and job.provider_kind != SYNC_KIND
    if job.status in IN_FLIGHT and not held:
        found.append(f"stuck_in_flight: {job.status}/{job.submission_state} with no live chain, "
                     f"claim or sweep path (last error {job.reconcile_last_error!r}) ({phase})")
    found += [f"audit: {d.kind} {d.detail} ({phase})" for d in audit]
    return found


def _settled_by_rule(job: Job, refund: bool, kept: int | None, rule: _Rule,
                     phase: str) -> list[str]:
    """A failed/cancelled job's settlement is exactly the rule's: a full refund (nothing kept)
    when its share is 1; otherwise a commit of the kept part, ``credits_actual`` the same."""
    if job.credits_actual is None or not (refund or kept is not None):
        return [f"unsettled: {job.status} without its settlement ({rule}) ({phase})"]
    if rule.share == 1:
        ok = refund and kept is None and job.credits_actual == 0
    else:
        ok = not refund and kept == rule.kept and job.credits_actual == rule.kept
    if ok:
        return []
    how = "a refund" if refund else f"a commit of {kept}"
    return [f"settled_off_rule: {job.status} settled by {how} (credits_actual "
            f"{job.credits_actual}); the rule gives {rule} ({phase})"]


def _nodes(value: Any) -> list[str]:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return [value]
    return [str(v) for v in value] if isinstance(value, list) else []


# ----------------------------------------------------------------------------- quiescence


def _drain(rt: Any, ctx: Context) -> None:
    """Run the messages queued so far the way workers would; what they enqueue (the next poll,
    a re-enqueued create) waits for the next round, as its countdown would make it."""
    queues = ctx.explorer.queues
    with queues.lock:
        creates, polls = list(queues.creates), list(queues.polls)
        queues.creates.clear()
        queues.polls.clear()
    for job_id in creates:
        lifecycle.create_step(rt, job_id)
    for poll in polls:
        lifecycle.poll_step(rt, *poll)
    if rt.settings.poll_mode == "batch":  # beat's poll_due tick: whatever is due now
        batch_poll.poll_due(rt, budget=3600.0)


def _next_deadline(rt: Any, job: Job, now: Any) -> Any:
    """The earliest lease, threshold, spacing or grace of the row still ahead (+1 s)."""
    kind = rt.kind(job.provider_kind)
    candidates = [
        job.claim_expires_at, job.poll_lease_expires_at, job.create_not_before, job.poll_due_at,
        job.created_at + NOT_STARTED_AGE if job.created_at else None,
        job.create_enqueued_at + NOT_STARTED_AGE if job.create_enqueued_at else None,
        job.reconcile_last_attempt_at + ATTEMPT_SPACING if job.reconcile_last_attempt_at else None,
        horizon.attempts_from(rt.settings, job, kind) if kind is not None else None,
        job.next_poll_at + SETTLE_GRACE if job.next_poll_at else None,
    ]
    ahead = [c for c in candidates if c is not None and c > now]
    return (min(ahead) if ahead else now + ATTEMPT_SPACING) + timedelta(seconds=1)


def quiesce_and_check(rt: Any, ctx: Context, scenario: Scenario, rounds: int = 40) -> list[str]:
    """Drive the job the way production would — workers run queued messages, time passes to
    the next deadline, the sweep ticks — until it is terminal and settled (or held uncertain
    with its evidence attempts spent), then past the settle grace once more; check."""
    from ...sweep import sweep

    clock = ctx.clock
    for _ in range(rounds):
        _drain(rt, ctx)
        with rt.sessions() as session:
            job = jobstore.load(session, ctx.job_id)
        assert job is not None
        if job.status in TERMINAL and job.credits_actual is not None:
            break
        if job.submission_state == Submission.UNCERTAIN and job.status in IN_FLIGHT \
                and horizon.exhausted(job):
            break
        clock.now = max(clock.now, _next_deadline(rt, job, clock.now))
        sweep(rt)
    assert job is not None
    if job.status not in TERMINAL or job.credits_actual is None:  # past the grace once more
        clock.now += SETTLE_GRACE + timedelta(seconds=1)
        sweep(rt)
        _drain(rt, ctx)
    return check(rt, ctx, scenario, "at quiescence", final=True)


def _count_settlements(rt: Any, ctx: Context, phase: str) -> list[str]:
    with rt.sessions() as session:
        n = session.execute(select(func.count()).select_from(CreditTransaction).where(
            CreditTransaction.job_id == ctx.job_id,
            CreditTransaction.type.in_(["COMMIT", "REFUND"]),
            CreditTransaction.id.like("job-%"))).scalar_one()
    return [f"settled_twice: {n} settlement transactions ({phase})"] if n > 1 else []
