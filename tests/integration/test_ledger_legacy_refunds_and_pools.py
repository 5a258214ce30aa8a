"""The ledger against a platform's legacy refunds, stale balance copies, pool order on a commit
for less, unusable usage metadata and prefixed refund ids, on real PostgreSQL (each failed on
the ledger before its fix)."""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import select, text, update
from sqlalchemy.orm import Session, sessionmaker

from reconcile import credits
from reconcile.db.models import (
    CreditAnomaly,
    CreditBalance,
    CreditLot,
    CreditTransaction,
    Job,
    UsageLog,
)
from reconcile.errors import BadUsageMetadata, LegacyRefundRefused
from tests.integration.harness import balance


def _job(s: Session, user: uuid.UUID, status: str = "pending") -> uuid.UUID:
    jid = uuid.uuid4()
    s.add(Job(id=jid, user_id=user, job_type="image", status=status))
    s.flush()
    return jid


def _funded(db: sessionmaker[Session], sub: int, topup: int = 0) -> uuid.UUID:
    user = uuid.uuid4()
    with db.begin() as s:
        if sub:
            credits.grant(s, user, "sub", sub, f"g-sub-{user}")
        if topup:
            credits.grant(s, user, "topup", topup, f"g-topup-{user}")
    return user


def _reserved(db: sessionmaker[Session], user: uuid.UUID, amount: int) -> uuid.UUID:
    with db.begin() as s:
        jid = _job(s, user)
        credits.reserve(s, user, jid, amount)
    return jid


def _audit(db: sessionmaker[Session]) -> list[credits.Discrepancy]:
    with db() as s:
        return credits.audit(s)


def _txns(db: sessionmaker[Session], job: uuid.UUID) -> dict[str, tuple[str, int, int]]:
    with db() as s:
        return {t.id: (t.type, t.from_sub, t.from_topup) for t in s.execute(
            select(CreditTransaction).where(CreditTransaction.job_id == job)).scalars()}


# ----------------------------------------------------------------------------- hole 3


def test_legacy_refund_after_the_librarys_refund_is_refused_and_writes_nothing(
    db: sessionmaker[Session],
) -> None:
    """Hole 3a: the library refunded 40 of 100 → 100; a legacy refund of 40 after that would make
    it 140. It is refused (legacy_refund_after_refund) and nothing changes."""
    user = _funded(db, 100)
    job = _reserved(db, user, 40)
    with db.begin() as s:
        assert credits.refund(s, job) is True
    with pytest.raises(LegacyRefundRefused) as err, db.begin() as s:
        credits.import_legacy_refund(s, job, 40, "platform-refund-1")
    assert err.value.reason == "legacy_refund_after_refund"
    assert balance(db, user) == (100, 0)
    assert "platform-refund-1" not in _txns(db, job)
    assert _audit(db) == []


def test_legacy_refund_after_a_commit_is_refused(db: sessionmaker[Session]) -> None:
    """Hole 3b: a completed (committed) job cannot be made free by a legacy refund."""
    user = _funded(db, 100)
    job = _reserved(db, user, 40)
    with db.begin() as s:
        assert credits.commit(s, job) is True
    with pytest.raises(LegacyRefundRefused) as err, db.begin() as s:
        credits.import_legacy_refund(s, job, 40, "platform-refund-2")
    assert err.value.reason == "legacy_refund_after_commit"
    assert balance(db, user) == (60, 0)
    assert _audit(db) == []


def test_legacy_refund_above_what_is_still_held_is_refused(db: sessionmaker[Session]) -> None:
    """Hole 3c: 100 on a 40 reservation is refused; so is 30 after a legacy 15 (only 25 held)."""
    user = _funded(db, 100)
    job = _reserved(db, user, 40)
    with pytest.raises(LegacyRefundRefused) as err, db.begin() as s:
        credits.import_legacy_refund(s, job, 100, "platform-refund-3")
    assert err.value.reason == "legacy_refund_exceeds_held"
    with db.begin() as s:
        assert credits.import_legacy_refund(s, job, 15, "platform-refund-4") is True
    with pytest.raises(LegacyRefundRefused), db.begin() as s:
        credits.import_legacy_refund(s, job, 30, "platform-refund-5")
    with db.begin() as s:  # the same import again is an idempotent no-op
        assert credits.import_legacy_refund(s, job, 15, "platform-refund-4") is False
        assert credits.import_legacy_refund(s, job, 25, "platform-refund-6") is True
    assert balance(db, user) == (100, 0)
    with db.begin() as s:  # everything went back: the library's refund adds nothing
        assert credits.refund(s, job) is True
    assert balance(db, user) == (100, 0)
    assert _audit(db) == []


# ----------------------------------------------------------------------------- hole 4


