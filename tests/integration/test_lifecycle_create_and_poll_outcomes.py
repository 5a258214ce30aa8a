"""The outcome table rows a create or a poll decides, on both ledger backends (PostgreSQL +
the simulator, steps run in-process): every family persists its kind, task id and call start;
the task id is saved before the first poll; a confirmed rejection fails and refunds, an uncertain
create keeps its reservation and is never resubmitted, a rate-limited create is retried until
accepted or exhausted, a request the builder refuses is failed and refunded; the provider's
failure, an empty success and an unknown status; options reach the client.
"""

from __future__ import annotations

import time

import pytest
from sqlalchemy import select

from reconcile import lifecycle
from reconcile.db.models import Asset
from reconcile.testing.simulator import Script
from tests.integration._lifecycle_helpers import FAMILIES, FOREVER, INSTANT, load_job, submit
from tests.integration.harness import audit, drain, make_runtime

pytestmark = pytest.mark.usefixtures("on_each_ledger")


@pytest.mark.parametrize("kind,model,inp", FAMILIES, ids=[f[0] for f in FAMILIES])
def test_each_family_persists_kind_task_id_and_call_start(db, simulator, tmp_path, kind, model, inp) -> None:  # type: ignore[no-untyped-def]
    """Phase 1: after a successful generation the row has provider_kind, task id and call start."""
    rt, q = make_runtime(db, simulator, tmp_path)
    simulator.script_default(Script(timeline=INSTANT))
    job_id = submit(rt, db, kind, model, inp)
    drain(rt, q)
    job = load_job(db, job_id)
    assert job.status == "completed", (job.error_code, job.error_message, job.reconcile_last_error)
    assert job.provider_kind == kind and job.provider_task_id and job.provider_call_started_at
    assert simulator.creates(str(job_id)) == 1
    with db() as s:
        assert s.execute(select(Asset).where(Asset.job_id == job_id)).scalars().all()
        assert audit(s) == []


