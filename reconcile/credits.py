"""The credit ledger: reserve → commit (optionally for less) or refund, exact and idempotent.

* A balance row per user holds one balance per pool (``sub``, ``topup``); it is locked
  (``SELECT … FOR UPDATE``; on SQLite the ``BEGIN IMMEDIATE`` write lock) by every operation
  that moves credits, always first, so concurrent writers serialise on it and never deadlock.
* Credits live in lots whose ``remaining_amount`` is consumed oldest first. A reservation drains
  the ``sub`` pool before ``topup`` (subscription credits are spent first), FIFO within a pool,
  and records ``from_sub``/``from_topup`` in ``usage_logs.metadata``.
* Every movement is an append-only transaction with a deterministic id: ``job-usage:{job}``,
  ``job-commit:{job}``, ``job-release:{job}``, ``job-refund:{job}``; grants carry the caller's id.
  Repeating an operation is a no-op that returns False.
* Legacy refunds (REFUND transactions for the job under other ids, partial ones included) count
  toward what is already refunded: a legacy refund ``p`` on a reservation ``a`` still ``reserved``
  shrinks what it holds to ``a − p``.
* Released credits and refunds return to the reservation's pools pro rata to
  ``from_sub``/``from_topup``, the rounding remainder to ``sub``.

Credits are integers. Each function runs inside the caller's transaction and never commits.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from .db.models import CreditBalance, CreditLot, CreditTransaction, Job, UsageLog
from .errors import InsufficientCredits, InvalidParam, LedgerError

POOLS = ("sub", "topup")
TERMINAL_JOB_STATUSES = ("completed", "failed", "cancelled")
LOT_PAGE = 32  # lots locked per FIFO page in reserve


def usage_txn_id(job_id: uuid.UUID) -> str:
    return f"job-usage:{job_id}"


def commit_txn_id(job_id: uuid.UUID) -> str:
    return f"job-commit:{job_id}"


def release_txn_id(job_id: uuid.UUID) -> str:
    return f"job-release:{job_id}"


def refund_txn_id(job_id: uuid.UUID) -> str:
    return f"job-refund:{job_id}"


@dataclass(frozen=True)
class Reservation:
    usage_log_id: uuid.UUID
    job_id: uuid.UUID
    user_id: uuid.UUID
    amount: int
    from_sub: int
    from_topup: int


def _now(now: datetime | None) -> datetime:
    return now or datetime.now(UTC)


def _check_amount(amount: Any, param: str = "credits") -> int:
    if isinstance(amount, bool) or not isinstance(amount, int):
        raise InvalidParam(f"{param} must be an integer number of credits", param=param)
    if amount <= 0:
        raise InvalidParam(f"{param} must be greater than zero", param=param)
    return amount


def split_pro_rata(amount: int, from_sub: int, from_topup: int) -> tuple[int, int]:
    """``amount`` split between (sub, topup) in the ratio of the reservation; remainder to sub."""
    total = from_sub + from_topup
    if total <= 0:
        return amount, 0
    topup = amount * from_topup // total
    return amount - topup, topup


def lock_balance(session: Session, user_id: uuid.UUID) -> CreditBalance:
    """The user's balance row, created if absent, locked for this transaction."""
    stmt = select(CreditBalance).where(CreditBalance.user_id == user_id).with_for_update()
    row = session.execute(stmt).scalar_one_or_none()
    if row is not None:
        return row
    dialect = session.get_bind().dialect.name
    if dialect == "postgresql":
        from sqlalchemy.dialects.postgresql import insert
    else:
        from sqlalchemy.dialects.sqlite import insert  # type: ignore[assignment]
    session.execute(insert(CreditBalance).values(user_id=user_id, sub=0, topup=0)
                    .on_conflict_do_nothing(index_elements=["user_id"]))
    return session.execute(stmt).scalar_one()


def _txn_exists(session: Session, txn_id: str) -> bool:
    return session.get(CreditTransaction, txn_id) is not None


