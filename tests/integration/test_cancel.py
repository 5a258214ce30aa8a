"""User cancel (README, Design notes: Cancel) against real PostgreSQL and the provider simulator."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import delete, select, update
from sqlalchemy.orm import Session, sessionmaker

from reconcile import Runtime, jobstore, lifecycle
from reconcile.db.models import Asset, Job, JobEvent
from reconcile.errors import Conflict, ErrorCode, JobNotFound
from reconcile.ledger import audit as library_audit
from reconcile.lifecycle.cancel import cancel_job
from reconcile.providers import Output, PollResult, PollStatus
from reconcile.states import CREATE_CLAIM_LEASE
from reconcile.testing.simulator import Script, Simulator
from tests.integration.harness import (
    Clock,
    Queues,
    audit,
    backend,
    drain,
    fund,
    ledger_backend,
    make_runtime,
    use_policy,
)
from tests.integration.ledgers import (
    BACKENDS,
    Backend,
    assert_builtin_ledger_untouched,
    make_backend,
)

T0 = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)
RUNNING = ((0.0, "queued"), (3600.0, "succeeded"))
INSTANT = ((0.0, "queued"), (0.0, "succeeded"))


@pytest.fixture
def env(db: sessionmaker[Session], simulator: Simulator,
        tmp_path: Path) -> tuple[Runtime, Queues, Clock]:
    clock = Clock(T0)
    rt, queues = make_runtime(db, simulator, tmp_path, clock=clock)
    return rt, queues, clock


@pytest.fixture(autouse=True, params=BACKENDS)
def ledger(request: pytest.FixtureRequest, db: sessionmaker[Session]) -> Iterator[Backend]:
    """Every cancel test runs on both ledger backends (built-in; platform user_credits)."""
    with ledger_backend(make_backend(request.param, db)) as current:
        yield current
    if current.name == "platform":
        assert_builtin_ledger_untouched(db)


def balance(db: sessionmaker[Session], user: uuid.UUID) -> int:
    current = backend()
    assert current is not None
    return current.total(user)


def load(db: sessionmaker[Session], job_id: uuid.UUID) -> Job:
    with db() as s:
        job = s.get(Job, job_id)
        assert job is not None
        return job


def refunds(db: sessionmaker[Session], job_id: uuid.UUID) -> int:
    current = backend()
    assert current is not None
    return current.refund_count(job_id)


def submit(rt: Runtime, user: uuid.UUID, kind: str = "kie-standard",
           model: str = "seedream/4.5-edit", credits_: int = 40) -> uuid.UUID:
    return lifecycle.submit_job(rt, user, kind, model, {"prompt": "a cat"}, credits_,
                                job_type="image").job_id


def assert_cancelled_and_refunded(db: sessionmaker[Session], job_id: uuid.UUID,
                                  user: uuid.UUID) -> Job:
    job = load(db, job_id)
    assert (job.status, job.error_code, job.credits_actual, job.next_poll_at) == \
        ("cancelled", "CANCELED", 0, None)
    assert refunds(db, job_id) == 1
    assert balance(db, user) == 1000
    with db() as s:
        assert audit(s, now=T0) == []
    return job


def test_cancel_before_the_claim_means_the_create_never_happens(env, db, simulator) -> None:
    """not_started → cancelled + refunded; the queued create then loses its claim upstream-free."""
    rt, queues, _ = env
    user = uuid.uuid4()
    fund(db, user)
    job_id = submit(rt, user)
    assert list(queues.creates) == [job_id]
    cancelled = cancel_job(rt, user, job_id)
    assert (cancelled.id, cancelled.status) == (job_id, "cancelled")
    drain(rt, queues)  # the worker runs the create it was given
    assert simulator.creates(str(job_id)) == 0
    assert simulator.attempts(str(job_id)) == 0
    job = assert_cancelled_and_refunded(db, job_id, user)
    assert job.submission_state == "not_started" and job.provider_call_started_at is None


def test_a_claim_that_lands_first_makes_the_cancel_a_409(env, db) -> None:
    """Race: the create claim's transaction holds the row; the cancel's CAS waits, re-checks
    ``not_started``, loses, re-reads ``submitting`` and answers 409 — exactly one wins."""
    rt, _, clock = env
    user = uuid.uuid4()
    fund(db, user)
    job_id = submit(rt, user)
    outcome: dict[str, Any] = {}

    def user_cancels() -> None:
        try:
            outcome["job"] = cancel_job(rt, user, job_id)
        except Conflict as exc:
            outcome["conflict"] = exc.code

    with db.begin() as claim_session:
        assert jobstore.claim_create(claim_session, job_id, "worker", clock.now,
                                     CREATE_CLAIM_LEASE) is not None
        canceller = threading.Thread(target=user_cancels)
        canceller.start()
        time.sleep(0.3)  # the cancel is now blocked on the claim's row lock
    canceller.join(10)
    assert outcome == {"conflict": ErrorCode.SUBMISSION_RECONCILIATION_REQUIRED}
    job = load(db, job_id)
    assert (job.status, job.submission_state) == ("pending", "submitting")
    assert balance(db, user) == 960


def test_a_cancel_that_lands_first_makes_the_claim_lose(env, db, simulator) -> None:
    """Race, the other way: the cancel commits first; the create step's claim finds nothing."""
    rt, _, _ = env
    user = uuid.uuid4()
    fund(db, user)
    job_id = submit(rt, user)
    results: list[lifecycle.CreateOutcome] = []
    with db.begin() as cancel_session:  # the cancel CAS, holding the row until commit
        assert jobstore.mark_failed(cancel_session, job_id, now=T0, code="CANCELED",
                                    message="Canceled by the user.", detail=None,
                                    where=(Job.submission_state == "not_started",),
                                    status="cancelled") is not None
        worker = threading.Thread(target=lambda: results.append(lifecycle.create_step(rt, job_id)))
        worker.start()
        time.sleep(0.3)
    worker.join(10)
    assert [r.action for r in results] == ["lost"]
    assert simulator.attempts(str(job_id)) == 0


