"""Issue 24: the audit checks the job row against the ledger, where a platform may change it
under the library (each class on PostgreSQL and on the embedded SQLite default): a terminal
status moved back, a rewritten ``jobs.user_id``, a usage log naming another user."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import update
from sqlalchemy.orm import Session, sessionmaker

from reconcile import credits
from reconcile.db.models import Job, UsageLog

NOW = datetime.now(UTC)
OLD = NOW - timedelta(hours=1)


@pytest.fixture
def factory(pg_and_sqlite: sessionmaker[Session]) -> sessionmaker[Session]:
    return pg_and_sqlite  # PostgreSQL, then SQLite (tests/integration/conftest.py)


def _job(factory: sessionmaker[Session], *, settle: str | None = "commit",
         at: datetime = OLD) -> tuple[uuid.UUID, uuid.UUID]:
    """A job of a user granted 100 that reserved 40, completed (committed) or failed
    (refunded) at ``at``; ``settle=None``: still processing and reserved."""
    user, job = uuid.uuid4(), uuid.uuid4()
    status = {"commit": "completed", "refund": "failed", None: "processing"}[settle]
    with factory.begin() as s:
        credits.grant(s, user, "sub", 100, f"g-{user}", now=at)
        s.add(Job(id=job, user_id=user, job_type="image", status=status, created_at=at,
                  completed_at=at if settle else None,
                  credits_actual={"commit": 40, "refund": 0, None: None}[settle]))
        s.flush()
        credits.reserve(s, user, job, 40, now=at)
        if settle == "commit":
            credits.commit(s, job, now=at)
        elif settle == "refund":
            credits.refund(s, job, now=at)
    return user, job


def _found(factory: sessionmaker[Session]) -> list[tuple[str, uuid.UUID | None, uuid.UUID | None]]:
    with factory() as s:
        return [(d.kind, d.user_id, d.job_id) for d in credits.audit(s, now=NOW)]


def _clean_first(factory: sessionmaker[Session]) -> None:
    """A healthy neighbour of every kind; the ledger audits clean before the corruption."""
    for settle in ("commit", "refund", None):
        _job(factory, settle=settle)
    assert _found(factory) == []


@pytest.mark.parametrize("settle", ["commit", "refund"])
def test_a_terminal_job_moved_back_in_flight_is_reported(factory: sessionmaker[Session],
                                                         settle: str) -> None:
    """A completed (committed) or failed (refunded) job set back to `processing` by the platform:
    `settled_job_in_flight` (the audit was clean: its in-flight horizon needs a kind, and the
    per-job identity still balances)."""
    _clean_first(factory)
    user, job = _job(factory, settle=settle)
    with factory.begin() as s:
        s.execute(update(Job).where(Job.id == job).values(status="processing", completed_at=None))
    assert _found(factory) == [("settled_job_in_flight", user, job)]


def test_a_job_settled_within_the_grace_is_not_yet_reported(factory: sessionmaker[Session]) -> None:
    """A platform that settles first and writes the status in a later transaction is not
    flagged within the grace."""
    _, job = _job(factory, settle="commit", at=NOW - timedelta(minutes=1))
    with factory.begin() as s:
        s.execute(update(Job).where(Job.id == job).values(status="processing"))
    assert _found(factory) == []


@pytest.mark.parametrize("settle", ["commit", None])
def test_a_rewritten_job_user_is_reported(factory: sessionmaker[Session],
                                          settle: str | None) -> None:
    """`jobs.user_id` rewritten to another user: `job_user_mismatch` (the user its USAGE row
    charged), settled or still reserved; the usage log still agrees with the ledger."""
    _clean_first(factory)
    user, job = _job(factory, settle=settle)
    with factory.begin() as s:
        s.execute(update(Job).where(Job.id == job).values(user_id=uuid.uuid4()))
    assert _found(factory) == [("job_user_mismatch", user, job)]


@pytest.mark.parametrize("settle", ["commit", None])
def test_a_usage_log_naming_another_user_is_reported(factory: sessionmaker[Session],
                                                     settle: str | None) -> None:
    """`usage_logs.user_id` rewritten: `usage_log_user_mismatch` before any settlement pays it
    to the wrong user (the audit was clean: it found it only after such a refund)."""
    _clean_first(factory)
    user, job = _job(factory, settle=settle)
    with factory.begin() as s:
        s.execute(update(UsageLog).where(UsageLog.job_id == job).values(user_id=uuid.uuid4()))
    assert ("usage_log_user_mismatch", user, job) in _found(factory)
    assert {kind for kind, _, _ in _found(factory)} == {"usage_log_user_mismatch"}


def test_a_platform_usage_log_without_a_usage_row_is_checked_against_its_job(
        factory: sessionmaker[Session]) -> None:
    """A platform's own reserved log (no USAGE row yet) naming another user than its job."""
    user, job = uuid.uuid4(), uuid.uuid4()
    with factory.begin() as s:
        s.add(Job(id=job, user_id=user, job_type="image", status="processing", created_at=OLD))
        s.add(UsageLog(id=uuid.uuid4(), job_id=job, user_id=uuid.uuid4(), status="reserved",
                       credits=40, created_at=OLD))
    assert _found(factory) == [("usage_log_user_mismatch", user, job)]
