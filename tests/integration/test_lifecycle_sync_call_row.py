"""``sync_call`` on both ledger backends (PostgreSQL + the simulator): the row is marked (kind,
call start, no task id) before the call runs; on a platform row only those columns are written,
never the status; a failed call is refunded at once.
"""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import select

from reconcile import sync_call
from reconcile.db.models import Asset, Job
from reconcile.errors import SyncCallFailed
from tests.integration._lifecycle_helpers import load_job, submit
from tests.integration.harness import make_runtime

pytestmark = pytest.mark.usefixtures("on_each_ledger")


def test_sync_call_marks_the_row_before_the_call(db, simulator, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Sync route: provider_kind + call start are set, task id NULL, before the call runs."""
    rt, _ = make_runtime(db, simulator, tmp_path)
    job_id = submit(rt, db, "anthropic-sync", "claude-x", {"prompt": "hi"})
    client = rt.client(rt.kind("anthropic-sync"))  # type: ignore[arg-type]
    with sync_call(rt, job_id) as call:
        inside = load_job(db, job_id)
        assert inside.provider_kind == "anthropic-sync" and inside.provider_call_started_at
        assert inside.provider_task_id is None and inside.submission_state == "submitting"
        call.result = client.call("claude-x", {"prompt": "hi"})  # type: ignore[union-attr]
    job = load_job(db, job_id)
    assert job.status == "completed" and job.credits_actual == 40
    with db() as s:
        assert s.execute(select(Asset).where(Asset.job_id == job_id)).scalar_one().media_type == "text/plain"


def test_sync_call_on_a_platform_row_leaves_status_untouched(db, simulator, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A platform row (no submission_state): only provider_kind + call start are written."""
    rt, _ = make_runtime(db, simulator, tmp_path)
    job_id = uuid.uuid4()
    with db.begin() as s:
        s.add(Job(id=job_id, user_id=uuid.uuid4(), job_type="writer", status="pending"))
    with pytest.raises(RuntimeError), sync_call(rt, job_id, provider_kind="kie-llm"):
        inside = load_job(db, job_id)
        assert inside.status == "pending" and inside.provider_kind == "kie-llm"
        assert inside.provider_call_started_at is not None and inside.submission_state is None
        raise RuntimeError("the platform's handler crashed")
    assert load_job(db, job_id).status == "failed"


def test_sync_call_failure_refunds_at_once(db, simulator, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A sync call answered 429 fails UPSTREAM_RATE_LIMITED and is refunded immediately."""
    rt, _ = make_runtime(db, simulator, tmp_path)
    job_id = submit(rt, db, "anthropic-sync", "claude-x", {"prompt": "hi"})
    with pytest.raises(SyncCallFailed), sync_call(rt, job_id):
        raise SyncCallFailed("rate limited", code="UPSTREAM_RATE_LIMITED", status=429)  # type: ignore[arg-type]
    job = load_job(db, job_id)
    assert (job.status, job.error_code, job.credits_actual) == ("failed", "UPSTREAM_RATE_LIMITED", 0)
