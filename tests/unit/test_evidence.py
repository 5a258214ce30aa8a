"""The per-provider evidence table (reconcile.jobstore.evidence): what binds, what must be confirmed."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from reconcile import Settings
from reconcile.db.models import WebhookDelivery
from reconcile.jobstore import evidence
from reconcile.kinds import get_kind

JOB = str(uuid.uuid4())
OTHER = str(uuid.uuid4())
HOOK = "https://platform.example/hooks/webhooks/{p}?job_id={j}"


def row(provider: str, payload: dict[str, Any], planted: str | None = JOB) -> WebhookDelivery:
    return WebhookDelivery(provider=provider, delivery_id="d", upstream_id="u",
                           job_id=uuid.UUID(planted) if planted else None, payload=payload)


@pytest.mark.parametrize(("delivery", "kind", "settings", "usable", "needs_read", "bound"), [
    # Replicate: the signed body's webhook binds; the prediction read confirms
    (row("replicate", {"webhook": HOOK.format(p="replicate", j=JOB)}), "replicate-prediction",
     {}, True, True, True),
    (row("replicate", {"webhook": HOOK.format(p="replicate", j=OTHER)}), "replicate-prediction",
     {}, False, False, False),
    (row("replicate", {"urls": {"get": "https://api.replicate.com/v1/trainings/t"}}),
     "replicate-prediction", {}, False, False, False),
    # KIE: nothing signed names the job; usable only after record-info echoes it
    (row("kie", {"data": {"taskId": "t"}}), "kie-standard", {}, True, True, False),
    # ElevenLabs: the signed webhook_metadata binds
    (row("elevenlabs", {"data": {"webhook_metadata": {"job_id": JOB}}}), "elevenlabs-async",
     {}, True, True, True),
    # fal: the configured account id binds; unset, operator only
    (row("fal", {"request_id": "r", evidence.FAL_CHECKED_USER: "me"}), "fal-queue",
     {"fal_webhook_user_id": "me"}, True, False, True),
    # stored while the id was unset (or another): any account's, so never bound
    (row("fal", {"request_id": "r", evidence.FAL_CHECKED_USER: None}), "fal-queue",
     {"fal_webhook_user_id": "me"}, False, False, False),
    (row("fal", {"request_id": "r"}), "fal-queue", {}, False, False, False),
    # another provider's delivery is never evidence
    (row("fal", {"request_id": "r"}), "replicate-prediction", {"fal_webhook_user_id": "me"},
     False, False, False),
])
def test_assess(delivery: WebhookDelivery, kind: str, settings: dict[str, Any], usable: bool,
                needs_read: bool, bound: bool) -> None:
    judged = evidence.assess(delivery, JOB, get_kind(kind), Settings(**settings))  # type: ignore[arg-type]
    assert (judged.usable, judged.needs_read, judged.bound) == (usable, needs_read, bound), judged


def test_a_confirming_read_must_echo_this_job() -> None:
    bound = evidence.Assessment(True, True, True, "bound")
    hint = evidence.Assessment(True, True, False, "to be confirmed")
    assert evidence.confirmed(bound, JOB, JOB) and evidence.confirmed(bound, None, JOB)
    assert not evidence.confirmed(bound, OTHER, JOB)
    assert evidence.confirmed(hint, JOB, JOB)
    assert not evidence.confirmed(hint, None, JOB) and not evidence.confirmed(hint, OTHER, JOB)


def test_every_provider_with_webhooks_has_a_row() -> None:
    from reconcile.webhooks import PROVIDERS

    assert set(evidence.BINDINGS) == set(PROVIDERS)