def _platform_row(db: sessionmaker[Session], user: uuid.UUID, **columns: Any) -> uuid.UUID:
    job_id = uuid.uuid4()
    with db.begin() as s:
        s.add(Job(**{"id": job_id, "user_id": user, "job_type": "image", "status": "pending",
                     "created_at": T0, **columns}))
        s.flush()
        backend().ledger.reserve(s, user, job_id, 40, now=T0)  # type: ignore[union-attr]
    return job_id


def test_platform_row_without_a_provider_call_cancels_with_a_refund(env, db) -> None:
    """submission_state NULL and no provider call started: cancelled + refunded."""
    rt, _, _ = env
    user = uuid.uuid4()
    fund(db, user)
    job_id = _platform_row(db, user)
    cancel_job(rt, user, job_id)
    assert_cancelled_and_refunded(db, job_id, user)


@pytest.mark.parametrize("trace", [{"provider_call_started_at": T0},
                                   {"provider_task_id": "task-from-the-platform"}])
def test_platform_row_with_a_provider_call_started_is_409(env, db, trace: dict[str, Any]) -> None:
    """submission_state NULL but the provider was called: the outcome is unknown → 409."""
    rt, _, _ = env
    user = uuid.uuid4()
    fund(db, user)
    job_id = _platform_row(db, user, provider_kind="kie-standard", **trace)
    with pytest.raises(Conflict) as caught:
        cancel_job(rt, user, job_id)
    assert caught.value.code == ErrorCode.SUBMISSION_RECONCILIATION_REQUIRED
    assert load(db, job_id).status == "pending" and balance(db, user) == 960


