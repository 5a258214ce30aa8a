"""The crash-safe lifecycle on PostgreSQL + the simulator (steps run in-process).

The create/poll/resume split, finalize, the retry guard, the outcome table rows a create or poll decides, and the
races of issue 4.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from reconcile import lifecycle, sync_call
from reconcile.db.models import Asset, Job, JobEvent, WorkflowExecution
from reconcile.errors import SyncCallFailed
from reconcile.settlement import SettleOutcome
from reconcile.testing import sim_signing
from reconcile.testing.simulator import Script, Simulator
from reconcile.webhook_ingest import handle_webhook
from tests.integration.harness import audit, backend, drain, fund, ledger_backend, make_runtime
from tests.integration.ledgers import BACKENDS, assert_builtin_ledger_untouched, make_backend


@pytest.fixture(autouse=True, params=BACKENDS)
def ledger(request: pytest.FixtureRequest, db: sessionmaker[Session]):  # type: ignore[no-untyped-def]
    """Every lifecycle test runs on both ledger backends (built-in; platform user_credits)."""
    with ledger_backend(make_backend(request.param, db)) as current:
        yield current
    if current.name == "platform":  # the lifecycle reached credits only through the seam
        assert_builtin_ledger_untouched(db)


INSTANT = ((0.0, "queued"), (0.0, "succeeded"))
FOREVER = ((0.0, "queued"), (0.0, "running"))

FAMILIES = [
    ("kie-standard", "seedream/4.5-edit", {"prompt": "a cat"}),
    ("kie-veo", "veo3_fast", {"prompt": "a dog"}),
    ("kie-suno", "V4_5", {"prompt": "a song", "customMode": False, "instrumental": False}),
    ("replicate-prediction", "owner/model:abc123", {"prompt": "x"}),
    ("elevenlabs-async", "dubbing", {"source_url": "https://example.com/a.mp4", "target_lang": "es"}),
    ("fal-queue", "fal-ai/flux/dev", {"prompt": "x"}),
]


def _job(db: sessionmaker[Session], job_id: uuid.UUID) -> Job:
    with db() as s:
        job = s.get(Job, job_id)
        assert job is not None
        return job


def _submit(rt, db, kind="kie-standard", model="m", inp=None, amount=40, user=None, **kw):  # type: ignore[no-untyped-def]
    user = user or uuid.uuid4()
    fund(db, user)
    return lifecycle.submit_job(rt, user, kind, model, inp or {"prompt": "x"}, amount,
                                job_type="image", **kw).job_id


@pytest.mark.parametrize("kind,model,inp", FAMILIES, ids=[f[0] for f in FAMILIES])
def test_each_family_persists_kind_task_id_and_call_start(db, simulator, tmp_path, kind, model, inp) -> None:  # type: ignore[no-untyped-def]
    """Phase 1: after a successful generation the row has provider_kind, task id and call start."""
    rt, q = make_runtime(db, simulator, tmp_path)
    simulator.script_default(Script(timeline=INSTANT))
    job_id = _submit(rt, db, kind, model, inp)
    drain(rt, q)
    job = _job(db, job_id)
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
    job_id = _submit(rt, db)
    lifecycle.create_step(rt, q.creates.popleft())
    job = _job(db, job_id)
    assert job.submission_state == "accepted" and job.status == "processing"
    assert job.provider_task_id and len(q.polls) == 1 and simulator.attempts(str(job_id)) == 1


def test_sync_call_marks_the_row_before_the_call(db, simulator, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Sync route: provider_kind + call start are set, task id NULL, before the call runs."""
    rt, _ = make_runtime(db, simulator, tmp_path)
    job_id = _submit(rt, db, "anthropic-sync", "claude-x", {"prompt": "hi"})
    client = rt.client(rt.kind("anthropic-sync"))  # type: ignore[arg-type]
    with sync_call(rt, job_id) as call:
        inside = _job(db, job_id)
        assert inside.provider_kind == "anthropic-sync" and inside.provider_call_started_at
        assert inside.provider_task_id is None and inside.submission_state == "submitting"
        call.result = client.call("claude-x", {"prompt": "hi"})  # type: ignore[union-attr]
    job = _job(db, job_id)
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
        inside = _job(db, job_id)
        assert inside.status == "pending" and inside.provider_kind == "kie-llm"
        assert inside.provider_call_started_at is not None and inside.submission_state is None
        raise RuntimeError("the platform's handler crashed")
    assert _job(db, job_id).status == "failed"


