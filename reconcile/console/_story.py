"""Internal: a job's story — one sentence saying what the library is waiting for, and one
timeline of everything that names the job (its row's times, its events, its ledger rows,
webhook deliveries, anomalies, operator actions), read through :mod:`reconcile.ops.queries`."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from .. import jobstore, operator
from ..db.models import CreditTransaction, Job, JobEvent, UsageLog, WebhookDelivery
from ..jobstore.horizon import exhaustion_deadline
from ..ops import queries
from ..runtime import Runtime
from ..settlement import RECORD_KEY
from ..states import MAX_ATTEMPTS, TERMINAL, UNKNOWN_OUTCOME, Status, Submission

EVENTS = 500  # a story's events: the newest, the earlier ones counted


def _at(value: datetime | None) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%S UTC") if value else "?"


def waiting_for(rt: Runtime, job: Job | None, now: datetime, held: int | None) -> str:
    """What the library is waiting for, in one sentence."""
    if job is None:
        return ("Nothing of its own: this job's row is gone, and the ledger may still hold its "
                "reservation (the audit's orphaned_reservation; release it below).")
    if job.status == Status.COMPLETED:
        return f"Nothing: the job completed and {job.credits_actual or 0} credits were committed."
    if job.status in TERMINAL:
        if jobstore.is_settlement_pending(job):
            return (f"Its refund: the {job.status} job's settlement is pending and is tried again "
                    f"at {_at(job.next_poll_at)} (tried {job.settle_attempts} times); the sweep "
                    "retries it, or retry it now.")
        if job.credits_actual is None:
            return (f"The platform: it {job.status} this row itself, so its reservation is the "
                    "platform's to settle (the audit reports it).")
        return f"Nothing: the job {job.status} and its settlement is done."
    kind = rt.kind(job.provider_kind)
    if job.submission_state is None:
        if job.provider_call_started_at and not job.provider_task_id:
            return (f"The platform's provider call, started at {_at(job.provider_call_started_at)}"
                    ": the library never fails a call in progress before its kind's threshold.")
        return "The platform's own worker: the library watches this row but did not submit it."
    if kind is None:
        return (f"An operator: its kind {job.provider_kind!r} is not registered in this process, "
                "so nothing polls it.")
    state = job.submission_state
    if state == Submission.NOT_STARTED:
        return (f"A worker to run its create (enqueued {job.create_enqueue_count} times"
                + (f", not before {_at(job.create_not_before)}" if job.create_not_before else "")
                + ").")
    if state == Submission.SUBMITTING and job.claim_expires_at and job.claim_expires_at >= now:
        return (f"The create call a worker is making now (its claim holds until "
                f"{_at(job.claim_expires_at)}).")
    if state in UNKNOWN_OUTCOME:
        return (f"Evidence or an operator: the provider may have created this job (its create's "
                f"answer was lost), so it holds its {held if held is not None else '?'} reserved "
                "credits until a signed webhook or a provider listing proves its upstream id, or "
                "an operator resolves it either way.")
    deadline = exhaustion_deadline(rt.settings, job)
    late = f" — its horizon passed at {_at(deadline)}" if deadline and deadline < now else (
        f"; it is failed and refunded at {_at(deadline)} if nothing answers" if deadline else "")
    if kind.sync:
        return f"The {kind.name} call's answer{late}."
    return (f"The provider to finish task {job.provider_task_id or '?'} (attempt "
            f"{job.reconcile_attempts} of {MAX_ATTEMPTS}){late}.")


def timeline(detail: dict[str, Any], events: list[Any], actions: list[dict[str, Any]],
             job: Job | None) -> list[dict[str, Any]]:
    """Every dated thing about the job, oldest first: ``{"at", "what", "detail"}``."""
    out: list[dict[str, Any]] = []

    def add(at: Any, what: str, more: Any = None) -> None:
        if at is not None:
            out.append({"at": at, "what": what, "detail": more})

    if job is not None:
        add(job.created_at, "row created", f"{job.job_type}, kind {job.provider_kind}")
        add(job.started_at, "taken by a worker")
        add(job.provider_call_started_at, "provider call started")
        add(job.reconcile_last_attempt_at, "last attempt (poll or sweep)",
            job.reconcile_last_error)
        add(job.completed_at, f"finished: {job.status}", job.error_code)
    for e in events:
        add(e.created_at, f"event {e.type}", e.payload or None)
    for u in detail["usage_logs"]:
        add(u["created_at"], f"usage log: {u['credits']} credits, now {u['status']}")
    for t in detail["transactions"]:
        add(t["created_at"], f"ledger {t['type']} {t['amount']}",
            f"sub {t['from_sub']}, topup {t['from_topup']}")
    for w in detail["webhook_deliveries"]:
        add(w["received_at"], f"webhook delivery from {w['provider']}",
            f"upstream id {w['upstream_id']}, status {w['status']}")
    for a in detail["anomalies"]:
        add(a["created_at"], f"anomaly {a['kind']}", a["detail"])
        add(a["resolved_at"], f"anomaly {a['kind']} resolved",
            f"{a['resolved_by']} ({a['resolved_action']})")
    for r in actions:
        add(datetime.fromisoformat(r["at"]), f"operator {r['operator']} via {r['via']}: "
            f"{r['action']}", r["reason"])
    return sorted(out, key=lambda e: e["at"])


def pools(detail: dict[str, Any]) -> dict[str, dict[str, int]]:
    """The job's ledger rows summed per pool and type: ``{type: {"sub": n, "topup": n}}``."""
    out: dict[str, dict[str, int]] = {}
    for t in detail["transactions"]:
        row = out.setdefault(t["type"], {"sub": 0, "topup": 0})
        row["sub"] += t["from_sub"]
        row["topup"] += t["from_topup"]
    return out