def test_accepted_without_its_task_id_is_409(env, db) -> None:
    """accepted but the upstream handle is missing: the outcome cannot be reconciled → 409."""
    rt, _, _ = env
    user = uuid.uuid4()
    fund(db, user)
    job_id = _platform_row(db, user, status="processing", provider_kind="kie-standard",
                           submission_state="accepted", provider_call_started_at=T0)
    with pytest.raises(Conflict) as caught:
        cancel_job(rt, user, job_id)
    assert caught.value.code == ErrorCode.SUBMISSION_RECONCILIATION_REQUIRED
    assert load(db, job_id).status == "processing" and balance(db, user) == 960


@pytest.mark.parametrize("kind, model", [("replicate-prediction", "acme/flux"),
                                         ("fal-queue", "fal-ai/flux/dev")])
def test_accepted_job_is_cancelled_upstream_too(env, db, simulator, kind: str, model: str) -> None:
    """Replicate and fal have a cancel endpoint: it is called, then cancelled + refunded."""
    rt, queues, _ = env
    user = uuid.uuid4()
    fund(db, user)
    simulator.script_default(Script(timeline=RUNNING))
    job_id = submit(rt, user, kind, model)
    assert lifecycle.create_step(rt, job_id).action == "accepted"
    task_id = load(db, job_id).provider_task_id
    assert task_id and simulator.state_of(task_id) != "canceled"
    cancel_job(rt, user, job_id)
    assert simulator.state_of(task_id) == "canceled"
    job = assert_cancelled_and_refunded(db, job_id, user)
    assert job.error_detail["upstream_cancel"] == "requested"
    drain(rt, queues)  # the poll chain is fenced off: the job stays cancelled
    assert load(db, job_id).status == "cancelled"


@pytest.mark.parametrize("kind, model", [("replicate-prediction", "acme/flux"),
                                         ("fal-queue", "fal-ai/flux/dev")])
def test_a_poll_that_reads_our_upstream_cancel_first_still_ends_cancelled(
        env, db, simulator, monkeypatch, kind: str, model: str) -> None:
    """The explorer's running:poll/cancel hole: between the provider's cancel and the cancel's
    CAS, a poll reads ``canceled`` and fails the job UPSTREAM_FAILED (refunded). The user's
    cancel is still a cancel: 200 with the cancelled row, one refund, no 409."""
    rt, _, _ = env
    user = uuid.uuid4()
    fund(db, user)
    simulator.script_default(Script(timeline=RUNNING))
    job_id = submit(rt, user, kind, model)
    assert lifecycle.create_step(rt, job_id).action == "accepted"
    client = rt.client(rt.kind(kind))
    real_cancel = client.cancel

    def cancel_then_a_poll_reads_it(task_id: str, **kwargs: Any) -> bool:
        done = real_cancel(task_id, **kwargs)
        job = load(db, job_id)
        assert lifecycle.observe(rt, job, rt.kind(kind), via="poll") == "failed"
        assert load(db, job_id).error_code == "UPSTREAM_FAILED"
        return done

    monkeypatch.setattr(client, "cancel", cancel_then_a_poll_reads_it)
    returned = cancel_job(rt, user, job_id)
    assert (returned.status, returned.error_code) == ("cancelled", "CANCELED")
    job = assert_cancelled_and_refunded(db, job_id, user)
    assert job.error_detail["upstream_cancel"] == "requested"
    with db() as s:
        types = [e.type for e in s.execute(select(JobEvent).where(JobEvent.job_id == job_id)
                                           .order_by(JobEvent.id)).scalars()]
    assert types[-2:] == ["failed", "canceled"]


def test_upstream_cancel_errors_are_ignored(env, db, simulator, monkeypatch, caplog) -> None:
    """The provider's cancel raising does not stop the local cancel (it is logged)."""
    rt, _, _ = env
    user = uuid.uuid4()
    fund(db, user)
    simulator.script_default(Script(timeline=RUNNING))
    job_id = submit(rt, user, "replicate-prediction", "acme/flux")
    lifecycle.create_step(rt, job_id)
    client = rt.client(rt.kind("replicate-prediction"))

    def broken(*args: Any, **kwargs: Any) -> bool:
        raise RuntimeError("provider exploded")

    monkeypatch.setattr(client, "cancel", broken)
    cancel_job(rt, user, job_id)
    job = assert_cancelled_and_refunded(db, job_id, user)
    assert job.error_detail["upstream_cancel"] == "error"
    assert "upstream_cancel_failed" in caplog.text


