"""The credit ledger on real PostgreSQL: exact, idempotent, FIFO, race-safe."""

from __future__ import annotations

import random
import threading
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from reconcile import credits
from reconcile.db.models import CreditBalance, CreditLot, CreditTransaction, Job, UsageLog
from reconcile.errors import InsufficientCredits, InvalidParam, LedgerError
from tests.integration.harness import balance

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def _job(s: Session, user: uuid.UUID, status: str = "pending") -> uuid.UUID:
    jid = uuid.uuid4()
    s.add(Job(id=jid, user_id=user, job_type="image", status=status, created_at=NOW))
    return jid


def test_grant_is_idempotent_on_its_transaction_id(db: sessionmaker[Session]) -> None:
    """The same grant id twice adds the credits once."""
    user = uuid.uuid4()
    with db.begin() as s:
        assert credits.grant(s, user, "sub", 100, "grant-1") is True
    with db.begin() as s:
        assert credits.grant(s, user, "sub", 100, "grant-1") is False
    assert balance(db, user) == (100, 0)


def test_reserve_drains_sub_first_fifo_and_records_pools(db: sessionmaker[Session]) -> None:
    """A reservation takes the oldest sub lots first, then topup, and records the split."""
    user = uuid.uuid4()
    with db.begin() as s:
        credits.grant(s, user, "topup", 50, "t1", now=NOW)
        credits.grant(s, user, "sub", 30, "s1", now=NOW)
        credits.grant(s, user, "sub", 30, "s2", now=NOW + timedelta(seconds=1))
    with db.begin() as s:
        jid = _job(s, user)
        r = credits.reserve(s, user, jid, 70, now=NOW)
    assert (r.from_sub, r.from_topup) == (60, 10)
    with db() as s:
        log = s.execute(select(UsageLog).where(UsageLog.job_id == jid)).scalar_one()
        assert log.status == "reserved" and log.metadata_ == {"from_sub": 60, "from_topup": 10}
        lots = {lot.source_txn_id: lot.remaining_amount for lot in s.execute(select(CreditLot)).scalars()}
    assert lots == {"t1": 40, "s1": 0, "s2": 0}
    assert balance(db, user) == (0, 40)


def test_reserve_refuses_an_insufficient_balance_and_changes_nothing(db: sessionmaker[Session]) -> None:
    """Too low a balance raises InsufficientCredits and writes nothing."""
    user = uuid.uuid4()
    with db.begin() as s:
        credits.grant(s, user, "sub", 10, "g")
    with pytest.raises(InsufficientCredits), db.begin() as s:
        credits.reserve(s, user, _job(s, user), 11)
    with db() as s:
        assert s.execute(select(UsageLog)).first() is None
    assert balance(db, user) == (10, 0)


@pytest.mark.parametrize("bad", [0, -5, 1.5, True, "10"])
def test_reserve_rejects_non_positive_or_non_integer_amounts(db: sessionmaker[Session], bad: object) -> None:
    """Credits are positive integers; anything else is INVALID_PARAM."""
    with pytest.raises(InvalidParam), db.begin() as s:
        credits.reserve(s, uuid.uuid4(), uuid.uuid4(), bad)  # type: ignore[arg-type]


def test_refund_returns_to_recorded_pools_as_lots_later_reservations_consume(
    db: sessionmaker[Session],
) -> None:
    """A refund makes one REFUND lot per pool, and the next reservation consumes them."""
    user = uuid.uuid4()
    with db.begin() as s:
        credits.grant(s, user, "sub", 30, "s")
        credits.grant(s, user, "topup", 30, "t")
        j1 = _job(s, user)
        credits.reserve(s, user, j1, 50)
    with db.begin() as s:
        assert credits.refund(s, j1) is True
    with db.begin() as s:
        assert credits.refund(s, j1) is False
    assert balance(db, user) == (30, 30)
    with db() as s:
        refund_lots = {lot.source_txn_id: lot.amount for lot in s.execute(
            select(CreditLot).where(CreditLot.kind == "REFUND")).scalars()}
    assert refund_lots == {f"job-refund:{j1}:sub": 30, f"job-refund:{j1}:topup": 20}
    with db.begin() as s:
        j2 = _job(s, user)
        credits.reserve(s, user, j2, 60)
    with db() as s:
        assert all(lot.remaining_amount == 0 for lot in s.execute(select(CreditLot)).scalars())
        assert credits.audit(s) == []


def test_commit_for_less_takes_sub_first_and_releases_each_pools_rest(
    db: sessionmaker[Session],
) -> None:
    """Committing 40 of 100 (70 sub / 30 topup) takes 40 sub and releases 30 sub + 30 topup
    (README, Design notes: Pools: each pool is conserved on its own)."""
    user = uuid.uuid4()
    with db.begin() as s:
        credits.grant(s, user, "sub", 70, "s")
        credits.grant(s, user, "topup", 30, "t")
        jid = _job(s, user)
        credits.reserve(s, user, jid, 100)
    with db.begin() as s:
        assert credits.commit(s, jid, 40) is True
        assert credits.commit(s, jid, 40) is False
        assert credits.refund(s, jid) is False
    assert balance(db, user) == (30, 30)
    with db() as s:
        assert credits.settled_amount(s, jid) == 40
        c, r = s.get(CreditTransaction, f"job-commit:{jid}"), s.get(CreditTransaction, f"job-release:{jid}")
        assert (c.from_sub, c.from_topup) == (40, 0) and (r.from_sub, r.from_topup) == (30, 30)
        assert credits.audit(s) == []