def _add_lot(session: Session, user_id: uuid.UUID, pool: str, kind: str, txn_id: str, amount: int,
             now: datetime) -> None:
    session.add(CreditLot(user_id=user_id, pool=pool, kind=kind, source_txn_id=txn_id,
                          amount=amount, remaining_amount=amount, created_at=now))


def _return_to_pools(session: Session, balance: CreditBalance, *, kind: str, txn_id: str,
                     parts: tuple[int, int], now: datetime) -> None:
    """New lots (one per pool that gets something back) and the balance increments."""
    for pool, part in zip(POOLS, parts, strict=True):
        if part > 0:
            _add_lot(session, balance.user_id, pool, kind, f"{txn_id}:{pool}", part, now)
    balance.sub += parts[0]
    balance.topup += parts[1]
    balance.updated_at = now


def grant(session: Session, user_id: uuid.UUID, pool: str, amount: int, txn_id: str, *,
          now: datetime | None = None) -> bool:
    """Add ``amount`` credits to ``pool`` as a new lot. Idempotent on ``txn_id``."""
    if pool not in POOLS:
        raise InvalidParam(f"pool must be one of {POOLS}", param="pool")
    _check_amount(amount, "amount")
    now = _now(now)
    balance = lock_balance(session, user_id)
    if _txn_exists(session, txn_id):
        return False
    session.add(CreditTransaction(id=txn_id, user_id=user_id, type="GRANT", amount=amount,
                                  from_sub=amount if pool == "sub" else 0,
                                  from_topup=amount if pool == "topup" else 0, created_at=now))
    _add_lot(session, user_id, pool, "GRANT", txn_id, amount, now)
    if pool == "sub":
        balance.sub += amount
    else:
        balance.topup += amount
    balance.updated_at = now
    session.flush()
    return True


def reserve(session: Session, user_id: uuid.UUID, job_id: uuid.UUID, amount: int, *,
            now: datetime | None = None) -> Reservation:
    """Hold ``amount`` credits for ``job_id`` (in the caller's job-insert transaction).

    Raises :class:`InsufficientCredits` (nothing changed) when the balance is too low. A
    second call for the same job returns the first reservation.
    """
    _check_amount(amount)
    now = _now(now)
    balance = lock_balance(session, user_id)
    if _txn_exists(session, usage_txn_id(job_id)):
        log = session.execute(select(UsageLog).where(UsageLog.job_id == job_id)
                              .order_by(UsageLog.created_at)).scalars().first()
        if log is None:
            raise LedgerError(f"job {job_id} has a usage transaction but no usage log")
        meta = log.metadata_ or {}
        return Reservation(log.id, job_id, user_id, log.credits, int(meta.get("from_sub", 0)),
                           int(meta.get("from_topup", 0)))
    if balance.sub + balance.topup < amount:
        raise InsufficientCredits(
            f"balance {balance.sub + balance.topup} is lower than the {amount} credits needed")
    taken = {"sub": 0, "topup": 0}
    left = amount
    for pool in POOLS:
        after = 0
        while left:
            # oldest first, a page at a time: never lock or load every open lot of a user
            # whose history left thousands of small REFUND/RELEASE lots
            lots = list(session.execute(
                select(CreditLot)
                .where(CreditLot.user_id == user_id, CreditLot.pool == pool,
                       CreditLot.remaining_amount > 0, CreditLot.id > after)
                .order_by(CreditLot.id)
                .limit(LOT_PAGE)
                .with_for_update()
            ).scalars())
            for lot in lots:
                take = min(lot.remaining_amount, left)
                lot.remaining_amount -= take
                taken[pool] += take
                left -= take
                after = lot.id
                if left == 0:
                    break
            if len(lots) < LOT_PAGE:
                break
    if left:
        raise LedgerError(f"user {user_id}: balance row and lots disagree ({left} missing)")
    balance.sub -= taken["sub"]
    balance.topup -= taken["topup"]
    balance.updated_at = now
    log_id = uuid.uuid4()
    session.add(UsageLog(id=log_id, job_id=job_id, user_id=user_id, status="reserved",
                         credits=amount, created_at=now,
                         metadata_={"from_sub": taken["sub"], "from_topup": taken["topup"]}))
    session.add(CreditTransaction(id=usage_txn_id(job_id), user_id=user_id, job_id=job_id,
                                  type="USAGE", amount=amount, from_sub=taken["sub"],
                                  from_topup=taken["topup"], created_at=now))
    session.flush()
    return Reservation(log_id, job_id, user_id, amount, taken["sub"], taken["topup"])


