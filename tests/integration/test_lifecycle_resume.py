"""Resuming instead of creating again, on both ledger backends (PostgreSQL + the
simulator): a redelivered create on a row with a task id resumes polling, resuming dispatches to
the kind's provider, and a row without a task id falls back to a create only when not started.
"""

from __future__ import annotations

import pytest

from reconcile import lifecycle
from reconcile.db.models import Job
from reconcile.testing.simulator import Script
from tests.integration._lifecycle_helpers import FAMILIES, FOREVER, INSTANT, load_job, submit
from tests.integration.harness import drain, make_runtime

pytestmark = pytest.mark.usefixtures("on_each_ledger")


def test_stall_retry_with_a_task_id_never_calls_create(db, simulator, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Phase 4: a redelivered create on a row with a task id resumes polling; no second create."""
    rt, q = make_runtime(db, simulator, tmp_path)
    job_id = submit(rt, db)
    simulator.script(str(job_id), Script(timeline=FOREVER))
    lifecycle.create_step(rt, q.creates.popleft())
    q.polls.clear()
    with db.begin() as s:  # the poll lease ran out: the old chain is presumed dead
        s.get(Job, job_id).poll_lease_expires_at = rt.now()
    assert lifecycle.create_step(rt, job_id).action == "resumed"
    assert simulator.attempts(str(job_id)) == 1 and len(q.polls) == 1


@pytest.mark.parametrize("kind,model,inp", FAMILIES, ids=[f[0] for f in FAMILIES])
def test_resume_dispatches_to_the_right_provider(db, simulator, tmp_path, kind, model, inp) -> None:  # type: ignore[no-untyped-def]
    """Phase 4 cross-provider dispatch: resuming by kind polls that provider's task."""
    rt, q = make_runtime(db, simulator, tmp_path)
    simulator.script_default(Script(timeline=FOREVER))
    job_id = submit(rt, db, kind, model, inp)
    lifecycle.create_step(rt, q.creates.popleft())
    q.polls.clear()
    task_id = load_job(db, job_id).provider_task_id
    simulator.set_state(task_id, "succeeded")
    with db.begin() as s:
        s.get(Job, job_id).poll_lease_expires_at = rt.now()
    assert lifecycle.resume_chain(rt, job_id)
    drain(rt, q)
    assert load_job(db, job_id).status == "completed"
    assert simulator.creates(str(job_id)) == 1


def test_no_task_id_falls_back_to_create_only_when_not_started(db, simulator, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Phase 4 fallback: no id + not_started → normal create; no id + submitting → never."""
    rt, q = make_runtime(db, simulator, tmp_path)
    simulator.script_default(Script(timeline=INSTANT))
    job_id = submit(rt, db)
    other = submit(rt, db)
    with db.begin() as s:  # `other` is mid-submission elsewhere (live claim)
        j = s.get(Job, other)
        j.submission_state, j.claim_token = "submitting", "someone"
        j.claim_expires_at = rt.now().replace(year=2099)
    q.creates.clear()
    assert lifecycle.create_step(rt, job_id).action == "accepted"
    assert lifecycle.create_step(rt, other).action == "busy"
    assert simulator.attempts(str(other)) == 0
