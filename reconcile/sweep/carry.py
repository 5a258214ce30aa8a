"""Internal: carrying out a claimed sweep action after its commit — the refund of a failure, a
re-enqueue, a resumed chain, one poll, the evidence lookup (stored webhook deliveries, then the
provider's listing), a settlement."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from datetime import timedelta

from sqlalchemy import select

from .. import jobstore, lifecycle
from ..db.models import Job, WebhookDelivery
from ..errors import ProviderError
from ..jobstore import evidence, horizon
from ..jobstore.events import publish
from ..kinds import Kind
from ..providers.base import AsyncProvider
from ..runtime import Runtime
from ..settlement import SettleOutcome
from ..states import Submission
from .claims import _anomaly_once, _Plan
from .table import Action

log = logging.getLogger("reconcile.sweep")

# clock skew allowed between us and a provider when listing tasks "created after" our claim
LISTING_SLACK = timedelta(minutes=2)


def _carry_out(rt: Runtime, plan: _Plan, fan_out: Callable[[uuid.UUID], None] | None) -> str:
    if plan.outcome is not None:
        return plan.outcome
    job, action = plan.job, plan.decision.action
    if fan_out is not None:
        fan_out(job.id)
        return "fanned_out"
    if action is Action.FAIL:
        log.info("job_failed job_id=%s code=%s via=sweep row=%s", job.id,
                 plan.decision.code, plan.decision.row)
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


def _run(rt: Runtime, plan: _Plan, fan_out: Callable[[uuid.UUID], None] | None) -> str:
    try:
        return _carry_out(rt, plan, fan_out)
    except Exception:
        log.exception("sweep_row_failed job_id=%s row=%s action=%s", plan.job.id,
                      plan.decision.row, plan.decision.action)
        return "error"


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
    """The ``accepted`` row's poll: one read through ``lifecycle.observe``. The attempt was counted by the claim,
    so observe's own count loses its spacing CAS, and observe exhausts the job at its horizon
    under the claim (as a poller whose attempt another reader counted). The read is made
    under the row's poll claim as the sweep's claim left it (``jobstore.claim_of``: generation,
    seq and resume count): a webhook's resume or a poller's turn meanwhile takes the job over
    (a resume that keeps a turnless generation moves the count), and then a read that is no
    verdict fails nothing (the poller that took it exhausts it in its turn). The same when a
    poller held the row before the sweep loaded it (a live chain, a claimed or scheduled batch
    row): it exhausts the job itself, after storing the success it may have read meanwhile."""
    job, kind = plan.job, plan.kind
    assert kind is not None
    # the attempt is counted (the claim); a dead chain this plan resumed held nobody (not the
    # reaper's plan: a lapsed heartbeat is no proof that its poller stopped)
    claim = lifecycle.reader_claim(rt, job, resumed=plan.decision.resume and not plan.reaped)
    outcome = lifecycle.observe(rt, job, kind, via="sweep", claim=claim)
    if outcome in ("in_flight", "error"):
        _enqueue_chain(rt, plan)
    return outcome


def _evidence(rt: Runtime, plan: _Plan) -> str:
    """The ``uncertain`` row: adopt the upstream id on evidence; else the (claimed) attempt stands, and at
    MAX_ATTEMPTS one ``uncertain_unresolved`` anomaly — the reservation stays for an operator."""
    job, kind = plan.job, plan.kind
    assert kind is not None
    found = _find_evidence(rt, job, kind)
    if found is not None:
        task_id, source = found
        return "adopted" if lifecycle.adopt_upstream_id(rt, job.id, task_id, source=source) else "lost"
    if not horizon.exhausted(job):
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
    listing. A delivery counts only as :mod:`reconcile.jobstore.evidence` allows: same provider family
    and kind, bound by a provider-signed field, and — where the provider has one — confirmed
    by a read echoing this job's planted id before anything changes. An upstream id another job
    already holds is never this job's (:func:`reconcile.jobstore.evidence.held_elsewhere`)."""
    client = rt.client(kind)
    if not isinstance(client, AsyncProvider):
        return None
    with rt.sessions() as session:
        rows = session.execute(
            select(WebhookDelivery).where(
                WebhookDelivery.job_id == job.id, WebhookDelivery.upstream_id.is_not(None))
            .order_by(WebhookDelivery.received_at)).scalars().all()
        taken = evidence.held_elsewhere(session, (r.upstream_id or "" for r in rows), job.id)
    tried: set[str] = set(taken)
    for upstream_id in taken:
        log.warning("evidence_held_elsewhere job_id=%s upstream_id=%s", job.id, upstream_id)
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
    with rt.sessions() as session:
        if evidence.held_elsewhere(session, (listed.task_id,), job.id):
            log.warning("evidence_held_elsewhere job_id=%s upstream_id=%s", job.id,
                        listed.task_id)
            return None
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
