"""Edges of the naive-now refusal and of the share bound, on PostgreSQL and SQLite: the paths
test_ledger_naive_now.py does not call (legacy import, re-charge, metadata repair, the audit)
refuse a naive now before writing; an aware now in another zone is stored as its instant on
every write path (PostgreSQL session in another zone); the policy's own share at the largest
allowed denominator is exact near 2**63 credits; and the audit refuses a policy whose share was
set past SettlementPolicy's checks instead of overflowing (PostgreSQL) or crying wolf (SQLite)."""
from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta, timezone
from fractions import Fraction

import pytest
from sqlalchemy import func, select, text, update

from reconcile import credits
from reconcile.db.models import (
    CreditAnomaly,
    CreditBalance,
    CreditLot,
    CreditTransaction,
    Job,
)
from reconcile.settlement import MAX_SHARE_DENOMINATOR, SettlementPolicy, decide, kept_of

T0 = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)
NAIVE = datetime(2026, 12, 1, 9, 0)
PLUS5 = datetime(2026, 12, 1, 14, 0, tzinfo=timezone(timedelta(hours=5)))


def _count(db):
    with db() as s:
        return (s.execute(select(func.count()).select_from(CreditTransaction)).scalar_one(),
                s.execute(select(func.count()).select_from(CreditLot)).scalar_one(),
                s.execute(select(func.count()).select_from(CreditAnomaly)).scalar_one())


def _setup(db, status="reserved"):
    user, job = uuid.uuid4(), uuid.uuid4()
    with db.begin() as s:
        s.add(Job(id=job, user_id=user, job_type="t", status="pending",
                      provider_task_id=f"t-{job}"))  # accepted: the policy's share applies
        credits.grant(s, user, "sub", 100, f"g-{user}", now=T0)
        credits.reserve(s, user, job, 40, now=T0)
    return user, job


def test_a_naive_now_is_refused_by_legacy_import_recharge_repair_and_audit(pg_and_sqlite):
    db = pg_and_sqlite
    user, job = _setup(db)
    before = _count(db)
    with pytest.raises(ValueError):
        with db.begin() as s:
            credits.import_legacy_refund(s, job, 5, "legacy-1", now=NAIVE)
    assert _count(db) == before
    with db.begin() as s:
        credits.refund(s, job, now=T0)
    before = _count(db)
    with pytest.raises(ValueError):
        with db.begin() as s:
            credits.recharge(s, job, 10, now=NAIVE)
    assert _count(db) == before
    with pytest.raises(ValueError):
        with db.begin() as s:
            credits.repair_usage_metadata(s, job, 40, 0, now=NAIVE)
    with pytest.raises(ValueError):
        with db() as s:
            credits.audit(s, now=NAIVE)


@pytest.mark.parametrize("op", ["grant", "commit", "commit_part", "refund", "legacy", "recharge", "reserve"])
def test_an_aware_now_in_another_zone_is_stored_as_its_instant(pg_and_sqlite, op):
    db = pg_and_sqlite
    user, job = _setup(db)
    with db.begin() as s:
        if db.kw["bind"].dialect.name == "postgresql":
            s.execute(text("SET LOCAL TIME ZONE 'America/New_York'"))
        if op == "grant":
            credits.grant(s, user, "topup", 5, "gg-" + str(job), now=PLUS5)
        elif op == "commit":
            credits.commit(s, job, now=PLUS5)
        elif op == "commit_part":
            credits.commit(s, job, 12, now=PLUS5, record={"status": "cancelled", "refund_share": "7/10"})
        elif op == "refund":
            credits.refund(s, job, now=PLUS5)
        elif op == "legacy":
            credits.import_legacy_refund(s, job, 5, "legacy-" + str(job), now=PLUS5)
        elif op == "recharge":
            credits.refund(s, job, now=T0 - timedelta(hours=1))
            credits.recharge(s, job, 10, now=PLUS5)
        elif op == "reserve":
            credits.reserve(s, user, uuid.uuid4(), 5, now=PLUS5)
    with db() as s:
        times = set(s.execute(select(CreditTransaction.created_at).where(
            CreditTransaction.user_id == user)).scalars())
        lots = set(s.execute(select(CreditLot.created_at).where(CreditLot.user_id == user)).scalars())
        bal = s.execute(select(CreditBalance.updated_at).where(CreditBalance.user_id == user)).scalar_one()
    assert times <= {T0, T0 - timedelta(hours=1)}, times
    assert lots <= {T0, T0 - timedelta(hours=1)}, lots
    assert bal == T0, bal


