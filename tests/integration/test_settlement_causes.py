"""The share of a failed or cancelled job is decided by its cause and whether the provider ever
accepted it (``reconcile.settlement.refund_share``), under the deployment's policy (settings):
issue 24 findings 3 (a raced cancel settles as a cancel) and 13 (never accepted: refunded in
full, whatever the policy)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import update
from sqlalchemy.orm import Session, sessionmaker

from reconcile import Runtime, credits, lifecycle
from reconcile.db.models import CreditBalance, Job
from reconcile.lifecycle.cancel import cancel_job
from reconcile.settlement import SettlementPolicy, kept_of
from reconcile.testing.simulator import Script, Simulator
from tests.integration.harness import Clock, fund, make_runtime

T0 = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)
RUNNING = ((0.0, "queued"), (3600.0, "succeeded"))
FAILED = ((0.0, "queued"), (0.0, "failed"))
# a partial policy set as deployment configuration: failures keep half, a cancel keeps 2/3
POLICY = {"failure_refund": "1/2", "cancel_refund": "1/3"}
CANCEL_KEEPS = kept_of(40, Fraction(1, 3))  # 26 of 40
FAILURE_KEEPS = kept_of(40, Fraction(1, 2))  # 20 of 40


class Killed(BaseException):
    """The cancelling process dies (a BaseException: nothing catches it)."""


@pytest.fixture
def rt(db: sessionmaker[Session], simulator: Simulator, tmp_path: Path) -> Runtime:
    runtime, _ = make_runtime(db, simulator, tmp_path, clock=Clock(T0), **POLICY)
    wanted = SettlementPolicy(failure_refund=Fraction(1, 2), cancel_refund=Fraction(1, 3))
    if runtime.settlement_policy != wanted:  # a library that ignores the settings' policy:
        runtime.settlement_policy = wanted  # give it the same one, to compare the rules alone
    return runtime


def _job(db: sessionmaker[Session], job_id: uuid.UUID) -> Job:
    with db() as s:
        job = s.get(Job, job_id)
        assert job is not None
        return job


def _balance(db: sessionmaker[Session], user: uuid.UUID) -> int:
    with db() as s:
        row = s.get(CreditBalance, user)
        return 0 if row is None else row.sub + row.topup


def _clean(rt: Runtime) -> None:
    with rt.sessions() as s:
        assert credits.audit(s, now=T0, settings=rt.settings) == []


def _submit(rt: Runtime, db: sessionmaker[Session], kind: str = "replicate-prediction",
            model: str = "acme/flux") -> tuple[uuid.UUID, uuid.UUID]:
    user = uuid.uuid4()
    fund(db, user)
    job_id = lifecycle.submit_job(rt, user, kind, model, {"prompt": "a cat"}, 40,
                                  job_type="image").job_id
    return user, job_id


@pytest.mark.parametrize("cancel_survives", [True, False])
def test_a_cancel_whose_upstream_cancel_a_poll_reads_first_settles_as_a_cancel(
        rt: Runtime, db: sessionmaker[Session], simulator: Simulator,
        monkeypatch: pytest.MonkeyPatch, cancel_survives: bool) -> None:
    """Finding 3. The user cancels an accepted job; between the provider's cancel and the
    cancel's own write, a poll reads ``canceled`` and fails the job ``UPSTREAM_FAILED``, which
    settles it at once. The user's cancel is settled as a cancel (1/3 back: 26 of 40 kept),
    whether the cancel then relabels the row or its process dies first. On main the poll's
    settlement used the failure share (20 kept) and the cancel only relabelled the row."""
    simulator.script_default(Script(timeline=RUNNING))
    user, job_id = _submit(rt, db)
    assert lifecycle.create_step(rt, job_id).action == "accepted"
    kind = rt.kind("replicate-prediction")
    client = rt.client(kind)
    real_cancel = client.cancel

    def cancel_then_a_poll_reads_it(task_id: str, **kwargs: Any) -> bool:
        done = real_cancel(task_id, **kwargs)
        assert lifecycle.observe(rt, _job(db, job_id), kind, via="poll") == "failed"
        if not cancel_survives:
            raise Killed("the cancelling process died after the provider's cancel")
        return done

    monkeypatch.setattr(client, "cancel", cancel_then_a_poll_reads_it)
    if cancel_survives:
        assert cancel_job(rt, user, job_id).status == "cancelled"
    else:
        with pytest.raises(Killed):
            cancel_job(rt, user, job_id)
    job = _job(db, job_id)
    assert job.status == ("cancelled" if cancel_survives else "failed")
    assert job.credits_actual == CANCEL_KEEPS == 26
    assert _balance(db, user) == 1000 - CANCEL_KEEPS
    _clean(rt)


def test_a_failure_of_an_accepted_job_keeps_the_failure_share(
        rt: Runtime, db: sessionmaker[Session], simulator: Simulator) -> None:
    """The control: the provider accepted the job and reported it failed, no cancel asked:
    the failure share applies (half kept)."""
    simulator.script_default(Script(timeline=FAILED))
    user, job_id = _submit(rt, db)
    assert lifecycle.create_step(rt, job_id).action == "accepted"
    assert lifecycle.observe(rt, _job(db, job_id), rt.kind("replicate-prediction"),
                             via="poll") == "failed"
    assert _job(db, job_id).credits_actual == FAILURE_KEEPS == 20
    assert _balance(db, user) == 1000 - FAILURE_KEEPS
    _clean(rt)


def test_a_create_the_provider_rejected_is_refunded_in_full(
        rt: Runtime, db: sessionmaker[Session], simulator: Simulator) -> None:
    """Finding 13: the provider refused the create (400): the job never reached an accepted
    task, so everything goes back, although failures keep half. On main it kept 20."""
    simulator.script_default(Script(create="reject_invalid"))
    user, job_id = _submit(rt, db)
    assert lifecycle.create_step(rt, job_id).action == "rejected"
    job = _job(db, job_id)
    assert (job.status, job.submission_state, job.credits_actual) == ("failed", "rejected", 0)
    assert _balance(db, user) == 1000
    _clean(rt)


def test_a_job_resolved_as_not_submitted_is_refunded_in_full(
        rt: Runtime, db: sessionmaker[Session]) -> None:
    """Finding 13: an uncertain submission an operator resolves as never created upstream is
    refunded in full under a partial failure policy. On main it kept 20."""
    user, job_id = _submit(rt, db)
    with db.begin() as s:
        s.execute(update(Job).where(Job.id == job_id).values(
            submission_state="uncertain", claim_token=None, claim_expires_at=None))
    assert lifecycle.resolve_not_submitted(rt, job_id)
    job = _job(db, job_id)
    assert (job.status, job.submission_state, job.credits_actual) == ("failed", "rejected", 0)
    assert _balance(db, user) == 1000
    _clean(rt)


def test_a_cancel_before_the_create_is_refunded_in_full(
        rt: Runtime, db: sessionmaker[Session]) -> None:
    """A job cancelled before its create ran never reached the provider: all 40 back, although
    a cancel keeps 2/3 of an accepted job."""
    user, job_id = _submit(rt, db)
    assert cancel_job(rt, user, job_id).credits_actual == 0
    assert _balance(db, user) == 1000
    _clean(rt)


def test_prune_keeps_a_cancel_request_while_its_job_is_unsettled(
        rt: Runtime, db: sessionmaker[Session], simulator: Simulator,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The settlement reads the user's cancel request: `reconcile prune` never deletes it while
    the job's settlement is pending (the ledger refused it, say), and does once it is settled."""
    from datetime import timedelta

    from sqlalchemy import select

    from reconcile.db.models import JobEvent
    from reconcile.jobstore.retention import prune

    simulator.script_default(Script(timeline=RUNNING))
    user, job_id = _submit(rt, db)
    assert lifecycle.create_step(rt, job_id).action == "accepted"
    with db.begin() as s:  # the cancel asked, then its process died; the poll failed the job
        s.add(JobEvent(event_id=str(uuid.uuid4()), job_id=job_id, user_id=user,
                       type="cancel_requested", payload={}, created_at=T0, published_at=T0))
        s.execute(update(Job).where(Job.id == job_id).values(
            status="failed", error_code="UPSTREAM_FAILED", completed_at=T0, next_poll_at=T0))
    later = T0 + timedelta(days=30)

    def types() -> list[str]:
        with db() as s:
            return list(s.execute(select(JobEvent.type).where(JobEvent.job_id == job_id)
                                  .order_by(JobEvent.id)).scalars())

    prune(db, now=later, events=timedelta(days=1), deliveries=None)
    assert types() == ["cancel_requested"]
    assert lifecycle.settle(rt, job_id).value == "settled"
    assert _job(db, job_id).credits_actual == CANCEL_KEEPS
    prune(db, now=later, events=timedelta(days=1), deliveries=None)
    assert types() == []


