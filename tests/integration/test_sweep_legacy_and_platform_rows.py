"""The sweep on rows the library did not submit (PostgreSQL, an injected clock): legacy
rows (no submission state, no kind) age out and are failed + refunded, unless excluded or the
legacy sweep is off; a row of an unknown kind follows the legacy rules, or gets one anomaly when
it has upstream state; a platform-plumbed row of a known kind is failed past its threshold, or
polled when it has a task id.
"""

from __future__ import annotations

import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.orm import Session, sessionmaker

from reconcile.testing.simulator import Script, Simulator
from tests.integration._sweep_helpers import INSTANT, World, assert_refunded, world as world

# ----------------------------------------------------------------------------- row 1: legacy


def test_legacy_row_past_five_minutes_is_failed_and_refunded(world: World) -> None:
    """Row 1: a row with neither submission state nor kind, started 6 min ago, fails + refunds."""
    old = world.platform_row(started_at=world.clock.now - timedelta(minutes=6))
    young = world.platform_row(status="pending")
    report = world.tick()
    job = assert_refunded(world, old)
    assert job.error_message == "reconcile_no_recovery"
    assert world.job(young).status == "pending" and world.log_status(young) == "reserved"
    assert (report.failed, report.still_running) == (1, 1)


def test_legacy_row_ages_by_created_at_without_started_at(world: World) -> None:
    """Row 1 ages a row with no started_at by created_at (not by provider columns, which a legacy row lacks)."""
    job_id = world.platform_row(status="pending")
    world.clock.advance(minutes=4)
    world.tick()
    assert world.job(job_id).status == "pending"
    world.clock.advance(minutes=2)
    world.tick()
    assert_refunded(world, job_id)


def test_excluded_job_types_are_not_swept(db: sessionmaker[Session], simulator: Simulator,
                                          tmp_path: Path) -> None:
    """LEGACY_EXCLUDE_JOB_TYPES: a stale legacy pipeline wrapper is left, others are swept."""
    w = World(db, simulator, tmp_path, legacy_exclude_job_types=["pipeline"])
    wrapper = w.platform_row(job_type="pipeline")
    plain = w.platform_row(job_type="image")
    w.clock.advance(minutes=10)
    w.tick()
    assert w.job(wrapper).status == "processing" and w.log_status(wrapper) == "reserved"
    assert_refunded(w, plain)


def test_legacy_sweep_off_leaves_legacy_rows(db: sessionmaker[Session], simulator: Simulator,
                                             tmp_path: Path) -> None:
    """LEGACY_SWEEP off: stale legacy rows stay in flight; the library's own rows are swept."""
    w = World(db, simulator, tmp_path, legacy_sweep=False)
    legacy = w.platform_row()
    own = w.submit("anthropic-sync")
    w.clock.advance(minutes=10)
    w.tick()
    assert w.job(legacy).status == "processing" and w.log_status(legacy) == "reserved"
    assert_refunded(w, own)


# ----------------------------------------------------------------------------- rows 1-3: unknown kinds


def test_unknown_kind_platform_row_follows_the_legacy_rules(world: World) -> None:
    """Rows 1-2: a platform row of an unregistered kind without a task id is decided as a legacy
    row (enforce here, with a 5-minute legacy age): one anomaly while it is too young, then failed
    + refunded (tests/integration/test_unknown_kind_rows.py: the other bounds)."""
    job_id = world.platform_row(provider_kind="acme-video",
                                provider_call_started_at=world.clock.now)
    world.clock.advance(minutes=4)
    world.tick()
    assert world.job(job_id).status == "processing"
    assert world.anomalies(job_id) == ["unknown_provider_kind"]
    world.clock.advance(minutes=2)
    world.tick()
    assert_refunded(world, job_id)


@pytest.mark.parametrize("columns", [{"provider_task_id": "t-1"},
                                     {"submission_state": "accepted", "provider_task_id": "t-1"},
                                     {"submission_state": "accepted"}])
def test_unknown_kind_with_upstream_state_gets_one_anomaly(world: World,
                                                           columns: dict[str, Any]) -> None:
    """Row 3: an unknown kind with a task id or a submission state: one anomaly, row untouched
    (even enforced and 3 hours old)."""
    job_id = world.platform_row(provider_kind="acme-video", **columns)
    world.clock.advance(hours=3)
    first = world.tick()
    world.clock.advance(minutes=10)
    world.tick()
    job = world.job(job_id)
    assert job.status == "processing" and world.log_status(job_id) == "reserved"
    assert world.anomalies(job_id) == ["unknown_provider_kind"]
    assert [(a.row, a.outcome) for a in first.actions] == [("unknown_kind", "anomaly")]


# ----------------------------------------------------------------------------- rows 4-5: platform rows


def test_anthropic_sync_processing_past_five_minutes_fails_after_one_tick(world: World) -> None:
    """Row 4 (a platform-plumbed sync row): anthropic-sync, processing, no task id, > 5 min: failed + refunded."""
    job_id = world.platform_row(provider_kind="anthropic-sync",
                                provider_call_started_at=world.clock.now)
    world.clock.advance(minutes=5, seconds=1)
    report = world.tick()
    assert_refunded(world, job_id)
    assert (report.scanned, report.failed, report.errors) == (1, 1, 0)


def test_platform_row_of_async_kind_without_task_id_uses_its_threshold(world: World) -> None:
    """Row 4: a platform kie-standard row with no task id is swept only past its 10 min."""
    job_id = world.platform_row(provider_kind="kie-standard",
                                provider_call_started_at=world.clock.now)
    world.clock.advance(minutes=9)
    world.tick()
    assert world.job(job_id).status == "processing"
    world.clock.advance(minutes=2)
    world.tick()
    assert_refunded(world, job_id)


def test_kie_llm_pending_already_refunded_fails_without_a_second_refund(world: World) -> None:
    """A platform-plumbed kie-llm row pending > 5 min whose credits were already refunded: failed, once."""
    job_id = world.platform_row(status="pending", provider_kind="kie-llm",
                                provider_call_started_at=world.clock.now)
    with world.db.begin() as s:
        world.rt.ledger.refund(s, job_id, now=world.clock.now)
    balance = world.pools(world.user)
    world.clock.advance(minutes=6)
    world.tick()
    assert_refunded(world, job_id)
    assert world.pools(world.user) == balance


def test_platform_row_with_task_id_is_polled_only_past_its_threshold(world: World) -> None:
    """Row 5: a platform row with a task id and a NULL lease is left before the threshold (no
    chain started), then treated as accepted: polled, finalized, credits committed."""
    world.sim.script_default(Script(timeline=INSTANT))
    client = world.rt.client(world.rt.kind("kie-standard"))
    from reconcile.providers import CreateRequest

    job_id = uuid.uuid4()
    created = client.create(CreateRequest(model="m/x", input={"prompt": "p"}, job_id=str(job_id),
                                          webhook_url=world.rt.webhook_url("kie", job_id)))
    world.platform_row(id=job_id, provider_kind="kie-standard", provider_task_id=created.task_id,
                       provider_call_started_at=world.clock.now)
    world.clock.advance(minutes=9)
    world.tick()
    job = world.job(job_id)
    assert job.status == "processing" and job.poll_generation == 0 and not world.q.polls
    world.clock.advance(minutes=2)
    report = world.tick()
    job = world.job(job_id)
    assert job.status == "completed" and job.credits_actual == 40
    assert report.recovered == 1 and world.audit() == []
