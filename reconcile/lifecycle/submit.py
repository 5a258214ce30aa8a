"""Internal: submit — validate, reserve the credits and insert the job in one transaction, then
enqueue the create after the commit.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .. import idempotency, jobstore
from ..core.limits import storable_text
from ..core.redact import printable
from ..db.models import Job
from ..errors import InvalidParam
from ..jobstore.events import new_event, publish_events
from ..kinds import Kind, binding_key
from ..providers.base import JOB_REF_PREFIX
from ..runtime import Runtime, Validator
from ..states import Status, Submission

log = logging.getLogger("reconcile.lifecycle")


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
    for key in input:  # the library writes its own binding fields (README "Webhook fields that are trusted")
        field = binding_key(kind, key) if isinstance(key, str) else None
        if field is not None:
            raise InvalidParam(f"input may not set {field!r}: the library writes it for "
                               f"{kind.name} jobs", param="input")
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
        if not storable_text(value):
            raise InvalidParam(f"{param} holds a NUL or an unpaired surrogate", param=param)
        if not printable(value):  # an operator's terminal shows identifiers (reconcile show)
            raise InvalidParam(f"{param} holds a control or format character", param=param)
    stack: list[Any] = [input]
    while stack:  # iterative: a deeply nested input cannot exhaust the stack here
        value = stack.pop()
        if isinstance(value, str) and not storable_text(value):
            raise InvalidParam("input holds a NUL or an unpaired surrogate", param="input")
        if isinstance(value, str) and JOB_REF_PREFIX in value.casefold():
            raise InvalidParam(f"input may not use the library's prefix {JOB_REF_PREFIX!r}",
                               param="input")
        if isinstance(value, Mapping):
            stack.extend(value.keys())
            stack.extend(value.values())
        elif isinstance(value, list | tuple):
            stack.extend(value)
    size = len(json.dumps(input, separators=(",", ":")).encode())
    if size > rt.settings.max_input_bytes:
        raise InvalidParam(f"input is larger than {rt.settings.max_input_bytes} bytes",
                           param="input")




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
        queued = new_event(_stub(job_id, user_id), "queued", now, rt=rt)
        # the job row and its event (one statement on PostgreSQL), before the ledger's rows
        # that name the job
        jobstore.insert_job_with_event(session, dict(
            id=job_id, user_id=user_id, job_type=job_type, status=Status.PENDING,
            input_data=dict(input), progress=0, should_watermark=should_watermark,
            is_public=is_public, workflow_execution_id=workflow_execution_id, node_id=node_id,
            created_at=now, provider_kind=provider_kind, provider_model=model,
            submission_state=Submission.NOT_STARTED,
            provider_options=dict(options) if options else None,
        ), queued)
        rt.ledger.reserve(session, user_id, job_id, credits_, now=now)
    # committed: nothing below may raise (a client retrying an error would pay a second job)
    try:
        publish_events(rt, [queued])
    except Exception:  # the outbox row stays unpublished: the sweep republishes it
        log.exception("event_publish_failed job_id=%s", job_id)
    if enqueue and not kind.sync:
        enqueue_create_after_commit(rt, job_id)
    log.info("job_submitted job_id=%s kind=%s", job_id, provider_kind)
    return Submitted(job_id, kind)


def enqueue_create_after_commit(rt: Runtime, job_id: uuid.UUID) -> bool:
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
