"""Internal: the library's own mechanics, not an import path for platforms (may move).

Webhook evidence for an uncertain job: what binds a delivery to a job, what confirms it.

A stored delivery that names an ``uncertain`` job may let the sweep adopt its upstream id — and
an adopted id decides whether the user is charged or refunded, so a delivery is evidence only
when the provider itself ties it to the job. The ``?job_id=`` of the callback URL is never
enough on its own: anyone who can get *a* signature from the provider (fal signs every account's
webhooks with one JWKS; KIE signs only ``taskId.timestamp``) can put any job id there.

Per provider, its webhook scheme's :attr:`~reconcile.webhooks.WebhookScheme.binding` says
which signed field binds a delivery to a job and which read confirms an adopted id; each
provider's webhook module (``reconcile/providers/<family>/webhook.py``) explains its row, and
README "Security model" carries the whole table. For example: Replicate signs the body, whose ``webhook`` is our
callback URL with its ``job_id``, and ``GET /v1/predictions/{id}`` echoes it; KIE signs only
``taskId`` and the timestamp, so only its ``record-info`` echo of ``param.callBackUrl`` binds;
fal's signed ``X-Fal-Webhook-User-Id`` must equal ``RECONCILE_FAL_WEBHOOK_USER_ID`` (checked at
ingestion), and its status reads echo nothing.

The rule (:func:`assess`): a delivery is used only for a job of the same provider family and
kind; where the provider has a confirming read, the read must echo this job's id before the job
changes state (a bound delivery whose read echoes another job is refused); where it has none,
the signed binding alone decides; an upstream id another job already holds is that job's
(:func:`held_elsewhere`). A delivery with neither (fal without a configured user id,
an ElevenLabs speech-to-text delivery planted only in the query) is shown to the operator
(``reconcile uncertain`` / ``show``) and adopted only by ``reconcile resolve --upstream-id``.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import dataclass

from sqlalchemy import Integer, cast, func, literal, select
from sqlalchemy.orm import Session

from ..db.models import Job, WebhookDelivery
from ..kinds import Kind, provider_of
from ..providers.fal.webhook import FAL_CHECKED_USER
from ..settings import Settings
from ..webhooks import PROVIDERS, Binding, get_scheme

# The shipped schemes' rows of the table; each provider's webhook module
# (``reconcile/providers/<family>/webhook.py``) owns its row; a platform's scheme brings its own.
BINDINGS: dict[str, Binding] = {p: scheme.binding for p in PROVIDERS
                                if (scheme := get_scheme(p)) is not None}


def family(kind_name: str | None) -> str:
    """The provider family of a kind (its :attr:`~reconcile.kinds.Kind.provider`)."""
    return provider_of(kind_name) or ""


def signed_job_id(row: WebhookDelivery, settings: Settings) -> str | None:
    """The job id the provider's signature ties this stored delivery to, or None."""
    payload = row.payload if isinstance(row.payload, dict) else {}
    scheme = get_scheme(row.provider)
    if scheme is None:
        return None
    return scheme.signed_job_id(payload, str(row.job_id) if row.job_id is not None else None,
                                settings)


def same_kind(row: WebhookDelivery, kind: Kind) -> bool:
    """The delivery is for this job's provider family and, where the body says, its kind."""
    if row.provider != kind.provider:
        return False
    payload = row.payload if isinstance(row.payload, dict) else {}
    scheme = get_scheme(row.provider)
    return scheme is None or scheme.same_kind(payload, kind)


@dataclass(frozen=True)
class Assessment:
    """What the sweep may do with one stored delivery for one job."""

    usable: bool  # False: shown to the operator only
    needs_read: bool  # the provider has a read that echoes the planted job id
    bound: bool  # the provider's signature names this job
    reason: str


def assess(row: WebhookDelivery, job_id: str, kind: Kind, settings: Settings) -> Assessment:
    scheme = get_scheme(kind.provider)
    binding = scheme.binding if scheme is not None else Binding(None, None)
    if not same_kind(row, kind):
        return Assessment(False, False, False, f"a {row.provider} delivery for a {kind.name} job")
    signed = signed_job_id(row, settings)
    if signed is not None and signed != job_id:
        return Assessment(False, False, False, f"its signed job id is {signed!r}")
    bound = signed == job_id
    needs_read = kind.echo_check if kind.echo_check is not None else \
        binding.confirming_read is not None
    if not bound and not needs_read:
        return Assessment(False, False, False, "nothing the provider signed names this job")
    return Assessment(True, needs_read, bound, "bound" if bound else "to be confirmed")


def held_elsewhere(session: Session, upstream_ids: Iterable[str], job_id: uuid.UUID) -> set[str]:
    """The upstream ids another job already holds: that job's own tasks, never evidence for this
    one, whatever a delivery's binding says. A field a customer could set before the library
    refused it (an ElevenLabs dubbing ``name`` of ``reconcile-job:<another job>``) named the
    customer's own task, which the customer's job holds."""
    return set(holders(session, upstream_ids, job_id))


#: the advisory-lock class of :func:`lock_upstream_id` (PostgreSQL's two-key form: the id's
#: hash is the second key), so its keys never meet another use of advisory locks
UPSTREAM_LOCK_CLASS = 0x7265636F


def lock_upstream_id(session: Session, upstream_id: str) -> None:
    """Hold, until the caller's transaction ends, the lock of ``upstream_id``: two transactions
    adopting one id (for two jobs: two operators, an operator and the sweep) take turns, so the
    second's :func:`held_elsewhere` sees the first's job instead of both adopting it. Taken
    before that check. On SQLite a write transaction already excludes every other."""
    if session.get_bind().dialect.name == "postgresql":
        session.execute(select(func.pg_advisory_xact_lock(
            cast(literal(UPSTREAM_LOCK_CLASS), Integer), func.hashtext(upstream_id))))


def holders(session: Session, upstream_ids: Iterable[str], job_id: uuid.UUID
            ) -> dict[str, uuid.UUID]:
    """:func:`held_elsewhere` with the job holding each: ``{upstream id: that job's id}``."""
    ids = {i for i in upstream_ids if i}
    if not ids:
        return {}
    return {task_id: holder for task_id, holder in session.execute(
        select(Job.provider_task_id, Job.id).where(
            Job.provider_task_id.in_(ids), Job.id != job_id)) if task_id}


def confirmed(assessment: Assessment, echoed: str | None, job_id: str) -> bool:
    """After the confirming read: an echo must be this job's; no echo leaves the binding."""
    if echoed is not None:
        return echoed == job_id
    return assessment.bound


__all__ = ["BINDINGS", "FAL_CHECKED_USER", "UPSTREAM_LOCK_CLASS", "Assessment", "Binding", "assess",
           "confirmed", "family", "held_elsewhere", "holders", "lock_upstream_id", "same_kind",
           "signed_job_id"]
