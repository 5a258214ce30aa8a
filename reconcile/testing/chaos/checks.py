"""The invariants of a chaos run, over the quiescent end state: no duplicate create, no double
settlement, a clean audit, every job terminal and settled (but ``uncertain`` ones), every asset's
object stored and counted right, every refund backed by evidence, every event published."""

from __future__ import annotations

import time
import uuid
from collections import Counter
from datetime import datetime, timedelta
from typing import Any

from ..processes import ScratchRedis, WebhookReceiver
from .control import _Run
from .plan import OBSERVED_KIND, SYNC_KINDS
from .platform_rows import check_platform_rows
from .policy import check_kept, parse_policy
from .report import ChaosReport


def _evidenced_uncertain() -> Any:
    """Uncertain jobs a stored webhook delivery names (with an upstream id): resolvable."""
    from sqlalchemy import select

    from ...db.models import Job, WebhookDelivery

    return select(WebhookDelivery.job_id).join(Job, Job.id == WebhookDelivery.job_id).where(
        Job.status == "pending", Job.submission_state == "uncertain",
        WebhookDelivery.upstream_id.is_not(None))


def _row_state(job: Any, now: Any, tasks: list[Any] | None, clock: float) -> str:
    """What a stuck row says about why: its poll chain, claims, attempts and the upstream task
    (ages in seconds before ``now``), so a red run explains itself without a replay."""
    def age(at: Any) -> str:
        return "-" if at is None else f"{(now - at).total_seconds():.1f}s"

    upstream = ",".join(f"{t.task_id}:{t.state_at(clock)[0]}" for t in tasks or []) or "none"
    return (f"task={job.provider_task_id} started={age(job.provider_call_started_at)} "
            f"gen={job.poll_generation} seq={job.poll_seq} "
            f"lease_in={age(job.poll_lease_expires_at)} due={age(job.poll_due_at)} "
            f"attempts={job.reconcile_attempts} last_attempt={age(job.reconcile_last_attempt_at)} "
            f"last_error={job.reconcile_last_error_code or job.reconcile_last_error} "
            f"upstream={upstream}")