def test_task_id_is_saved_before_the_first_poll(db, simulator, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """on_task_created persists the id and `accepted` before any poll is enqueued or run."""
    rt, q = make_runtime(db, simulator, tmp_path)
    simulator.script_default(Script(timeline=FOREVER))
    job_id = submit(rt, db)
    lifecycle.create_step(rt, q.creates.popleft())
    job = load_job(db, job_id)
    assert job.submission_state == "accepted" and job.status == "processing"
    assert job.provider_task_id and len(q.polls) == 1 and simulator.attempts(str(job_id)) == 1


@pytest.mark.parametrize("mode,code", [("reject_invalid", "UPSTREAM_INVALID_INPUT"),
                                       ("reject_auth", "UPSTREAM_SUBMISSION_FAILED")])
def test_confirmed_rejection_fails_and_refunds(db, simulator, tmp_path, mode, code) -> None:  # type: ignore[no-untyped-def]
    """A 4xx rejection: rejected, failed with its code, refunded; nothing retried."""
    rt, q = make_runtime(db, simulator, tmp_path)
    job_id = submit(rt, db)
    simulator.script(str(job_id), Script(create=mode))
    drain(rt, q)
    job = load_job(db, job_id)
    assert (job.status, job.submission_state, job.error_code, job.credits_actual) == \
        ("failed", "rejected", code, 0)
    assert job.error_detail["submissionOutcome"] == "rejected" and job.error_detail["body"]
    assert simulator.attempts(str(job_id)) == 1


@pytest.mark.parametrize("mode", ["drop_after_accept", "server_error", "garbage_2xx"])
def test_uncertain_create_keeps_reservation_and_is_never_resubmitted(db, simulator, tmp_path, mode) -> None:  # type: ignore[no-untyped-def]
    """Transport error / 5xx / garbage 2xx: uncertain, still pending, reserved, no second create."""
    rt, q = make_runtime(db, simulator, tmp_path)
    job_id = submit(rt, db)
    simulator.script(str(job_id), Script(create=mode))
    drain(rt, q)
    lifecycle.create_step(rt, job_id)  # a redelivered message
    job = load_job(db, job_id)
    assert (job.status, job.submission_state, job.error_code) == \
        ("pending", "uncertain", "UPSTREAM_SUBMISSION_UNCERTAIN")
    assert simulator.attempts(str(job_id)) == 1
    with db() as s:
        assert rt.ledger.settled_amount(s, job_id) is None


def test_rate_limited_create_is_retried_then_accepted(db, simulator, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """429 twice then accepted: the claim is released with a not-before, and the job completes."""
    rt, q = make_runtime(db, simulator, tmp_path, time_scale=0.001)
    job_id = submit(rt, db)
    simulator.script(str(job_id), Script(create="rate_limit", rate_limit_times=2, retry_after=1,
                                         timeline=INSTANT))
    for _ in range(20):
        drain(rt, q)
        if load_job(db, job_id).status == "completed":
            break
        time.sleep(0.01)
        q.creates.append(job_id)
    job = load_job(db, job_id)
    assert job.status == "completed" and job.create_rate_limit_count == 2
    assert simulator.creates(str(job_id)) == 1


def test_rate_limited_until_exhausted_fails_rate_limited(db, simulator, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Always 429: after 5 tries the job is rejected with UPSTREAM_RATE_LIMITED and refunded."""
    rt, q = make_runtime(db, simulator, tmp_path, time_scale=0.0001)
    job_id = submit(rt, db)
    simulator.script(str(job_id), Script(create="rate_limit", retry_after=0))
    for _ in range(10):
        drain(rt, q)
        time.sleep(0.01)
    job = load_job(db, job_id)
    assert (job.status, job.error_code, job.credits_actual) == ("failed", "UPSTREAM_RATE_LIMITED", 0)
    assert simulator.creates(str(job_id)) == 0


@pytest.mark.parametrize("timeline,code", [
    (((0.0, "queued"), (0.0, "failed")), "UPSTREAM_FAILED"),
])
def test_provider_failure_fails_and_refunds(db, simulator, tmp_path, timeline, code) -> None:  # type: ignore[no-untyped-def]
    """The provider reports failure: failed with the provider's code in detail, refunded."""
    rt, q = make_runtime(db, simulator, tmp_path)
    job_id = submit(rt, db)
    simulator.script(str(job_id), Script(timeline=timeline, fail_code="422", fail_message="nsfw"))
    drain(rt, q)
    job = load_job(db, job_id)
    assert (job.status, job.error_code, job.credits_actual) == ("failed", code, 0)
    assert job.error_detail["via"] == "poll" and job.error_detail["provider_message"] == "nsfw"


def test_success_without_media_is_empty_result(db, simulator, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Succeeded with no outputs: UPSTREAM_EMPTY_RESULT, refunded."""
    rt, q = make_runtime(db, simulator, tmp_path)
    job_id = submit(rt, db)
    simulator.script(str(job_id), Script(timeline=INSTANT, outputs=0))
    drain(rt, q)
    job = load_job(db, job_id)
    assert (job.status, job.error_code, job.credits_actual) == ("failed", "UPSTREAM_EMPTY_RESULT", 0)


def test_unknown_status_keeps_the_job_in_flight(db, simulator, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """An unknown status is kept in reconcile_last_error; the job stays in flight."""
    rt, q = make_runtime(db, simulator, tmp_path)
    job_id = submit(rt, db)
    simulator.script(str(job_id), Script(timeline=((0.0, "queued"), (0.0, "unknown:teleporting"))))
    drain(rt, q, max_steps=3)
    job = load_job(db, job_id)
    assert job.status == "processing"
    assert job.reconcile_last_error.startswith("UPSTREAM_UNKNOWN_STATUS") and "teleporting" in job.reconcile_last_error


def test_a_request_the_provider_builder_refuses_is_failed_and_refunded(db, simulator, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A model string the fal builder rejects: INVALID_PARAM, rejected, refunded — never stuck."""
    rt, q = make_runtime(db, simulator, tmp_path)
    job_id = submit(rt, db, "fal-queue", "badmodel")
    drain(rt, q)
    job = load_job(db, job_id)
    assert (job.status, job.submission_state, job.error_code, job.credits_actual) == \
        ("failed", "rejected", "INVALID_PARAM", 0)
    assert simulator.attempts(str(job_id)) == 0


def test_replicate_training_gets_its_destination_through_options(db, simulator, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """submit_job(options=…) reaches the client: a training is created with its destination."""
    rt, q = make_runtime(db, simulator, tmp_path)
    simulator.script_default(Script(timeline=INSTANT))
    job_id = submit(rt, db, "replicate-training", "owner/model:v1", {"steps": 10},
                    options={"destination": "owner/lora"})
    drain(rt, q)
    job = load_job(db, job_id)
    assert job.status == "completed", (job.error_code, job.error_message)
    assert simulator.creates(str(job_id)) == 1
