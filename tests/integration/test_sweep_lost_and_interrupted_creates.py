"""The sweep on creates that never reached the provider or died on the way (PostgreSQL,
an injected clock): a lost create message is re-enqueued, not before its not-before time, and
the job fails + refunds after five re-enqueues; a sync job that never called fails past its
threshold, with the code its decision carries; a create under a live claim is left, an expired
async claim becomes ``uncertain`` (reservation kept), an expired sync claim fails past its
threshold.
"""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import select

from reconcile import jobstore, lifecycle
from reconcile.testing.simulator import Script
from tests.integration._sweep_helpers import FOREVER, World, assert_refunded, world as world

# ----------------------------------------------------------------------------- rows 6-7: not started


def test_not_started_async_is_reenqueued_then_failed_after_five(world: World) -> None:
    """Row 6: a lost create message is re-enqueued every 2 min (not sooner); after 5 re-enqueues
    the job fails + refunds through a CAS from not_started."""
    job_id = world.submit("kie-standard")
    world.clock.advance(minutes=1)
    world.tick()
    assert world.q.create_calls == 0
    for n in range(1, 6):
        world.clock.advance(minutes=2)
        world.tick()
        world.tick()  # a second tick at the same time does not re-enqueue again
        job = world.job(job_id)
        assert (world.q.create_calls, job.create_enqueue_count) == (n, n)
        assert job.create_enqueued_at == world.clock.now
    world.clock.advance(minutes=2)
    world.tick()
    job = assert_refunded(world, job_id)
    assert job.submission_state == "not_started" and world.q.create_calls == 5
    assert world.sim.creates(str(job_id)) == 0


def test_not_started_async_waits_for_its_not_before_time(world: World) -> None:
    """Row 6: a rate-limited create waiting for its not-before time is not re-enqueued early."""
    job_id = world.submit("kie-standard")
    world.set(job_id, create_not_before=world.clock.now + timedelta(minutes=10))
    world.clock.advance(minutes=5)
    world.tick()
    assert world.q.create_calls == 0
    world.clock.advance(minutes=6)
    world.tick()
    assert list(world.q.creates) == [job_id]


def test_reenqueued_create_runs_once_upstream(world: World) -> None:
    """Row 6: the re-enqueued create claims, creates once and is accepted."""
    world.sim.script_default(Script(timeline=FOREVER))
    job_id = world.submit("kie-standard")
    world.clock.advance(minutes=3)
    world.tick()
    assert lifecycle.create_step(world.rt, world.q.creates.popleft()).action == "accepted"
    assert world.sim.creates(str(job_id)) == 1 and world.job(job_id).status == "processing"


def test_not_started_sync_past_threshold_fails(world: World) -> None:
    """Row 7: a sync-kind job whose request died before calling fails + refunds past 5 min."""
    job_id = world.submit("elevenlabs-sync")
    world.clock.advance(minutes=4)
    world.tick()
    assert world.job(job_id).status == "pending" and world.q.create_calls == 0
    world.clock.advance(minutes=2)
    world.tick()
    assert_refunded(world, job_id)


def test_a_failing_row_stores_the_code_its_decision_carries(
        world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    """The executor writes the decision's ``code`` (default ``RECONCILE_NO_RECOVERY``): a new
    failing row of the table names its own code in the table only, nothing in the executor."""
    from dataclasses import replace

    from reconcile.errors import ErrorCode
    from reconcile.sweep import claims, table

    real = table.decide

    def with_code(*args: Any, **kwargs: Any) -> table.Decision:
        decision = real(*args, **kwargs)
        if decision.action is table.Action.FAIL:
            return replace(decision, code=ErrorCode.UPSTREAM_TIMEOUT)
        return decision

    monkeypatch.setattr(claims.table, "decide", with_code)
    job_id = world.submit("elevenlabs-sync")
    world.clock.advance(minutes=6)
    world.tick()
    job = assert_refunded(world, job_id, code="UPSTREAM_TIMEOUT")
    assert job.error_message == "upstream_timeout"
    from reconcile.db.models import JobEvent

    with world.db() as s:
        failed = s.execute(select(JobEvent.payload).where(JobEvent.job_id == job_id,
                                                       JobEvent.type == "failed")).scalars().all()
    assert [d.get("code") for d in failed] == ["UPSTREAM_TIMEOUT"]


# ----------------------------------------------------------------------------- rows 8-9: submitting


def _claim(w: World, job_id: uuid.UUID, lease: timedelta) -> None:
    with w.db.begin() as s:
        assert jobstore.claim_create(s, job_id, "tok", w.clock.now, lease) is not None


def test_submitting_with_a_live_claim_is_left(world: World) -> None:
    """Row 8: a create in progress (claim lease alive) is not touched, however old the job."""
    job_id = world.submit("kie-standard")
    world.clock.advance(hours=2)
    _claim(world, job_id, timedelta(minutes=2))
    world.clock.advance(minutes=1)
    report = world.tick()
    assert world.job(job_id).submission_state == "submitting" and report.actions == ()


def test_submitting_async_with_expired_claim_becomes_uncertain(world: World) -> None:
    """Row 9: an async create whose lease expired becomes uncertain, reservation kept."""
    job_id = world.submit("kie-standard")
    _claim(world, job_id, timedelta(minutes=2))
    world.clock.advance(minutes=3)
    world.tick()
    job = world.job(job_id)
    assert (job.status, job.submission_state) == ("pending", "uncertain")
    assert job.error_code == "UPSTREAM_SUBMISSION_UNCERTAIN"
    assert world.log_status(job_id) == "reserved" and world.refunds(job_id) == 0


def test_submitting_sync_with_expired_claim_fails_past_threshold(world: World) -> None:
    """Row 9 (no recovery possible for a sync call): a sync call's dead process fails + refunds past its threshold only."""
    job_id = world.submit("anthropic-sync")
    _claim(world, job_id, timedelta(minutes=1))
    world.clock.advance(minutes=3)
    world.tick()
    assert world.job(job_id).submission_state == "submitting"
    world.clock.advance(minutes=3)
    world.tick()
    assert_refunded(world, job_id)
