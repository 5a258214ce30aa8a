"""Sync calls under issue 11 (holes 6, 7 and 12), on PostgreSQL with the simulator.

Hole 6: a platform row's call is guarded by its status. Hole 7: a sync call has a total
deadline below its kind's threshold, checked at start-up, and its claim lease covers it. Hole
12: a stray create message never turns a sync job ``uncertain``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy.orm import Session, sessionmaker

from reconcile.cancel import cancel_job
from reconcile.errors import Conflict
from reconcile.sync import sync_call
from reconcile.testing.simulator import Simulator
from tests.integration.test_sweep import World


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
