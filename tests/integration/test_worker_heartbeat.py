"""A dead worker is noticed at once, not after a lease: the heartbeat rows, the end of a dead
worker's claims, and the transitions that follow — the ones an expired lease gets.

In process, on PostgreSQL: a create claim of a lapsed worker becomes ``uncertain`` (never
``not_started``), its poll chain resumes under a new generation, its batch claim is due again
and the next claim fences it; a live worker's claims and the claims of no worker are left to
their lease. The SIGKILL of real ``celery worker`` processes is in
``tests/integration/test_worker_heartbeat_kill.py``.
"""

from __future__ import annotations

import uuid
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from reconcile import Runtime, Settings, jobstore, lifecycle
from reconcile.db.models import Job, WorkerHeartbeat
from reconcile.errors import ErrorCode
from reconcile.lifecycle import batch as batch_poll
from reconcile.states import Submission
from reconcile.sweep.liveness import reap
from reconcile.testing.simulator import Script, Simulator
from reconcile.worker.heartbeat import Heartbeat
from tests.integration.harness import Queues, fund, make_runtime

RUNNING = Script(timeline=((0.0, "queued"), (0.1, "running"), (600.0, "succeeded")), outputs=1)


def _workers(db: sessionmaker[Session], rt: Runtime, **lapsed: bool) -> None:
    """Heartbeat rows: each name lapsed (past its expires_at) or alive."""
    now = rt.now()
    with db.begin() as s:
        for name, dead in lapsed.items():
            jobstore.register_worker(s, name, "host", 1, now - timedelta(minutes=1),
                                     timedelta(seconds=6))
            if not dead:
                jobstore.renew_worker(s, name, now, timedelta(seconds=60))


def _job(db: sessionmaker[Session], job_id: uuid.UUID) -> Job:
    with db() as s:
        job = s.get(Job, job_id)
        assert job is not None
        return job


def _submit(rt: Runtime, db: sessionmaker[Session], sim: Simulator) -> uuid.UUID:
    user = uuid.uuid4()
    fund(db, user)
    job_id = lifecycle.submit_job(rt, user, "kie-standard", "m", {"prompt": "x"}, 10,
                                  job_type="image", enqueue=False).job_id
    sim.script(str(job_id), RUNNING)
    return job_id


def _claim_create(rt: Runtime, job_id: uuid.UUID, worker: str | None) -> None:
    with rt.sessions.begin() as s:
        assert jobstore.claim_create(s, job_id, uuid.uuid4().hex, rt.now(), timedelta(minutes=10),
                                     worker=worker) is not None


def test_a_lapsed_workers_create_claim_becomes_uncertain_at_once(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path) -> None:
    """Three create claims, each with ten minutes of lease left: the lapsed worker's becomes
    ``uncertain`` now; the live worker's and the one with no worker stay ``submitting``."""
    rt, _ = make_runtime(db, simulator, tmp_path)
    dead, live, nobody = (_submit(rt, db, simulator) for _ in range(3))
    _claim_create(rt, dead, "w-dead")
    _claim_create(rt, live, "w-live")
    _claim_create(rt, nobody, None)
    _workers(db, rt, **{"w-dead": True, "w-live": False})
    report = reap(rt)
    assert report.workers == ["w-dead"] and dict(report.decided) == {"uncertain": 1}
    job = _job(db, dead)
    assert job.submission_state == Submission.UNCERTAIN  # never not_started: the call may have landed
    assert job.error_code == ErrorCode.UPSTREAM_SUBMISSION_UNCERTAIN
    assert job.claim_expires_at is not None and job.claim_expires_at < rt.now()
    for other in (live, nobody):
        row = _job(db, other)
        assert row.submission_state == Submission.SUBMITTING
        assert row.claim_expires_at is not None and row.claim_expires_at > rt.now()
    with db() as s:  # the lapsed row is gone (taken once), the live one stays
        assert list(s.execute(select(WorkerHeartbeat.worker_id)).scalars()) == ["w-live"]
    assert reap(rt).workers == []  # nothing left to take


def _accepted(rt: Runtime, queues: Queues, db: sessionmaker[Session], sim: Simulator,
              worker: str | None) -> uuid.UUID:
    """A job created and polled once by ``worker`` (its create claim and its poll turn)."""
    job_id = _submit(rt, db, sim)
    rt.worker_id = worker
    assert lifecycle.create_step(rt, job_id).action == "accepted"
    generation = _job(db, job_id).poll_generation
    assert lifecycle.poll_step(rt, job_id, generation, 0) == "in_flight"
    rt.worker_id = None
    queues.polls.clear()
    return job_id