def test_commit_more_than_held_is_refused(db: sessionmaker[Session]) -> None:
    """A commit above the reservation raises and rolls back."""
    user = uuid.uuid4()
    with db.begin() as s:
        credits.grant(s, user, "sub", 10, "s")
        jid = _job(s, user)
        credits.reserve(s, user, jid, 10)
    with pytest.raises(LedgerError), db.begin() as s:
        credits.commit(s, jid, 11)
    with db() as s:
        assert credits.settled_amount(s, jid) is None


def test_legacy_partial_refund_shrinks_reservation(db: sessionmaker[Session]) -> None:
    """A legacy refund p on a reserved a: a later refund adds a − p; audit stays clean."""
    user = uuid.uuid4()
    with db.begin() as s:
        credits.grant(s, user, "sub", 100, "s")
        j1, j2 = _job(s, user), _job(s, user)
        credits.reserve(s, user, j1, 40)
        credits.reserve(s, user, j2, 40)
    with db.begin() as s:
        assert credits.import_legacy_refund(s, j1, 15, "legacy-a") is True
        assert credits.import_legacy_refund(s, j1, 10, "legacy-b") is True
        assert credits.import_legacy_refund(s, j2, 5, "legacy-c") is True
    with db() as s:
        assert credits.audit(s) == []
    with db.begin() as s:
        assert credits.refund(s, j1) is True
        assert credits.commit(s, j2) is True
    with db() as s:
        assert s.get(CreditTransaction, f"job-refund:{j1}").amount == 15
        assert s.get(CreditTransaction, f"job-commit:{j2}").amount == 35
        assert credits.audit(s) == []
    assert sum(balance(db, user)) == 100 - 35


def test_audit_reports_terminal_job_still_reserved_and_corruption(db: sessionmaker[Session]) -> None:
    """A failed job holding a reservation past the grace, and a tampered balance, are reported."""
    user = uuid.uuid4()
    with db.begin() as s:
        credits.grant(s, user, "sub", 10, "s", now=NOW)
        jid = _job(s, user, status="failed")
        credits.reserve(s, user, jid, 5, now=NOW)
    with db() as s:
        assert credits.audit(s, now=NOW + timedelta(minutes=1)) == []
        kinds = {d.kind for d in credits.audit(s, now=NOW + timedelta(hours=1))}
        assert kinds == {"terminal_job_reserved"}
    with db.begin() as s:
        s.execute(update(CreditBalance).values(sub=CreditBalance.sub + 1))
    with db() as s:
        kinds = {d.kind for d in credits.audit(s, now=NOW + timedelta(minutes=1))}
        assert {"balance_mismatch", "unbalanced"} <= kinds


def test_16_concurrent_refunds_of_one_job_refund_once(db: sessionmaker[Session]) -> None:
    """16 connections refunding the same job at once: one refund, the balance rises once."""
    user = uuid.uuid4()
    with db.begin() as s:
        credits.grant(s, user, "sub", 100, "s")
        jid = _job(s, user)
        credits.reserve(s, user, jid, 60)
    barrier = threading.Barrier(16)
    results: list[bool] = []
    lock = threading.Lock()

    def worker() -> None:
        with db.begin() as s:
            s.connection()  # open the connection before the race
            barrier.wait()
            ok = credits.refund(s, jid)
        with lock:
            results.append(ok)

    threads = [threading.Thread(target=worker) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == [False] * 15 + [True]
    assert balance(db, user) == (100, 0)
    with db() as s:
        assert s.execute(select(CreditTransaction).where(
            CreditTransaction.type == "REFUND")).scalars().all().__len__() == 1
        assert credits.audit(s) == []


def test_8_writers_2000_random_operations_on_one_hot_user(db: sessionmaker[Session]) -> None:
    """8 concurrent writers, 2,000 reserve/commit/refund ops: no lost update, audit clean."""
    user = uuid.uuid4()
    with db.begin() as s:
        credits.grant(s, user, "sub", 60_000, "s")
        credits.grant(s, user, "topup", 40_000, "t")
    committed_total = [0]
    lock = threading.Lock()

    def writer(seed: int) -> None:
        rng = random.Random(seed)
        mine: list[uuid.UUID] = []
        for _ in range(250):
            op = rng.random()
            if op < 0.5 or not mine:
                with db.begin() as s:
                    jid = _job(s, user)
                    try:
                        credits.reserve(s, user, jid, rng.randint(1, 40))
                    except InsufficientCredits:
                        continue
                mine.append(jid)
            else:
                jid = mine.pop(rng.randrange(len(mine)))
                with db.begin() as s:
                    if op < 0.75:
                        held = s.execute(select(UsageLog.credits).where(UsageLog.job_id == jid)).scalar_one()
                        amount = rng.randint(0, held)
                        if credits.commit(s, jid, amount):
                            with lock:
                                committed_total[0] += amount
                    else:
                        credits.refund(s, jid)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    with db() as s:
        assert credits.audit(s) == []
        reserved = sum(s.execute(select(UsageLog.credits).where(UsageLog.status == "reserved")).scalars())
    # no lost update: every credit is in the balance, a reservation, or a commit we counted
    assert sum(balance(db, user)) + reserved + committed_total[0] == 100_000


def test_reserve_pages_through_many_small_lots_in_fifo_order(db: sessionmaker[Session]) -> None:
    """100 one-credit lots (more than a page): a 70-credit reservation drains the oldest 70."""
    user = uuid.uuid4()
    with db.begin() as s:
        for i in range(100):
            credits.grant(s, user, "sub", 1, f"g{i:03d}")
    with db.begin() as s:
        credits.reserve(s, user, _job(s, user), 70)
    with db() as s:
        left = sorted(lot.source_txn_id for lot in s.execute(
            select(CreditLot).where(CreditLot.remaining_amount > 0)).scalars())
        assert left == [f"g{i:03d}" for i in range(70, 100)]
        assert credits.audit(s) == []
