"""The PostgreSQL statements of the built-in ledger move the pools exactly as its pure
arithmetic says (tests/unit/test_ledger_split.py): the reserve CTE's FIFO walk over lots is
:func:`credits.take_from_lots` pool by pool (``sub`` first), and the commit CTE's split of a
commit for less is :func:`credits.take_in_order` over what is held, the rest released."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from reconcile import credits
from reconcile.db.models import CreditLot, CreditTransaction

NOW = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)
SUB_LOTS, TOPUP_LOTS = [10, 5, 20], [7, 30]


def _open_lots(s: Session, user: uuid.UUID, pool: str) -> list[tuple[int, int]]:
    return [(lot.id, lot.remaining_amount) for lot in s.execute(
        select(CreditLot).where(CreditLot.user_id == user, CreditLot.pool == pool,
                                CreditLot.kind == "GRANT").order_by(CreditLot.id)).scalars()]


@pytest.mark.parametrize("amount", [1, 10, 11, 35, 36, 50, 72])
def test_reserve_walks_the_lots_as_take_from_lots(db: sessionmaker[Session], amount: int) -> None:
    user = uuid.uuid4()
    with db.begin() as s:
        for pool, sizes in (("sub", SUB_LOTS), ("topup", TOPUP_LOTS)):
            for i, size in enumerate(sizes):
                credits.grant(s, user, pool, size, f"g-{pool}-{i}-{user}", now=NOW)
    with db() as s:
        before = {pool: _open_lots(s, user, pool) for pool in credits.POOLS}
    expected: dict[str, dict[int, int]] = {}
    left, taken = amount, []
    for pool in credits.POOLS:
        changes, took = credits.take_from_lots(left, before[pool])
        expected[pool] = dict(before[pool]) | dict(changes)
        taken.append(took)
        left -= took
    assert left == 0
    with db.begin() as s:
        r = credits.reserve(s, user, uuid.uuid4(), amount, now=NOW)
    assert (r.from_sub, r.from_topup) == tuple(taken)
    with db() as s:
        for pool in credits.POOLS:
            assert dict(_open_lots(s, user, pool)) == expected[pool], pool


@pytest.mark.parametrize("amount", [0, 10, 30, 31, 50])
def test_a_commit_for_less_splits_as_take_in_order(db: sessionmaker[Session], amount: int) -> None:
    user, job = uuid.uuid4(), uuid.uuid4()
    with db.begin() as s:
        credits.grant(s, user, "sub", 30, f"g-sub-{user}", now=NOW)
        credits.grant(s, user, "topup", 100, f"g-topup-{user}", now=NOW)
        r = credits.reserve(s, user, job, 50, now=NOW)
    held = (r.from_sub, r.from_topup)
    assert held == (30, 20)
    with db.begin() as s:
        assert s.get_bind().dialect.name == "postgresql"
        assert credits.commit(s, job, amount, now=NOW)
    committed = credits.take_in_order(amount, held)
    with db() as s:
        c = s.get(CreditTransaction, credits.commit_txn_id(job))
        rel = s.get(CreditTransaction, credits.release_txn_id(job))
        assert c is not None and (c.from_sub, c.from_topup) == committed
        released = (held[0] - committed[0], held[1] - committed[1])
        if sum(released):
            assert rel is not None and (rel.from_sub, rel.from_topup) == released
        else:
            assert rel is None
