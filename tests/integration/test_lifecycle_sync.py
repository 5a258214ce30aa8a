"""Sync calls under issue 11 (holes 6, 7 and 12), on PostgreSQL with the simulator.

Hole 6: a platform row's call is guarded by its status. Hole 7: a sync call has a total
deadline below its kind's threshold, checked at start-up, and its claim lease covers it. Hole
12: a stray create message never turns a sync job ``uncertain``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy.orm import Session, sessionmaker

from reconcile import lifecycle, sync
from reconcile.cancel import cancel_job
from reconcile.errors import Conflict
from reconcile.sync import sync_call
from reconcile.testing.simulator import Simulator
from tests.integration.test_sweep import World, assert_refunded


@pytest.fixture
def world(db: sessionmaker[Session], simulator: Simulator, tmp_path: Path) -> World:
    return World(db, simulator, tmp_path)


def test_sync_call_on_a_cancelled_platform_row_raises_and_calls_nobody(world: World) -> None:
    """Hole 6: the user cancels a platform row (refunded); the platform's request then enters
    sync_call: it raises before the block runs, writes nothing, and the provider sees 0 calls."""
    w = world
    job_id = w.platform_row(status="pending", job_type="writer")
    assert cancel_job(w.rt, w.user, job_id).status == "cancelled"
    assert w.log_status(job_id) == "refunded"
    client = w.rt.client(w.rt.kind("anthropic-sync"))  # type: ignore[arg-type]
    ran: list[bool] = []
    with pytest.raises(Conflict), sync_call(w.rt, job_id, provider_kind="anthropic-sync"):
        ran.append(True)
        client.call("claude-sonnet-4-5", {"prompt": "hi"})  # type: ignore[union-attr]
    assert ran == [] and w.sim.attempts(provider="anthropic") == 0
    job = w.job(job_id)
    assert (job.status, job.provider_call_started_at, job.provider_kind) == ("cancelled", None, None)
    assert w.refunds(job_id) == 1 and w.audit() == []


def test_a_stray_create_message_never_makes_a_sync_job_uncertain(world: World) -> None:
    """Hole 12: the platform's request took the sync claim and died. A stray create message
    after the lease leaves the row alone (not ``uncertain``, which the sweep would hold for
    ever); the sweep then fails and refunds it past the threshold (DESIGN §6)."""
    w = world
    job_id = w.submit("anthropic-sync")
    sync._claim(w.rt, job_id, None)  # sync_call's claim; the request then dies in its block
    assert w.job(job_id).submission_state == "submitting"
    w.clock.advance(minutes=10)  # past the claim lease and the 5-minute threshold
    assert lifecycle.create_step(w.rt, job_id).action == "lost"
    assert w.job(job_id).submission_state == "submitting"
    w.tick()
    assert_refunded(w, job_id)
    assert w.sim.attempts(provider="anthropic") == 0


def test_a_sync_job_left_uncertain_by_an_old_stray_create_is_failed_past_its_threshold(world: World) -> None:
    """A sync row already ``uncertain`` (written by the old stray-create path) is no longer
    held for ever: past the threshold the sweep fails and refunds it."""
    w = world
    job_id = w.submit("kie-llm")
    w.set(job_id, submission_state="submitting", provider_call_started_at=w.clock.now)
    w.set(job_id, submission_state="uncertain")
    w.clock.advance(minutes=2)
    w.tick()
    assert w.job(job_id).status == "pending"  # before the threshold: left
    w.clock.advance(minutes=4)
    w.tick()
    assert_refunded(w, job_id)
