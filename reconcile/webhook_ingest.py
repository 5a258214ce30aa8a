"""Webhook ingestion: verify → store (dedupe) → re-read the task → the same CAS path as polls.

``handle_webhook`` is framework-agnostic: give it the provider name (``kie``, ``replicate``,
``elevenlabs``, ``fal`` or a platform's registered scheme — the last path segment of the planted
callback URL, the kind's :attr:`~reconcile.kinds.Kind.provider`), the headers, the
raw body and the query string; it returns ``(http_status, body)``. Polling stays authoritative:
a delivery only makes the library read the task now. A delivery that names a job still
``submitting``/``uncertain`` is kept as evidence for the sweep, never dropped (what may bind it
to the job: :mod:`reconcile.jobstore.evidence`).

Bounds: a body over ``WEBHOOK_MAX_BODY_BYTES`` is refused (413) before any parsing — and before
it is read, by :func:`handle_webhook_stream`: a ``Content-Length`` over the cap is refused at once,
and a body without one is read through :class:`CappedBody` and cut at the cap + 1 byte; a delivery
only ever reads the task of a job of its own provider, and never that of a platform row of an
``OBSERVE_ONLY_KINDS`` kind (stored only: the platform's own code runs it); a confirmed success
is handed to a worker (a fresh poll chain) — the request thread stores and enqueues, it never
fetches media. The confirming read itself (a provider read, retried on 429/5xx with
``Retry-After``) can be moved off the request path too: pass ``defer`` and the delivery is
verified and stored, answered 202 ``confirming``, and the read runs wherever ``defer`` sends it
(the example gateway: after the answer, in a small pool of its own).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import uuid
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError

from . import jobstore, lifecycle, webhooks
from .core import redact
from .core.limits import declared_over, storable
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
    "BodyRefused",
    "CappedBody",
    "handle_webhook",
    "handle_webhook_stream",
    "read_capped",
]

_Answer = tuple[int, dict[str, Any]]

log = logging.getLogger("reconcile.webhooks")


def _scheme(provider: str) -> webhooks.WebhookScheme:
    """The scheme served on this path segment (:mod:`reconcile.webhooks.registry`)."""
    scheme = webhooks.get_scheme(provider)
    if scheme is None:
        raise WebhookPayloadError(f"unknown webhook provider {provider!r}")
    return scheme




def _pg_text(value: Any) -> Any:
    """PostgreSQL ``text``/``jsonb`` hold neither NUL nor a lone surrogate, and jsonb has no
    ``NaN``/``Infinity``: a signed delivery carrying one (in an id, a status or anywhere in its
    body) is stored and handled with U+FFFD for the character and the token's name as a string
    (``"NaN"``, ``"Infinity"``, ``"-Infinity"``) for the number — never a 500, never lost."""
    if isinstance(value, str):
        return storable(value)
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


class BodyRefused(Exception):
    """A request body refused before it was read whole; ``response`` is the answer (413, or 400
    for an unreadable ``Content-Length``)."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.response: _Answer = (status, {"error": {"type": "invalid_request_error",
                                                      "code": code, "message": message}})


class CappedBody:
    """A request body read under a byte cap (issue 25 finding 3): the one home of the rule.

    A declared ``Content-Length`` over ``limit`` is refused at construction, before a byte is
    read; then each chunk is :meth:`feed`-ed as it arrives and the body is refused as soon as it
    passes ``limit`` (a chunked body is cut at the cap + 1 byte). Raises :class:`BodyRefused`;
    ``code`` names the error (``WEBHOOK_INVALID`` for a delivery).
    """

    def __init__(self, limit: int, headers: Mapping[str, str], *, code: str = "WEBHOOK_INVALID",
                 what: str = "webhook body") -> None:
        self.limit, self.code, self.what = limit, code, what
        self.size = 0
        self.parts: list[bytes] = []
        declared = next((str(v) for k, v in headers.items() if str(k).lower() == "content-length"),
                        None)
        if declared is not None:
            over = declared_over(declared, limit)
            if over is None:
                raise BodyRefused(400, code, "Content-Length is not a byte count")
            if over:
                raise self._over()

    def _over(self) -> BodyRefused:
        return BodyRefused(413, self.code, f"{self.what} over {self.limit} bytes")

    def feed(self, chunk: bytes) -> None:
        self.size += len(chunk)
        if self.size > self.limit:
            self.parts.clear()
            raise self._over()
        self.parts.append(chunk)

    def body(self) -> bytes:
        return b"".join(self.parts)


def read_capped(chunks: Iterable[bytes], headers: Mapping[str, str], limit: int, *,
                code: str = "WEBHOOK_INVALID", what: str = "webhook body") -> bytes:
    """The body of ``chunks`` read through :class:`CappedBody` (raises :class:`BodyRefused`):
    nothing past the cap + 1 byte is ever pulled from the iterator."""
    capped = CappedBody(limit, headers, code=code, what=what)
    for chunk in chunks:
        capped.feed(chunk)
    return capped.body()


def handle_webhook_stream(rt: Runtime, provider: str, headers: Mapping[str, str],
                          chunks: Iterable[bytes], query: Mapping[str, str], *,
                          defer: Callable[[Callable[[], _Answer]], None] | None = None,
                          ) -> _Answer:
    """:func:`handle_webhook` for a body still arriving (a WSGI input, a framework's chunk
    iterator): a ``Content-Length`` over ``WEBHOOK_MAX_BODY_BYTES`` is answered 413 before a
    byte is read, and a longer body is cut at the cap + 1 byte (413). Prefer it to reading the
    body yourself."""
    try:
        body = read_capped(chunks, headers, rt.settings.webhook_max_body_bytes)
    except BodyRefused as exc:
        return exc.response
    return handle_webhook(rt, provider, headers, body, query, defer=defer)


def handle_webhook(rt: Runtime, provider: str, headers: Mapping[str, str], body: bytes,
                   query: Mapping[str, str], *,
                   defer: Callable[[Callable[[], _Answer]], None] | None = None) -> _Answer:
    """Verify, store and act on one delivery; ``(http_status, body)``.

    With ``defer``, the confirming read of an in-flight job (and the CAS path after it) is not
    run here: it is handed to ``defer`` as a callable (returning what this function would have
    answered) once the delivery is stored, and the answer is 202 ``confirming``. A verified
    delivery is stored before anything is deferred, so it is never lost; polling stays
    authoritative if the deferred read never runs.
    """
    now = rt.now()
    try:  # before any parsing: KIE's body is parsed before its HMAC is checked
        CappedBody(rt.settings.webhook_max_body_bytes, {}).feed(body)
    except BodyRefused as exc:
        return exc.response
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
    if defer is not None:
        defer(lambda: _confirm(rt, job, kind, event))
        return 202, {"status": "confirming"}
    return _confirm(rt, job, kind, event)


def _confirm(rt: Runtime, job: Job, kind: Any, event: Any) -> _Answer:
    """The confirming read of a stored delivery's in-flight job, then the same CAS path as a
    poll (or, for a signed failure the provider cannot confirm, the failure)."""
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
    # under the claim the delivery's row carried, while no poller holds it: a poller's turn or
    # a resume has news of the task, and this read's no-verdict outcome spends and fails nothing
    outcome = lifecycle.observe(rt, job, kind, via="webhook", result=result,
                                claim=lifecycle.reader_claim(rt, job))
    with rt.sessions() as session:
        current = jobstore.load(session, job.id)
    log.info("webhook_handled job_id=%s outcome=%s", job.id, outcome)
    return 200, {"status": outcome, "job_status": current.status if current else None}
