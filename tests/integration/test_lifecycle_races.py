"""Concurrent and interrupted steps, on both ledger backends (PostgreSQL + the simulator,
threads): two copies of one create message create once; a crash between the failure and its
refund settles exactly once later; three finishers at once complete once; a completion after a
local cancel is refused and logged.
"""

from __future__ import annotations

import threading
import uuid

import pytest
from sqlalchemy import select

from reconcile import lifecycle
from reconcile.db.models import Asset, JobEvent
from reconcile.settlement import SettleOutcome
from reconcile.testing.simulator import Script
from tests.integration._lifecycle_helpers import FOREVER, INSTANT, load_job, submit
from tests.integration.harness import audit, backend, drain, make_runtime

pytestmark = pytest.mark.usefixtures("on_each_ledger")


def test_two_copies_of_one_create_message_create_once(db, simulator, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Two workers running the same create at once: exactly one upstream create."""
    rt, q = make_runtime(db, simulator, tmp_path)
    job_id = submit(rt, db)
    simulator.script(str(job_id), Script(timeline=FOREVER, latency=0.3))
    barrier = threading.Barrier(2)
    outcomes: list[str] = []

    def run() -> None:
        barrier.wait()
        outcomes.append(lifecycle.create_step(rt, job_id).action)

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # the loser either lost the claim CAS or saw the winner's live claim first
    assert sorted(outcomes)[0] == "accepted" and sorted(outcomes)[1] in ("busy", "lost")
    assert simulator.attempts(str(job_id)) == 1


def test_crash_after_failure_before_refund_settles_exactly_once(db, simulator, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A crash after the failure is recorded: the row is unsettled, then settled once."""
    rt, q = make_runtime(db, simulator, tmp_path)
    job_id = submit(rt, db)
    simulator.script(str(job_id), Script(create="reject_auth"))

    class Crash(Exception):
        pass

    def crash(point: str) -> None:
        if point == "before_refund":
            raise Crash(point)

    rt.crash_hook = crash
    with pytest.raises(Crash):
        drain(rt, q)
    job = load_job(db, job_id)
    assert job.status == "failed" and job.credits_actual is None and job.next_poll_at is not None
    rt.crash_hook = None
    assert lifecycle.settle(rt, job_id) is SettleOutcome.SETTLED
    assert lifecycle.settle(rt, job_id) is SettleOutcome.ALREADY_SETTLED
    job = load_job(db, job_id)
    assert job.credits_actual == 0 and job.next_poll_at is None
    with db() as s:
        assert backend().refund_count(job_id) == 1 and audit(s) == []


def test_finalize_race_worker_webhook_and_second_worker(db, simulator, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Three finishers at once: one completion, one commit, one asset row and object per output."""
    rt, q = make_runtime(db, simulator, tmp_path)
    job_id = submit(rt, db)
    simulator.script(str(job_id), Script(timeline=INSTANT, outputs=3))
    lifecycle.create_step(rt, q.creates.popleft())
    job = load_job(db, job_id)
    result = rt.client(rt.kind("kie-standard")).poll(job.provider_task_id)  # type: ignore[union-attr,arg-type]
    barrier = threading.Barrier(3)
    wins: list[bool] = []

    def finish(source: str) -> None:
        barrier.wait()
        wins.append(lifecycle.finalize_job_with_media(rt, job_id, result, source=source))

    threads = [threading.Thread(target=finish, args=(s,)) for s in ("poll", "webhook", "sweep")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(wins) == [False, False, True]
    with db() as s:
        assets = s.execute(select(Asset).where(Asset.job_id == job_id)).scalars().all()
        assert len(assets) == 3 and backend().commit_count(job_id) == 1
        completions = s.execute(select(JobEvent).where(JobEvent.job_id == job_id,
                                                       JobEvent.type == "completed")).scalars().all()
        assert len(completions) == 1
    assert sorted(rt.storage.keys(f"image/{job_id}/")) == sorted(a.storage_key for a in assets)


def test_a_completion_after_a_local_cancel_is_refused_and_logged(db, simulator, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A cancelled job that later succeeds upstream stays cancelled; an anomaly records it."""
    from reconcile.db.models import CreditAnomaly
    from reconcile.lifecycle.cancel import cancel_job

    rt, q = make_runtime(db, simulator, tmp_path)
    user = uuid.uuid4()
    job_id = submit(rt, db, user=user)
    simulator.script(str(job_id), Script(timeline=FOREVER))
    lifecycle.create_step(rt, q.creates.popleft())
    cancel_job(rt, user, job_id)
    task_id = load_job(db, job_id).provider_task_id
    simulator.set_state(task_id, "succeeded")
    result = rt.client(rt.kind("kie-standard")).poll(task_id)  # type: ignore[union-attr,arg-type]
    assert lifecycle.finalize_job_with_media(rt, job_id, result, source="webhook") is False
    job = load_job(db, job_id)
    assert job.status == "cancelled" and job.credits_actual == 0
    with db() as s:
        kinds = [a.kind for a in s.execute(select(CreditAnomaly)).scalars()]
    assert kinds == ["completed_after_cancel"]
