"""Issue 18: a create's Retry-After beyond the broker's countdown bound publishes no message;
``create_not_before`` holds the job and the sweep enqueues it once that has passed."""

from __future__ import annotations

import uuid
from datetime import timedelta
from pathlib import Path

from sqlalchemy.orm import Session, sessionmaker

from reconcile import lifecycle
from reconcile.db.models import Job
from reconcile.sweep import sweep
from reconcile.testing.simulator import Script, Simulator
from tests.integration.harness import Clock, fund, make_runtime
from tests.integration.test_api import KIE, KIE_MODEL, T0


def test_a_retry_after_past_the_bound_waits_in_the_database_not_in_the_broker(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path) -> None:
    clock = Clock(T0)
    rt, queues = make_runtime(db, simulator, tmp_path, clock=clock)
    user = uuid.uuid4()
    fund(db, user)
    countdowns: list[float] = []
    rt.enqueue_create = lambda job_id, countdown=0.0: (countdowns.append(countdown),
                                                       queues.enqueue_create(job_id))
    job_id = lifecycle.submit_job(rt, user, KIE, KIE_MODEL, {"prompt": "x"}, 10,
                                  job_type="image").job_id
    simulator.script(str(job_id), Script(create="rate_limit", rate_limit_times=2,
                                         retry_after=1800.0))
    queues.creates.clear()
    assert lifecycle.create_step(rt, job_id).action == "rate_limited"
    with db() as s:
        job = s.get(Job, job_id)
        assert job is not None and job.create_not_before == T0 + timedelta(seconds=1800)
    assert list(queues.creates) == []  # no 30-minute countdown message
    assert countdowns == [0.0]  # only the submit's own enqueue
    clock.advance(seconds=1799)
    sweep(rt)
    assert list(queues.creates) == []
    clock.advance(seconds=2)
    sweep(rt)
    assert list(queues.creates) == [job_id]


def test_a_retry_after_within_the_bound_is_a_countdown(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path) -> None:
    rt, queues = make_runtime(db, simulator, tmp_path)
    user = uuid.uuid4()
    fund(db, user)
    seen: list[float] = []
    rt.enqueue_create = lambda job_id, countdown=0.0: seen.append(countdown)
    job_id = lifecycle.submit_job(rt, user, KIE, KIE_MODEL, {"prompt": "x"}, 10,
                                  job_type="image", enqueue=False).job_id
    simulator.script(str(job_id), Script(create="rate_limit", rate_limit_times=1,
                                         retry_after=120.0))
    assert lifecycle.create_step(rt, job_id).action == "rate_limited"
    assert seen == [120.0]
