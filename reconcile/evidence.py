"""Webhook evidence for an uncertain job: what binds a delivery to a job, what confirms it.

A stored delivery that names an ``uncertain`` job may let the sweep adopt its upstream id — and
an adopted id decides whether the user is charged or refunded, so a delivery is evidence only
when the provider itself ties it to the job. The ``?job_id=`` of the callback URL is never
enough on its own: anyone who can get *a* signature from the provider (fal signs every account's
webhooks with one JWKS; KIE signs only ``taskId.timestamp``) can put any job id there.

Per provider (README "Security model" carries the same table):

========== ===================================================== ==========================================
provider   signed field that binds a delivery to a job           read that confirms an adopted id
========== ===================================================== ==========================================
replicate  the signed body's ``webhook`` (our callback URL, with  ``GET /v1/predictions/{id}`` (trainings:
           its ``job_id``): the body is the prediction object    ``/v1/trainings/{id}``) echoes ``webhook``
kie        none: only ``taskId`` and the timestamp are signed    ``record-info`` / ``record-detail`` echoes
                                                                 ``param.callBackUrl`` with the ``job_id``
elevenlabs the signed body's ``data.webhook_metadata.job_id``    dubbing: ``GET /v1/dubbing/{id}`` echoes
           (dubbing: ``data.name`` = ``reconcile-job:<id>``)      ``name``; speech-to-text: none
fal        ``X-Fal-Webhook-User-Id`` (signed) equal to            none: status reads echo nothing
           ``RECONCILE_FAL_WEBHOOK_USER_ID`` — checked at
           ingestion — makes the planted ``job_id`` ours
========== ===================================================== ==========================================

The rule (:func:`assess`): a delivery is used only for a job of the same provider family and
kind; where the provider has a confirming read, the read must echo this job's id before the job
changes state (a bound delivery whose read echoes another job is refused); where it has none,
the signed binding alone decides. A delivery with neither (fal without a configured user id,
an ElevenLabs speech-to-text delivery planted only in the query) is shown to the operator
(``reconcile uncertain`` / ``show``) and adopted only by ``reconcile resolve --upstream-id``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .db.models import WebhookDelivery
from .kinds import Kind
from .settings import Settings


@dataclass(frozen=True)
class Binding:
    """One provider's row of the table above (the README carries the same table)."""

    signed_field: str | None
    confirming_read: str | None


BINDINGS: dict[str, Binding] = {
    "replicate": Binding("signed body `webhook` (the callback URL's job_id)",
                         "GET prediction/training echoes `webhook`"),
    "kie": Binding(None, "record-info/record-detail echoes param.callBackUrl's job_id"),
    "elevenlabs": Binding("signed body data.webhook_metadata.job_id (dubbing: data.name)",
                          "GET dubbing echoes `name` (speech-to-text: none)"),
    "fal": Binding("signed X-Fal-Webhook-User-Id == RECONCILE_FAL_WEBHOOK_USER_ID", None),
}


FAL_CHECKED_USER = "_reconcile_fal_user_id"  # set by ingestion on every stored fal delivery


def family(kind_name: str | None) -> str:
    return (kind_name or "").split("-", 1)[0]


def _elevenlabs_job_id(payload: dict[str, Any]) -> str | None:
    """The job id in the signed body only (never the unsigned query)."""
    from .webhooks import _dubbing_name_job_id, _metadata_job_id

    inner = payload.get("data")
    if not isinstance(inner, dict):
        return None
    return _metadata_job_id(inner.get("webhook_metadata")) or _dubbing_name_job_id(inner.get("name"))


def signed_job_id(row: WebhookDelivery, settings: Settings) -> str | None:
    """The job id the provider's signature ties this stored delivery to, or None."""
    payload = row.payload if isinstance(row.payload, dict) else {}
    if row.provider == "replicate":
        from .providers.replicate import planted_job_id

        return planted_job_id(payload.get("webhook"))
    if row.provider == "elevenlabs":
        return _elevenlabs_job_id(payload)
    if row.provider == "fal" and settings.fal_webhook_user_id and row.job_id is not None \
            and payload.get(FAL_CHECKED_USER) == settings.fal_webhook_user_id:
        # ingestion refused every delivery whose signed user id is not the configured one, and
        # recorded that id on the row (a row stored while it was unset is any account's)
        return str(row.job_id)
    return None  # kie: nothing that names the job is signed


def same_kind(row: WebhookDelivery, kind: Kind) -> bool:
    """The delivery is for this job's provider family and, where the body says, its kind."""
    if row.provider != family(kind.name):
        return False
    payload = row.payload if isinstance(row.payload, dict) else {}
    if row.provider == "replicate":
        urls = payload.get("urls")
        get = urls.get("get") if isinstance(urls, dict) else None
        if isinstance(get, str) and ("/trainings/" in get) != (kind.name == "replicate-training"):
            return False
    return True


@dataclass(frozen=True)
class Assessment:
    """What the sweep may do with one stored delivery for one job."""

    usable: bool  # False: shown to the operator only
    needs_read: bool  # the provider has a read that echoes the planted job id
    bound: bool  # the provider's signature names this job
    reason: str


def assess(row: WebhookDelivery, job_id: str, kind: Kind, settings: Settings) -> Assessment:
    fam = family(kind.name)
    binding = BINDINGS.get(fam, Binding(None, None))
    if not same_kind(row, kind):
        return Assessment(False, False, False, f"a {row.provider} delivery for a {kind.name} job")
    signed = signed_job_id(row, settings)
    if signed is not None and signed != job_id:
        return Assessment(False, False, False, f"its signed job id is {signed!r}")
    bound = signed == job_id
    needs_read = binding.confirming_read is not None
    if not bound and not needs_read:
        return Assessment(False, False, False, "nothing the provider signed names this job")
    return Assessment(True, needs_read, bound, "bound" if bound else "to be confirmed")


def confirmed(assessment: Assessment, echoed: str | None, job_id: str) -> bool:
    """After the confirming read: an echo must be this job's; no echo leaves the binding."""
    if echoed is not None:
        return echoed == job_id
    return assessment.bound


__all__ = ["BINDINGS", "Assessment", "Binding", "assess", "confirmed", "family", "same_kind",
           "signed_job_id"]