def legacy_refunded(session: Session, job_id: uuid.UUID) -> int:
    """What legacy REFUND transactions (ids other than ``job-refund:{job}``) gave back."""
    total = session.execute(
        select(func.coalesce(func.sum(CreditTransaction.amount), 0)).where(
            CreditTransaction.job_id == job_id,
            CreditTransaction.type == "REFUND",
            CreditTransaction.id != refund_txn_id(job_id),
        )
    ).scalar_one()
    return int(total)


def _reserved_log(session: Session, job_id: uuid.UUID) -> UsageLog | None:
    return session.execute(
        select(UsageLog).where(UsageLog.job_id == job_id, UsageLog.status == "reserved")
        .order_by(UsageLog.created_at).limit(1)
    ).scalar_one_or_none()


def _cas_log(session: Session, log_id: uuid.UUID, to: str) -> bool:
    changed = session.execute(
        update(UsageLog).where(UsageLog.id == log_id, UsageLog.status == "reserved")
        .values(status=to).returning(UsageLog.id)
    ).scalar_one_or_none()
    return changed is not None


def _pools_of(log: UsageLog) -> tuple[int, int]:
    meta = log.metadata_ or {}
    try:
        return int(meta.get("from_sub", 0) or 0), int(meta.get("from_topup", 0) or 0)
    except (TypeError, ValueError):
        return log.credits, 0


def commit(session: Session, job_id: uuid.UUID, amount: int | None = None, *,
           now: datetime | None = None) -> bool:
    """CAS the job's reservation ``reserved`` → ``committed``.

    ``amount`` (default: all that is held) may be less than held; the rest is released back
    to the reservation's pools. False: no reservation is held (already settled, or none).
    """
    now = _now(now)
    log = _reserved_log(session, job_id)
    if log is None:
        return False
    balance = lock_balance(session, log.user_id)
    if not _cas_log(session, log.id, "committed"):
        return False
    held = max(0, log.credits - legacy_refunded(session, job_id))
    if amount is None:
        amount = held
    if isinstance(amount, bool) or not isinstance(amount, int) or not 0 <= amount <= held:
        raise LedgerError(f"cannot commit {amount!r} of the {held} credits held for job {job_id}")
    from_sub, from_topup = _pools_of(log)
    c_sub, c_topup = split_pro_rata(amount, from_sub, from_topup)
    session.add(CreditTransaction(id=commit_txn_id(job_id), user_id=log.user_id, job_id=job_id,
                                  type="COMMIT", amount=amount, from_sub=c_sub,
                                  from_topup=c_topup, created_at=now))
    released = held - amount
    if released:
        parts = split_pro_rata(released, from_sub, from_topup)
        session.add(CreditTransaction(id=release_txn_id(job_id), user_id=log.user_id,
                                      job_id=job_id, type="RELEASE", amount=released,
                                      from_sub=parts[0], from_topup=parts[1], created_at=now))
        _return_to_pools(session, balance, kind="RELEASE", txn_id=release_txn_id(job_id),
                         parts=parts, now=now)
    session.flush()
    return True


def refund(session: Session, job_id: uuid.UUID, *, now: datetime | None = None) -> bool:
    """CAS the job's reservation ``reserved`` → ``refunded`` and return what it still holds.

    Adds only the difference legacy refunds left (``a − p``), as REFUND lots in the recorded
    pools. False: nothing was reserved any more (already refunded or committed, or never).
    """
    now = _now(now)
    log = _reserved_log(session, job_id)
    if log is None:
        return False
    balance = lock_balance(session, log.user_id)
    if not _cas_log(session, log.id, "refunded"):
        return False
    if _txn_exists(session, refund_txn_id(job_id)):
        raise LedgerError(f"job {job_id} was refunded before but its log was still reserved")
    due = max(0, log.credits - legacy_refunded(session, job_id))
    parts = split_pro_rata(due, *_pools_of(log))
    session.add(CreditTransaction(id=refund_txn_id(job_id), user_id=log.user_id, job_id=job_id,
                                  type="REFUND", amount=due, from_sub=parts[0],
                                  from_topup=parts[1], created_at=now))
    _return_to_pools(session, balance, kind="REFUND", txn_id=refund_txn_id(job_id),
                     parts=parts, now=now)
    session.flush()
    return True