def orphan_detail(session: Session, job_id: uuid.UUID) -> dict[str, Any] | None:
    """What the ledger still holds for a job whose row is gone (None: nothing names it)."""
    logs = list(session.execute(select(UsageLog).where(UsageLog.job_id == job_id)).scalars())
    txns = list(session.execute(select(CreditTransaction).where(
        CreditTransaction.job_id == job_id).order_by(CreditTransaction.created_at)).scalars())
    if not logs and not txns:
        return None
    return {
        "job": None,
        "usage_logs": [{"id": u.id, "status": u.status, "credits": u.credits,
                        "created_at": u.created_at, "metadata": u.metadata_} for u in logs],
        "transactions": [{"id": t.id, "type": t.type, "amount": t.amount,
                          "from_sub": t.from_sub, "from_topup": t.from_topup,
                          "created_at": t.created_at} for t in txns],
        "anomalies": [], "webhook_deliveries": [], "assets": [],
    }


def story(rt: Runtime, session: Session, job_id: uuid.UUID, now: datetime) -> dict[str, Any] | None:
    """Everything the story page shows, or None when nothing names the job."""
    job = session.get(Job, job_id)
    detail = queries.job_detail(rt, session, job) if job is not None else \
        orphan_detail(session, job_id)
    if detail is None:
        return None
    shown = len(detail["webhook_deliveries"])
    deliveries = shown if shown < queries.DELIVERIES or job is None else session.execute(
        select(func.count()).select_from(WebhookDelivery).where(queries.deliveries_of(job))
    ).scalar_one()
    held_rows = queries.reserved(session, [job_id])
    held = held_rows[job_id][0] if job_id in held_rows else None
    events = queries.events(session, job_id, EVENTS)
    earlier = 0 if len(events) < EVENTS else session.execute(
        select(func.count()).select_from(JobEvent).where(JobEvent.job_id == job_id,
                                                         JobEvent.id < events[0].id)).scalar_one()
    actions = operator.records(session, job_id=job_id)
    settlement = [u["metadata"][RECORD_KEY] for u in detail["usage_logs"]
                  if isinstance(u["metadata"], dict) and RECORD_KEY in u["metadata"]]
    facts: list[tuple[str, Any]] = []
    if job is not None:
        deadline = exhaustion_deadline(rt.settings, job) if job.status not in TERMINAL else None
        facts = [
            ("create claim", f"until {_at(job.claim_expires_at)}" + (
                " (live)" if job.claim_expires_at and job.claim_expires_at >= now else
                " (expired)") if job.claim_expires_at else "none"),
            ("poll generation / turn", f"{job.poll_generation} / {job.poll_seq}"),
            ("poll lease until", job.poll_lease_expires_at),
            ("next batch read", job.poll_due_at),
            ("creates enqueued", job.create_enqueue_count),
            ("attempts", f"{job.reconcile_attempts} of {MAX_ATTEMPTS}"),
            ("last provider read", job.reconcile_last_attempt_at),
            ("last read's error", job.reconcile_last_error),
            ("exhaustion horizon", deadline),
            ("progress", job.progress),
        ]
    return {
        "job_id": job_id, "job": job, "detail": detail, "held": held,
        "waiting": waiting_for(rt, job, now, held),
        "timeline": timeline(detail, events, actions, job),
        "facts": facts, "pools": pools(detail), "settlement": settlement, "actions": actions,
        "events": events, "earlier_events": earlier, "deliveries": deliveries,
    }
