"""Real ``celery worker`` processes SIGKILLed mid-poll, mid-create and mid-batch-claim, at the
default heartbeat settings (``HEARTBEAT_INTERVAL`` 2 s, ``HEARTBEAT_TIMEOUT`` 6 s) and real time
(``TIME_SCALE`` 1): a live worker's heartbeat notices the dead process and its claims end at
once — the transition an expired lease gets is applied while the lease the dead process held
still had most of its time, with no sweep tick at all; a worker started after the kill (as a
supervisor restarts one) then finishes the job. A standby worker that consumes no queue of the
library runs from the start, so the heartbeat's reaction does not wait for the restarted
worker to boot. Each test prints what it measured (kill → transition, kill → recovered);
nothing asserts a duration.
"""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy.orm import Session, sessionmaker

from reconcile import credits, lifecycle
from reconcile.db.models import Job
from reconcile.states import Submission
from reconcile.testing.simulator import Script, Simulator
from tests.integration.harness import fund, make_runtime
from tests.integration.workers import Worker, make_sender, wait_for

pytestmark = pytest.mark.slow


def _env(pg_url: str, broker: str, sim: Simulator, tmp: Path, **extra: str) -> dict[str, str]:
    return {
        **sim.env(),
        "RECONCILE_DATABASE_URL": pg_url,
        "RECONCILE_BROKER_URL": broker,
        "RECONCILE_BROKER_VISIBILITY_TIMEOUT": "60",
        "RECONCILE_MAX_COUNTDOWN": "20", "RECONCILE_TASK_TIME_LIMIT": "30",
        "RECONCILE_STORAGE_URL": f"file://{tmp / 'media'}",
        "RECONCILE_WEBHOOK_BASE_URL": "https://platform.example/hooks",
        **extra,
    }


def _job(db: sessionmaker[Session], job_id: uuid.UUID) -> Job:
    with db() as s:
        job = s.get(Job, job_id)
        assert job is not None
        return job


def _flush(redis_url: str) -> None:
    import redis

    redis.Redis.from_url(redis_url).flushdb()


@pytest.mark.parametrize("case", ["chain_mid_poll_whole_worker", "chain_mid_poll_pool_child",
                                  "create_after_accept", "batch_mid_claim"])
def test_a_killed_worker_is_recovered_by_a_live_workers_heartbeat_before_its_lease(
    db: sessionmaker[Session], pg_url: str, simulator: Simulator, tmp_path: Path,
    redis_url: str, case: str, capsys: pytest.CaptureFixture[str],
) -> None:
    _flush(redis_url)
    batch = case.startswith("batch")
    mode = {"POLL_MODE": "batch", "POLL_BATCH_INTERVAL": "0.5"} if batch else {"POLL_MODE": "chain"}
    extra = {f"RECONCILE_{k}": v for k, v in mode.items()}
    point = {"create_after_accept": "after_accept", "batch_mid_claim": "mid_batch"}.get(
        case, "mid_poll")
    marker = tmp_path / "crashed"
    crash = {"RECONCILE_TEST_CRASH_AT": point,
             "RECONCILE_TEST_CRASH_MODE": "self" if case.endswith("pool_child") else "group",
             "RECONCILE_TEST_CRASH_ONCE": str(marker)}
    sender = make_sender(redis_url)
    rt, _ = make_runtime(db, simulator, tmp_path, **{k.lower(): v for k, v in mode.items()})
    rt.enqueue_create = lambda jid, countdown=0.0: sender.send_task(
        "reconcile.create", args=[str(jid)], countdown=countdown or None)
    first = Worker(_env(pg_url, redis_url, simulator, tmp_path, **extra, **crash),
                   tmp_path / "w1.log")
    standby = Worker(_env(pg_url, redis_url, simulator, tmp_path, **extra),
                     tmp_path / "standby.log", queues="standby")
    second: Worker | None = None

    def tick() -> None:  # batch mode: beat's poll_due ticks (no beat process here)
        if batch:
            sender.send_task("reconcile.poll_due")

    try:
        first.wait_ready(timeout=60)
        standby.wait_ready(timeout=60)
        user = uuid.uuid4()
        fund(db, user)
        job_id = uuid.uuid4()
        simulator.script(str(job_id), Script(timeline=((0.0, "queued"), (1.0, "running"),
                                                       (8.0, "succeeded")), outputs=1))
        lifecycle.submit_job(rt, user, "kie-standard", "m", {"prompt": "x"}, 30,
                             job_type="image", job_id=job_id)
        assert wait_for(marker.exists, 60, interval=0.05, tick=tick), \
            first.log_path.read_text()[-3000:]
        killed = time.monotonic()
        held = _job(db, job_id)
        # the lease the dead process held: the create claim, the poll turn or the batch claim
        lease = held.claim_expires_at if point == "after_accept" else held.poll_lease_expires_at
        assert lease is not None and held.claimed_by is not None

        def transitioned() -> bool:
            job = _job(db, job_id)
            if point == "after_accept":
                return job.submission_state == Submission.UNCERTAIN
            if batch:  # the claim's lease moved to now: due again (or read already)
                return job.poll_seq > held.poll_seq or job.poll_due_at < held.poll_due_at
            return job.poll_generation > held.poll_generation or job.status == "completed"

        assert wait_for(transitioned, 60, interval=0.05), standby.log_path.read_text()[-3000:]
        reacted = time.monotonic() - killed
        reacted_at = datetime.now(UTC)
        if case.endswith("pool_child"):
            assert first.alive()  # the main process forks a new child, with its own heartbeat
        else:
            assert wait_for(lambda: not first.alive(), 10)
            second = Worker(_env(pg_url, redis_url, simulator, tmp_path, **extra),
                            tmp_path / "w2.log")
            second.wait_ready(timeout=60)

        def recovered() -> bool:
            job = _job(db, job_id)
            if point == "after_accept":
                return job.submission_state == Submission.UNCERTAIN
            return job.status == "completed"

        assert wait_for(recovered, 120, interval=0.1, tick=tick), (
            first.log_path.read_text()[-3000:]
            + (second.log_path.read_text()[-3000:] if second else ""))
        seconds = time.monotonic() - killed
        logs = "".join(w.log_path.read_text() for w in (first, standby, second) if w is not None)
        assert "worker_lapsed" in logs  # a live worker's heartbeat took the dead one
        # the transition came while the dead claim's lease was alive: not the lease's doing
        assert reacted_at < lease, (reacted_at, lease)
        job = _job(db, job_id)
        if point == "after_accept":  # never not_started: the provider accepted the call
            assert job.error_code == "UPSTREAM_SUBMISSION_UNCERTAIN"
        elif not batch:
            assert job.poll_generation > held.poll_generation  # the chain was resumed
        assert simulator.creates(str(job_id)) == 1
        with db() as s:
            assert credits.audit(s) == []
        with capsys.disabled():
            print(f"\n[heartbeat recovery] {case}: claims ended and decided {reacted:.1f} s "
                  f"after SIGKILL (the lease had {(lease - reacted_at).total_seconds():.0f} s left)"
                  + ("" if point == "after_accept" else
                     f"; completed {seconds:.1f} s after it, a restarted worker included"))
    finally:
        first.stop()
        standby.stop()
        if second is not None:
            second.stop()
        _flush(redis_url)
