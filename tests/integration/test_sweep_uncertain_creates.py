"""The sweep on ``uncertain`` creates (PostgreSQL, an injected clock): adopted from
Replicate's listing by the planted job id, or from a KIE webhook only when recordInfo echoes the
job; without evidence, one ``uncertain_unresolved`` anomaly and the reservation kept — never
refunded, never resubmitted.
"""

from __future__ import annotations

import uuid

from reconcile import lifecycle
from reconcile.db.models import WebhookDelivery
from reconcile.testing.simulator import Script
from tests.integration._sweep_helpers import FOREVER, World, uncertain_kie, world as world

# ----------------------------------------------------------------------------- row 12: uncertain


def test_uncertain_replicate_is_adopted_from_the_listing(world: World) -> None:
    """Row 12: a create accepted upstream but dropped is found in Replicate's listing by its
    planted job id after 5 min, adopted and resumed — never created twice."""
    job_id = world.submit("replicate-prediction")
    world.sim.script(str(job_id), Script(timeline=FOREVER, create="drop_after_accept"))
    assert lifecycle.create_step(world.rt, job_id).action == "uncertain"
    world.tick()
    assert world.job(job_id).submission_state == "uncertain"  # evidence check not due yet
    world.clock.advance(minutes=5)
    report = world.tick()
    job = world.job(job_id)
    assert (job.status, job.submission_state) == ("processing", "accepted")
    assert job.provider_task_id == world.sim.tasks_for(str(job_id))[0].task_id
    assert job.reconcile_attempts == 0 and world.q.polls[-1][0] == job_id
    assert [a.outcome for a in report.actions] == ["adopted"]
    assert world.sim.creates(str(job_id)) == 1


def _delivery(w: World, job_id: uuid.UUID, upstream_id: str) -> None:
    with w.db.begin() as s:
        s.add(WebhookDelivery(provider="kie", delivery_id=uuid.uuid4().hex, upstream_id=upstream_id,
                              job_id=job_id, received_at=w.clock.now, payload_digest="d"))


def test_uncertain_kie_adopts_a_webhook_id_only_when_record_info_echoes_the_job(world: World) -> None:
    """Row 12 (KIE, unsigned body): a delivery naming another job's task is not adopted; one
    whose recordInfo echoes this job's planted id is."""
    job_id = uncertain_kie(world)
    other = world.accept("kie-standard", Script(timeline=FOREVER))
    _delivery(world, job_id, world.task_id(other))
    world.clock.advance(minutes=5)
    world.tick()
    job = world.job(job_id)
    assert job.submission_state == "uncertain" and job.reconcile_attempts == 1
    _delivery(world, job_id, world.sim.tasks_for(str(job_id))[0].task_id)
    world.clock.advance(minutes=5)
    world.tick()
    job = world.job(job_id)
    assert job.submission_state == "accepted"
    assert job.provider_task_id == world.sim.tasks_for(str(job_id))[0].task_id


def test_uncertain_without_evidence_gets_one_anomaly_and_keeps_its_reservation(world: World) -> None:
    """Row 12: no evidence after 18 checks (5 min apart): one uncertain_unresolved anomaly; the
    job stays uncertain and reserved — never refunded, never resubmitted."""
    job_id = uncertain_kie(world)
    for _ in range(17):
        world.clock.advance(minutes=5)
        world.tick()
        world.tick()  # not due again at the same time
    assert world.job(job_id).reconcile_attempts == 17 and world.anomalies(job_id) == []
    for _ in range(3):
        world.clock.advance(minutes=5)
        world.tick()
    job = world.job(job_id)
    assert (job.status, job.submission_state, job.reconcile_attempts) == ("pending", "uncertain", 20)
    assert world.anomalies(job_id) == ["uncertain_unresolved"]
    assert world.log_status(job_id) == "reserved" and world.refunds(job_id) == 0
    assert world.sim.creates(str(job_id)) == 1 and world.q.create_calls == 0
