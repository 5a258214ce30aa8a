"""A platform's stale ORM save writes a completed job's row back to ``processing``
(every column as it was loaded in flight). The next finalize finds its assets stored and
re-completes the row from them, once, without a second charge; the audit sees the reverted row
before that (PostgreSQL + the simulator, steps in-process)."""

from __future__ import annotations

import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import inspect, select, update
from sqlalchemy.orm import Session, sessionmaker

from reconcile import lifecycle
from reconcile.db.models import Asset, CreditAnomaly, Job
from reconcile.lifecycle.finalize import COMPLETED_ROW_REVERTED
from reconcile.sweep import sweep
from reconcile.testing.simulator import Script, Simulator
from tests.integration.harness import audit, drain, fund, ledger_backend, make_runtime
from tests.integration.ledgers import BACKENDS, make_backend

INSTANT = ((0.0, "queued"), (0.0, "succeeded"))


def _row(db: sessionmaker[Session], job_id: uuid.UUID) -> dict[str, Any]:
    with db() as s:
        job = s.get(Job, job_id)
        assert job is not None
        return {c.key: getattr(job, c.key) for c in inspect(Job).column_attrs if c.key != "id"}


def _completed_then_written_back(db: sessionmaker[Session], simulator: Simulator,
                                 tmp_path: Path) -> tuple[Any, Any, uuid.UUID, uuid.UUID]:
    rt, q = make_runtime(db, simulator, tmp_path)
    user = uuid.uuid4()
    fund(db, user)
    simulator.script_default(Script(timeline=INSTANT, outputs=2))
    job_id = lifecycle.submit_job(rt, user, "kie-standard", "seedream/4.5-edit",
                                  {"prompt": "cat"}, 40, job_type="image").job_id
    lifecycle.create_step(rt, q.creates.popleft())
    loaded = _row(db, job_id)  # the platform's instance, loaded while the job is in flight
    assert loaded["status"] == "processing"
    drain(rt, q)
    done = _row(db, job_id)
    assert done["status"] == "completed" and done["credits_actual"] == 40
    with db.begin() as s:  # Job.save() of that instance: every column as loaded
        s.execute(update(Job).where(Job.id == job_id).values(**loaded))
    reverted = _row(db, job_id)
    assert reverted["status"] == "processing" and reverted["output_data"] is None
    return rt, q, job_id, user


@pytest.mark.parametrize("ledger", BACKENDS)
def test_a_written_back_row_is_recompleted_from_its_assets_once(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path, ledger: str) -> None:
    """On both ledger backends (built-in; a platform's ``user_credits``): the commit of the
    repair settles nothing twice."""
    with ledger_backend(make_backend(ledger, db)) as current:
        _recompleted_once(db, simulator, tmp_path, current)


def _recompleted_once(db: sessionmaker[Session], simulator: Simulator, tmp_path: Path,
                      current: Any) -> None:
    rt, q, job_id, user = _completed_then_written_back(db, simulator, tmp_path)
    before = current.balance(user)
    later = rt.now() + timedelta(minutes=2)
    assert sweep(rt, now=later).errors == 0  # resumes the poll chain of the row
    # the next poll: old code failed on uq_reconcile_assets_job_id_index and polled again (the
    # chain's next countdown), for ever
    assert drain(rt, q, max_steps=5) == 1 and not q.polls
    job = _row(db, job_id)
    assert job["status"] == "completed" and job["credits_actual"] == 40
    with db() as s:
        assets = s.execute(select(Asset).where(Asset.job_id == job_id)
                           .order_by(Asset.index)).scalars().all()
        anomalies = s.execute(select(CreditAnomaly.kind).where(
            CreditAnomaly.job_id == job_id)).scalars().all()
    assert len(assets) == 2
    assert job["output_data"]["outputs"] == [{"key": a.storage_key, "media_type": a.media_type}
                                             for a in assets]
    assert all(rt.storage.exists(a.storage_key) for a in assets)
    assert anomalies == [COMPLETED_ROW_REVERTED]
    assert current.balance(user) == before and current.commit_count(job_id) == 1  # charged once
    assert sweep(rt, now=later + timedelta(minutes=2)).scanned == 0  # no loop
    with db() as s:
        assert audit(s, now=later + timedelta(hours=1)) == []


def test_the_audit_sees_the_written_back_row_at_once(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path) -> None:
    """Assets stored and the job in flight: a completion moved back, with no grace (the
    committed-ledger check waits out its grace, and a free job has no commit at all)."""
    rt, _, job_id, _ = _completed_then_written_back(db, simulator, tmp_path)
    with db() as s:
        found = [(d.kind, d.job_id) for d in audit(s, now=rt.now())]
    assert ("completed_job_in_flight", job_id) in found, found
    with db() as s:  # past the commit's grace: one report, the ledger's
        found = [(d.kind, d.job_id) for d in audit(s, now=rt.now() + timedelta(hours=1))]
    assert found == [("settled_job_in_flight", job_id)], found
