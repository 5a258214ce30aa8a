"""Webhook ingestion: verify → store (dedupe) → re-read the task → the same CAS path as polls.

``handle_webhook`` is framework-agnostic: give it the provider name (``kie``, ``replicate``,
``elevenlabs``, ``fal`` or a platform's registered scheme — the last path segment of the planted
callback URL, the kind's :attr:`~reconcile.kinds.Kind.provider`), the headers, the
raw body and the query string; it returns ``(http_status, body)``. Polling stays authoritative:
a delivery only makes the library read the task now. A delivery that names a job still
``submitting``/``uncertain`` is kept as evidence for the sweep, never dropped (what may bind it
to the job: :mod:`reconcile.jobstore.evidence`).

Bounds: a body over ``WEBHOOK_MAX_BODY_BYTES`` is refused (413) before any parsing; a delivery
only ever reads the task of a job of its own provider, and never that of a platform row of an
``OBSERVE_ONLY_KINDS`` kind (stored only: the platform's own code runs it); a confirmed success
is handed to a worker (a fresh poll chain) — the request thread stores and enqueues, it never
fetches media.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import re
import uuid
from collections.abc import Mapping
from typing import Any

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError

from . import jobstore, lifecycle, webhooks
from .core import redact
from .db.models import Job, WebhookDelivery
from .errors import (
    ErrorCode,
    ProviderError,
    ReadFailed,
    WebhookError,
    WebhookPayloadError,
)
from .jobstore import adoption
from .kinds import provider_of
from .providers.base import PollResult, PollStatus
from .runtime import Runtime
from .states import IN_FLIGHT, Submission

__all__ = [
    "handle_webhook",
]

log = logging.getLogger("reconcile.webhooks")


def _scheme(provider: str) -> webhooks.WebhookScheme:
    """The scheme served on this path segment (:mod:`reconcile.webhooks.registry`)."""
    scheme = webhooks.get_scheme(provider)
    if scheme is None:
        raise WebhookPayloadError(f"unknown webhook provider {provider!r}")
    return scheme


_LONE_SURROGATE = re.compile("[\ud800-\udfff]")  # json.loads joins the valid pairs


def _pg_text(value: Any) -> Any:
    """PostgreSQL ``text``/``jsonb`` hold neither NUL nor a lone surrogate, and jsonb has no
    ``NaN``/``Infinity``: a signed delivery carrying one (in an id, a status or anywhere in its
    body) is stored and handled with U+FFFD for the character and the token's name as a string
    (``"NaN"``, ``"Infinity"``, ``"-Infinity"``) for the number — never a 500, never lost."""
    if isinstance(value, str):
        return _LONE_SURROGATE.sub("\ufffd", value.replace("\x00", "\ufffd"))
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, dict):
        return {_pg_text(k): _pg_text(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_pg_text(v) for v in value]
    return value


def _stored(payload: Any) -> dict[str, Any] | None:
    """The payload as the row keeps it: credentials redacted (a presigned output URL's
    ``X-Amz-Signature``/``X-Amz-Security-Token``: :func:`reconcile.core.redact.value`). Nothing
    fetches from a stored payload: outputs come from a fresh read of the task, and the binding
    fields (ids, callback URLs, names) hold no credential shape."""
    return redact.value(payload) if isinstance(payload, dict) else None


def _as_uuid(value: str | None) -> uuid.UUID | None:
    try:
        return uuid.UUID(value) if value else None
    except ValueError:
        return None


def handle_webhook(rt: Runtime, provider: str, headers: Mapping[str, str], body: bytes,
                   query: Mapping[str, str]) -> tuple[int, dict[str, Any]]:
    now = rt.now()
    limit = rt.settings.webhook_max_body_bytes
    if len(body) > limit:  # before any parsing: KIE's body is parsed before its HMAC is checked
        return 413, {"error": {"type": "invalid_request_error", "code": "WEBHOOK_INVALID",
                               "message": f"webhook body over {limit} bytes"}}
    try:
        scheme = _scheme(provider)
        event = scheme.verify(headers, body, query, scheme.secret(rt), now,
                              **scheme.options(rt.settings))
    except WebhookPayloadError as exc:
        return 400, {"error": {"type": "invalid_request_error", "code": "WEBHOOK_INVALID",
                               "message": exc.message}}
    except WebhookError as exc:
        return 401, {"error": {"type": "authentication_error", "code": "WEBHOOK_REJECTED",
                               "message": exc.message}}
    except ReadFailed as exc:  # the JWKS could not be fetched: let the provider retry
        return 503, {"error": {"type": "internal_error", "code": "INTERNAL", "message": exc.message}}
    event = dataclasses.replace(event, **{f: _pg_text(getattr(event, f)) for f in (
        "delivery_id", "task_id", "status", "error", "payload")})

    if isinstance(event.payload, dict):  # what the scheme keeps with the row (fal: the account)
        event = dataclasses.replace(event, payload=scheme.stamp(event.payload, rt.settings))
    planted = _as_uuid(event.planted_job_id)
    try:
        with rt.sessions.begin() as session:
            session.add(WebhookDelivery(
                provider=provider, delivery_id=event.delivery_id, upstream_id=event.task_id,
                job_id=planted, received_at=now, payload_digest=webhooks.payload_digest(body),
                status=event.status, payload=_stored(event.payload),
            ))
    except IntegrityError:
        return 200, {"status": "duplicate"}

    with rt.sessions() as session:
        job = session.get(Job, planted) if planted else None
        if job is not None and job.provider_task_id and event.task_id and \
                job.provider_task_id != event.task_id:
            job = None  # the planted id is only a hint: the upstream id must match
        if job is None and event.task_id:
            job = session.execute(select(Job).where(
                Job.provider_task_id == event.task_id, Job.status.in_(IN_FLIGHT))).scalars().first()
    if job is not None and provider_of(job.provider_kind) != provider:
        # a delivery on one provider's route never makes us read another provider's task
        log.warning("webhook_provider_mismatch job_id=%s route=%s kind=%s", job.id, provider,
                    job.provider_kind)
        return 202, {"status": "stored"}
    if job is None:
        return 202, {"status": "stored"}
    if adoption.observe_only_platform_row(rt.settings, job):
        # the platform's own row of an observe-only kind: its own worker runs it, the library
        # only watches (README, Adopting on a live platform) — stored, never read or acted on
        log.info("webhook_observe_only job_id=%s kind=%s", job.id, job.provider_kind)
        return 202, {"status": "stored"}
    if job.submission_state in (Submission.SUBMITTING, Submission.UNCERTAIN) and not job.provider_task_id:
        log.info("webhook_evidence job_id=%s upstream_id=%s", job.id, event.task_id)
        return 202, {"status": "evidence"}
    if job.status not in IN_FLIGHT or not job.provider_task_id:
        return 200, {"status": "ignored"}
    kind = rt.kind(job.provider_kind)
    if kind is None or kind.sync:
        return 200, {"status": "ignored"}

    result = lifecycle.read_status(rt, job, kind)
    unreadable = isinstance(result, ProviderError) and getattr(result, "status", None) in (401, 403, 404)
    not_found = isinstance(result, PollResult) and result.status is PollStatus.NOT_FOUND
    if (unreadable or not_found) and event.failed and event.signed_body:
        # the signed body says failed and the confirming read is impossible
        ok = lifecycle.fail_job(rt, job.id, ErrorCode.UPSTREAM_WEBHOOK_ERROR,
                                event.error or "The provider's webhook reported a failure.",
                                {"via": "webhook", "provider_status": event.status})
        return 200, {"status": "failed" if ok else "lost"}
    if isinstance(result, ProviderError) or not_found:
        return 202, {"status": "unconfirmed"}  # the poll chain and the sweep carry on
    if result.status is PollStatus.SUCCEEDED:
        # storing outputs is media work: a worker does it (a fresh poll chain), never the
        # request thread — a delivery naming thousands of outputs cannot hold it
        started = lifecycle.resume_chain(rt, job.id)
        log.info("webhook_enqueued job_id=%s started=%s", job.id, started)
        return 202, {"status": "enqueued"}
    outcome = lifecycle.observe(rt, job, kind, via="webhook", result=result)
    with rt.sessions() as session:
        current = jobstore.load(session, job.id)
    log.info("webhook_handled job_id=%s outcome=%s", job.id, outcome)
    return 200, {"status": outcome, "job_status": current.status if current else None}