def import_legacy_refund(session: Session, job_id: uuid.UUID, amount: int, txn_id: str, *,
                         now: datetime | None = None) -> bool:
    """Record a refund a platform made before the library (partial or whole) for ``job_id``.

    It returns ``amount`` to the reservation's pools (pro rata) as lots, under ``txn_id``; the
    library then counts it toward what is already refunded. Idempotent on ``txn_id``.
    """
    _check_amount(amount, "amount")
    if txn_id == refund_txn_id(job_id):
        raise InvalidParam("a legacy refund needs an id of its own", param="txn_id")
    now = _now(now)
    log = session.execute(select(UsageLog).where(UsageLog.job_id == job_id)
                          .order_by(UsageLog.created_at).limit(1)).scalar_one_or_none()
    if log is None:
        raise InvalidParam(f"job {job_id} has no usage log", param="job_id")
    balance = lock_balance(session, log.user_id)
    if _txn_exists(session, txn_id):
        return False
    parts = split_pro_rata(amount, *_pools_of(log))
    session.add(CreditTransaction(id=txn_id, user_id=log.user_id, job_id=job_id, type="REFUND",
                                  amount=amount, from_sub=parts[0], from_topup=parts[1],
                                  created_at=now))
    _return_to_pools(session, balance, kind="REFUND", txn_id=txn_id, parts=parts, now=now)
    session.flush()
    return True


def settled_amount(session: Session, job_id: uuid.UUID) -> int | None:
    """What the job finally cost: the committed amount, 0 when refunded, None while reserved."""
    log = session.execute(select(UsageLog).where(UsageLog.job_id == job_id)
                          .order_by(UsageLog.created_at).limit(1)).scalar_one_or_none()
    if log is None:
        return 0
    if log.status == "reserved":
        return None
    if log.status == "committed":
        txn = session.get(CreditTransaction, commit_txn_id(job_id))
        return txn.amount if txn is not None else max(0, log.credits - legacy_refunded(session, job_id))
    return 0


def history(session: Session, user_id: uuid.UUID) -> list[CreditTransaction]:
    """The user's own ledger transactions, oldest first."""
    return list(session.execute(
        select(CreditTransaction).where(CreditTransaction.user_id == user_id)
        .order_by(CreditTransaction.created_at, CreditTransaction.id)
    ).scalars())


# ----------------------------------------------------------------------------- audit


@dataclass(frozen=True)
class Discrepancy:
    kind: str
    user_id: uuid.UUID | None
    job_id: uuid.UUID | None
    detail: str


