"""A reserve replayed after the balance was drained returns the first reservation, in the Core ledger (each
on PostgreSQL and on the embedded SQLite default)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest
from sqlalchemy.orm import Session, sessionmaker

from reconcile import credits
from reconcile.db.models import Job
from reconcile.ledger import DEFAULT as LEDGER

T0 = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.fixture
def factory(pg_and_sqlite: sessionmaker[Session]) -> sessionmaker[Session]:
    return pg_and_sqlite  # PostgreSQL, then SQLite (tests/integration/conftest.py)


@pytest.mark.parametrize("via_ledger", [False, True])
def test_reserve_replay_after_the_balance_was_drained_returns_the_first_reservation(
        factory: sessionmaker[Session], via_ledger: bool) -> None:
    """A repeated reserve of a job (a retried job insert) returns the first reservation even
    when what is left is below the amount: the documented idempotent replay. The Core (SQLite)
    path caught only LedgerError, and InsufficientCredits is not one: the replay raised."""
    user, job = uuid.uuid4(), uuid.uuid4()
    reserve = LEDGER.reserve if via_ledger else credits.reserve
    with factory.begin() as s:
        s.add(Job(id=job, user_id=user, job_type="t", status="pending"))
        credits.grant(s, user, "sub", 20, "g", now=T0)
        first = reserve(s, user, job, 20, now=T0)
    with factory.begin() as s:
        again = reserve(s, user, job, 20, now=T0)
        bigger = reserve(s, user, job, 59, now=T0)
    assert again == first and bigger == first
    with factory() as s:
        assert credits.audit(s, now=T0) == []