def _check(state: _Run, rt: Any, sim: Any, receiver: WebhookReceiver,
           redis_server: ScratchRedis) -> ChaosReport:
    """Every invariant, over the quiescent end state."""
    from sqlalchemy import func, select

    from ... import credits
    from ...db.models import Asset, CreditTransaction, Job, JobEvent, UsageLog
    from ...jobstore.events import publish

    publish(rt, older_than=timedelta(0), limit=10**6)  # the outbox drains once all is quiet
    violations: list[str] = list(state.live_violations)
    specs = {uuid.UUID(s.job_id): s for s in state.plan.jobs}
    with rt.sessions() as session:
        jobs = {j.id: j for j in session.execute(select(Job)).scalars()}
        assets: dict[uuid.UUID, list[Asset]] = {}
        for asset in session.execute(select(Asset)).scalars():
            assets.setdefault(asset.job_id, []).append(asset)
        settlements = Counter(session.execute(
            select(CreditTransaction.job_id).where(
                CreditTransaction.id.like("job-commit:%") | CreditTransaction.id.like(
                    "job-refund:%"))).scalars())
        refunded = session.execute(select(func.count()).select_from(UsageLog).where(
            UsageLog.status == "refunded")).scalar_one()
        unpublished = session.execute(select(func.count()).select_from(JobEvent).where(
            JobEvent.published_at.is_(None))).scalar_one()
        # the audit reads the deployment's policy from the settings, as `reconcile audit` does
        problems = credits.audit(session, now=rt.now(), grace=timedelta(0), settings=rt.settings)
        evidenced = set(session.execute(_evidenced_uncertain()).scalars())

    for job_id, spec in specs.items():
        if job_id not in jobs and job_id not in state.failed_submits:
            violations.append(f"missing_job {job_id} ({spec.kind})")
    platform = {job_id for job_id, spec in specs.items() if spec.platform}
    violations += check_platform_rows(rt, specs.values(), jobs, settlements)
    policy = parse_policy(state.config.policy or "1")
    kept, partly_kept = check_kept(rt, policy, (j for i, j in jobs.items() if i not in platform),
                                   {i: s.credits for i, s in specs.items() if not s.platform})
    violations += kept
    observed: list[str] = []  # library jobs of the observe-only kind the sweep left in flight
    uncertain: list[str] = []
    outcomes: Counter[str] = Counter()
    tasks_by_job: dict[str, list[Any]] = {}
    for task in sim.tasks.values():
        tasks_by_job.setdefault(task.job_id or "", []).append(task)
    for job_id, job in jobs.items():
        kind = job.provider_kind or "?"
        if job_id in platform:
            outcomes[f"platform:{kind}:{job.status}"] += 1
            continue
        outcomes[f"{job.status}:{job.error_code or 'ok'}"] += 1
        creates = sim.creates(str(job_id))
        if kind not in SYNC_KINDS and creates > 1:
            violations.append(f"duplicate_create {job_id} ({kind}): {creates} upstream tasks")
        if settlements[job_id] > 1:
            violations.append(f"double_settlement {job_id} ({kind})")
        if job.status in ("pending", "processing"):
            if job.submission_state == "uncertain":
                created = "created upstream" if creates else "never created"
                uncertain.append(f"{job_id} ({kind}, {created})")
                # the sweep adopts an id on evidence, except for the observe-only kind, whose
                # upstream decisions it only logs (its evidence waits for an operator)
                if job_id in evidenced and kind != OBSERVED_KIND:
                    violations.append(f"evidence_ignored {job_id} ({kind}): a stored webhook "
                                      f"names its upstream id, still uncertain")
            elif kind == OBSERVED_KIND:  # nothing resumes it (an operator's choice): reported
                observed.append(f"{job_id} status={job.status} submission={job.submission_state}")
            else:
                violations.append(f"not_terminal {job_id} ({kind}) status={job.status} "
                                  f"submission={job.submission_state} "
                                  f"{_row_state(job, rt.now(), tasks_by_job.get(str(job_id)), sim.now())}")
            continue
        if job.credits_actual is None:
            violations.append(f"unsettled {job_id} ({kind}) status={job.status}")
        mine = sorted(assets.get(job_id, []), key=lambda a: a.index)
        if job.status == "completed":
            outputs = (job.output_data or {}).get("outputs") or []
            if len(mine) != len(outputs) or [a.index for a in mine] != list(range(len(mine))) \
                    or not mine:
                violations.append(f"asset_rows {job_id} ({kind}): {len(mine)} rows for "
                                  f"{len(outputs)} outputs")
            if kind not in SYNC_KINDS:
                upstream = tasks_by_job.get(str(job_id), [])
                if not any(t.first_at({"succeeded"}, sim.now()) for t in upstream):
                    violations.append(f"completed_without_upstream_success {job_id} ({kind})")
                script = specs[job_id].script if job_id in specs else {}
                if kind != "elevenlabs-async" and script.get("outputs") and \
                        len(mine) != script["outputs"]:
                    violations.append(f"asset_count {job_id} ({kind}): {len(mine)} rows, "
                                      f"upstream made {script['outputs']}")
        else:
            if mine:
                violations.append(f"assets_on_{job.status}_job {job_id} ({kind})")
            if kind not in SYNC_KINDS:
                why = _refund_evidence(job, creates, tasks_by_job.get(str(job_id), []), sim)
                if why:
                    violations.append(f"refund_without_evidence {job_id} ({kind}): {why}")
    for job_id, rows in assets.items():
        for asset in rows:
            if not rt.storage.exists(asset.storage_key):
                violations.append(f"asset_object_missing {job_id} {asset.storage_key}")
    named = {a.storage_key for rows in assets.values() for a in rows}
    orphans = [key for key in rt.storage.keys() if key not in named]
    violations += [f"audit {p.kind} job={p.job_id} user={p.user_id}: {p.detail}" for p in problems]
    violations += _times_outside_run(rt, jobs.values(), rt.now(), time.monotonic() - state.started)
    if unpublished:
        violations.append(f"events_unpublished {unpublished}")
    terminal = sum(1 for j in jobs.values() if j.status not in ("pending", "processing"))
    elapsed = time.monotonic() - state.started
    recovered = sum(1 for jid in state.recovered_ids
                    if jid in jobs and jobs[jid].status not in ("pending", "processing"))
    return ChaosReport(
        seed=state.plan.seed, plan_digest=state.plan.digest(), jobs=len(state.plan.jobs),
        by_kind=dict(Counter(("platform:" if s.platform else "") + s.kind
                             for s in state.plan.jobs)), kills=state.counts["kills"],
        worker_restarts=state.counts["worker_restarts"],
        unplanned_worker_exits=state.counts["unplanned_worker_exits"],
        redis_restarts=redis_server.restarts,
        pg_terminations=state.counts["pg_terminations"],
        submit_failed=state.counts["submit_failed"], pg_backends_terminated=state.counts["pg_backends_terminated"],
        sweeps=state.counts["sweeps"], sweep_errors=state.counts["sweep_errors"],
        poll_due_ticks=state.counts["poll_due_ticks"],
        poll_due_ticks_lost=state.counts["poll_due_ticks_lost"],
        recovered=recovered,
        completed=sum(1 for i, j in jobs.items() if j.status == "completed" and i not in platform),
        failed=sum(1 for i, j in jobs.items()
                   if j.status in ("failed", "cancelled") and i not in platform),
        refunded=int(refunded), uncertain=sorted(uncertain), orphans=len(orphans),
        lost_publishes=state.counts["lost_publishes"],
        webhook_answers={str(k): v for k, v in sorted(receiver.answers.items())},
        violations=violations, seconds=elapsed, throughput=terminal / elapsed if elapsed else 0.0,
        outcomes=dict(outcomes), settle_seconds=state.settle_seconds,
        sweep_resumes=state.counts["sweep_resumes"],
        extra_generations=sum(max((j.poll_generation or 0) - 1, 0) for j in jobs.values()),
        policy=state.config.policy or "", partly_kept=partly_kept, observed_in_flight=observed,
        observed_settled=sum(1 for i, j in jobs.items() if i not in platform
                             and j.provider_kind == OBSERVED_KIND and j.credits_actual is not None),
        platform_rows=len(platform))


