"""Internal: create — the submission claim, the one upstream create, saving its task id (and what a
late answer may do), the create's rate-limit release.
"""

from __future__ import annotations

import logging
import math
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Row
from sqlalchemy.orm import Session

from .. import jobstore
from ..core.limits import storable_text
from ..db.models import Job
from ..db.session import one_statement
from ..errors import (
    CreateRateLimited,
    CreateRejected,
    CreateUncertain,
    ErrorCode,
    InvalidParam,
    ProviderError,
    ReconcileError,
)
from ..jobstore import horizon
from ..jobstore.events import new_event, publish_events
from ..kinds import Kind, all_kinds
from ..providers.base import AsyncProvider, CreateRequest
from ..runtime import Runtime
from ..states import (
    ATTEMPT_SPACING,
    CREATE_CLAIM_LEASE,
    MAX_RATE_LIMITED_CREATES,
    TERMINAL,
    Status,
    Submission,
)
from .poll import _batch_mode, first_due, poll_countdown, poll_lease, resume_chain
from .settling import fail_job

log = logging.getLogger("reconcile.lifecycle")


@dataclass(frozen=True)
class CreateOutcome:
    """What one create step did: ``accepted``, ``rejected``, ``rate_limited``, ``uncertain``,
    ``resumed`` (the id was already there), ``busy`` (someone holds the claim), ``lost``."""

    action: str
    job_id: uuid.UUID
    error: ProviderError | None = None


def _async_kinds() -> list[str]:
    return [kind.name for kind in all_kinds() if not kind.sync]


# what the create step reads of the row it claimed (the request to send; a 429's retry count and
# the job's horizon, from the claimed row itself), and of the row its save wrote (the poll
# chain's start): only these come back, not the whole row
_CLAIMED = tuple(dict.fromkeys(("id", "provider_kind", "provider_model", "input_data",
                                "provider_options", "create_rate_limit_count",
                                *horizon.DEADLINE_COLUMNS)))
_SAVED = ("poll_generation", "provider_call_started_at")


def create_step(rt: Runtime, job_id: uuid.UUID) -> CreateOutcome:
    """Run the create for one job, at most once upstream whatever the number of messages.

    The claim comes first and is the step's load (one ``UPDATE … RETURNING``, only for a
    not-started row of an async kind); only a lost claim reads the row to tell a resume, a busy
    claim or an expired one from a lost message.
    """
    now = rt.now()
    token = uuid.uuid4().hex
    rt.crash_point("before_claim")
    with one_statement(rt.sessions) as session:  # the claim is its one UPDATE … RETURNING
        claimed = jobstore.claim_create(session, job_id, token, now,
                                        rt.settings.scaled(CREATE_CLAIM_LEASE),
                                        kinds=_async_kinds(),  # sync kinds: the platform's request
                                        worker=rt.worker_id, columns=_CLAIMED)
    if claimed is None:
        return _not_claimed(rt, job_id, now)
    kind = rt.kind(claimed.provider_kind)
    if kind is None or kind.sync:  # the kind registry changed under the claim: the sweep's
        return CreateOutcome("lost", job_id)  # expired-claim row marks it uncertain
    rt.crash_point("after_claim")
    client = rt.client(kind)
    assert isinstance(client, AsyncProvider)
    request = CreateRequest(model=claimed.provider_model or "", input=claimed.input_data or {},
                            job_id=str(job_id),
                            webhook_url=rt.webhook_url(kind.provider, job_id),
                            extra=claimed.provider_options or {})
    try:
        created = client.create(request)
    except InvalidParam as exc:  # the provider's request builder refused it: nothing was sent
        fail_job(rt, job_id, ErrorCode.INVALID_PARAM, exc.message,
                 {"param": exc.param, "submissionOutcome": "rejected"},
                 submission_state=Submission.REJECTED, where=_owner_where(token))
        return CreateOutcome("rejected", job_id)
    except CreateRejected as exc:
        fail_job(rt, job_id, exc.code, exc.message, _detail(exc, submission="rejected"),
                 submission_state=Submission.REJECTED, where=_owner_where(token))
        return CreateOutcome("rejected", job_id, exc)
    except CreateRateLimited as exc:
        return _rate_limited(rt, claimed, token, exc)
    except CreateUncertain as exc:
        with rt.sessions.begin() as session:
            jobstore.mark_uncertain(session, job_id, token=token, now=rt.now(),
                                    code=ErrorCode.UPSTREAM_SUBMISSION_UNCERTAIN,
                                    detail=_detail(exc, submission="uncertain"))
        log.warning("create_uncertain job_id=%s error=%s", job_id, exc.message)
        return CreateOutcome("uncertain", job_id, exc)
    except Exception as exc:  # a raising client: whether it sent the create is unknown (hole 2)
        log.exception("create_raised job_id=%s", job_id)
        with rt.sessions.begin() as session:
            jobstore.mark_uncertain(session, job_id, token=token, now=rt.now(),
                                    code=ErrorCode.UPSTREAM_SUBMISSION_UNCERTAIN,
                                    detail={"submissionOutcome": "uncertain",
                                            "exception": f"{type(exc).__name__}: {exc}"[:1000]})
        return CreateOutcome("uncertain", job_id)
    rt.crash_point("after_accept")
    if not usable_task_id(created.task_id):  # accepted (billed), but nothing can poll that id
        with rt.sessions.begin() as session:
            jobstore.mark_uncertain(session, job_id, token=token, now=rt.now(),
                                    code=ErrorCode.UPSTREAM_SUBMISSION_UNCERTAIN,
                                    detail={"submissionOutcome": "uncertain",
                                            "reason": "the provider answered an unusable task id",
                                            "answered_task_id": repr(created.task_id)[:200]})
        log.warning("create_unusable_task_id job_id=%s", job_id)
        return CreateOutcome("uncertain", job_id)
    saved = on_task_created(rt, job_id, token, created.task_id, kind=kind)
    if not saved:
        return CreateOutcome("lost", job_id)
    rt.crash_point("after_id_saved")
    return CreateOutcome("accepted", job_id)


