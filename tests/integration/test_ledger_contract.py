"""The ledger seam's contract (``reconcile.ledger`` docstring), which every backend must pass:
the built-in ledger and the platform ``user_credits`` backend, on real PostgreSQL."""

from __future__ import annotations

import threading
import uuid
from datetime import UTC, datetime

import pytest
from sqlalchemy import select, text
from sqlalchemy.orm import Session, sessionmaker

from reconcile import Ledger
from reconcile.db.models import UsageLog
from reconcile.errors import InsufficientCredits, LedgerError
from tests.integration.ledgers import Backend, log_status

NOW = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)


def _reserve(b: Backend, user: uuid.UUID, amount: int) -> uuid.UUID:
    job = uuid.uuid4()
    with b.db.begin() as s:
        b.ledger.reserve(s, user, job, amount, now=NOW)
    return job


def _user(b: Backend, sub: int = 0, topup: int = 0) -> uuid.UUID:
    user = uuid.uuid4()
    if sub:
        b.fund(user, sub, "sub")
    if topup:
        b.fund(user, topup, "topup")
    return user


def test_backends_satisfy_the_protocol(ledger_backend: Backend) -> None:
    """Both backends are :class:`Ledger` implementations."""
    assert isinstance(ledger_backend.ledger, Ledger)


def test_reserve_takes_sub_first_and_is_idempotent(ledger_backend: Backend) -> None:
    """A reservation drains ``sub`` before ``topup``; reserving the job again returns the first
    reservation and moves nothing."""
    b = ledger_backend
    user = _user(b, sub=30, topup=100)
    job = uuid.uuid4()
    with b.db.begin() as s:
        first = b.ledger.reserve(s, user, job, 50, now=NOW)
    with b.db.begin() as s:
        again = b.ledger.reserve(s, user, job, 50, now=NOW)
    assert (first.from_sub, first.from_topup) == (30, 20)
    assert again.usage_log_id == first.usage_log_id
    assert b.balance(user) == (0, 80)
    assert log_status(b.db, job) == "reserved"


def test_operations_run_in_the_callers_transaction(ledger_backend: Backend) -> None:
    """Nothing an operation did survives the caller's rollback: it never commits itself."""
    b = ledger_backend
    user = _user(b, sub=100)
    job = uuid.uuid4()
    with b.db() as s:
        b.ledger.reserve(s, user, job, 40, now=NOW)
        s.rollback()
    assert b.balance(user) == (100, 0) and log_status(b.db, job) is None
    job = _reserve(b, user, 40)
    for op in (lambda s: b.ledger.commit(s, job, now=NOW), lambda s: b.ledger.refund(s, job, now=NOW)):
        with b.db() as s:
            assert op(s) is True
            s.rollback()
        assert log_status(b.db, job) == "reserved" and b.balance(user) == (60, 0)


def test_insufficient_credits_raise_and_write_nothing(ledger_backend: Backend) -> None:
    """A reservation above the balance raises; the caller may still commit: nothing was written."""
    b = ledger_backend
    user = _user(b, sub=10, topup=5)
    job = uuid.uuid4()
    with b.db.begin() as s:
        with pytest.raises(InsufficientCredits):
            b.ledger.reserve(s, user, job, 16, now=NOW)
    assert b.balance(user) == (10, 5) and log_status(b.db, job) is None


def test_commit_is_a_cas_on_reserved(ledger_backend: Backend) -> None:
    """Commit moves ``reserved`` → ``committed`` once; a second commit or a refund is False."""
    b = ledger_backend
    user = _user(b, sub=100)
    job = _reserve(b, user, 40)
    with b.db.begin() as s:
        assert b.ledger.commit(s, job, now=NOW) is True
    with b.db.begin() as s:
        assert b.ledger.commit(s, job, now=NOW) is False
        assert b.ledger.refund(s, job, now=NOW) is False
        assert b.ledger.settled_amount(s, job) == 40 and b.ledger.refunded(s, job) == 0
    assert log_status(b.db, job) == "committed" and b.balance(user) == (60, 0)
    assert b.audit() == []


def test_refund_is_a_cas_and_restores_each_pool(ledger_backend: Backend) -> None:
    """Refund gives each pool exactly what it gave; a second refund or a commit is False."""
    b = ledger_backend
    user = _user(b, sub=30, topup=100)
    job = _reserve(b, user, 50)
    with b.db.begin() as s:
        assert b.ledger.settled_amount(s, job) is None
        assert b.ledger.refund(s, job, now=NOW) is True
    with b.db.begin() as s:
        assert b.ledger.refund(s, job, now=NOW) is False
        assert b.ledger.commit(s, job, now=NOW) is False
        assert b.ledger.settled_amount(s, job) == 0 and b.ledger.refunded(s, job) == 50
    assert b.balance(user) == (30, 100) and log_status(b.db, job) == "refunded"
    assert b.audit() == []


