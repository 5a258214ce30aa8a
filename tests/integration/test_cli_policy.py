"""The `reconcile` command settles and audits with the deployment's settlement policy, set only
in the environment (issue 24 finding 5): ``RECONCILE_FAILURE_REFUND`` /
``RECONCILE_CANCEL_REFUND``."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy.orm import Session, sessionmaker

from reconcile import credits
from tests.integration.test_cli import add_job, balance, cli, load, refunds


@pytest.fixture(autouse=True)
def half_policy(monkeypatch: pytest.MonkeyPatch) -> None:
    """Failures and cancels keep half: the platform's configuration, in the environment only."""
    monkeypatch.setenv("RECONCILE_FAILURE_REFUND", "1/2")
    monkeypatch.setenv("RECONCILE_CANCEL_REFUND", "0.5")


def test_sweep_finishes_an_interrupted_cancel_settlement_with_the_configured_fee(
        db: sessionmaker[Session]) -> None:
    """A cancel whose settlement was interrupted (cancelled, ``credits_actual`` NULL, the retry
    due) is settled by `reconcile sweep`: it keeps the platform's 20 of 40 and `reconcile
    audit` is clean. On main the command used the default policy: it refunded all 40."""
    long_ago = datetime.now(UTC) - timedelta(hours=1)
    job_id = add_job(db, status="cancelled", error_code="CANCELED", completed_at=long_ago,
                     next_poll_at=long_ago)
    result = cli(db, "sweep")
    assert result.exit_code == 0, result.output
    job = load(db, job_id)
    assert job.credits_actual == 20 and job.next_poll_at is None
    assert balance(db, job_id) == 1000 - 20 and refunds(db, job_id) == []
    audit = cli(db, "audit")
    assert audit.exit_code == 0 and "ledger clean" in audit.stdout, audit.output


def test_audit_judges_a_commit_without_a_record_by_the_configured_policy(
        db: sessionmaker[Session]) -> None:
    """A cancel settled before the record existed (half kept, no record) is what the
    configured policy keeps: `reconcile audit` exits 0. On main it judged it by the default
    policy (everything refunded) and exited 1 with ``failed_job_committed``."""
    job_id = add_job(db, status="cancelled", error_code="CANCELED",
                     completed_at=datetime.now(UTC) - timedelta(hours=1), credits_actual=20)
    with db.begin() as s:
        assert credits.commit(s, job_id, 20)  # no record: the policy path of the audit
    result = cli(db, "audit", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == []


def test_fail_keeps_the_failure_share_of_an_accepted_job(db: sessionmaker[Session]) -> None:
    """`reconcile fail` on a job the provider accepted (its task id): the operator's failure
    keeps the configured half."""
    job_id = add_job(db)
    result = cli(db, "fail", str(job_id), "--reason", "stuck")
    assert result.exit_code == 0, result.output
    assert load(db, job_id).credits_actual == 20 and balance(db, job_id) == 1000 - 20
    assert cli(db, "audit").exit_code == 0


def test_resolve_not_submitted_refunds_everything_whatever_the_policy(
        db: sessionmaker[Session]) -> None:
    """Finding 13 through the command: `reconcile resolve --not-submitted` established that
    nothing was created upstream, so all 40 go back although failures keep half."""
    job_id = add_job(db, status="pending", submission="uncertain", task_id=None)
    result = cli(db, "resolve", str(job_id), "--not-submitted")
    assert result.exit_code == 0, result.output
    assert "refunded 40 credits" in result.stdout
    assert load(db, job_id).credits_actual == 0 and balance(db, job_id) == 1000
    assert cli(db, "audit").exit_code == 0