def _not_claimed(rt: Runtime, job_id: uuid.UUID, now: datetime) -> CreateOutcome:
    """The claim lost: read the row once to say why (and act on an expired claim)."""
    with rt.sessions.begin() as session:
        job = jobstore.load(session, job_id)
        if job is None:
            return CreateOutcome("lost", job_id)
        if not job.provider_task_id:
            if job.submission_state != Submission.SUBMITTING:
                # claimed by someone else and moved on, not due yet, terminal, or a sync kind
                return CreateOutcome("lost", job_id)
            if job.claim_expires_at and job.claim_expires_at > now:
                return CreateOutcome("busy", job_id)
            expired_kind = rt.kind(job.provider_kind)
            if expired_kind is None or expired_kind.sync:
                # a sync call's claim (issue 11 hole 12): never uncertain — there is nothing to
                # look up later; the sweep fails + refunds it past the threshold
                return CreateOutcome("lost", job_id)
            jobstore.mark_uncertain(session, job_id, token=None, now=now,
                                    code=ErrorCode.UPSTREAM_SUBMISSION_UNCERTAIN,
                                    detail={"reason": "submission claim expired before the id was saved"})
            return CreateOutcome("uncertain", job_id)
    # the retry guard: a persisted id is resumed, never re-created (a duplicate create pays twice)
    resume_chain(rt, job_id, only_if_lease_expired=True)
    return CreateOutcome("resumed", job_id)


def usable_task_id(task_id: object) -> bool:
    """An upstream id the job row can hold and a poll can name (PostgreSQL text cannot hold a
    NUL or an unpaired surrogate: saving one raises, and would leave an accepted create in an
    error loop)."""
    return isinstance(task_id, str) and bool(task_id) and storable_text(task_id)


def _owner_where(token: str) -> tuple[Any, ...]:
    return (Job.claim_token == token, Job.status == Status.PENDING,
            Job.submission_state.in_([Submission.SUBMITTING, Submission.UNCERTAIN]))


def _detail(exc: ProviderError, **extra: Any) -> dict[str, Any]:
    detail = exc.detail()
    if exc.request_id is not None:
        detail["upstreamRequestId"] = exc.request_id
    detail.update({"submissionOutcome" if k == "submission" else k: v for k, v in extra.items()})
    return detail


def on_task_created(rt: Runtime, job_id: uuid.UUID, token: str, task_id: str, *,
                    kind: Kind | None = None) -> bool:
    """Persist the upstream id before the first poll and start the poll chain.

    ``kind``: the job's kind, known to the claim's owner; then the save is the step's only read
    of the row (the row is loaded only when the save lost, or to learn the kind).
    """
    now = rt.now()
    job: Job | None = None
    if kind is None:
        with rt.sessions() as session:  # the kind, from the row (read only)
            job = jobstore.load(session, job_id)
            kind = rt.kind(job.provider_kind) if job else None
            if job is None or kind is None:
                return False
    batch = _batch_mode(rt)
    # the outbox event is written by the same statement when the save wins
    running = new_event(Job(id=job_id), "running", now, {"provider_task_id": task_id}, rt=rt)
    with one_statement(rt.sessions) as session:
        saved = jobstore.save_task_id(session, job_id, token, task_id, now, poll_lease(rt, kind),
                                      poll_due_at=first_due(rt, kind, now) if batch else None,
                                      event=running, columns=_SAVED)
    if saved is None:  # lost: what the late answer means, decided under the row's lock
        with rt.sessions.begin() as session:
            job = jobstore.load(session, job_id)
            if job is None:
                return False
            verdict = _late_answer(session, job, task_id, now)
        if verdict == "cancel":
            log.warning("task_created_after_terminal job_id=%s task_id=%s", job_id, task_id)
            client = rt.client(kind)
            try:
                client.cancel(task_id, model=job.provider_model)  # type: ignore[union-attr]
            except ReconcileError:
                pass
        return verdict == "same"
    publish_events(rt, [running])
    log.info("task_created job_id=%s task_id=%s", job_id, task_id)
    if not batch:  # batch mode: the row is due at poll_due_at, no message (reconcile.lifecycle.batch)
        rt.enqueue_poll(job_id, saved.poll_generation, 0, poll_countdown(rt, kind, saved, now))
    return True


