"""The audit proves conservation (issue 11): one corruption per class, written directly in SQL,
is reported by ``credits.audit`` and makes ``reconcile audit`` exit 1; the incremental mode."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest
from click.testing import CliRunner
from sqlalchemy import delete, select, update
from sqlalchemy.orm import Session, sessionmaker

from reconcile import Settings, credits
from reconcile.cli import main
from reconcile.db.models import CreditBalance, CreditLot, CreditTransaction, Job, UsageLog

Corruption = Callable[[sessionmaker[Session]], None]


def _now() -> datetime:
    return datetime.now(UTC)


def _user(s: Session, sub: int = 100, topup: int = 0) -> uuid.UUID:
    user = uuid.uuid4()
    if sub:
        credits.grant(s, user, "sub", sub, f"g-sub-{user}")
    if topup:
        credits.grant(s, user, "topup", topup, f"g-topup-{user}")
    return user


def _job(s: Session, user: uuid.UUID, amount: int = 40, **columns: object) -> uuid.UUID:
    jid = uuid.uuid4()
    columns.setdefault("status", "processing")
    s.add(Job(id=jid, user_id=user, job_type="image", **columns))
    s.flush()
    credits.reserve(s, user, jid, amount)
    return jid


def _kinds(db: sessionmaker[Session], **kwargs: object) -> set[str]:
    with db() as s:
        return {d.kind for d in credits.audit(s, **kwargs)}  # type: ignore[arg-type]


def _take_from_lot(s: Session, user: uuid.UUID, n: int) -> None:
    """Credits leave a lot (and the balance, so balance = lots still holds) with no transaction."""
    lot = s.execute(select(CreditLot).where(CreditLot.user_id == user, CreditLot.pool == "sub",
                                            CreditLot.remaining_amount >= n)).scalars().first()
    assert lot is not None
    lot.remaining_amount -= n
    s.execute(update(CreditBalance).where(CreditBalance.user_id == user)
              .values(sub=CreditBalance.sub - n))


# ----------------------------------------------------------------------------- the corruptions


def commit_above_reservation(db: sessionmaker[Session]) -> None:
    with db.begin() as s:
        user = _user(s)
        job = _job(s, user, 40)
        credits.commit(s, job)
    with db.begin() as s:
        s.execute(update(CreditTransaction).where(CreditTransaction.id == f"job-commit:{job}")
                  .values(amount=50, from_sub=50))
        _take_from_lot(s, user, 10)


def failed_job_committed(db: sessionmaker[Session]) -> None:
    with db.begin() as s:
        job = _job(s, _user(s))
        credits.commit(s, job)
    with db.begin() as s:
        s.execute(update(Job).where(Job.id == job).values(status="failed", completed_at=_now()))


def cancelled_job_committed(db: sessionmaker[Session]) -> None:
    with db.begin() as s:
        job = _job(s, _user(s))
        credits.commit(s, job)
    with db.begin() as s:
        s.execute(update(Job).where(Job.id == job).values(status="cancelled", completed_at=_now()))


def completed_after_refund(db: sessionmaker[Session]) -> None:
    with db.begin() as s:
        job = _job(s, _user(s))
        credits.refund(s, job)
    with db.begin() as s:
        s.execute(update(Job).where(Job.id == job).values(status="completed", completed_at=_now()))


def credits_actual_wrong(db: sessionmaker[Session]) -> None:
    with db.begin() as s:
        job = _job(s, _user(s))
        credits.commit(s, job)
        s.execute(update(Job).where(Job.id == job)
                  .values(status="completed", completed_at=_now(), credits_actual=40))
    with db.begin() as s:
        s.execute(update(Job).where(Job.id == job).values(credits_actual=25))


def refund_without_reservation_with_lot(db: sessionmaker[Session]) -> None:
    with db.begin() as s:
        user = _user(s)
    ghost = uuid.uuid4()
    with db.begin() as s:
        s.add(CreditTransaction(id=f"job-refund:{ghost}", user_id=user, job_id=ghost, type="REFUND",
                                amount=10, from_sub=10, from_topup=0))
        s.add(CreditLot(user_id=user, pool="sub", kind="REFUND", source_txn_id=f"job-refund:{ghost}:sub",
                        amount=10, remaining_amount=10))
        s.execute(update(CreditBalance).where(CreditBalance.user_id == user)
                  .values(sub=CreditBalance.sub + 10))


def refund_without_reservation_no_lot(db: sessionmaker[Session]) -> None:
    with db.begin() as s:
        user = _user(s)
    ghost = uuid.uuid4()
    with db.begin() as s:
        s.add(CreditTransaction(id=f"job-refund:{ghost}", user_id=user, job_id=ghost, type="REFUND",
                                amount=10, from_sub=10, from_topup=0))


def negative_lot(db: sessionmaker[Session]) -> None:
    with db.begin() as s:
        user = _user(s)
        _job(s, user, 40)
    with db.begin() as s:
        s.execute(update(CreditLot).where(CreditLot.user_id == user).values(remaining_amount=-5))
        s.execute(update(CreditBalance).where(CreditBalance.user_id == user).values(sub=-5))


def balance_row_missing(db: sessionmaker[Session]) -> None:
    with db.begin() as s:
        user = _user(s)
        _job(s, user, 40)
    with db.begin() as s:
        s.execute(delete(CreditBalance).where(CreditBalance.user_id == user))


def two_reserved_logs(db: sessionmaker[Session]) -> None:
    with db.begin() as s:
        user = _user(s)
        job = _job(s, user, 40)
    with db.begin() as s:
        s.add(UsageLog(id=uuid.uuid4(), job_id=job, user_id=user, status="reserved", credits=40,
                       metadata_={"from_sub": 40, "from_topup": 0}))


def usage_amount_differs(db: sessionmaker[Session]) -> None:
    with db.begin() as s:
        job = _job(s, _user(s), 40)
    with db.begin() as s:
        s.execute(update(UsageLog).where(UsageLog.job_id == job).values(credits=50))


def release_lot_differs(db: sessionmaker[Session]) -> None:
    with db.begin() as s:
        user = _user(s)
        job = _job(s, user, 40)
        credits.commit(s, job, 10)
    with db.begin() as s:  # the RELEASE says 30, the lot got 20 (balance kept equal to the lots)
        s.execute(update(CreditLot).where(CreditLot.source_txn_id == f"job-release:{job}:sub")
                  .values(amount=20, remaining_amount=20))
        s.execute(update(CreditBalance).where(CreditBalance.user_id == user)
                  .values(sub=CreditBalance.sub - 10))


def pools_swapped(db: sessionmaker[Session]) -> None:
    with db.begin() as s:
        user = _user(s, 1, 1)
        job = _job(s, user, 2)
        credits.commit(s, job, 1)
    with db.begin() as s:  # the COMMIT claims topup paid: totals still add up, pools do not
        s.execute(update(CreditTransaction).where(CreditTransaction.id == f"job-commit:{job}")
                  .values(from_sub=0, from_topup=1))


def in_flight_past_horizon(db: sessionmaker[Session]) -> None:
    started = _now() - timedelta(hours=3)  # kie-standard: 10 min + 18 × 5 min < 3 h
    with db.begin() as s:
        _job(s, _user(s), 40, provider_kind="kie-standard", submission_state="accepted",
             provider_task_id="t-1", provider_call_started_at=started, created_at=started,
             reconcile_attempts=4, reconcile_last_attempt_at=started + timedelta(minutes=30))


CLASSES: dict[str, tuple[str, Corruption]] = {
    "commit_above_reservation": ("commit_exceeds_reservation", commit_above_reservation),
    "failed_job_committed": ("failed_job_committed", failed_job_committed),
    "cancelled_job_committed": ("failed_job_committed", cancelled_job_committed),
    "completed_after_refund": ("completed_after_refund", completed_after_refund),
    "credits_actual_wrong": ("credits_actual_mismatch", credits_actual_wrong),
    "refund_without_reservation_with_lot": ("refund_without_reservation",
                                            refund_without_reservation_with_lot),
    "refund_without_reservation_no_lot": ("refund_without_reservation",
                                          refund_without_reservation_no_lot),
    "negative_lot": ("negative_lot", negative_lot),
    "balance_row_missing": ("balance_missing", balance_row_missing),
    "two_reserved_logs": ("duplicate_reserved_log", two_reserved_logs),
    "usage_amount_differs": ("usage_amount_mismatch", usage_amount_differs),
    "release_lot_differs": ("release_lot_mismatch", release_lot_differs),
    "pools_swapped": ("pool_mismatch", pools_swapped),
    "in_flight_past_horizon": ("in_flight_past_horizon", in_flight_past_horizon),
}


@pytest.mark.parametrize("name", list(CLASSES))
def test_audit_reports_each_class_of_corruption(db: sessionmaker[Session], name: str) -> None:
    """Given a ledger the audit finds clean, when one corruption is written directly, then the
    audit reports its class (and a clean ledger stays clean before it)."""
    kind, corrupt = CLASSES[name]
    with db.begin() as s:  # an unrelated, healthy user with a settled job
        other = _user(s, 50, 50)
        credits.commit(s, _job(s, other, 60, status="completed"), 30)
    assert _kinds(db) == set()
    corrupt(db)
    assert kind in _kinds(db)


@pytest.mark.parametrize("name", list(CLASSES))
def test_cli_audit_exits_one_on_each_class(db: sessionmaker[Session], name: str) -> None:
    """`reconcile audit --json` exits 1 and names the class; `--since 1h` sees it too."""
    kind, corrupt = CLASSES[name]
    url = db.kw["bind"].url.render_as_string(hide_password=False)
    assert CliRunner().invoke(main, ["--database-url", url, "audit"]).exit_code == 0
    corrupt(db)
    result = CliRunner().invoke(main, ["--database-url", url, "audit", "--json"])
    assert result.exit_code == 1, result.output
    assert kind in {d["kind"] for d in json.loads(result.stdout)}
    recent = CliRunner().invoke(main, ["--database-url", url, "audit", "--since", "1h", "--json"])
    assert recent.exit_code == 1 and kind in {d["kind"] for d in json.loads(recent.stdout)}


# ----------------------------------------------------------------------------- classes in detail


def test_audit_finds_the_hole_3_money_creation_the_old_audit_missed(db: sessionmaker[Session]) -> None:
    """A legacy refund written after the library's refund (what hole 3 let through) breaks the
    per-job identity USAGE = COMMIT + RELEASE + REFUND."""
    with db.begin() as s:
        user = _user(s)
        job = _job(s, user, 40)
        credits.refund(s, job)
    with db.begin() as s:
        s.add(CreditTransaction(id="platform-refund", user_id=user, job_id=job, type="REFUND",
                                amount=40, from_sub=40, from_topup=0))
        s.add(CreditLot(user_id=user, pool="sub", kind="REFUND", source_txn_id="platform-refund:sub",
                        amount=40, remaining_amount=40))
        s.execute(update(CreditBalance).where(CreditBalance.user_id == user)
                  .values(sub=CreditBalance.sub + 40))
    assert {"job_unbalanced", "unbalanced"} <= _kinds(db)


def test_horizon_excepts_uncertain_and_observe_only_and_counts_attempts(
    db: sessionmaker[Session],
) -> None:
    """An uncertain job and an observe-only kind are never past their horizon; a job whose
    attempts are spent (hole 2: 39 of 18) is, even with a recent attempt; a job with attempts
    left and a recent attempt is not."""
    started = _now() - timedelta(hours=3)
    recent = _now() - timedelta(minutes=2)
    common = {"provider_call_started_at": started, "created_at": started, "provider_task_id": "t"}
    with db.begin() as s:
        user = _user(s, 1000)
        _job(s, user, 10, provider_kind="kie-standard", submission_state="uncertain",
             **{**common, "provider_task_id": None, "status": "pending"})
        _job(s, user, 10, provider_kind="kie-veo", submission_state="accepted", **common)
        spent = _job(s, user, 10, provider_kind="kie-standard", submission_state="accepted",
                     reconcile_attempts=39, reconcile_last_attempt_at=recent, **common)
        _job(s, user, 10, provider_kind="kie-standard", submission_state="accepted",
             reconcile_attempts=10, reconcile_last_attempt_at=recent, **common)
    with db() as s:
        found = credits.audit(s, settings=Settings.model_construct(observe_only_kinds=["kie-veo"]))
    assert [(d.kind, d.job_id) for d in found] == [("in_flight_past_horizon", spent)]


def test_incremental_audit_checks_touched_users_and_cannot_see_an_untouched_lot(
    db: sessionmaker[Session],
) -> None:
    """`since` checks what was touched after the watermark; a lot changed in place for a user
    untouched since then is invisible to it, which is why the full audit stays the proof."""
    old = _now() - timedelta(hours=2)
    with db.begin() as s:
        quiet = uuid.uuid4()
        credits.grant(s, quiet, "sub", 100, "g-quiet", now=old)
    watermark = _now() - timedelta(minutes=30)
    with db.begin() as s:
        busy = _user(s)
        job = _job(s, busy, 40)
    with db.begin() as s:
        s.execute(update(UsageLog).where(UsageLog.job_id == job).values(credits=41))
        s.execute(update(CreditLot).where(CreditLot.user_id == quiet).values(remaining_amount=90))
    with db() as s:
        incremental = {(d.kind, d.user_id) for d in credits.audit(s, since=watermark)}
        full = {(d.kind, d.user_id) for d in credits.audit(s)}
    assert ("usage_amount_mismatch", busy) in incremental
    assert not any(user == quiet for _, user in incremental)
    assert ("balance_mismatch", quiet) in full and ("lot_consumption_mismatch", quiet) in full


def test_cli_since_accepts_a_timestamp_or_a_duration_and_refuses_garbage(
    db: sessionmaker[Session],
) -> None:
    """--since 15m, --since <ISO time> → 0 on a clean ledger; --since soon → exit 2."""
    url = db.kw["bind"].url.render_as_string(hide_password=False)
    with db.begin() as s:
        _job(s, _user(s), 40)
    run = CliRunner().invoke
    assert run(main, ["--database-url", url, "audit", "--since", "15m"]).exit_code == 0
    stamp = (_now() - timedelta(hours=1)).isoformat()
    assert run(main, ["--database-url", url, "audit", "--since", stamp]).exit_code == 0
    assert run(main, ["--database-url", url, "audit", "--since", "soon"]).exit_code == 2


def test_audit_runs_on_the_embedded_sqlite_default(tmp_path: object) -> None:
    """The same SQL checks on SQLite (the embedded default the demo can use): clean after real
    operations, and a corrupted log and an outside completion after a refund are found."""
    from pathlib import Path

    from reconcile.db.migrate import upgrade
    from reconcile.db.session import make_engine, make_sessionmaker

    url = f"sqlite:///{Path(str(tmp_path)) / 'ledger.db'}"
    upgrade(url)
    engine = make_engine(url)
    db = make_sessionmaker(engine)
    with db.begin() as s:
        user = _user(s, 5, 5)
        jobs = [_job(s, user, 2) for _ in range(4)]
        credits.commit(s, jobs[0], 1)
        credits.refund(s, jobs[1])
        credits.import_legacy_refund(s, jobs[2], 1, "platform-refund")
        credits.commit(s, jobs[2])
    assert _kinds(db) == set() and _kinds(db, since=_now() - timedelta(hours=1)) == set()
    with db.begin() as s:
        s.execute(update(UsageLog).where(UsageLog.job_id == jobs[3]).values(credits=3))
        s.execute(update(Job).where(Job.id == jobs[1]).values(status="completed"))
    assert _kinds(db) == {"usage_amount_mismatch", "completed_after_refund"}
    engine.dispose()
