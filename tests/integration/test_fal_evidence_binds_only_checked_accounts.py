"""A fal delivery stored while RECONCILE_FAL_WEBHOOK_USER_ID was
unset binds an uncertain job once the operator sets it.

fal signs every account's deliveries with one JWKS. While the user id is unset, ingestion stores
any account's delivery (``?job_id=`` planted by the attacker). Before the fix the stored row did
not say which account had been checked, so once the operator configured the user id,
``evidence.signed_job_id`` trusted the row's query-string job id, and the sweep adopted the
attacker's request id for the victim's uncertain job (fal has no confirming read).
"""
from __future__ import annotations

from pathlib import Path

from sqlalchemy.orm import Session, sessionmaker

from reconcile.testing.simulator import Simulator
from reconcile.webhook_ingest import handle_webhook
from tests.integration._sweep_helpers import World
from tests.integration.test_security import (
    ATTACKER,
    _fal_delivery,
    _uncertain_without_upstream_task,
)


def test_reproducer_fal_delivery_stored_before_user_id_was_set_never_binds(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path) -> None:
    """reproducer: set the user id after the attacker's delivery was stored; no adoption."""
    w = World(db, simulator, tmp_path, fal_webhook_user_id=None)
    victim = _uncertain_without_upstream_task(w, "fal-queue")
    headers, body = _fal_delivery(simulator, "attacker-request", ATTACKER)
    assert handle_webhook(w.rt, "fal", headers, body, {"job_id": str(victim)})[0] == 202
    # the operator now configures the account id (a restart with the new setting)
    object.__setattr__(w.rt.settings, "fal_webhook_user_id", simulator.secrets.fal_user_id)
    for _ in range(4):
        w.clock.advance(minutes=5)
        report = w.tick()
        assert "adopted" not in [a.outcome for a in report.actions], report.actions
    job = w.job(victim)
    assert job.provider_task_id is None and job.submission_state == "uncertain"
    assert w.log_status(victim) == "reserved" and w.refunds(victim) == 0