class _Boom(Exception):
    pass


@pytest.mark.parametrize(("outcome", "kept"), [
    ("provider_error", 0),  # the provider refused the call (a non-2xx): never accepted
    ("raised", 0),  # the block raised: no answer on record, the user's side of the doubt
    ("no_result", FAILURE_KEEPS),  # the call returned with nothing usable: answered (2xx)
])
def test_a_sync_calls_failure_keeps_the_failure_share_only_once_the_provider_answered(
        rt: Runtime, db: sessionmaker[Session], outcome: str, kept: int) -> None:
    """The sync path's "accepted": only a failure written after the call returned an answer
    keeps the failure share; a provider error or a raising block is refunded in full."""
    from reconcile import sync_call
    from reconcile.errors import SyncCallFailed

    user, job_id = _submit(rt, db, "anthropic-sync", "claude-sonnet-4-5")
    with pytest.raises((SyncCallFailed, _Boom)) if outcome != "no_result" else _nothing():
        with sync_call(rt, job_id) as call:
            if outcome == "provider_error":
                raise SyncCallFailed("upstream 500", status=500)
            if outcome == "raised":
                raise _Boom("the platform's own code failed")
            call.result = None
    job = _job(db, job_id)
    assert job.status == "failed" and job.credits_actual == kept, job.error_code
    assert _balance(db, user) == 1000 - kept
    _clean(rt)


def _nothing() -> Any:
    from contextlib import nullcontext

    return nullcontext()
