"""What a completion writes besides the job, on both ledger backends (PostgreSQL + the
simulator): a failed workflow execution is reopened only when the node was its sole cause; NULL
is_public / should_watermark default to true; a pricing hook commits less and releases the rest;
the state-change events reach the outbox, the hooks and Redis pub/sub.
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

import pytest
from sqlalchemy import select

from reconcile import lifecycle
from reconcile.db.models import Asset, JobEvent, WorkflowExecution
from reconcile.testing.simulator import Script
from tests.integration._lifecycle_helpers import INSTANT, load_job, submit
from tests.integration.harness import audit, backend, drain, fund, make_runtime

pytestmark = pytest.mark.usefixtures("on_each_ledger")


def _workflow(db, status: str, failed: list[str]) -> uuid.UUID:  # type: ignore[no-untyped-def]
    wid = uuid.uuid4()
    with db.begin() as s:
        s.add(WorkflowExecution(id=wid, status=status, failed_nodes=failed, error_message="timeout"))
    return wid


@pytest.mark.parametrize("status,failed,expect", [
    ("failed", ["X"], ("completed", [])),            # sole cause → reopened
    ("failed", ["X", "Y"], ("failed", ["X", "Y"])),  # multi-failure → stays failed
    ("cancelled", ["X"], ("cancelled", ["X"])),      # user cancel in between → untouched
])
def test_workflow_reopen_only_on_sole_cause(db, simulator, tmp_path, status, failed, expect) -> None:  # type: ignore[no-untyped-def]
    """README, Design notes: Orchestrators. Completing node X reopens a failed execution only when X was the sole cause."""
    rt, q = make_runtime(db, simulator, tmp_path)
    wid = _workflow(db, status, failed)
    job_id = submit(rt, db, workflow_execution_id=wid, node_id="X")
    simulator.script(str(job_id), Script(timeline=INSTANT))
    drain(rt, q)
    assert load_job(db, job_id).status == "completed"
    with db() as s:
        w = s.get(WorkflowExecution, wid)
        assert (w.status, w.failed_nodes) == expect
        # the recovered output lands as a standalone asset either way
        assert s.execute(select(Asset).where(Asset.job_id == job_id)).scalars().all()


def test_is_public_and_watermark_default_to_true_when_null(db, simulator, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """NULL is_public → public asset; NULL should_watermark → the watermark hook runs."""
    rt, q = make_runtime(db, simulator, tmp_path)
    seen: list[str | None] = []
    rt.watermark_hook = lambda data, media_type, job: (seen.append(media_type), data + b"WM")[1]
    job_id = submit(rt, db)
    simulator.script(str(job_id), Script(timeline=INSTANT))
    drain(rt, q)
    with db() as s:
        asset = s.execute(select(Asset).where(Asset.job_id == job_id)).scalar_one()
    assert asset.is_public is True and asset.watermarked is True and seen
    assert Path(rt.storage.root, asset.storage_key).read_bytes().endswith(b"WM")  # type: ignore[attr-defined]


def test_pricing_hook_commits_less_and_releases_the_rest(db, simulator, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A pricing hook committing 25 of 40: credits_actual 25, 15 released to the pools."""
    rt, q = make_runtime(db, simulator, tmp_path)
    rt.pricing_hook = lambda job, result: 25
    job_id = submit(rt, db)
    simulator.script(str(job_id), Script(timeline=INSTANT))
    drain(rt, q)
    job = load_job(db, job_id)
    assert job.credits_actual == 25 and job.display_cost == 25
    with db() as s:
        assert audit(s) == []
    assert backend().total(job.user_id) == 1000 - 25  # the 15 not charged went back


def test_events_are_written_with_state_changes_and_published(db, simulator, tmp_path, redis_url) -> None:  # type: ignore[no-untyped-def]
    """queued → running → completed events land in the outbox, reach the hook and Redis pub/sub."""
    import redis

    rt, q = make_runtime(db, simulator, tmp_path, events_redis_url=redis_url)
    got: list[dict] = []
    rt.event_hooks.append(got.append)
    job_id = uuid.uuid4()
    client = redis.Redis.from_url(redis_url)
    pubsub = client.pubsub()
    pubsub.subscribe(f"reconcile:job:{job_id}")
    pubsub.get_message(timeout=1)
    user = uuid.uuid4()
    fund(db, user)
    simulator.script(str(job_id), Script(timeline=INSTANT))
    lifecycle.submit_job(rt, user, "kie-standard", "m", {"prompt": "x"}, 10, job_type="image",
                         job_id=job_id)
    drain(rt, q)
    assert [e["type"] for e in got] == ["queued", "running", "completed"]
    assert len({e["event_id"] for e in got}) == 3
    received = []
    deadline = time.time() + 3
    while len(received) < 3 and time.time() < deadline:
        m = pubsub.get_message(timeout=0.5)
        if m and m["type"] == "message":
            received.append(json.loads(m["data"])["type"])
    assert received == ["queued", "running", "completed"]
    with db() as s:
        assert all(e.published_at for e in s.execute(select(JobEvent)).scalars())
