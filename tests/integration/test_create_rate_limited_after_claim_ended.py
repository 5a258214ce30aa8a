"""A create answered 429 after its claim ended (the lease passed, or the worker's heartbeat
lapsed) and its row was marked ``uncertain`` meanwhile: a 429 says "not created", so the claim's
owner puts the job back to ``not_started`` to be tried again, its horizon counted from the row
as the claim wrote it.

The create step's claim returns only some columns; for a while the 429 path read the row again
after the answer instead, saw ``uncertain`` (which has no exhaustion deadline) and rejected and
refunded the job on its first 429 as "retry_after_past_horizon". Found by an attack with the
explorer (a create answered 429 once, interleaved with the sweep or a redelivered create)."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from reconcile import lifecycle
from reconcile.db.models import CreditTransaction, Job
from reconcile.jobstore.workers import register_worker
from reconcile.sweep import sweep
from reconcile.sweep.liveness import reap
from reconcile.testing.simulator import Script, Simulator
from tests.integration._lifecycle_helpers import submit
from tests.integration.harness import Clock, make_runtime

T0 = datetime(2026, 12, 1, 10, 3, 30, tzinfo=UTC)
KIND = "kie-standard"


def _rate_limited_once(db: sessionmaker[Session], simulator: Simulator,
                       tmp_path: Path) -> tuple[Any, Clock, uuid.UUID]:
    clock = Clock(T0)
    rt, queue = make_runtime(db, simulator, tmp_path, clock=clock)
    job_id = submit(rt, db, KIND)
    queue.creates.clear()
    simulator.script(str(job_id), Script(create="rate_limit", rate_limit_times=1, retry_after=1.0,
                                         timeline=((0.0, "queued"), (0.0, "succeeded"))))
    return rt, clock, job_id


def _after_the_create(rt: Any, then: Callable[[], None]) -> None:
    """Run ``then`` once the provider has answered, before the step goes on."""
    client = rt.client(rt.kind(KIND))
    real = client.create

    def create(request: Any) -> Any:
        try:
            return real(request)
        finally:
            then()

    client.create = create


def _row(db: sessionmaker[Session], job_id: uuid.UUID) -> Job:
    with db() as s:
        job = s.get(Job, job_id)
        assert job is not None
        return job


def _lease_passes_and_the_sweep_runs(rt: Any, clock: Clock, job_id: uuid.UUID) -> None:
    clock.advance(minutes=3)  # past the create claim's lease
    sweep(rt)


def _a_redelivered_create(rt: Any, clock: Clock, job_id: uuid.UUID) -> None:
    clock.advance(minutes=3)
    assert lifecycle.create_step(rt, job_id).action == "uncertain"


def _the_workers_heartbeat_lapses(rt: Any, clock: Clock, job_id: uuid.UUID) -> None:
    clock.advance(seconds=31)  # past the worker's 30-s heartbeat timeout
    reap(rt)


@pytest.mark.parametrize("meanwhile", [_lease_passes_and_the_sweep_runs, _a_redelivered_create,
                                       _the_workers_heartbeat_lapses],
                         ids=["sweep", "redelivered", "reaped"])
def test_a_429_after_the_claim_ended_and_the_row_was_marked_uncertain_is_tried_again(
        pg_and_sqlite: sessionmaker[Session], simulator: Simulator, tmp_path: Path,
        meanwhile: Callable[[Any, Clock, uuid.UUID], None]) -> None:
    db = pg_and_sqlite
    rt, clock, job_id = _rate_limited_once(db, simulator, tmp_path)
    with db.begin() as s:  # the claiming worker, whose heartbeat may lapse
        register_worker(s, "w-1", "host", 1, clock.now, timedelta(seconds=30))
    rt.worker_id = "w-1"

    def during_the_call() -> None:
        meanwhile(rt, clock, job_id)
        assert _row(db, job_id).submission_state == "uncertain"

    _after_the_create(rt, during_the_call)
    outcome = lifecycle.create_step(rt, job_id)
    job = _row(db, job_id)
    assert (outcome.action, job.status, job.submission_state, job.create_rate_limit_count) == \
        ("rate_limited", "pending", "not_started", 1), (outcome.action, job.error_code,
                                                        job.error_detail)
    with db() as s:
        kinds = [t.type for t in s.execute(select(CreditTransaction)
                                           .where(CreditTransaction.job_id == job_id)).scalars()]
    assert "REFUND" not in kinds
