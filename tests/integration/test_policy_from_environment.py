"""The Celery ``reconcile.settle`` task settles with the policy of the environment its worker
runs in (issue 24 section 1): the task's runtime is built from ``Settings()``, and the
`reconcile audit` of an operator with the same environment is clean."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from fractions import Fraction
from pathlib import Path

import pytest
from sqlalchemy.orm import Session, sessionmaker

from reconcile import tasks
from reconcile.settlement import SettlementPolicy
from tests.integration.test_cli import add_job, balance, cli, load, url_of


@pytest.fixture
def worker_env(db: sessionmaker[Session], tmp_path: Path,
               monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A worker process's environment: failures keep half, a cancel keeps two thirds."""
    monkeypatch.setenv("RECONCILE_DATABASE_URL", url_of(db))
    monkeypatch.setenv("RECONCILE_STORAGE_URL", f"file://{tmp_path / 'media'}")
    monkeypatch.setenv("RECONCILE_FAILURE_REFUND", "1/2")
    monkeypatch.setenv("RECONCILE_CANCEL_REFUND", "1/3")
    tasks.reset_runtime()
    yield
    tasks.reset_runtime()


def test_the_settle_task_uses_the_environments_policy(db: sessionmaker[Session],
                                                       worker_env: None) -> None:
    """Three settlements left pending (a crash after the terminal write), each settled by the
    ``reconcile.settle`` task as a worker runs it: an accepted job's failure keeps 20 of 40,
    an accepted job's cancel keeps 26, a job the provider never accepted (no task id) keeps
    nothing. On main the task's runtime used the default policy: it refunded all three."""
    ago = datetime.now(UTC) - timedelta(hours=1)
    pending = {"completed_at": ago, "next_poll_at": ago}
    failed = add_job(db, status="failed", error_code="UPSTREAM_FAILED", **pending)
    cancelled = add_job(db, status="cancelled", error_code="CANCELED", **pending)
    never = add_job(db, status="failed", error_code="UPSTREAM_FAILED", task_id=None,
                    submission="submitting", **pending)
    for job_id, kept in ((failed, 20), (cancelled, 26), (never, 0)):
        assert tasks.settle(str(job_id)) == "settled"
        assert load(db, job_id).credits_actual == kept, job_id
        assert balance(db, job_id) == 1000 - kept
    assert tasks.get_runtime().settlement_policy == SettlementPolicy(
        failure_refund=Fraction(1, 2), cancel_refund=Fraction(1, 3))
    audit = cli(db, "audit")
    assert audit.exit_code == 0 and "ledger clean" in audit.stdout, audit.output


def test_a_worker_runtime_refuses_a_policy_other_than_its_environments(
        worker_env: None) -> None:
    """A process wiring its own runtime (``tasks.set_runtime``) with a policy in code that
    differs from the environment's is refused at start-up, not left to settle differently."""
    from reconcile import Runtime, Settings

    with pytest.raises(ValueError, match="RECONCILE_CANCEL_REFUND"):
        Runtime.from_settings(Settings(), settlement_policy=SettlementPolicy(
            cancel_refund=Fraction(1, 2)))