def test_kie_job_cancels_locally_and_a_late_success_is_refused(env, db, simulator) -> None:
    """KIE has no cancel endpoint: cancelled + refunded locally; the task still succeeds
    upstream, and neither a poll nor a direct finalize can complete or charge the job."""
    rt, queues, _ = env
    user = uuid.uuid4()
    fund(db, user)
    simulator.script_default(Script(timeline=INSTANT))
    job_id = submit(rt, user)
    assert lifecycle.create_step(rt, job_id).action == "accepted"
    stale = load(db, job_id)
    cancel_job(rt, user, job_id)
    assert simulator.state_of(stale.provider_task_id) == "succeeded"  # not cancelled upstream
    job = assert_cancelled_and_refunded(db, job_id, user)
    assert job.error_detail["upstream_cancel"] == "unconfirmed"

    drain(rt, queues)  # the poll chain: fenced, no provider read acts on the job
    success = PollResult(PollStatus.SUCCEEDED, outputs=(Output(data=b"png", media_type="image/png"),))
    assert lifecycle.finalize_job_with_media(rt, job_id, success, source="webhook") is False
    kind = rt.kind("kie-standard")
    assert lifecycle.observe(rt, stale, kind, via="webhook", result=success) == "lost"
    assert_cancelled_and_refunded(db, job_id, user)
    with db() as s:
        assert s.execute(select(Asset).where(Asset.job_id == job_id)).first() is None
    assert rt.storage.keys() == []


def test_terminal_jobs_are_not_cancelable(env, db, simulator) -> None:
    """Completed, failed or already cancelled: 409 JOB_NOT_CANCELABLE, the ledger untouched."""
    rt, queues, _ = env
    user = uuid.uuid4()
    fund(db, user)
    simulator.script_default(Script(timeline=INSTANT))
    done = submit(rt, user)
    drain(rt, queues)
    assert load(db, done).status == "completed"
    cancelled = submit(rt, user)
    cancel_job(rt, user, cancelled)
    for job_id in (done, cancelled):
        with pytest.raises(Conflict) as caught:
            cancel_job(rt, user, job_id)
        assert caught.value.code == ErrorCode.JOB_NOT_CANCELABLE
    assert refunds(db, cancelled) == 1 and refunds(db, done) == 0
    assert balance(db, user) == 960


def test_another_users_job_is_not_found(env, db) -> None:
    """Scoped to the owner: another user's cancel is JobNotFound and changes nothing."""
    rt, _, _ = env
    user = uuid.uuid4()
    fund(db, user)
    job_id = submit(rt, user)
    with pytest.raises(JobNotFound):
        cancel_job(rt, uuid.uuid4(), job_id)
    with pytest.raises(JobNotFound):
        cancel_job(rt, user, uuid.uuid4())
    assert load(db, job_id).status == "pending"


def test_a_half_cancel_refund_policy_is_executed_by_the_ledger(env, db) -> None:
    """``Runtime.settlement_policy`` with a 50 % cancel refund (reconcile.settlement): the
    cancel keeps 20 of the 40 held (a commit for less: no refund row), releases 20, records
    credits_actual 20; the pools balance. The audit, given the runtime's policy, is clean: the
    cancelled job's commit is exactly the share the policy keeps."""
    from fractions import Fraction

    from reconcile.settlement import SettlementPolicy, SettleOutcome

    rt, _, _ = env
    use_policy(rt, SettlementPolicy(cancel_refund=Fraction(1, 2)))
    user = uuid.uuid4()
    fund(db, user)
    job_id = submit(rt, user)
    # accepted upstream (a task id): the policy's share applies (a job the provider never
    # accepted is refunded in full, whatever the policy)
    assert lifecycle.create_step(rt, job_id).action == "accepted"
    cancelled = cancel_job(rt, user, job_id)
    assert (cancelled.status, cancelled.credits_actual, cancelled.next_poll_at) == \
        ("cancelled", 20, None)
    assert refunds(db, job_id) == 0
    assert balance(db, user) == 1000 - 20
    assert lifecycle.settle(rt, job_id) is SettleOutcome.ALREADY_SETTLED
    assert balance(db, user) == 1000 - 20
    with db() as s:
        found = library_audit(rt.ledger, s, now=T0, policy=rt.settlement_policy)
    assert found == []