def test_a_lapsed_workers_poll_chain_resumes_at_once(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path) -> None:
    """The lapsed worker took the chain's last turn: the chain resumes under a new generation
    (its first turn enqueued) while the old lease still had most of its time; a live worker's
    chain is left alone."""
    rt, queues = make_runtime(db, simulator, tmp_path)
    dead = _accepted(rt, queues, db, simulator, "w-dead")
    live = _accepted(rt, queues, db, simulator, "w-live")
    before = _job(db, dead)
    assert before.claimed_by == "w-dead" and before.poll_lease_expires_at > rt.now()
    _workers(db, rt, **{"w-dead": True, "w-live": False})
    report = reap(rt)
    assert report.workers == ["w-dead"] and sum(report.decided.values()) == 1
    after = _job(db, dead)
    assert after.poll_generation == before.poll_generation + 1 and after.poll_seq == 0
    assert list(queues.polls) == [(dead, after.poll_generation, 0)]
    # the dead chain's next message is fenced; the resumed one runs and keeps polling
    assert lifecycle.poll_step(rt, dead, before.poll_generation, before.poll_seq) == "fenced"
    assert lifecycle.poll_step(rt, dead, after.poll_generation, 0) == "in_flight"
    untouched = _job(db, live)
    assert untouched.claimed_by == "w-live" and untouched.poll_lease_expires_at > rt.now()


def test_a_lapsed_workers_batch_claim_is_due_again_and_fenced(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path) -> None:
    """Batch mode: the lapsed worker's claim ends now (its row due at once, nothing resumed);
    the next claim takes it and the dead claim's result is refused."""
    rt, _ = make_runtime(db, simulator, tmp_path, poll_mode="batch")
    job_id = _submit(rt, db, simulator)
    assert lifecycle.create_step(rt, job_id).action == "accepted"
    with db.begin() as s:  # due now
        s.execute(update(Job).where(Job.id == job_id).values(poll_due_at=rt.now()))
    rt.worker_id = "w-dead"
    [dead_claim] = batch_poll.claim(rt)
    rt.worker_id = None
    assert _job(db, job_id).poll_due_at > rt.now()
    assert batch_poll.claim(rt) == []  # claimed: not due until the claim's lease ends
    _workers(db, rt, **{"w-dead": True})
    report = reap(rt)
    assert report.workers == ["w-dead"] and sum(report.decided.values()) == 0
    # the operator's log line counts the released claim (it read "rows=0" before)
    assert report.released == 1 and "batch_released=1" in report.line()
    assert _job(db, job_id).poll_due_at < rt.now()
    [claim] = batch_poll.claim(rt)
    assert claim.seq == dead_claim.seq + 1
    with db.begin() as s:
        assert jobstore.hold_claim(s, job_id, dead_claim.generation, dead_claim.seq,
                                   rt.now() + timedelta(minutes=1)) is None


def test_the_sweep_reaps_too(db: sessionmaker[Session], simulator: Simulator,
                             tmp_path: Path) -> None:
    """A sweep tick ends a lapsed worker's claims before it decides the rows."""
    from reconcile.sweep import sweep

    rt, _ = make_runtime(db, simulator, tmp_path)
    job_id = _submit(rt, db, simulator)
    _claim_create(rt, job_id, "w-dead")
    _workers(db, rt, **{"w-dead": True})
    sweep(rt)
    assert _job(db, job_id).submission_state == Submission.UNCERTAIN


def test_a_heartbeat_registers_renews_and_registers_again_once_reaped(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    """Its first beat registers the process; a beat renews the row; a row reaped meanwhile (the
    process was taken for dead) comes back under a new id, and the old id's claims stay ended;
    a clean stop removes the row."""
    rt, _ = make_runtime(db, simulator, tmp_path)
    beat = Heartbeat(Settings(heartbeat_interval=2, heartbeat_timeout=6), db, lambda: rt)
    first = beat.beat()
    assert first is not None and first.endswith(tuple("0123456789abcdef"))
    with db() as s:
        row = s.get(WorkerHeartbeat, first)
        assert row is not None and row.expires_at - row.beat_at == timedelta(seconds=6)
    assert beat.beat() == first
    job_id = _submit(rt, db, simulator)
    _claim_create(rt, job_id, first)
    with db.begin() as s:  # the process stalled: its row lapsed and another process reaps it
        s.execute(update(WorkerHeartbeat).values(expires_at=rt.now() - timedelta(seconds=1)))
    assert reap(rt).workers == [first]
    second = beat.beat()
    assert second is not None and second != first
    assert "heartbeat_reregistered" in caplog.text
    assert _job(db, job_id).submission_state == Submission.UNCERTAIN
    beat.stop()
    with db() as s:
        assert s.execute(select(WorkerHeartbeat)).first() is None


def test_heartbeat_settings_refuse_a_timeout_under_two_beats() -> None:
    with pytest.raises(ValueError, match="HEARTBEAT_TIMEOUT"):
        Settings(heartbeat_interval=4, heartbeat_timeout=6)
    assert Settings(heartbeat_interval=0, heartbeat_timeout=1).heartbeat_interval == 0
