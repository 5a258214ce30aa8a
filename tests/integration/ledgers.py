"""The two ledger backends behind one test interface, for the contract suite and the
lifecycle tests that are parametrized over both (the ``ledger_backend`` fixture, and
``on_each_ledger``, which also installs the backend for the test)."""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from sqlalchemy import select, text
from sqlalchemy.orm import Session, sessionmaker

from reconcile import Ledger, credits
from reconcile.db.models import CreditBalance
from reconcile.ledger import BuiltinLedger, audit as library_audit
from reconcile.testing.platform_ledger import DDL, PlatformLedger
from tests.integration import harness

_seq = itertools.count()


@dataclass
class Backend:
    """A ledger plus what a test needs around it: fund a user, read a balance, record a
    platform's legacy refund, lock a balance row from outside."""

    name: str
    ledger: Ledger
    db: sessionmaker[Session]
    extra: dict[str, Any] = field(default_factory=dict)

    def fund(self, user: uuid.UUID, amount: int, pool: str = "sub") -> None:
        with self.db.begin() as s:
            if isinstance(self.ledger, PlatformLedger):
                self.ledger.grant(s, user, pool, amount)
            else:
                credits.grant(s, user, pool, amount, f"test-grant:{user}:{pool}:{next(_seq)}")

    def balance(self, user: uuid.UUID) -> tuple[int, int]:
        with self.db() as s:
            if isinstance(self.ledger, PlatformLedger):
                return self.ledger.balance(s, user)
            row = s.get(CreditBalance, user)
            return (0, 0) if row is None else (row.sub, row.topup)

    def legacy_refund(self, session: Session, job_id: uuid.UUID, amount: int) -> None:
        if isinstance(self.ledger, PlatformLedger):
            self.ledger.legacy_refund(session, job_id, amount)
        else:
            credits.import_legacy_refund(session, job_id, amount, f"legacy:{job_id}:{next(_seq)}")

    def lock_balance(self, session: Session, user: uuid.UUID) -> None:
        """Take the user's balance row lock from another session (SELECT … FOR UPDATE)."""
        table = "user_credits" if isinstance(self.ledger, PlatformLedger) \
            else CreditBalance.__table__.name
        session.execute(text(f"SELECT 1 FROM {table} WHERE user_id = :u FOR UPDATE"), {"u": user})

    def total(self, user: uuid.UUID) -> int:
        return sum(self.balance(user))

    def _count(self, job_id: uuid.UUID, kind: str) -> int:
        """How many settlements of ``kind`` (REFUND / COMMIT) the backend recorded for the job."""
        from reconcile.db.models import CreditTransaction, UsageLog

        with self.db() as s:
            if not isinstance(self.ledger, PlatformLedger):
                return len(s.execute(select(CreditTransaction.id).where(
                    CreditTransaction.job_id == job_id, CreditTransaction.type == kind)).all())
            key = "refund" if kind == "REFUND" else "committed"
            logs = s.execute(select(UsageLog).where(UsageLog.job_id == job_id)).scalars()
            return sum(1 for log in logs if key in (log.metadata_ or {}))

    def refund_count(self, job_id: uuid.UUID) -> int:
        return self._count(job_id, "REFUND")

    def commit_count(self, job_id: uuid.UUID) -> int:
        return self._count(job_id, "COMMIT")

    def audit(self) -> list[Any]:
        with self.db() as s:
            return library_audit(self.ledger, s)


BACKENDS = ("builtin", "platform")


def make_backend(name: str, db: sessionmaker[Session]) -> Backend:
    if name == "builtin":
        return Backend(name, BuiltinLedger(), db)
    with db.begin() as s:
        s.connection().exec_driver_sql(DDL)
        s.connection().exec_driver_sql("TRUNCATE user_credits")
    return Backend(name, PlatformLedger(), db)


@pytest.fixture(params=BACKENDS)
def ledger_backend(request: pytest.FixtureRequest, db: sessionmaker[Session]) -> Iterator[Backend]:
    """Each ledger backend in turn, on a clean database."""
    yield make_backend(request.param, db)


@pytest.fixture(params=BACKENDS)
def on_each_ledger(request: pytest.FixtureRequest, db: sessionmaker[Session]) -> Iterator[Backend]:
    """Each ledger backend in turn (built-in; platform user_credits), installed for the test; on
    the platform one, afterwards, nothing reached the built-in ledger (the code under test reached
    credits only through the seam). A module runs every test so with ``pytestmark =
    pytest.mark.usefixtures("on_each_ledger")``."""
    with harness.ledger_backend(make_backend(request.param, db)) as current:
        yield current
    if current.name == "platform":
        assert_builtin_ledger_untouched(db)


def log_status(db: sessionmaker[Session], job_id: uuid.UUID) -> str | None:
    from reconcile.db.models import UsageLog

    with db() as s:
        return s.execute(select(UsageLog.status).where(UsageLog.job_id == job_id)).scalar_one_or_none()


def assert_builtin_ledger_untouched(db: sessionmaker[Session]) -> None:
    """No row in the built-in ledger's tables: everything went through the plugged backend."""
    from reconcile.db.models import CreditLot, CreditTransaction

    with db() as s:
        for model in (CreditBalance, CreditLot, CreditTransaction):
            assert s.execute(select(model).limit(1)).first() is None, model.__tablename__