# --- issue 11 hole 1: what a create answer that lost ``save_task_id`` may do (begin) ---------
def _late_answer(session: Session, job: Job, task_id: str, now: datetime) -> str:
    """The owner's save lost: decide under the row lock what the (late) answer means.

    ``same``: the row already holds this id (the sweep adopted it from evidence, or an operator
    did): success — a chain already runs, so nothing is cancelled or enqueued. ``conflict``: the
    row holds another id (an adopted id that may be wrong, an operator's typo) or still waits
    for one: the late answer is the only proof of the real task, so nothing is cancelled and a
    ``task_id_conflict`` anomaly names both ids. ``cancel``: the row is terminal with no task
    id (cancelled, resolved as not submitted): only then is the upstream task cancelled.
    """
    session.refresh(job, with_for_update=True)  # the locked row's current values
    if job.provider_task_id == task_id:
        return "same"
    if job.provider_task_id is not None or job.status not in TERMINAL:
        jobstore.record_anomaly(session, job_id=job.id, user_id=job.user_id,
                                kind="task_id_conflict",
                                detail={"row_task_id": job.provider_task_id,
                                        "answered_task_id": task_id, "status": job.status},
                                now=now)
        log.warning("task_id_conflict job_id=%s row_task_id=%s answered_task_id=%s", job.id,
                    job.provider_task_id, task_id)
        return "conflict"
    jobstore.record_anomaly(session, job_id=job.id, user_id=job.user_id,
                            kind="accepted_after_terminal",
                            detail={"task_id": task_id, "status": job.status}, now=now)
    return "cancel"
# --- issue 11 hole 1 (end) -------------------------------------------------------------------


def _rate_limited(rt: Runtime, job: Row[Any], token: str,
                  exc: CreateRateLimited) -> CreateOutcome:
    """A 429 (documented as not created): the claim is released with a not-before time, or,
    after ``MAX_RATE_LIMITED_CREATES`` tries or with no room left before the job's horizon, the
    job is rejected (refunded). Never uncertain: whatever ``Retry-After`` said. ``job``: the
    row as the claim wrote it (``_CLAIMED``), not as it is now: a claim that ended during the
    call (its row marked uncertain by the sweep) still has its horizon ahead."""
    now = rt.now()
    count = job.create_rate_limit_count + 1
    wait = exc.retry_after if exc.retry_after is not None and math.isfinite(exc.retry_after) \
        else 2.0 * (2 ** count)
    not_before = _retry_not_before(rt, job, now, wait)
    if count >= MAX_RATE_LIMITED_CREATES or not_before is None:
        extra = {} if not_before is not None else {"reason": "retry_after_past_horizon"}
        fail_job(rt, job.id, ErrorCode.UPSTREAM_RATE_LIMITED, exc.message,
                 _detail(exc, submission="rejected", tries=count, retry_after=wait, **extra),
                 submission_state=Submission.REJECTED, where=_owner_where(token))
        return CreateOutcome("rejected", job.id, exc)
    wait_td = not_before - now
    with rt.sessions.begin() as session:
        released = jobstore.release_rate_limited(session, job.id, token, not_before,
                                                 _detail(exc, tries=count, retry_after=wait))
    # a wait past the broker's countdown bound is no message: create_not_before holds it and
    # the sweep's not-started row enqueues the create once it has passed
    if released is not None and wait_td.total_seconds() <= rt.settings.max_countdown:
        rt.enqueue_create(job.id, wait_td.total_seconds())
    return CreateOutcome("rate_limited", job.id, exc)


def _retry_not_before(rt: Runtime, job: Row[Any], now: datetime,
                      wait: float) -> datetime | None:
    """When a rate-limited create may run again: ``wait`` seconds (at least 1, scaled), but no
    later than one attempt spacing before the job's exhaustion deadline
    (:func:`reconcile.jobstore.horizon.exhaustion_deadline`), so the sweep's not-started row
    enqueues it while the job is still within its horizon; a wait too long for a date (1e12 s,
    a far-future HTTP date) is that bound. None: no room is left before the horizon."""
    deadline = horizon.exhaustion_deadline(rt.settings, job)
    if deadline is None:
        return None
    latest = deadline - rt.settings.scaled(ATTEMPT_SPACING)
    if latest <= now:
        return None
    try:
        return min(now + rt.settings.scaled(timedelta(seconds=max(wait, 1.0))), latest)
    except OverflowError:
        return latest
