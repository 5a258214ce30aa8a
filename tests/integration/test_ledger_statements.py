"""The built-in ledger's statements per operation on PostgreSQL, counted with a
``before_cursor_execute`` listener — one statement (a call of the operation's PL/pgSQL function:
the balance lock, then its data-modifying CTEs) for reserve, commit and refund, their failures
and no-ops included; no SAVEPOINT, no existence check before the USAGE insert, no re-read of the
settled amount — and the ``commit_settled`` seam (a bool-returning ledger still works)."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy import event
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session, sessionmaker

from reconcile import credits
from reconcile.db.contract import usage_log_ids_assigned
from reconcile.db.models import CreditBalance, CreditTransaction, Job, UsageLog
from reconcile.ledger import BuiltinLedger, commit_settled
from tests.integration.harness import balance
from tests.integration.ledgers import make_backend

NOW = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)


@contextmanager
def counted(engine: Engine) -> Iterator[list[str]]:
    """Every SQL statement sent to the server (BEGIN/COMMIT are not cursor statements)."""
    seen: list[str] = []

    def listener(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        seen.append(" ".join(statement.split()))

    event.listen(engine, "before_cursor_execute", listener)
    try:
        yield seen
    finally:
        event.remove(engine, "before_cursor_execute", listener)


def _statements(db: sessionmaker[Session], op: Callable[[Session], Any]) -> tuple[Any, list[str]]:
    with db.begin() as s:
        # the connection's own setup is not the operation's, nor what a process reads once per
        # engine at start-up (whether the database assigns usage_logs.id)
        usage_log_ids_assigned(s.connection())
        with counted(db.kw["bind"]) as seen:
            result = op(s)
    return result, seen


def _funded(db: sessionmaker[Session], sub: int, topup: int = 0) -> uuid.UUID:
    user = uuid.uuid4()
    with db.begin() as s:
        credits.grant(s, user, "sub", sub, f"g-sub-{user}", now=NOW)
        if topup:
            credits.grant(s, user, "topup", topup, f"g-topup-{user}", now=NOW)
    return user


def _reserved(db: sessionmaker[Session], user: uuid.UUID, amount: int) -> uuid.UUID:
    job = uuid.uuid4()
    with db.begin() as s:
        credits.reserve(s, user, job, amount, now=NOW)
    return job


LEDGER = BuiltinLedger()


def _calls(seen: list[str], function: str) -> bool:
    """``seen`` is exactly one call of ``function`` (reconcile_ledger_reserve, …)."""
    return len(seen) == 1 and seen[0].startswith(f"SELECT * FROM {function}(")


def test_reserve_is_one_statement_without_savepoint_or_existence_check(
    db: sessionmaker[Session],
) -> None:
    """One call: the balance lock, then one statement (FIFO lots, USAGE row ON CONFLICT,
    balance, usage log); the result is the reservation, sub first, and the rows are written."""
    user = _funded(db, 30, 100)
    job = uuid.uuid4()
    with db.begin() as s:  # its job row (a reservation without one is orphaned_reservation)
        s.add(Job(id=job, user_id=user, job_type="image", status="processing", created_at=NOW))
    r, seen = _statements(db, lambda s: LEDGER.reserve(s, user, job, 50, now=NOW))
    assert _calls(seen, "reconcile_ledger_reserve"), seen
    assert (r.amount, r.from_sub, r.from_topup) == (50, 30, 20)
    assert balance(db, user) == (0, 80)
    with db() as s:
        log = s.get(UsageLog, r.usage_log_id)
        assert log is not None and log.metadata_ == {"from_sub": 30, "from_topup": 20}
        assert credits.audit(s) == []


def test_reserve_replay_and_insufficient_credits_write_nothing(db: sessionmaker[Session]) -> None:
    """The same job again returns the first reservation (the insert met the unique key: the
    call writes nothing, then the first reservation is read); too large an amount raises after
    the one call (the lock, the replay check), which wrote nothing."""
    user = _funded(db, 100)
    job = uuid.uuid4()
    with db.begin() as s:
        first = LEDGER.reserve(s, user, job, 40, now=NOW)
    again, seen = _statements(db, lambda s: LEDGER.reserve(s, user, job, 40, now=NOW))
    assert again == first
    assert seen[0].startswith("SELECT * FROM reconcile_ledger_reserve(")
    assert not any(q.startswith(("INSERT", "UPDATE", "WITH")) for q in seen[1:]), seen
    short = uuid.uuid4()
    with pytest.raises(credits.InsufficientCredits), db.begin() as s:
        usage_log_ids_assigned(s.connection())
        with counted(db.kw["bind"]) as seen:
            LEDGER.reserve(s, user, short, 61, now=NOW)
    assert _calls(seen, "reconcile_ledger_reserve"), seen
    assert balance(db, user) == (60, 0)
    with db() as s:
        assert s.get(CreditTransaction, credits.usage_txn_id(short)) is None
    # a replay whose amount the balance no longer covers: still the first reservation
    again, seen = _statements(db, lambda s: LEDGER.reserve(s, user, job, 100, now=NOW))
    assert again == first and seen[0].startswith("SELECT * FROM reconcile_ledger_reserve(")


@pytest.mark.parametrize("amount", [None, 25])
def test_commit_is_one_statement_and_carries_the_settled_amount(
    db: sessionmaker[Session], amount: int | None,
) -> None:
    """One call: the reserved log with its balance row locked, then one statement (held from
    the job's transactions, CAS, COMMIT, RELEASE and its lot, balance); commit_settled returns
    the committed amount without reading it back."""
    user = _funded(db, 100)
    job = _reserved(db, user, 40)
    settled, seen = _statements(db, lambda s: commit_settled(LEDGER, s, job, amount, now=NOW))
    assert _calls(seen, "reconcile_ledger_commit"), seen
    assert settled == (40 if amount is None else 25)
    assert balance(db, user) == (60 if amount is None else 75, 0)
    with db() as s:
        assert credits.settled_amount(s, job) == settled
        assert credits.audit(s) == []


def test_commit_and_refund_after_settlement_are_false_and_write_nothing(
    db: sessionmaker[Session],
) -> None:
    user = _funded(db, 100)
    job = _reserved(db, user, 40)
    with db.begin() as s:
        assert LEDGER.commit(s, job, now=NOW) is True
    again, seen = _statements(db, lambda s: LEDGER.commit(s, job, now=NOW))
    assert again is False and _calls(seen, "reconcile_ledger_commit"), seen
    settled, _ = _statements(db, lambda s: commit_settled(LEDGER, s, job, now=NOW))
    assert settled == 40  # not settled by this call: read back
    refunded, seen = _statements(db, lambda s: LEDGER.refund(s, job, now=NOW))
    assert refunded is False and _calls(seen, "reconcile_ledger_refund"), seen
    assert balance(db, user) == (60, 0)
    never = uuid.uuid4()  # no reservation at all: one call each, nothing written
    assert _statements(db, lambda s: LEDGER.commit(s, never, now=NOW))[0] is False
    refunded, seen = _statements(db, lambda s: LEDGER.refund(s, never, now=NOW))
    assert refunded is False and _calls(seen, "reconcile_ledger_refund"), seen
    assert balance(db, user) == (60, 0)


def test_refund_is_one_statement(db: sessionmaker[Session]) -> None:
    """One call: the lock, then one statement (held, CAS, REFUND row, one lot per pool,
    balance)."""
    user = _funded(db, 30, 100)
    job = _reserved(db, user, 50)
    done, seen = _statements(db, lambda s: LEDGER.refund(s, job, now=NOW))
    assert done is True and _calls(seen, "reconcile_ledger_refund"), seen
    assert balance(db, user) == (30, 100)
    with db() as s:
        assert credits.audit(s) == []


def test_legacy_refunds_are_counted_by_the_same_statement(db: sessionmaker[Session]) -> None:
    """No separate legacy-refund query: a legacy refund of 15 on 40 still caps the commit at 25
    and the commit is still one statement; the refused commit too, and it wrote nothing."""
    user = _funded(db, 100)
    job = _reserved(db, user, 40)
    with db.begin() as s:
        credits.import_legacy_refund(s, job, 15, f"legacy-{job}")
    with pytest.raises(credits.LedgerError) as err, db.begin() as s:
        usage_log_ids_assigned(s.connection())
        with counted(db.kw["bind"]) as seen:
            LEDGER.commit(s, job, 26, now=NOW)
    assert err.value.reason == "commit_exceeds_held"
    assert _calls(seen, "reconcile_ledger_commit"), seen
    with db() as s:
        assert s.get(CreditTransaction, credits.commit_txn_id(job)) is None
    settled, seen = _statements(db, lambda s: commit_settled(LEDGER, s, job, now=NOW))
    assert settled == 25 and _calls(seen, "reconcile_ledger_commit"), seen
    assert balance(db, user) == (75, 0)
    with db() as s:
        assert credits.audit(s) == []


def test_a_session_copy_of_the_balance_is_refreshed_after_core_writes(
    db: sessionmaker[Session],
) -> None:
    """The operations write with Core; an ORM copy the session held is expired, not stale."""
    user = _funded(db, 100)
    with db.begin() as s:
        held = s.get(CreditBalance, user)
        assert held is not None and held.sub == 100
        credits.reserve(s, user, uuid.uuid4(), 30, now=NOW)
        assert held.sub == 70


def test_a_bool_ledger_gets_commit_then_settled_amount(db: sessionmaker[Session]) -> None:
    """A third-party ledger without ``commit_settled`` (the platform backend: commit returns a
    bool) still settles through the seam: commit, then its own settled_amount."""
    backend = make_backend("platform", db)
    assert not hasattr(backend.ledger, "commit_settled")
    user = uuid.uuid4()
    backend.fund(user, 100)
    job = uuid.uuid4()
    with db.begin() as s:
        backend.ledger.reserve(s, user, job, 40, now=NOW)
    with db.begin() as s:
        assert commit_settled(backend.ledger, s, job, 30, now=NOW) == 30
    assert backend.balance(user) == (70, 0)
