"""Which lock a commit waits for, on PostgreSQL: a commit of everything held releases nothing,
so it locks the job's usage log and not its user's balance row; a commit for an amount may
release, so it still takes the balance row first (the lock order: the balance, then the log).

Another transaction of the same user holds the balance row here (a reserve of another job, not
yet committed, as a busy user's submit does), and the commit runs with a ``lock_timeout``: a
commit that queues behind that transaction raises instead of waiting."""

from __future__ import annotations

import threading
import uuid
from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session, sessionmaker

from reconcile import credits
from reconcile.db.models import CreditBalance, CreditTransaction, UsageLog
from reconcile.errors import LegacyRefundRefused

T0 = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)


def _user_with_a_reservation(db: sessionmaker[Session], amount: int = 100) -> tuple[uuid.UUID,
                                                                                   uuid.UUID]:
    user, job = uuid.uuid4(), uuid.uuid4()
    with db.begin() as s:
        credits.grant(s, user, "sub", 1000, f"g-{user}", now=T0)
    with db.begin() as s:
        credits.reserve(s, user, job, amount, now=T0)
    return user, job


def _holding_the_balance(db: sessionmaker[Session], user: uuid.UUID) -> Session:
    """An open transaction that holds the user's balance row: a reserve of another job."""
    holder = db()
    credits.reserve(holder, user, uuid.uuid4(), 10, now=T0)
    return holder


def _balance(s: Session, user: uuid.UUID) -> int:
    row = s.get(CreditBalance, user)
    assert row is not None
    return row.sub + row.topup


def _usage_status(db: sessionmaker[Session], job: uuid.UUID) -> str | None:
    with db() as s:
        return s.query(UsageLog.status).filter(UsageLog.job_id == job).scalar()


def test_a_commit_of_everything_held_does_not_wait_for_the_users_balance_row(
        db: sessionmaker[Session]) -> None:
    user, job = _user_with_a_reservation(db)
    holder = _holding_the_balance(db, user)
    try:
        with db.begin() as s:
            s.execute(text("SET LOCAL lock_timeout = '1500ms'"))
            assert credits.settle_commit(s, job, now=T0).amount == 100
    finally:
        holder.commit()
        holder.close()
    assert _usage_status(db, job) == "committed"
    with db() as s:
        assert credits.audit(s, now=T0) == []


def test_a_commit_for_an_amount_still_waits_for_the_balance_row(
        db: sessionmaker[Session]) -> None:
    """The rest of a commit for less goes back to the balance and a lot: it is written under
    the balance lock, behind the holder."""
    user, job = _user_with_a_reservation(db)
    holder = _holding_the_balance(db, user)
    try:
        with pytest.raises(OperationalError, match="lock timeout"), db.begin() as s:
            s.execute(text("SET LOCAL lock_timeout = '500ms'"))
            credits.commit(s, job, 60, now=T0)
    finally:
        holder.commit()
        holder.close()
    assert _usage_status(db, job) == "reserved"
    with db.begin() as s:
        assert credits.commit(s, job, 60, now=T0)
    with db() as s:
        assert s.get(CreditTransaction, f"job-release:{job}").amount == 40  # type: ignore[union-attr]
        assert credits.audit(s, now=T0) == []


def _in_thread(fn: Any) -> tuple[threading.Thread, dict[str, Any]]:
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["result"] = fn()
        except Exception as exc:  # noqa: BLE001 - the test reads what happened
            out["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    return thread, out


def test_a_full_commit_waits_for_a_legacy_refund_being_imported_and_counts_it(
        db: sessionmaker[Session]) -> None:
    """The import holds the log (and the balance) until it commits; the commit then reads what
    is held afresh: 100 reserved − 40 given back = 60 committed, never 100."""
    user, job = _user_with_a_reservation(db)
    importer = db()
    assert credits.import_legacy_refund(importer, job, 40, "legacy-1", now=T0)

    def commit() -> int:
        with db.begin() as s:
            return credits.settle_commit(s, job, now=T0).amount

    thread, out = _in_thread(commit)
    thread.join(timeout=1.0)
    assert thread.is_alive(), "the commit did not wait for the import"
    importer.commit()
    importer.close()
    thread.join(timeout=10.0)
    assert out == {"result": 60}
    with db() as s:
        assert credits.audit(s, now=T0) == []
        assert _balance(s, user) == 1000 - 100 + 40


def test_a_legacy_refund_imported_while_a_full_commit_runs_waits_and_is_refused(
        db: sessionmaker[Session]) -> None:
    """The commit holds the log until it commits; the import, behind it, finds the reservation
    committed and refuses (nothing is given back for credits already charged)."""
    user, job = _user_with_a_reservation(db)
    committer = db()
    assert credits.settle_commit(committer, job, now=T0).amount == 100

    def legacy_import() -> bool:
        with db.begin() as s:
            return credits.import_legacy_refund(s, job, 40, "legacy-1", now=T0)

    thread, out = _in_thread(legacy_import)
    thread.join(timeout=1.0)
    assert thread.is_alive(), "the import did not wait for the commit"
    committer.commit()
    committer.close()
    thread.join(timeout=10.0)
    assert isinstance(out.get("error"), LegacyRefundRefused)
    assert out["error"].reason == "legacy_refund_after_commit"
    with db() as s:
        assert credits.audit(s, now=T0) == []
        assert _balance(s, user) == 1000 - 100