def test_the_audit_flags_a_cancelled_commit_the_policy_does_not_keep(env, db) -> None:
    """A cancel settled under a 25 % refund keeps 30 of 40, and the built-in ledger records the
    decision with its commit (share 1/4, kept 30): the audit is clean under that policy, under
    the 50 % one and under the default — a policy change does not flag it. Without the record
    (a job settled before the library wrote one) the audit judges by the policy it is given: under
    the 50 % policy (which keeps 20) and under the default (which refunds all: any commit) the
    built-in audit flags ``failed_job_committed``, and nothing else. A failed job under a
    cancel-only policy still may not commit anything without a record (its share is still 1)."""
    from fractions import Fraction

    from reconcile.db.models import UsageLog
    from reconcile.settlement import DEFAULT_POLICY, SettlementPolicy

    rt, _, _ = env
    quarter = SettlementPolicy(cancel_refund=Fraction(1, 4))
    half = SettlementPolicy(cancel_refund=Fraction(1, 2))
    use_policy(rt, quarter)
    user = uuid.uuid4()
    fund(db, user)
    job_id = submit(rt, user)
    # accepted upstream (a task id): the policy's share applies (a job the provider never
    # accepted is refunded in full, whatever the policy)
    assert lifecycle.create_step(rt, job_id).action == "accepted"
    assert cancel_job(rt, user, job_id).credits_actual == 30
    assert balance(db, user) == 1000 - 30

    def findings(policy: SettlementPolicy | None) -> list[tuple[str, uuid.UUID | None, str]]:
        with db() as s:
            found = library_audit(rt.ledger, s, now=T0, policy=policy)
        return [(d.kind, d.job_id, d.detail) for d in found]

    builtin = backend().name == "builtin"  # the platform's audit does not check job statuses
    for policy in (quarter, half, DEFAULT_POLICY, None):
        assert findings(policy) == [], policy
    # the record removed: what a job settled before the record existed looks like
    with db.begin() as s:
        log = s.execute(select(UsageLog).where(UsageLog.job_id == job_id)).scalar_one()
        assert ("settlement" in log.metadata_) is builtin
        s.execute(update(UsageLog).where(UsageLog.id == log.id).values(
            metadata_={k: v for k, v in log.metadata_.items() if k != "settlement"}))
    assert findings(quarter) == []
    assert findings(half) == ([("failed_job_committed", job_id, "job cancelled, reservation "
                                "committed 30 (the settlement policy keeps 20 of 40)")]
                              if builtin else [])
    flagged = [("failed_job_committed", job_id, "job cancelled, reservation committed")]
    assert findings(DEFAULT_POLICY) == (flagged if builtin else [])
    assert findings(None) == (flagged if builtin else [])
    # the same commit on a failed job the user never asked to cancel: the policy refunds
    # failures in full (with its cancel request, a failure settles as the user's cancel)
    with db.begin() as s:
        s.execute(update(Job).where(Job.id == job_id).values(status="failed",
                                                              error_code="UPSTREAM_FAILED"))
        s.execute(delete(JobEvent).where(JobEvent.job_id == job_id,
                                         JobEvent.type == "cancel_requested"))
    assert findings(quarter) == ([("failed_job_committed", job_id,
                                   "job failed, reservation committed")] if builtin else [])
