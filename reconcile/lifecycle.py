"""The job lifecycle: submit → create (claim) → poll → finalize | fail → settle; cancel.

Each step is a plain function over a :class:`~reconcile.runtime.Runtime` and a job id; the Celery
tasks are thin wrappers. State changes are compare-and-set writes (``jobstore``); a step that
loses one does nothing more. Upstream creates happen only after winning the submission claim,
and a persisted task id is always resumed, never re-created.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from . import idempotency, jobstore
from .db.models import Asset, Job
from .errors import (
    CreateRateLimited,
    CreateRejected,
    CreateUncertain,
    ErrorCode,
    InvalidParam,
    MediaError,
    MediaExpired,
    MediaTooLarge,
    ProviderError,
    ReconcileError,
    UnsafeMediaURL,
)
from .events import add_event, publish_events
from .kinds import Kind, all_kinds, provider_of
from .providers.base import AsyncProvider, CreateRequest, Output, PollResult, PollStatus
from .runtime import Runtime, Validator
from .settlement import Finished, SettleOutcome, decide
from .states import (
    ATTEMPT_SPACING,
    CREATE_CLAIM_LEASE,
    IN_FLIGHT,
    MAX_ATTEMPTS,
    MAX_RATE_LIMITED_CREATES,
    POLL_LEASE_SLACK,
    POLL_READ_ATTEMPTS,
    POLL_READ_BACKOFF_MAX,
    TERMINAL,
    Status,
    Submission,
    settle_backoff,
)

__all__ = [
    "CreateOutcome", "Submitted", "adopt_upstream_id", "create_step", "fail_job", "observe",
    "on_task_created", "poll_step", "poll_step_deadline", "read_status",
    "resolve_not_submitted", "resume_chain", "settle", "submit_job",
]

log = logging.getLogger("reconcile.lifecycle")


# ----------------------------------------------------------------------------- submit


@dataclass(frozen=True)
class Submitted:
    job_id: uuid.UUID
    kind: Kind
    # set when an idempotency key named an earlier submit: nothing was inserted or reserved
    replay: idempotency.Replay | None = None


def _validate(provider_kind: str, model: str, input: Any, credits_: Any,
              validator: Validator | None, rt: Runtime) -> Kind:
    kind = rt.kind(provider_kind)
    if kind is None:
        raise InvalidParam(f"unknown provider_kind {provider_kind!r}", param="provider_kind")
    if not isinstance(model, str) or not model.strip():
        raise InvalidParam("model must be a non-empty string", param="model")
    if not isinstance(input, Mapping):
        raise InvalidParam("input must be a JSON object", param="input")
    try:
        json.dumps(input, allow_nan=False)
    except (TypeError, ValueError, RecursionError) as exc:
        raise InvalidParam(f"input is not JSON: {exc}", param="input") from exc
    if isinstance(credits_, bool) or not isinstance(credits_, int) or credits_ <= 0:
        raise InvalidParam("credits must be a positive integer", param="credits")
    if validator is not None:
        validator(provider_kind, model, input)
    return kind


def _check_storable(rt: Runtime, model: str, input: Mapping[str, Any], job_type: str) -> None:
    """PostgreSQL text/jsonb hold neither NUL nor lone surrogates, and sizes are bounded: a
    clear 400 here rather than a 500 from the INSERT (nothing is reserved before this)."""
    if not isinstance(job_type, str) or not job_type.strip():
        raise InvalidParam("job_type must be a non-empty string", param="job_type")
    if len(job_type) > rt.settings.max_job_type_length:
        raise InvalidParam(f"job_type is longer than {rt.settings.max_job_type_length} characters",
                           param="job_type")
    for param, value in (("model", model), ("job_type", job_type)):
        if not _plain_text(value):
            raise InvalidParam(f"{param} holds a NUL or an unpaired surrogate", param=param)
    stack: list[Any] = [input]
    while stack:  # iterative: a deeply nested input cannot exhaust the stack here
        value = stack.pop()
        if isinstance(value, str) and not _plain_text(value):
            raise InvalidParam("input holds a NUL or an unpaired surrogate", param="input")
        if isinstance(value, Mapping):
            stack.extend(value.keys())
            stack.extend(value.values())
        elif isinstance(value, list | tuple):
            stack.extend(value)
    size = len(json.dumps(input, separators=(",", ":")).encode())
    if size > rt.settings.max_input_bytes:
        raise InvalidParam(f"input is larger than {rt.settings.max_input_bytes} bytes",
                           param="input")


def _plain_text(value: str) -> bool:
    if "\x00" in value:
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate
        return False
    return True


def submit_job(
    rt: Runtime,
    user_id: uuid.UUID,
    provider_kind: str,
    model: str,
    input: Mapping[str, Any],
    credits_: int,
    *,
    job_type: str,
    should_watermark: bool | None = None,
    is_public: bool | None = None,
    workflow_execution_id: uuid.UUID | None = None,
    node_id: str | None = None,
    validator: Validator | None = None,
    enqueue: bool = True,
    job_id: uuid.UUID | None = None,
    options: Mapping[str, Any] | None = None,
    idempotency_key: str | None = None,
) -> Submitted:
    """Validate, reserve the credits and insert the job in ONE transaction; then (async kinds
    only, after commit) enqueue the create. Raises InvalidParam / InsufficientCredits /
    Conflict (``IDEMPOTENCY_KEY_REUSED``).

    ``options`` are provider request options that are not model input (a Replicate training's
    ``destination``, a ``webhook_events_filter``); they reach the client as ``CreateRequest.extra``.
    ``idempotency_key`` (unique per user, :mod:`reconcile.idempotency`): a repeat of the same
    request returns the original job (``Submitted.replay``) without inserting or reserving.
    A failed enqueue after the commit is logged, not raised: the job exists and the sweep's
    not-started row enqueues its create.
    """
    kind = _validate(provider_kind, model, input, credits_, validator, rt)
    _check_storable(rt, model, input, job_type)
    key = idempotency.check_key(idempotency_key)
    job_id = job_id or uuid.uuid4()
    now = rt.now()
    with rt.sessions.begin() as session:
        if key is not None:
            digest = idempotency.fingerprint({
                "provider_kind": provider_kind, "model": model, "input": input,
                "credits": credits_, "job_type": job_type, "options": options,
                "should_watermark": should_watermark, "is_public": is_public,
                "workflow_execution_id": workflow_execution_id, "node_id": node_id})
            replay = idempotency.claim(session, user_id, key, digest, job_id, now)
            if replay is not None:  # nothing was written: the commit is empty
                log.info("job_submit_replayed job_id=%s", replay.job_id)
                return Submitted(replay.job_id, kind, replay)
        jobstore.insert_job(
            session,
            id=job_id, user_id=user_id, job_type=job_type, status=Status.PENDING,
            input_data=dict(input), progress=0, should_watermark=should_watermark,
            is_public=is_public, workflow_execution_id=workflow_execution_id, node_id=node_id,
            created_at=now, provider_kind=provider_kind, provider_model=model,
            submission_state=Submission.NOT_STARTED,
            provider_options=dict(options) if options else None,
        )
        session.flush()  # the job row before the ledger's rows that name it
        rt.ledger.reserve(session, user_id, job_id, credits_, now=now)
        queued = add_event(session, _stub(job_id, user_id), "queued", now, rt=rt)
    publish_events(rt, [queued])
    if enqueue and not kind.sync:
        _enqueue_after_commit(rt, job_id)
    log.info("job_submitted job_id=%s kind=%s", job_id, provider_kind)
    return Submitted(job_id, kind)


def _enqueue_after_commit(rt: Runtime, job_id: uuid.UUID) -> bool:
    """The job and its reservation are committed: a broker that is down must not turn that
    into an error the client would retry (a second job, paid twice). The sweep's not-started
    row enqueues the create once the job is NOT_STARTED_AGE old (then ≤ one sweep interval)."""
    try:
        rt.enqueue_create(job_id)
        return True
    except Exception:
        log.exception("create_enqueue_failed job_id=%s (the sweep re-enqueues it)", job_id)
        return False


def _stub(job_id: uuid.UUID, user_id: uuid.UUID) -> Job:
    return Job(id=job_id, user_id=user_id)


# ----------------------------------------------------------------------------- create


@dataclass(frozen=True)
class CreateOutcome:
    """What one create step did: ``accepted``, ``rejected``, ``rate_limited``, ``uncertain``,
    ``resumed`` (the id was already there), ``busy`` (someone holds the claim), ``lost``."""

    action: str
    job_id: uuid.UUID
    error: ProviderError | None = None


def poll_lease(rt: Runtime, kind: Kind, age: timedelta = timedelta(0)) -> timedelta:
    """2 × interval + slack (scaled like every duration): what a live chain must beat between
    two turns, and how long a dead one waits for the sweep (issue 16, bench figure 6).

    It does not cover :func:`poll_step_deadline`: a status read slower than the slack loses the
    lease, and the sweep may start a new generation beside it — safe (the slow chain is fenced
    at its next turn; its answer goes through the same CAS paths), a duplicate read at worst."""
    return _lease_for(rt, kind.interval_at(age))


def _lease_for(rt: Runtime, interval: timedelta) -> timedelta:
    return rt.settings.scaled(interval * 2 + POLL_LEASE_SLACK)


def _turn_leases(rt: Runtime) -> dict[str, list[tuple[timedelta | None, timedelta]]]:
    """Every registered kind's ``poll_lease(rt, kind, age)`` by age (``Kind.interval_steps``):
    the poll turn picks its row's in SQL, so it needs no load before it. Worked out once per
    registry and time scale (kinds are frozen: a changed kind is a new object)."""
    kinds = all_kinds()
    key = (tuple(map(id, kinds)), rt.settings.time_scale)
    cached = _TURN_LEASES.get(key)
    if cached is None:
        leases = {kind.name: [(after, _lease_for(rt, interval))
                              for after, interval in kind.interval_steps()] for kind in kinds}
        if len(_TURN_LEASES) > 32:
            _TURN_LEASES.clear()
        # the kinds stay referenced by the entry, so their ids cannot be reused while it lives
        cached = _TURN_LEASES[key] = (kinds, leases)
    return cached[1]


_TURN_LEASES: dict[tuple[tuple[int, ...], Any], tuple[Any, dict[str, list[tuple[timedelta | None, timedelta]]]]] = {}


def _async_kinds() -> list[str]:
    return [kind.name for kind in all_kinds() if not kind.sync]


def poll_step_deadline(settings: Any) -> timedelta:
    """The longest one status read can take: every attempt to its total deadline (connect +
    read timeout) plus the capped backoff between attempts (``states.POLL_READ_*``)."""
    per_request = timedelta(seconds=settings.connect_timeout + settings.read_timeout)
    return per_request * POLL_READ_ATTEMPTS + POLL_READ_BACKOFF_MAX * (POLL_READ_ATTEMPTS - 1)


def poll_countdown(rt: Runtime, kind: Kind, job: Job, now: datetime) -> float:
    started = job.provider_call_started_at or now
    return rt.settings.scaled(kind.interval_at(now - started)).total_seconds()


def create_step(rt: Runtime, job_id: uuid.UUID) -> CreateOutcome:
    """Run the create for one job, at most once upstream whatever the number of messages.

    The claim comes first and is the step's load (one ``UPDATE … RETURNING``, only for a
    not-started row of an async kind); only a lost claim reads the row to tell a resume, a busy
    claim or an expired one from a lost message.
    """
    now = rt.now()
    token = uuid.uuid4().hex
    rt.crash_point("before_claim")
    with rt.sessions.begin() as session:
        claimed = jobstore.claim_create(session, job_id, token, now,
                                        rt.settings.scaled(CREATE_CLAIM_LEASE),
                                        kinds=_async_kinds())  # sync kinds: the platform's request
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
                # look up later; the sweep fails + refunds it past the threshold (§6)
                return CreateOutcome("lost", job_id)
            jobstore.mark_uncertain(session, job_id, token=None, now=now,
                                    code=ErrorCode.UPSTREAM_SUBMISSION_UNCERTAIN,
                                    detail={"reason": "submission claim expired before the id was saved"})
            return CreateOutcome("uncertain", job_id)
    # the retry guard (seed phase 4): a persisted id is resumed, never re-created
    resume_chain(rt, job_id, only_if_lease_expired=True)
    return CreateOutcome("resumed", job_id)


def usable_task_id(task_id: object) -> bool:
    """An upstream id the job row can hold and a poll can name (PostgreSQL text cannot hold
    NUL: saving one raises, and would leave an accepted create in an error loop)."""
    return isinstance(task_id, str) and bool(task_id) and "\x00" not in task_id


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
    with rt.sessions.begin() as session:
        if kind is None:
            job = jobstore.load(session, job_id)
            kind = rt.kind(job.provider_kind) if job else None
            if job is None or kind is None:
                return False
        batch = _batch_mode(rt)
        saved = jobstore.save_task_id(session, job_id, token, task_id, now, poll_lease(rt, kind),
                                      poll_due_at=_first_due(rt, kind, now) if batch else None)
        if saved is None:
            job = job or jobstore.load(session, job_id)
            if job is None:
                return False
            verdict = _late_answer(session, job, task_id, now)
        else:
            running = add_event(session, saved, "running", now, {"provider_task_id": task_id}, rt=rt)
    if saved is None:
        assert job is not None
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
    if not batch:  # batch mode: the row is due at poll_due_at, no message (reconcile.batch_poll)
        rt.enqueue_poll(job_id, saved.poll_generation, 0, poll_countdown(rt, kind, saved, now))
    return True


def _batch_mode(rt: Runtime) -> bool:
    return rt.settings.poll_mode == "batch"


def _first_due(rt: Runtime, kind: Kind, now: datetime) -> datetime:
    from .batch_poll import first_due

    return first_due(rt, kind, now)


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


def _rate_limited(rt: Runtime, job: Job, token: str, exc: CreateRateLimited) -> CreateOutcome:
    now = rt.now()
    count = job.create_rate_limit_count + 1
    if count >= MAX_RATE_LIMITED_CREATES:
        fail_job(rt, job.id, ErrorCode.UPSTREAM_RATE_LIMITED, exc.message,
                 _detail(exc, submission="rejected", tries=count),
                 submission_state=Submission.REJECTED, where=_owner_where(token))
        return CreateOutcome("rejected", job.id, exc)
    wait = exc.retry_after if exc.retry_after is not None else 2.0 * (2 ** count)
    wait_td = rt.settings.scaled(timedelta(seconds=max(wait, 1.0)))
    with rt.sessions.begin() as session:
        released = jobstore.release_rate_limited(session, job.id, token, now + wait_td,
                                                 _detail(exc, tries=count))
    # a wait past the broker's countdown bound is no message: create_not_before holds it and
    # the sweep's not-started row enqueues the create once it has passed
    if released is not None and wait_td.total_seconds() <= rt.settings.max_countdown:
        rt.enqueue_create(job.id, wait_td.total_seconds())
    return CreateOutcome("rate_limited", job.id, exc)


# ----------------------------------------------------------------------------- poll


def resume_chain(rt: Runtime, job_id: uuid.UUID, *, only_if_lease_expired: bool = False) -> bool:
    """Start a new poll chain (new generation) for an accepted job."""
    now = rt.now()
    with rt.sessions.begin() as session:
        job = jobstore.load(session, job_id)
        kind = rt.kind(job.provider_kind) if job else None
        if job is None or kind is None or kind.sync or job.status not in IN_FLIGHT:
            return False
        batch = _batch_mode(rt)
        if only_if_lease_expired and batch and job.poll_due_at is not None:
            return False  # scheduled: due (or claimed until its lease ends) — nothing to resume
        if only_if_lease_expired and job.poll_lease_expires_at and job.poll_lease_expires_at > now:
            return False
        # batch mode: the new generation is due now (a claim in progress is fenced), no message
        fresh = jobstore.start_new_chain(session, job_id, now, poll_lease(rt, kind),
                                         poll_due_at=now if batch else None)
    if fresh is None:
        return False
    log.info("poll_chain_resumed job_id=%s generation=%s batch=%s", job_id,
             fresh.poll_generation, batch)
    if not batch:
        rt.enqueue_poll(job_id, fresh.poll_generation, 0, 0.0)
    return True


def poll_step(rt: Runtime, job_id: uuid.UUID, generation: int, seq: int) -> str:
    """One status read for one job; reschedules itself while the job is in flight.

    The turn is the step's load: one ``UPDATE … RETURNING`` whose lease is the row's
    ``poll_lease(kind, age)`` picked in SQL. Only a lost turn reads the row (``lost``: no such
    job or an unknown kind; else ``fenced``).
    """
    now = rt.now()
    with rt.sessions.begin() as session:
        turn = jobstore.take_poll_turn(session, job_id, generation, seq, _turn_leases(rt),
                                       now=now)
    kind = rt.kind(turn.provider_kind) if turn is not None else None
    if turn is None or kind is None:
        with rt.sessions() as session:
            job = jobstore.load(session, job_id)
        return "fenced" if job is not None and rt.kind(job.provider_kind) is not None else "lost"
    rt.crash_point("mid_poll")
    outcome = observe(rt, turn, kind, via="poll")
    if outcome in ("in_flight", "error"):
        if _batch_mode(rt):  # a chain message from before the switch: the row carries on due
            from .batch_poll import reschedule_after_chain

            reschedule_after_chain(rt, kind, turn, generation, seq + 1)
        else:
            rt.enqueue_poll(job_id, generation, seq + 1, poll_countdown(rt, kind, turn, rt.now()))
    return outcome


def read_status(rt: Runtime, job: Job, kind: Kind) -> PollResult | ProviderError:
    client = rt.client(kind)
    try:
        return client.poll(job.provider_task_id or "", model=job.provider_model)  # type: ignore[union-attr]
    except ProviderError as exc:
        return exc


def observe(rt: Runtime, job: Job, kind: Kind, *, via: str,
            result: PollResult | ProviderError | None = None) -> str:
    """Read the task once (unless ``result`` is given) and act on it through the CAS paths.

    Returns ``completed``, ``failed``, ``in_flight``, ``lost`` (someone else finished it) or
    ``error``. Whatever a step raises (a read, a finalize sub-step, a platform hook, the
    ledger's commit) is no verdict about the task: it counts as an attempt with its code in
    ``reconcile_last_error`` (issue 11 hole 2), so no job outlives its exhaustion horizon;
    ``error`` means the job is still in flight after such a raise (the chain goes on).
    """
    try:
        return _observe(rt, job, kind, via=via, result=result)
    except Exception as exc:
        log.exception("observe_step_failed job_id=%s via=%s", job.id, via)
        code = exc.code if isinstance(exc, ReconcileError) else ErrorCode.INTERNAL
        outcome = _unfinished(rt, job, kind, None, f"{code}: {type(exc).__name__}: {exc}"[:1000],
                              raised=str(code))
        return "error" if outcome == "in_flight" else outcome


def _observe(rt: Runtime, job: Job, kind: Kind, *, via: str,
             result: PollResult | ProviderError | None) -> str:
    if result is None:
        result = read_status(rt, job, kind)
    if isinstance(result, ProviderError):
        # a failed read is no verdict: at exhaustion it counts as "still running" (TIMEOUT)
        return _unfinished(rt, job, kind, None, f"read failed: {result.message}")
    if result.status is PollStatus.SUCCEEDED:
        if not result.outputs:
            ok = fail_job(rt, job.id, ErrorCode.UPSTREAM_EMPTY_RESULT,
                          "The provider reported success but returned no media.",
                          _poll_detail(result, via))
            return "failed" if ok else "lost"
        limit = rt.settings.max_outputs_per_job
        if len(result.outputs) > limit:  # bounded before any download (a DoS otherwise)
            ok = fail_job(rt, job.id, ErrorCode.UPSTREAM_OUTPUT_LIMIT,
                          f"The provider returned more than {limit} outputs.",
                          {**_poll_detail(result, via), "outputs": len(result.outputs)})
            return "failed" if ok else "lost"
        try:
            ok = finalize_job_with_media(rt, job.id, result, source=via, job=job)
        except MediaExpired as exc:
            return _unfinished(rt, job, kind, ErrorCode.UPSTREAM_MEDIA_EXPIRED, exc.message)
        except (UnsafeMediaURL, MediaTooLarge) as exc:
            # refused, not failed: kept in flight (an operator may fix the allow-list) and, at
            # exhaustion, failed UPSTREAM_FAILED with the reason rather than as a timeout
            return _unfinished(rt, job, kind, ErrorCode.UPSTREAM_FAILED,
                               f"media refused: {exc.message}")
        except MediaError as exc:
            return _unfinished(rt, job, kind, None, f"media fetch failed: {exc.message}")
        return "completed" if ok else "lost"
    if result.status in (PollStatus.FAILED, PollStatus.CANCELED):
        message = result.error_message or f"The provider reported {result.raw_status or 'failure'}."
        ok = fail_job(rt, job.id, ErrorCode.UPSTREAM_FAILED, message, _poll_detail(result, via))
        return "failed" if ok else "lost"
    if result.status is PollStatus.UNKNOWN:
        return _unfinished(rt, job, kind, ErrorCode.UPSTREAM_UNKNOWN_STATUS,
                           f"unknown status {result.raw_status!r}")
    if result.status is PollStatus.NOT_FOUND:
        return _unfinished(rt, job, kind, ErrorCode.UPSTREAM_TASK_NOT_FOUND, "task not found upstream")
    if result.progress is not None:
        progress = max(0, min(99, int(result.progress)))
        if job.progress is None or progress > job.progress:  # else the CAS could only lose
            with rt.sessions.begin() as session:
                jobstore.set_progress(session, job.id, progress)
    return _unfinished(rt, job, kind, None, None)


def _poll_detail(result: PollResult, via: str) -> dict[str, Any]:
    detail: dict[str, Any] = {"via": via}
    if result.error_code is not None:
        detail["provider_code"] = result.error_code
    if result.error_message is not None:
        detail["provider_message"] = result.error_message
    if result.raw_status is not None:
        detail["raw_status"] = result.raw_status
    if result.request_id is not None:
        detail["upstreamRequestId"] = result.request_id
    return detail


def past_threshold(rt: Runtime, job: Job, kind: Kind, now: datetime) -> bool:
    started = job.provider_call_started_at or job.started_at or job.created_at
    return now - started >= rt.settings.scaled(kind.stale_threshold)


def _unfinished(rt: Runtime, job: Job, kind: Kind, code: str | None, message: str | None, *,
                raised: str | None = None) -> str:
    """Still not finished: note the error; past the threshold, count an attempt; at
    MAX_ATTEMPTS fail the job with the last error's code (or UPSTREAM_TIMEOUT). ``raised``: the
    code of a raising step (no verdict; ``message`` names it), stored as the error's code."""
    now = rt.now()
    last_error = f"{code}: {message}" if code else message
    error_code = str(code) if code else raised
    # an error with no code (a failed read, a failed fetch, a raising step) is no verdict about
    # the task: it never erases the last upstream verdict (not found, expired media…); "still
    # running" (no error at all) is one
    verdict = code is not None or message is None
    if not past_threshold(rt, job, kind, now):
        if last_error:
            _note_error(rt, job, last_error, verdict, error_code)
        return "in_flight"
    with rt.sessions.begin() as session:
        counted = jobstore.count_attempt(session, job.id, now, rt.settings.scaled(ATTEMPT_SPACING),
                                         last_error, verdict=verdict, code=error_code)
    if counted is None:
        if last_error:
            _note_error(rt, job, last_error, verdict, error_code)
        return "in_flight"
    if counted.reconcile_attempts < MAX_ATTEMPTS:
        return "in_flight"
    return exhaust(rt, counted)


def _note_error(rt: Runtime, job: Job, last_error: str, verdict: bool,
                code: str | None = None) -> None:
    """``note_error``, only when it changes the row as this step read it (``job`` is the
    step's own fresh row, kept in step with what it writes)."""
    from . import redact

    current, new = job.reconcile_last_error, redact.signed(last_error)
    if not verdict and jobstore.is_verdict(jobstore.last_error_code(job)):
        return  # an error that is no verdict keeps the upstream one
    if current == new:
        return
    with rt.sessions.begin() as session:
        if not jobstore.note_error(session, job.id, last_error, verdict=verdict, code=code):
            return  # no longer in flight: the row was not written
    job.reconcile_last_error, job.reconcile_last_error_code = new, code


def exhaust(rt: Runtime, job: Job) -> str:
    """Attempts exhausted: fail with the last error's code (or UPSTREAM_TIMEOUT) + anomaly."""
    last = job.reconcile_last_error or ""
    found = jobstore.last_error_code(job)  # the column (legacy rows: their text's prefix)
    code = found if found is not None and (jobstore.is_verdict(found) or found == ErrorCode.INTERNAL) \
        else ErrorCode.UPSTREAM_TIMEOUT
    message = ("The provider did not finish in time." if code == ErrorCode.UPSTREAM_TIMEOUT
               else last.split(": ", 1)[-1])
    ok = fail_job(rt, job.id, code, message,
                  {"attempts": job.reconcile_attempts, "last_error": last or None},
                  anomaly="reconcile_exhausted")
    return "failed" if ok else "lost"


# ----------------------------------------------------------------------------- finalize


@dataclass(frozen=True)
class _Stored:
    key: str
    media_type: str | None


def finalize_job_with_media(rt: Runtime, job_id: uuid.UUID, result: PollResult | None, *,
                            source: str, outputs: tuple[Output, ...] | None = None,
                            job: Job | None = None) -> bool:
    """Store every output, then complete + commit + assets + event + workflow reopen in ONE
    transaction. False: the job was already terminal or another writer won the race.

    ``job``: the row the caller's step just read (a poll turn, a sweep claim); then it is not
    read again. Only fields fixed at submit are taken from it, and its status only as the early
    "already terminal" check: the completion CAS is what decides.
    """
    from .media import guess_extension, safe_fetch
    from .storage import object_key

    outputs = outputs if outputs is not None else (result.outputs if result else ())
    if job is None or job.id != job_id:
        with rt.sessions() as session:
            job = jobstore.load(session, job_id)
    if job is None or job.status in TERMINAL:
        if job is not None and job.status == Status.CANCELLED:
            _completion_refused(rt, job, source)
        return False
    kind = rt.kind(job.provider_kind)
    client = rt.client(kind) if kind is not None else None
    media_headers = getattr(client, "media_headers", None)
    watermark = True if job.should_watermark is None else bool(job.should_watermark)
    is_public = True if job.is_public is None else bool(job.is_public)

    stored: list[_Stored] = []
    texts: list[str] = []
    kept = _already_stored(rt, job)
    for index, output in enumerate(outputs):
        if output.url and index in kept:  # stored by an earlier attempt: never fetched twice
            stored.append(_Stored(kept[index], output.media_type or _media_type_of(kept[index])))
            continue
        if output.data is not None:
            data, media_type = output.data, output.media_type
        elif output.text is not None:
            data, media_type = output.text.encode(), output.media_type or "text/plain"
            texts.append(output.text)
        elif output.url:
            fetched = safe_fetch(output.url, allowed_hosts=rt.settings.media_allowed_hosts,
                                 max_bytes=rt.settings.media_max_bytes,
                                 timeout=rt.settings.media_timeout,
                                 # per URL: a client's key goes only to its own host
                                 headers=media_headers(output.url) if callable(media_headers)
                                 else None)
            data, media_type = fetched.data, output.media_type or fetched.content_type
        else:
            continue
        if watermark and rt.watermark_hook is not None and media_type and \
                media_type.startswith(("image/", "video/")):
            data = rt.watermark_hook(data, media_type, job)
        key = object_key(job.job_type, str(job.id), index,
                         guess_extension(media_type, output.url or ""))
        rt.storage.put(key, data, media_type)
        stored.append(_Stored(key, media_type))
    rt.crash_point("after_upload")

    now = rt.now()
    won = False
    with rt.sessions.begin() as session:
        # the policy decides what the completion commits (reconcile.settlement); the ledger
        # below executes it (and refuses a price above what is held)
        amount = decide(Finished.COMPLETED,
                        priced=rt.pricing_hook(job, result) if rt.pricing_hook else None).commit
        # an explicit amount is what the commit below charges: written with the completion
        cost = {} if amount is None else {"credits_actual": amount, "display_cost": amount}
        done = jobstore.mark_completed(
            session, job_id,
            output_data={"outputs": [{"key": s.key, "media_type": s.media_type} for s in stored],
                         **({"text": "\n".join(texts)} if texts else {})},
            provider=provider_of(job.provider_kind),
            provider_cost=result.cost_usd if result else None,
            completed_at=now, progress=100, error_code=None, error_message=None,
            reconcile_last_error=None, **cost,
        )
        if done is not None:
            won = True
            from .ledger import commit_settled  # the amount with the commit, no re-read

            actual = commit_settled(rt.ledger, session, job_id, amount, now=now)
            actual = actual if actual is not None else 0
            if actual != amount:
                # not known at the completion CAS (no pricing hook), or the commit settled
                # otherwise (nothing held any more, legacy refunds)
                jobstore.record_cost(session, job_id, actual)  # refreshes ``done`` too
            for index, s in enumerate(stored):
                session.add(Asset(id=uuid.uuid4(), job_id=job_id, user_id=job.user_id, index=index,
                                  storage_key=s.key, media_type=s.media_type, is_public=is_public,
                                  watermarked=watermark and rt.watermark_hook is not None,
                                  created_at=now))
            completed = add_event(session, done, "completed", now,
                                  {"outputs": len(stored), "credits_actual": done.credits_actual,
                                   "via": source}, rt=rt)
            _reopen_workflow(session, done)
            hook = rt.completion_hooks.get(job.provider_kind or "")
            if hook is not None:
                hook(session, done, result)
    if not won:
        _drop_orphans(rt, job_id, [s.key for s in stored])
        with rt.sessions() as session:
            current = jobstore.load(session, job_id)
        if current is not None and current.status == Status.CANCELLED:
            _completion_refused(rt, current, source)
        log.info("finalize_lost job_id=%s source=%s", job_id, source)
        return False
    rt.crash_point("after_complete_txn")
    publish_events(rt, [completed])
    log.info("job_completed job_id=%s source=%s outputs=%d", job_id, source, len(stored))
    return True


def _already_stored(rt: Runtime, job: Job) -> dict[int, str]:
    """Index → key of the outputs an earlier (unfinished) attempt already stored for the job."""
    from .storage import object_key

    prefix = object_key(job.job_type, str(job.id), 0, "bin").rsplit("/", 1)[0] + "/"
    kept: dict[int, str] = {}
    for key in rt.storage.keys(prefix):
        stem = key[len(prefix):].split(".", 1)[0]
        if stem.isdigit():
            kept.setdefault(int(stem), key)
    return kept


def _media_type_of(key: str) -> str | None:
    from .media import media_type_for_extension

    return media_type_for_extension(key.rsplit(".", 1)[-1])


def _completion_refused(rt: Runtime, job: Job, source: str) -> None:
    """DESIGN §5.6: a completion after a local cancel is ignored, and logged as an anomaly."""
    with rt.sessions.begin() as session:
        jobstore.record_anomaly(session, job_id=job.id, user_id=job.user_id,
                                kind="completed_after_cancel",
                                detail={"source": source, "task_id": job.provider_task_id},
                                now=rt.now())
    log.warning("completion_after_cancel job_id=%s source=%s", job.id, source)


def _drop_orphans(rt: Runtime, job_id: uuid.UUID, keys: list[str]) -> None:
    """The loser of a race deletes what it stored that no asset row names (best effort)."""
    with rt.sessions() as session:
        named = set(session.execute(select(Asset.storage_key).where(Asset.job_id == job_id)).scalars())
    for key in keys:
        if key not in named:
            try:
                rt.storage.delete(key)
            except Exception:  # best effort; the chaos report counts orphans
                log.warning("orphan_delete_failed job_id=%s key=%s", job_id, key)


def _reopen_workflow(session: Session, job: Job) -> None:
    """Seed §5.7: a sole-cause failed execution is reopened (CAS on ``failed``)."""
    from sqlalchemy import update

    from .db.models import WorkflowExecution

    if job.workflow_execution_id is None or job.node_id is None:
        return
    execution = session.execute(
        select(WorkflowExecution).where(WorkflowExecution.id == job.workflow_execution_id)
        .with_for_update()).scalar_one_or_none()
    if execution is None or execution.status != "failed":
        return
    failed = execution.failed_nodes
    if isinstance(failed, str):
        try:
            failed = json.loads(failed)
        except ValueError:
            return
    if failed != [job.node_id]:
        return  # multi-cause: stays failed; the output is still a standalone asset
    session.execute(update(WorkflowExecution)
                    .where(WorkflowExecution.id == execution.id, WorkflowExecution.status == "failed")
                    .values(status="completed", failed_nodes=[], error_message=None))


# ----------------------------------------------------------------------------- fail & settle


def fail_job(rt: Runtime, job_id: uuid.UUID, code: str, message: str,
             detail: dict[str, Any] | None, *, submission_state: str | None = None,
             where: tuple[Any, ...] = (), anomaly: str | None = None,
             status: str = Status.FAILED) -> bool:
    """Persist the failure (and ``next_poll_at = now``) first, then settle the refund."""
    from . import redact

    detail = redact.detail(detail)  # the anomaly below stores it too
    now = rt.now()
    with rt.sessions.begin() as session:
        failed = jobstore.mark_failed(session, job_id, now=now, code=str(code), message=message,
                                      detail=detail, where=where,
                                      submission_state=submission_state, status=status)
        if failed is None:
            return False
        event = add_event(session, failed, "canceled" if status == Status.CANCELLED else "failed",
                          now, {"code": str(code)}, rt=rt)
        if anomaly:
            jobstore.record_anomaly(session, job_id=job_id, user_id=failed.user_id, kind=anomaly,
                                    detail={"code": str(code), **(detail or {})}, now=now)
    log.info("job_failed job_id=%s code=%s", job_id, code)
    rt.crash_point("before_refund")
    settle(rt, job_id)
    publish_events(rt, [event])
    return True


def settle(rt: Runtime, job_id: uuid.UUID) -> SettleOutcome:
    """Settle a failed/cancelled job as ``rt.settlement_policy`` decides (by default: refund
    everything held) and record ``credits_actual``; on error back off.

    Returns a :class:`~reconcile.settlement.SettleOutcome` (never test it for truthiness).
    Repeating never adds a second refund (the ledger's CAS); legacy refunds count.
    """
    now = rt.now()
    try:
        with rt.sessions.begin() as session:
            job = jobstore.load(session, job_id, lock=True)
            if job is None or job.status not in (Status.FAILED, Status.CANCELLED):
                return SettleOutcome.NOT_DUE
            if job.credits_actual is not None:
                return SettleOutcome.ALREADY_SETTLED
            _execute_settlement(rt, session, job, now)
            rt.crash_point("mid_refund")
            actual = rt.ledger.settled_amount(session, job_id)
            jobstore.settled(session, job_id, actual if actual is not None else 0)
        log.info("job_settled job_id=%s", job_id)
        return SettleOutcome.SETTLED
    except Exception as exc:
        log.exception("settle_failed job_id=%s", job_id)
        with rt.sessions.begin() as session:
            job = jobstore.load(session, job_id)
            if job is not None:
                jobstore.settle_failed(session, job_id, now + settle_backoff(job.settle_attempts))
                if not isinstance(exc, DBAPIError):  # the ledger refused: one anomaly per job
                    _ledger_error_once(session, job, exc, now)
        return SettleOutcome.BACKED_OFF


def _execute_settlement(rt: Runtime, session: Session, job: Job, now: datetime) -> None:
    """The ledger executes the policy's decision for a failed/cancelled job: a full refund is
    the ledger's ``refund`` (nothing read first); a partial one needs what is held (one read)
    and is a commit of the kept part, the ledger releasing the rest to its pools."""
    from .ledger import commit_settled

    policy = rt.settlement_policy
    share = policy.cancel_refund if job.status == Status.CANCELLED else policy.failure_refund
    reserved = None if share == 1 else _held(session, job.id)
    decision = decide(job.status, reserved=reserved, policy=policy)
    if decision.full_refund:
        rt.ledger.refund(session, job.id, now=now)
    else:
        commit_settled(rt.ledger, session, job.id, decision.commit, now=now)


def _held(session: Session, job_id: uuid.UUID) -> int:
    """What the job's reservation still holds: its reserved usage log net of legacy refunds
    (0: nothing reserved any more)."""
    from . import credits
    from .db.models import UsageLog

    reserved = session.execute(
        select(UsageLog.credits).where(UsageLog.job_id == job_id, UsageLog.status == "reserved")
        .order_by(UsageLog.created_at).limit(1)).scalar_one_or_none()
    if reserved is None:
        return 0
    return max(0, int(reserved) - credits.legacy_refunded(session, job_id))


def _ledger_error_once(session: Session, job: Job, exc: Exception, now: datetime) -> None:
    """One ``ledger_error`` anomaly per job whose settlement the ledger refused (the failure is
    already saved; settlement retries with capped backoff and shows in ``reconcile unsettled``)."""
    jobstore.record_anomaly(session, job_id=job.id, user_id=job.user_id, kind="ledger_error",
                            detail={"error": f"{type(exc).__name__}: {exc}"[:1000],
                                    "status": job.status}, now=now, once=True)


# ----------------------------------------------------------------------------- uncertain


def adopt_upstream_id(rt: Runtime, job_id: uuid.UUID, task_id: str, *, source: str) -> bool:
    """Evidence found (a webhook, a provider listing, an operator): an ``uncertain`` (or expired
    ``submitting``) job takes the upstream id, becomes ``accepted``/``processing`` with attempts
    reset, and its poll chain starts. False: the job is not waiting for evidence any more."""
    now = rt.now()
    with rt.sessions.begin() as session:
        job = jobstore.load(session, job_id)
        kind = rt.kind(job.provider_kind) if job else None
        if job is None or kind is None or kind.sync or not usable_task_id(task_id):
            return False
        adopted = jobstore.adopt_task_id(
            session, job_id, task_id, now, poll_lease_until=now + poll_lease(rt, kind),
            poll_due_at=now if _batch_mode(rt) else None, source=source)
        if adopted is None:
            return False
        running = add_event(session, adopted, "running", now,
                            {"provider_task_id": task_id, "adopted_from": source}, rt=rt)
    publish_events(rt, [running])
    log.info("uncertain_adopted job_id=%s task_id=%s source=%s", job_id, task_id, source)
    if not _batch_mode(rt):
        rt.enqueue_poll(job_id, adopted.poll_generation, 0, 0.0)
    return True


def resolve_not_submitted(rt: Runtime, job_id: uuid.UUID, *, reason: str = "operator") -> bool:
    """An operator established that nothing was created upstream: fail + refund."""
    return fail_job(
        rt, job_id, ErrorCode.RECONCILE_NO_RECOVERY, "reconcile_no_recovery",
        {"resolved": "not_submitted", "by": reason, "submissionOutcome": "rejected"},
        submission_state=Submission.REJECTED,
        where=(Job.submission_state.in_([Submission.UNCERTAIN, Submission.SUBMITTING]),
               Job.provider_task_id.is_(None),
               # a live claim means a worker may be creating right now: not for an operator
               jobstore.uncertain_expired(rt.now())),
    )