def test_lock_balance_yields_current_values_to_a_session_that_holds_a_stale_copy(
    pg_engine: object, db: sessionmaker[Session],
) -> None:
    """Hole 4a: reserves of 40 and 30 on 100 in one transaction leave 30, even when one of the
    two sessions sharing the transaction had read the balance before the other reserved."""
    user = _funded(db, 100)
    with db.kw["bind"].connect() as conn, conn.begin():
        platform, library = Session(bind=conn), Session(bind=conn)
        stale = library.get(CreditBalance, user)  # a read, kept by the session
        assert stale is not None and stale.sub == 100
        credits.reserve(platform, user, _job(platform, user), 40)
        platform.flush()
        credits.reserve(library, user, _job(library, user), 30)
        library.flush()
    assert balance(db, user) == (30, 0)
    assert _audit(db) == []


def test_read_then_concurrent_reserve_then_grant_gives_the_right_total(
    db: sessionmaker[Session],
) -> None:
    """Hole 4b: a session reads the balance (100) and commits; another reserves 35; the first
    then grants 40: 105, not 140."""
    user = _funded(db, 100)
    reader = db()
    with reader.begin():
        seen = reader.get(CreditBalance, user)
        assert seen is not None and seen.sub == 100
    _reserved(db, user, 35)
    with reader.begin():
        credits.grant(reader, user, "sub", 40, f"late-grant-{user}")
    reader.close()
    assert balance(db, user) == (105, 0)
    assert _audit(db) == []


# ----------------------------------------------------------------------------- hole 5


def test_commit_for_less_takes_sub_first_and_releases_topup_to_its_own_lot(
    db: sessionmaker[Session],
) -> None:
    """Hole 5a: reserve 1 sub + 1 topup, commit 1: COMMIT names sub 1, RELEASE names topup 1,
    and a topup lot gets it back."""
    user = _funded(db, 1, 1)
    job = _reserved(db, user, 2)
    with db.begin() as s:
        assert credits.commit(s, job, 1) is True
    rows = _txns(db, job)
    assert rows[f"job-commit:{job}"] == ("COMMIT", 1, 0)
    assert rows[f"job-release:{job}"] == ("RELEASE", 0, 1)
    with db() as s:
        lots = {lot.source_txn_id: (lot.pool, lot.amount) for lot in s.execute(
            select(CreditLot).where(CreditLot.kind == "RELEASE")).scalars()}
    assert lots == {f"job-release:{job}:topup": ("topup", 1)}
    assert balance(db, user) == (0, 1)
    assert _audit(db) == []


def test_legacy_refund_then_library_refund_restores_each_pool(db: sessionmaker[Session]) -> None:
    """Hole 5b: pools (1, 2) reserved whole, a legacy refund of 1, then the library's refund:
    the pools are (1, 2) again, not (2, 1)."""
    user = _funded(db, 1, 2)
    job = _reserved(db, user, 3)
    with db.begin() as s:
        assert credits.import_legacy_refund(s, job, 1, "platform-partial") is True
    with db.begin() as s:
        assert credits.refund(s, job) is True
    assert balance(db, user) == (1, 2)
    rows = _txns(db, job)
    assert rows["platform-partial"] == ("REFUND", 0, 1)
    assert rows[f"job-refund:{job}"] == ("REFUND", 1, 1)
    assert _audit(db) == []


def test_legacy_refund_then_commit_moves_pools_like_a_commit_for_less(
    db: sessionmaker[Session],
) -> None:
    """A legacy refund of 1 on (1 sub, 1 topup), then a commit of the rest: sub paid, topup back."""
    user = _funded(db, 1, 1)
    job = _reserved(db, user, 2)
    with db.begin() as s:
        credits.import_legacy_refund(s, job, 1, "platform-partial-2")
        assert credits.commit(s, job) is True
    assert _txns(db, job)[f"job-commit:{job}"] == ("COMMIT", 1, 0)
    assert balance(db, user) == (0, 1)
    assert _audit(db) == []


# ----------------------------------------------------------------------------- hole 9


@pytest.mark.parametrize("metadata", ['"{\\"from_sub\\": 40, \\"from_topup\\": 0}"', '"garbage"',
                                      "[40, 0]", "40", "null"])
def test_refund_survives_non_object_usage_metadata_with_one_anomaly(
    db: sessionmaker[Session], metadata: str,
) -> None:
    """Hole 9: a platform rewrote usage_logs.metadata as a JSON string, a list, a number or
    null. The refund still settles (the pools come from the ledger's own USAGE row) and records
    one bad_usage_metadata anomaly; a second settlement attempt is a plain no-op."""
    user = _funded(db, 30, 10)
    job = _reserved(db, user, 40)
    with db.begin() as s:
        s.execute(text("UPDATE usage_logs SET metadata = CAST(:m AS jsonb) WHERE job_id = :j"),
                  {"m": metadata, "j": job})
    with db.begin() as s:
        assert credits.refund(s, job) is True
    with db.begin() as s:
        assert credits.refund(s, job) is False
    assert balance(db, user) == (30, 10)
    with db() as s:
        kinds = list(s.execute(select(CreditAnomaly.kind).where(CreditAnomaly.job_id == job)).scalars())
    assert kinds == ["bad_usage_metadata"]
    assert _audit(db) == []