def test_commit_for_less_releases_the_rest(ledger_backend: Backend) -> None:
    """A commit for less charges that much; the rest returns to the user; totals conserved."""
    b = ledger_backend
    user = _user(b, sub=100)
    job = _reserve(b, user, 40)
    with b.db.begin() as s:
        assert b.ledger.commit(s, job, 25, now=NOW) is True
        assert b.ledger.settled_amount(s, job) == 25
    assert b.balance(user) == (75, 0)
    assert b.audit() == []


def test_commit_for_less_charges_sub_first_and_releases_each_pools_rest(
        ledger_backend: Backend) -> None:
    """README, Design notes: Pools. A commit for less takes from the pools in the order the reservation took
    them (sub first); each pool gets back what it reserved minus what it committed."""
    b = ledger_backend
    user = _user(b, sub=30, topup=100)
    job = _reserve(b, user, 50)  # 30 from sub, 20 from topup
    with b.db.begin() as s:
        assert b.ledger.commit(s, job, 40, now=NOW) is True
    assert b.balance(user) == (0, 90)  # 30 sub + 10 topup charged; 10 topup back
    assert b.audit() == []


def test_commit_above_what_is_held_raises_and_writes_nothing(ledger_backend: Backend) -> None:
    """Over-committing raises; the caller may still commit its transaction: nothing moved."""
    b = ledger_backend
    user = _user(b, sub=100)
    job = _reserve(b, user, 40)
    with b.db.begin() as s:
        with pytest.raises(LedgerError):
            b.ledger.commit(s, job, 41, now=NOW)
    assert log_status(b.db, job) == "reserved" and b.balance(user) == (60, 0)
    with b.db.begin() as s:
        assert b.ledger.refund(s, job, now=NOW) is True
    assert b.balance(user) == (100, 0)


def test_legacy_partial_refund_counts(ledger_backend: Backend) -> None:
    """A platform's refund p on a reservation a: a later refund returns a − p, a commit can
    charge at most a − p."""
    b = ledger_backend
    user = _user(b, sub=100)
    refunded, committed = _reserve(b, user, 40), _reserve(b, user, 40)
    with b.db.begin() as s:
        b.legacy_refund(s, refunded, 15)
        b.legacy_refund(s, committed, 10)
    assert b.balance(user) == (45, 0)
    with b.db.begin() as s:
        assert b.ledger.refund(s, refunded, now=NOW) is True
        assert b.ledger.refunded(s, refunded) == 25
    with b.db.begin() as s:
        with pytest.raises(LedgerError):
            b.ledger.commit(s, committed, 31, now=NOW)
    with b.db.begin() as s:
        assert b.ledger.commit(s, committed, now=NOW) is True
        assert b.ledger.settled_amount(s, committed) == 30
    assert b.balance(user) == (70, 0)
    assert b.audit() == []


def test_lock_order_is_the_balance_then_the_log(ledger_backend: Backend) -> None:
    """A refund waiting for the user's balance lock holds no lock on the usage log yet."""
    b = ledger_backend
    user = _user(b, sub=100)
    job = _reserve(b, user, 40)
    done = threading.Event()
    errors: list[BaseException] = []

    def refund() -> None:
        try:
            with b.db.begin() as s:
                b.ledger.refund(s, job, now=NOW)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finally:
            done.set()

    with b.db.begin() as holder:
        b.lock_balance(holder, user)
        worker = threading.Thread(target=refund)
        worker.start()
        _wait_for_lock_wait(b.db)
        assert not done.is_set()
        with b.db.begin() as probe:  # the log is free while the refund waits on the balance
            probe.execute(text("SET LOCAL lock_timeout = '2s'"))
            probe.execute(select(UsageLog.id).where(UsageLog.job_id == job).with_for_update(nowait=True))
    worker.join(timeout=60)
    assert done.is_set() and not errors, errors
    assert log_status(b.db, job) == "refunded" and b.balance(user) == (100, 0)


def _wait_for_lock_wait(db: sessionmaker[Session], timeout: float = 60.0) -> None:
    """Until some backend of this database waits on a lock (the refund blocked on the balance)."""
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with db() as s:
            waiting = s.execute(text(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND wait_event_type = 'Lock'")).scalar_one()
        if waiting:
            return
        time.sleep(0.05)
    raise AssertionError("the refund never waited on the balance lock")