def test_sync_call_failure_refunds_at_once(db, simulator, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A sync call answered 429 fails UPSTREAM_RATE_LIMITED and is refunded immediately."""
    rt, _ = make_runtime(db, simulator, tmp_path)
    job_id = _submit(rt, db, "anthropic-sync", "claude-x", {"prompt": "hi"})
    with pytest.raises(SyncCallFailed), sync_call(rt, job_id):
        raise SyncCallFailed("rate limited", code="UPSTREAM_RATE_LIMITED", status=429)  # type: ignore[arg-type]
    job = _job(db, job_id)
    assert (job.status, job.error_code, job.credits_actual) == ("failed", "UPSTREAM_RATE_LIMITED", 0)


@pytest.mark.parametrize("mode,code", [("reject_invalid", "UPSTREAM_INVALID_INPUT"),
                                       ("reject_auth", "UPSTREAM_SUBMISSION_FAILED")])
def test_confirmed_rejection_fails_and_refunds(db, simulator, tmp_path, mode, code) -> None:  # type: ignore[no-untyped-def]
    """A 4xx rejection: rejected, failed with its code, refunded; nothing retried."""
    rt, q = make_runtime(db, simulator, tmp_path)
    job_id = _submit(rt, db)
    simulator.script(str(job_id), Script(create=mode))
    drain(rt, q)
    job = _job(db, job_id)
    assert (job.status, job.submission_state, job.error_code, job.credits_actual) == \
        ("failed", "rejected", code, 0)
    assert job.error_detail["submissionOutcome"] == "rejected" and job.error_detail["body"]
    assert simulator.attempts(str(job_id)) == 1


@pytest.mark.parametrize("mode", ["drop_after_accept", "server_error", "garbage_2xx"])
def test_uncertain_create_keeps_reservation_and_is_never_resubmitted(db, simulator, tmp_path, mode) -> None:  # type: ignore[no-untyped-def]
    """Transport error / 5xx / garbage 2xx: uncertain, still pending, reserved, no second create."""
    rt, q = make_runtime(db, simulator, tmp_path)
    job_id = _submit(rt, db)
    simulator.script(str(job_id), Script(create=mode))
    drain(rt, q)
    lifecycle.create_step(rt, job_id)  # a redelivered message
    job = _job(db, job_id)
    assert (job.status, job.submission_state, job.error_code) == \
        ("pending", "uncertain", "UPSTREAM_SUBMISSION_UNCERTAIN")
    assert simulator.attempts(str(job_id)) == 1
    with db() as s:
        assert rt.ledger.settled_amount(s, job_id) is None


def test_rate_limited_create_is_retried_then_accepted(db, simulator, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """429 twice then accepted: the claim is released with a not-before, and the job completes."""
    rt, q = make_runtime(db, simulator, tmp_path, time_scale=0.001)
    job_id = _submit(rt, db)
    simulator.script(str(job_id), Script(create="rate_limit", rate_limit_times=2, retry_after=1,
                                         timeline=INSTANT))
    for _ in range(20):
        drain(rt, q)
        if _job(db, job_id).status == "completed":
            break
        time.sleep(0.01)
        q.creates.append(job_id)
    job = _job(db, job_id)
    assert job.status == "completed" and job.create_rate_limit_count == 2
    assert simulator.creates(str(job_id)) == 1


def test_rate_limited_until_exhausted_fails_rate_limited(db, simulator, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Always 429: after 5 tries the job is rejected with UPSTREAM_RATE_LIMITED and refunded."""
    rt, q = make_runtime(db, simulator, tmp_path, time_scale=0.0001)
    job_id = _submit(rt, db)
    simulator.script(str(job_id), Script(create="rate_limit", retry_after=0))
    for _ in range(10):
        drain(rt, q)
        time.sleep(0.01)
    job = _job(db, job_id)
    assert (job.status, job.error_code, job.credits_actual) == ("failed", "UPSTREAM_RATE_LIMITED", 0)
    assert simulator.creates(str(job_id)) == 0


@pytest.mark.parametrize("timeline,code", [
    (((0.0, "queued"), (0.0, "failed")), "UPSTREAM_FAILED"),
])
def test_provider_failure_fails_and_refunds(db, simulator, tmp_path, timeline, code) -> None:  # type: ignore[no-untyped-def]
    """The provider reports failure: failed with the provider's code in detail, refunded."""
    rt, q = make_runtime(db, simulator, tmp_path)
    job_id = _submit(rt, db)
    simulator.script(str(job_id), Script(timeline=timeline, fail_code="422", fail_message="nsfw"))
    drain(rt, q)
    job = _job(db, job_id)
    assert (job.status, job.error_code, job.credits_actual) == ("failed", code, 0)
    assert job.error_detail["via"] == "poll" and job.error_detail["provider_message"] == "nsfw"


def test_success_without_media_is_empty_result(db, simulator, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Succeeded with no outputs: UPSTREAM_EMPTY_RESULT, refunded."""
    rt, q = make_runtime(db, simulator, tmp_path)
    job_id = _submit(rt, db)
    simulator.script(str(job_id), Script(timeline=INSTANT, outputs=0))
    drain(rt, q)
    job = _job(db, job_id)
    assert (job.status, job.error_code, job.credits_actual) == ("failed", "UPSTREAM_EMPTY_RESULT", 0)


def test_unknown_status_keeps_the_job_in_flight(db, simulator, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """An unknown status is kept in reconcile_last_error; the job stays in flight."""
    rt, q = make_runtime(db, simulator, tmp_path)
    job_id = _submit(rt, db)
    simulator.script(str(job_id), Script(timeline=((0.0, "queued"), (0.0, "unknown:teleporting"))))
    drain(rt, q, max_steps=3)
    job = _job(db, job_id)
    assert job.status == "processing"
    assert job.reconcile_last_error.startswith("UPSTREAM_UNKNOWN_STATUS") and "teleporting" in job.reconcile_last_error


def test_stall_retry_with_a_task_id_never_calls_create(db, simulator, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Phase 4: a redelivered create on a row with a task id resumes polling; no second create."""
    rt, q = make_runtime(db, simulator, tmp_path)
    job_id = _submit(rt, db)
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
    job_id = _submit(rt, db, kind, model, inp)
    lifecycle.create_step(rt, q.creates.popleft())
    q.polls.clear()
    task_id = _job(db, job_id).provider_task_id
    simulator.set_state(task_id, "succeeded")
    with db.begin() as s:
        s.get(Job, job_id).poll_lease_expires_at = rt.now()
    assert lifecycle.resume_chain(rt, job_id)
    drain(rt, q)
    assert _job(db, job_id).status == "completed"
    assert simulator.creates(str(job_id)) == 1


def test_no_task_id_falls_back_to_create_only_when_not_started(db, simulator, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Phase 4 fallback: no id + not_started → normal create; no id + submitting → never."""
    rt, q = make_runtime(db, simulator, tmp_path)
    simulator.script_default(Script(timeline=INSTANT))
    job_id = _submit(rt, db)
    other = _submit(rt, db)
    with db.begin() as s:  # `other` is mid-submission elsewhere (live claim)
        j = s.get(Job, other)
        j.submission_state, j.claim_token = "submitting", "someone"
        j.claim_expires_at = rt.now().replace(year=2099)
    q.creates.clear()
    assert lifecycle.create_step(rt, job_id).action == "accepted"
    assert lifecycle.create_step(rt, other).action == "busy"
    assert simulator.attempts(str(other)) == 0


def test_two_copies_of_one_create_message_create_once(db, simulator, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Two workers running the same create at once: exactly one upstream create."""
    rt, q = make_runtime(db, simulator, tmp_path)
    job_id = _submit(rt, db)
    simulator.script(str(job_id), Script(timeline=FOREVER, latency=0.3))
    barrier = threading.Barrier(2)
    outcomes: list[str] = []

    def run() -> None:
        barrier.wait()
        outcomes.append(lifecycle.create_step(rt, job_id).action)

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # the loser either lost the claim CAS or saw the winner's live claim first
    assert sorted(outcomes)[0] == "accepted" and sorted(outcomes)[1] in ("busy", "lost")
    assert simulator.attempts(str(job_id)) == 1


def test_crash_after_failure_before_refund_settles_exactly_once(db, simulator, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A crash after the failure is recorded: the row is unsettled, then settled once."""
    rt, q = make_runtime(db, simulator, tmp_path)
    job_id = _submit(rt, db)
    simulator.script(str(job_id), Script(create="reject_auth"))

    class Crash(Exception):
        pass

    def crash(point: str) -> None:
        if point == "before_refund":
            raise Crash(point)

    rt.crash_hook = crash
    with pytest.raises(Crash):
        drain(rt, q)
    job = _job(db, job_id)
    assert job.status == "failed" and job.credits_actual is None and job.next_poll_at is not None
    rt.crash_hook = None
    assert lifecycle.settle(rt, job_id) is SettleOutcome.SETTLED
    assert lifecycle.settle(rt, job_id) is SettleOutcome.ALREADY_SETTLED
    job = _job(db, job_id)
    assert job.credits_actual == 0 and job.next_poll_at is None
    with db() as s:
        assert backend().refund_count(job_id) == 1 and audit(s) == []


def test_finalize_race_worker_webhook_and_second_worker(db, simulator, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Three finishers at once: one completion, one commit, one asset row and object per output."""
    rt, q = make_runtime(db, simulator, tmp_path)
    job_id = _submit(rt, db)
    simulator.script(str(job_id), Script(timeline=INSTANT, outputs=3))
    lifecycle.create_step(rt, q.creates.popleft())
    job = _job(db, job_id)
    result = rt.client(rt.kind("kie-standard")).poll(job.provider_task_id)  # type: ignore[union-attr,arg-type]
    barrier = threading.Barrier(3)
    wins: list[bool] = []

    def finish(source: str) -> None:
        barrier.wait()
        wins.append(lifecycle.finalize_job_with_media(rt, job_id, result, source=source))

    threads = [threading.Thread(target=finish, args=(s,)) for s in ("poll", "webhook", "sweep")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(wins) == [False, False, True]
    with db() as s:
        assets = s.execute(select(Asset).where(Asset.job_id == job_id)).scalars().all()
        assert len(assets) == 3 and backend().commit_count(job_id) == 1
        completions = s.execute(select(JobEvent).where(JobEvent.job_id == job_id,
                                                       JobEvent.type == "completed")).scalars().all()
        assert len(completions) == 1
    assert sorted(rt.storage.keys(f"image/{job_id}/")) == sorted(a.storage_key for a in assets)


def _kie_delivery(simulator: Simulator, task_id: str, job_id: uuid.UUID, state: str) -> tuple[dict, bytes, dict]:
    body = json.dumps({"code": 200, "msg": "ok", "data": {
        "taskId": task_id, "state": state,
        "resultJson": json.dumps({"resultUrls": ["https://evil.example/x.png"]})}}).encode()
    headers = sim_signing.kie_headers(simulator.secrets.kie_webhook_hmac_key, task_id,
                                      sim_signing.now_seconds())
    return headers, body, {"job_id": str(job_id)}


def test_forged_kie_success_does_not_complete_a_running_job(db, simulator, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A validly signed KIE callback claiming success: the re-read says running, nothing completes."""
    rt, q = make_runtime(db, simulator, tmp_path)
    job_id = _submit(rt, db)
    simulator.script(str(job_id), Script(timeline=FOREVER))
    lifecycle.create_step(rt, q.creates.popleft())
    task_id = _job(db, job_id).provider_task_id
    headers, body, query = _kie_delivery(simulator, task_id, job_id, "success")
    status, answer = handle_webhook(rt, "kie", headers, body, query)
    assert status == 200 and answer["job_status"] == "processing"
    assert _job(db, job_id).status == "processing"
    # the same delivery again is deduplicated
    assert handle_webhook(rt, "kie", headers, body, query) == (200, {"status": "duplicate"})


def test_webhook_completes_when_the_provider_confirms(db, simulator, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A KIE callback for a task the provider reports done completes the job via the CAS path."""
    rt, q = make_runtime(db, simulator, tmp_path)
    job_id = _submit(rt, db)
    simulator.script(str(job_id), Script(timeline=FOREVER))
    lifecycle.create_step(rt, q.creates.popleft())
    task_id = _job(db, job_id).provider_task_id
    simulator.set_state(task_id, "succeeded")
    headers, body, query = _kie_delivery(simulator, task_id, job_id, "success")
    # the request thread only confirms and enqueues: the media work is a worker's poll
    assert handle_webhook(rt, "kie", headers, body, query) == (202, {"status": "enqueued"})
    assert _job(db, job_id).status == "processing"
    drain(rt, q)
    assert _job(db, job_id).status == "completed"


def test_a_deferred_confirming_read_runs_off_the_request_and_answers_as_inline(  # type: ignore[no-untyped-def]
        db, simulator, tmp_path, monkeypatch) -> None:
    """Issue 25 finding 2: with ``defer``, the request stores the verified delivery and answers
    202 ``confirming`` without reading the provider (a read retried with Retry-After held a
    gateway thread up to ~90 s); the deferred callable does the read and acts as the inline
    path would. Fails on old code: handle_webhook took no ``defer``."""
    from reconcile.db.models import WebhookDelivery

    rt, q = make_runtime(db, simulator, tmp_path)
    job_id = _submit(rt, db)
    simulator.script(str(job_id), Script(timeline=FOREVER))
    lifecycle.create_step(rt, q.creates.popleft())
    task_id = _job(db, job_id).provider_task_id
    client = rt.client(rt.kind("kie-standard"))
    reads: list[str] = []
    real = client.poll
    monkeypatch.setattr(client, "poll", lambda t, **kw: reads.append(t) or real(t, **kw))
    headers, body, query = _kie_delivery(simulator, task_id, job_id, "success")
    deferred: list = []
    assert handle_webhook(rt, "kie", headers, body, query, defer=deferred.append) == \
        (202, {"status": "confirming"})
    assert reads == [] and len(deferred) == 1
    with db() as s:  # stored before anything was deferred: never lost
        assert s.execute(select(WebhookDelivery.upstream_id)).scalar_one() == task_id
    status, answer = deferred[0]()
    assert reads == [task_id]
    assert status == 200 and answer["job_status"] == "processing"


def test_webhook_stream_refuses_a_declared_length_unread_and_cuts_a_chunked_body() -> None:
    """Issue 25 finding 3, the library's helper: a ``Content-Length`` over the cap is refused
    (413) before one chunk is pulled; a body without one is pulled only to the cap + 1 byte.
    Fails on old code: the helpers did not exist (handle_webhook took the whole body)."""
    from reconcile import Settings
    from reconcile.webhook_ingest import BodyRefused, handle_webhook_stream, read_capped

    pulled: list[int] = []

    def endless():  # type: ignore[no-untyped-def]
        while True:
            pulled.append(64 * 1024)
            yield b"x" * (64 * 1024)

    class Rt:
        settings = Settings(webhook_max_body_bytes=1024 * 1024)

    status, answer = handle_webhook_stream(Rt(), "kie", {"Content-Length": str(256 << 20)},  # type: ignore[arg-type]
                                           endless(), {})
    assert (status, answer["error"]["code"]) == (413, "WEBHOOK_INVALID") and pulled == []
    status, answer = handle_webhook_stream(Rt(), "kie", {}, endless(), {})  # type: ignore[arg-type]
    assert (status, answer["error"]["code"]) == (413, "WEBHOOK_INVALID")
    assert sum(pulled) == 1024 * 1024 + 64 * 1024  # the chunk that crossed the cap, no more
    with pytest.raises(BodyRefused) as refused:
        read_capped([b"1"], {"content-length": "1e9"}, 10)
    assert refused.value.response[0] == 400
    assert read_capped([b"ab", b"cd"], {"Content-Length": "4"}, 4) == b"abcd"


def test_bad_webhook_signature_is_rejected_and_stores_nothing(db, simulator, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A wrong signature answers 401 and writes nothing."""
    rt, _ = make_runtime(db, simulator, tmp_path)
    headers, body, query = _kie_delivery(simulator, "task_x", uuid.uuid4(), "success")
    headers = {**headers, "X-Webhook-Signature": "AAAA"}
    assert handle_webhook(rt, "kie", headers, body, query)[0] == 401
    from reconcile.db.models import WebhookDelivery

    with db() as s:
        assert s.execute(select(WebhookDelivery)).first() is None


def test_webhook_for_a_submitting_job_is_kept_as_evidence(db, simulator, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A delivery naming a job still uncertain is stored (evidence), not dropped."""
    rt, q = make_runtime(db, simulator, tmp_path)
    job_id = _submit(rt, db)
    simulator.script(str(job_id), Script(create="drop_after_accept"))
    drain(rt, q)
    task_id = simulator.tasks_for(str(job_id))[0].task_id
    headers, body, query = _kie_delivery(simulator, task_id, job_id, "success")
    assert handle_webhook(rt, "kie", headers, body, query) == (202, {"status": "evidence"})
    from reconcile.db.models import WebhookDelivery

    with db() as s:
        row = s.execute(select(WebhookDelivery)).scalar_one()
        assert row.job_id == job_id and row.upstream_id == task_id


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
    job_id = _submit(rt, db, workflow_execution_id=wid, node_id="X")
    simulator.script(str(job_id), Script(timeline=INSTANT))
    drain(rt, q)
    assert _job(db, job_id).status == "completed"
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
    job_id = _submit(rt, db)
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
    job_id = _submit(rt, db)
    simulator.script(str(job_id), Script(timeline=INSTANT))
    drain(rt, q)
    job = _job(db, job_id)
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


def test_a_request_the_provider_builder_refuses_is_failed_and_refunded(db, simulator, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A model string the fal builder rejects: INVALID_PARAM, rejected, refunded — never stuck."""
    rt, q = make_runtime(db, simulator, tmp_path)
    job_id = _submit(rt, db, "fal-queue", "badmodel")
    drain(rt, q)
    job = _job(db, job_id)
    assert (job.status, job.submission_state, job.error_code, job.credits_actual) == \
        ("failed", "rejected", "INVALID_PARAM", 0)
    assert simulator.attempts(str(job_id)) == 0


def test_a_completion_after_a_local_cancel_is_refused_and_logged(db, simulator, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A cancelled job that later succeeds upstream stays cancelled; an anomaly records it."""
    from reconcile.db.models import CreditAnomaly
    from reconcile.lifecycle.cancel import cancel_job

    rt, q = make_runtime(db, simulator, tmp_path)
    user = uuid.uuid4()
    job_id = _submit(rt, db, user=user)
    simulator.script(str(job_id), Script(timeline=FOREVER))
    lifecycle.create_step(rt, q.creates.popleft())
    cancel_job(rt, user, job_id)
    task_id = _job(db, job_id).provider_task_id
    simulator.set_state(task_id, "succeeded")
    result = rt.client(rt.kind("kie-standard")).poll(task_id)  # type: ignore[union-attr,arg-type]
    assert lifecycle.finalize_job_with_media(rt, job_id, result, source="webhook") is False
    job = _job(db, job_id)
    assert job.status == "cancelled" and job.credits_actual == 0
    with db() as s:
        kinds = [a.kind for a in s.execute(select(CreditAnomaly)).scalars()]
    assert kinds == ["completed_after_cancel"]


def test_replicate_training_gets_its_destination_through_options(db, simulator, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """submit_job(options=…) reaches the client: a training is created with its destination."""
    rt, q = make_runtime(db, simulator, tmp_path)
    simulator.script_default(Script(timeline=INSTANT))
    job_id = _submit(rt, db, "replicate-training", "owner/model:v1", {"steps": 10},
                     options={"destination": "owner/lora"})
    drain(rt, q)
    job = _job(db, job_id)
    assert job.status == "completed", (job.error_code, job.error_message)
    assert simulator.creates(str(job_id)) == 1