def test_platform_reservation_with_unusable_metadata_is_refused_clearly_and_repairable(
    db: sessionmaker[Session],
) -> None:
    """Hole 9, a platform's own reservation (no USAGE row) whose metadata is a list: the refund
    raises BadUsageMetadata (a LedgerError with reason bad_usage_metadata, never AttributeError)
    and writes nothing; `repair-usage-metadata` sets the pools and the refund then settles."""
    from click.testing import CliRunner

    from reconcile.cli import main

    user = uuid.uuid4()
    with db.begin() as s:
        job = _job(s, user, status="failed")
        s.add(UsageLog(id=uuid.uuid4(), job_id=job, user_id=user, status="reserved", credits=40,
                       metadata_=[40, 0]))
    with pytest.raises(BadUsageMetadata) as err, db.begin() as s:
        credits.refund(s, job)
    assert err.value.reason == "bad_usage_metadata"
    with db() as s:
        assert s.execute(select(UsageLog.status).where(UsageLog.job_id == job)).scalar_one() == "reserved"
        assert s.get(CreditTransaction, f"job-refund:{job}") is None
    url = db.kw["bind"].url.render_as_string(hide_password=False)
    bad = CliRunner().invoke(main, ["--database-url", url, "repair-usage-metadata", str(job),
                                    "--from-sub", "30", "--from-topup", "5"])
    assert bad.exit_code == 2  # 35 ≠ 40: refused
    ok = CliRunner().invoke(main, ["--database-url", url, "repair-usage-metadata", str(job),
                                   "--from-sub", "30", "--from-topup", "10"])
    assert ok.exit_code == 0, ok.output
    with db.begin() as s:
        assert credits.refund(s, job) is True
    assert balance(db, user) == (30, 10)


# ----------------------------------------------------------------------------- hole 10


@pytest.mark.parametrize("prefix", ["job-refund:{job}:v1", "job-refund:{job}", "job-commit:x",
                                    "job-release:{job}", "job-usage:{job}", "job-recharge:{job}"])
def test_legacy_refund_ids_under_the_librarys_prefixes_are_refused(
    db: sessionmaker[Session], prefix: str,
) -> None:
    """Hole 10: an import under `job-refund:{job}:v1` (or any library prefix) is refused."""
    user = _funded(db, 100)
    job = _reserved(db, user, 40)
    with pytest.raises(LegacyRefundRefused) as err, db.begin() as s:
        credits.import_legacy_refund(s, job, 10, prefix.format(job=job))
    assert err.value.reason == "legacy_refund_reserved_id"
    assert balance(db, user) == (60, 0)


def test_ledger_and_audit_count_a_prefixed_legacy_refund_the_same_way(
    db: sessionmaker[Session],
) -> None:
    """Hole 10: a platform row written directly as `job-refund:{job}:v1` is a legacy refund for
    both the ledger and the audit: no false unbalanced / reserved_but_settled / settled_twice."""
    user = _funded(db, 100)
    job = _reserved(db, user, 40)
    with db.begin() as s:  # what an old platform wrote itself, lot and balance included
        s.add(CreditTransaction(id=f"job-refund:{job}:v1", user_id=user, job_id=job, type="REFUND",
                                amount=15, from_sub=15, from_topup=0))
        s.add(CreditLot(user_id=user, pool="sub", kind="REFUND", source_txn_id=f"job-refund:{job}:v1:sub",
                        amount=15, remaining_amount=15))
        s.execute(update(CreditBalance).where(CreditBalance.user_id == user)
                  .values(sub=CreditBalance.sub + 15))
    assert _audit(db) == []
    with db.begin() as s:
        assert credits.refund(s, job) is True
        assert s.get(CreditTransaction, f"job-refund:{job}").amount == 25
    assert balance(db, user) == (100, 0)
    assert _audit(db) == []


# ----------------------------------------------------------------------------- re-charge


def test_recharge_after_refund_is_a_usage_commit_pair_the_audit_counts(
    db: sessionmaker[Session],
) -> None:
    """A job completed after its refund: completed_after_refund until re-charged; the re-charge
    takes the credits again (sub first), sets credits_actual, and is idempotent."""
    user = _funded(db, 30, 30)
    job = _reserved(db, user, 40)
    with db.begin() as s:
        credits.refund(s, job)
        s.execute(update(Job).where(Job.id == job).values(status="failed", credits_actual=0))
    with db.begin() as s:  # an outside completion
        s.execute(update(Job).where(Job.id == job).values(status="completed"))
    assert [d.kind for d in _audit(db)] == ["completed_after_refund"]
    with db.begin() as s:
        assert credits.recharge(s, job, 40) is True
    with db.begin() as s:
        assert credits.recharge(s, job, 40) is False
        assert credits.settled_amount(s, job) == 40
        assert s.get(Job, job).credits_actual == 40
    rows = _txns(db, job)
    assert rows[f"job-recharge:{job}:usage"] == ("USAGE", 30, 10)
    assert rows[f"job-recharge:{job}:commit"] == ("COMMIT", 30, 10)
    assert balance(db, user) == (0, 20)
    assert _audit(db) == []