def audit(session: Session, *, now: datetime | None = None,
          grace: timedelta = timedelta(minutes=10)) -> list[Discrepancy]:
    """Every way the ledger is out of balance (an empty list means clean).

    Per user: each pool's balance equals its lots' remainders and no lot is negative or above
    its amount; granted = balance + reserved (net of legacy refunds) + committed. Per job: at
    most one settlement, consistent with its usage log. And no terminal job still holds a
    ``reserved`` log past ``grace``.
    """
    now = _now(now)
    found: list[Discrepancy] = []
    legacy: dict[uuid.UUID, int] = {}
    for job_id, amount in session.execute(
        select(CreditTransaction.job_id, func.sum(CreditTransaction.amount))
        .where(CreditTransaction.type == "REFUND",
               ~CreditTransaction.id.like("job-refund:%"))
        .group_by(CreditTransaction.job_id)
    ):
        if job_id is not None:
            legacy[job_id] = int(amount)

    lots: dict[tuple[uuid.UUID, str], int] = {}
    for lot in session.execute(select(CreditLot)).scalars():
        lots[(lot.user_id, lot.pool)] = lots.get((lot.user_id, lot.pool), 0) + lot.remaining_amount
        if not 0 <= lot.remaining_amount <= lot.amount:
            found.append(Discrepancy("lot_out_of_range", lot.user_id, None,
                                     f"lot {lot.id}: {lot.remaining_amount}/{lot.amount}"))

    sums: dict[tuple[uuid.UUID, str], int] = {}
    for user_id, type_, amount in session.execute(
        select(CreditTransaction.user_id, CreditTransaction.type, func.sum(CreditTransaction.amount))
        .group_by(CreditTransaction.user_id, CreditTransaction.type)
    ):
        sums[(user_id, type_)] = int(amount)

    reserved: dict[uuid.UUID, int] = {}
    for log in session.execute(select(UsageLog).where(UsageLog.status == "reserved")).scalars():
        held = max(0, log.credits - legacy.get(log.job_id, 0)) if log.job_id else log.credits
        reserved[log.user_id] = reserved.get(log.user_id, 0) + held

    for bal in session.execute(select(CreditBalance)).scalars():
        for pool in POOLS:
            have = getattr(bal, pool)
            in_lots = lots.get((bal.user_id, pool), 0)
            if have != in_lots:
                found.append(Discrepancy("balance_mismatch", bal.user_id, None,
                                         f"{pool}: balance {have} != lots {in_lots}"))
            if have < 0:
                found.append(Discrepancy("negative_balance", bal.user_id, None, f"{pool}: {have}"))
        granted = sums.get((bal.user_id, "GRANT"), 0)
        committed = sums.get((bal.user_id, "COMMIT"), 0)
        held = reserved.get(bal.user_id, 0)
        total = bal.sub + bal.topup + held + committed
        if granted != total:
            found.append(Discrepancy(
                "unbalanced", bal.user_id, None,
                f"granted {granted} != balance {bal.sub + bal.topup} + reserved {held} + "
                f"committed {committed}"))

    found.extend(_audit_jobs(session, now, grace))
    return found


def _audit_jobs(session: Session, now: datetime, grace: timedelta) -> list[Discrepancy]:
    found: list[Discrepancy] = []
    settlements: dict[uuid.UUID, list[str]] = {}
    for txn_id, job_id in session.execute(
        select(CreditTransaction.id, CreditTransaction.job_id).where(
            (CreditTransaction.id.like("job-commit:%")) | (CreditTransaction.id.like("job-refund:%"))
        )
    ):
        settlements.setdefault(job_id, []).append(txn_id)
    for job_id, ids in settlements.items():
        if len(ids) > 1:
            found.append(Discrepancy("settled_twice", None, job_id, ", ".join(sorted(ids))))
    for log in session.execute(
        select(UsageLog).where(UsageLog.job_id.in_(
            select(CreditTransaction.job_id).where(CreditTransaction.id.like("job-usage:%"))))
    ).scalars():
        ids = settlements.get(log.job_id, [])
        expect = {"reserved": None, "committed": "job-commit:", "refunded": "job-refund:"}
        prefix = expect.get(log.status)
        if prefix is None and ids:
            found.append(Discrepancy("reserved_but_settled", log.user_id, log.job_id, ", ".join(ids)))
        elif prefix is not None and not any(i.startswith(prefix) for i in ids):
            found.append(Discrepancy("settlement_missing", log.user_id, log.job_id,
                                     f"usage log {log.status} without its transaction"))
    cutoff = now - grace
    stuck = session.execute(
        select(Job.id, Job.user_id, Job.status).join(UsageLog, UsageLog.job_id == Job.id).where(
            Job.status.in_(TERMINAL_JOB_STATUSES),
            UsageLog.status == "reserved",
            func.coalesce(Job.completed_at, Job.created_at) < cutoff,
        )
    )
    for job_id, user_id, status in stuck:
        found.append(Discrepancy("terminal_job_reserved", user_id, job_id,
                                 f"job {status} still holds a reserved usage log"))
    return found
