"""End-to-end lifecycle against the simulator (steps run in-process, PostgreSQL real)."""

from __future__ import annotations

import uuid
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from reconcile import credits, lifecycle
from reconcile.db.models import Asset, Job
from reconcile.testing.simulator import Script, Simulator
from tests.integration.harness import drain, fund, make_runtime

INSTANT = ((0.0, "queued"), (0.0, "succeeded"))


def test_kie_market_job_completes_with_one_create(db: sessionmaker[Session], simulator: Simulator,
                                                  tmp_path: Path) -> None:
    """A KIE market job: created once, id persisted, polled, media stored, credits committed."""
    rt, q = make_runtime(db, simulator, tmp_path)
    user = uuid.uuid4()
    fund(db, user)
    simulator.script_default(Script(timeline=INSTANT, outputs=2))
    sub = lifecycle.submit_job(rt, user, "kie-standard", "seedream/4.5-edit", {"prompt": "cat"}, 40,
                               job_type="image")
    drain(rt, q)
    with db() as s:
        job = s.get(Job, sub.job_id)
        assets = s.execute(select(Asset).where(Asset.job_id == sub.job_id)).scalars().all()
        assert job.status == "completed", (job.error_code, job.error_message, job.reconcile_last_error)
        assert job.submission_state == "accepted" and job.provider_task_id
        assert job.credits_actual == 40
        assert len(assets) == 2
        assert credits.audit(s) == []
    assert simulator.creates(str(sub.job_id)) == 1
    for a in assets:
        assert rt.storage.exists(a.storage_key)