# the run's window on the wall clock, widened by this much each side (clock steps, rounding)
TIME_SLACK = timedelta(minutes=2)


def _times_outside_run(rt: Any, jobs: Any, now: datetime, elapsed: float) -> list[str]:
    """Every time the library wrote on the platform's tables (``jobs.created_at``,
    ``started_at``, ``completed_at``, ``usage_logs.created_at``) read back inside the run's own
    window: a value shifted by a session time zone (a naive column written in local wall time,
    read as UTC; README: Timestamps mean UTC) lands hours outside it."""
    from sqlalchemy import func, select

    from ...db.models import UsageLog

    low, high = now - timedelta(seconds=elapsed) - TIME_SLACK, now + TIME_SLACK
    found: list[str] = []
    for job in jobs:
        for column in ("created_at", "started_at", "completed_at"):
            at = getattr(job, column)
            if at is not None and not low <= at <= high:
                found.append(f"time_outside_run {job.id} jobs.{column}={at.isoformat()} "
                             f"(run: {low.isoformat()} .. {high.isoformat()})")
    with rt.sessions() as session:
        first, last = session.execute(select(func.min(UsageLog.created_at),
                                             func.max(UsageLog.created_at))).one()
    for at in dict.fromkeys((first, last)):  # the earliest and the latest, once each
        if at is not None and not low <= at <= high:
            found.append(f"time_outside_run usage_logs.created_at={at.isoformat()} "
                         f"(run: {low.isoformat()} .. {high.isoformat()})")
    return found


def _refund_evidence(job: Any, creates: int, upstream: list[Any], sim: Any) -> str | None:
    """Why this async job's refund is NOT backed by evidence (None: it is). Automatic refunds
    need a rejection, a provider-reported failure, or a create that never happened."""
    code = job.error_code
    if code in ("UPSTREAM_INVALID_INPUT", "UPSTREAM_SUBMISSION_FAILED", "UPSTREAM_RATE_LIMITED",
                "RECONCILE_NO_RECOVERY"):
        return f"{code} but created upstream" if creates else None
    states = {t.state_at(sim.now())[0] for t in upstream}
    if code == "UPSTREAM_FAILED":
        return None if states & {"failed", "canceled"} else f"{code} but upstream is {states}"
    if code == "UPSTREAM_EMPTY_RESULT":
        ok = any(t.state_at(sim.now())[0] == "succeeded" and t.script.outputs == 0
                 for t in upstream)
        return None if ok else f"{code} but upstream is {states}"
    return f"unexpected code {code} (no exhaustion or cancel happens in a chaos run)"