@pytest.mark.parametrize("den", [MAX_SHARE_DENOMINATOR, 999_999_937, 3])
@pytest.mark.parametrize("num_kind", ["one", "big"])
def test_the_policys_own_share_is_exact_at_the_bound_and_the_largest_amounts(pg_and_sqlite, den, num_kind):
    db = pg_and_sqlite
    num = 1 if num_kind == "one" else den - 1
    share = Fraction(num, den)
    policy = SettlementPolicy(cancel_refund=share, failure_refund=share)
    held = 2**62 + 12345
    jobs = {}
    for variant, delta, topup in (("good", 0, 0), ("more", 1, 0), ("less", -1, 0), ("good2", 0, 2**61), ("max", 0, None)):
        user, job = uuid.uuid4(), uuid.uuid4()
        h = held
        with db.begin() as s:
            s.add(Job(id=job, user_id=user, job_type="t", status="pending",
                      provider_task_id=f"t-{job}"))  # accepted: the policy's share applies
            if topup is None:
                h = 2**63 - 1
                credits.grant(s, user, "sub", 2**62, f"g-{user}", now=T0)
                credits.grant(s, user, "topup", 2**62 - 1, f"t-{user}", now=T0)
            else:
                credits.grant(s, user, "sub", held - topup, f"g-{user}", now=T0)
                if topup:
                    credits.grant(s, user, "topup", topup, f"t-{user}", now=T0)
            credits.reserve(s, user, job, h, now=T0)
        kept = decide("cancelled", reserved=h, policy=policy).commit + delta
        with db.begin() as s:
            s.execute(update(Job).where(Job.id == job).values(status="cancelled", completed_at=T0, credits_actual=kept))
            assert credits.commit(s, job, kept, now=T0)  # no record: the policy path
        jobs[variant] = job
    with db() as s:
        found = credits.audit(s, now=T0, policy=policy)
    got = {(d.kind, d.job_id) for d in found}
    assert got == {("failed_job_committed", jobs["more"]), ("failed_job_committed", jobs["less"])}, found


def test_a_policy_share_set_past_its_checks_is_refused_by_the_audit(pg_and_sqlite):
    """``object.__setattr__`` on the frozen policy (likewise an unpickled copy, or a subclass
    skipping ``__post_init__``) puts a 13-digit denominator past the bound. On main the audit
    ran it: PostgreSQL raised ``bigint out of range`` from its SQL, SQLite flagged the correct
    settlement. Now the audit refuses the policy with the construction's own ValueError."""
    db = pg_and_sqlite
    policy = SettlementPolicy(cancel_refund=Fraction(1, 2))
    object.__setattr__(policy, "cancel_refund", Fraction(1, 10**12 + 39))
    held = 2**62 + 12345
    user, job = uuid.uuid4(), uuid.uuid4()
    with db.begin() as s:
        s.add(Job(id=job, user_id=user, job_type="t", status="pending",
                      provider_task_id=f"t-{job}"))  # accepted: the policy's share applies
        credits.grant(s, user, "sub", held, f"g-{user}", now=T0)
        credits.reserve(s, user, job, held, now=T0)
    kept = kept_of(held, policy.cancel_refund)
    with db.begin() as s:
        s.execute(update(Job).where(Job.id == job).values(status="cancelled", completed_at=T0,
                                                          credits_actual=kept))
        assert credits.commit(s, job, kept, now=T0)
    with db() as s:
        with pytest.raises(ValueError, match="denominator above 999,999,999"):
            credits.audit(s, now=T0, policy=policy)
    with db() as s:  # a policy that passed its checks: judged (a commit it does not keep)
        found = credits.audit(s, now=T0, policy=SettlementPolicy(cancel_refund=Fraction(1, 2)))
    assert [(d.kind, d.job_id) for d in found] == [("failed_job_committed", job)]
