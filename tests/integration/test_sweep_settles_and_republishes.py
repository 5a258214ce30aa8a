"""The sweep settles a persisted failure whose refund never ran (after a grace, and not
before a backed-off retry time), and republishes outbox events left unpublished for 30 s.
"""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import select, update

from reconcile import jobstore
from reconcile.db.models import JobEvent
from tests.integration._sweep_helpers import World, assert_refunded, world as world

# ----------------------------------------------------------------------------- rows 13-14


def test_unsettled_failure_is_settled_when_due(world: World) -> None:
    """Row 13: a failure persisted without its refund (a crash) is refunded once, when due —
    after a 30 s grace that leaves a live settler (its writer) to finish first."""
    job_id = world.submit("kie-standard")
    with world.db.begin() as s:
        jobstore.mark_failed(s, job_id, now=world.clock.now, code="UPSTREAM_FAILED",
                             message="boom", detail=None)
    world.clock.advance(seconds=20)
    world.tick()
    assert world.job(job_id).credits_actual is None
    world.clock.advance(seconds=11)
    report = world.tick()
    assert_refunded(world, job_id, "UPSTREAM_FAILED")
    assert [(a.row, a.outcome) for a in report.actions] == [("unsettled", "settled")]
    world.tick()
    assert world.refunds(job_id) == 1


def test_backed_off_settlement_waits_for_its_retry_time(world: World) -> None:
    """Row 13: a settlement backed off to a later ``next_poll_at`` is not retried before it."""
    job_id = world.submit("kie-standard")
    with world.db.begin() as s:
        jobstore.mark_failed(s, job_id, now=world.clock.now, code="UPSTREAM_FAILED",
                             message="boom", detail=None)
        jobstore.settle_failed(s, job_id, world.clock.now + timedelta(minutes=10))
    world.clock.advance(minutes=5)
    world.tick()
    assert world.job(job_id).credits_actual is None and world.log_status(job_id) == "reserved"
    world.clock.advance(minutes=6)
    world.tick()
    assert_refunded(world, job_id, "UPSTREAM_FAILED")


def test_events_unpublished_for_30_seconds_are_published_again(world: World) -> None:
    """Row 14: an outbox event left unpublished > 30 s is republished; a fresh one is not."""
    job_id = world.submit("kie-standard")
    with world.db.begin() as s:  # as if the publisher was down after the commit
        s.execute(update(JobEvent).values(published_at=None))
        stale = s.execute(select(JobEvent.event_id)).scalar_one()
    seen: list[str] = []
    world.rt.event_hooks.append(lambda message: seen.append(message["event_id"]))
    world.clock.advance(seconds=20)
    world.tick()
    assert seen == []
    world.clock.advance(seconds=11)
    world.tick()
    assert seen == [stale]
    with world.db() as s:
        assert s.execute(select(JobEvent.published_at)).scalar_one() is not None
    assert world.job(job_id).status == "pending"
