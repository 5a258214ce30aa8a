# ruff: noqa
# Scratch copy of main:reconcile/credits.py (the ORM ledger before issue 16), for the differential test only.
"""The credit ledger: reserve → commit (optionally for less) or refund, exact and idempotent.

* A balance row per user holds one balance per pool (``sub``, ``topup``); it is locked
  (``SELECT … FOR UPDATE``; on SQLite the ``BEGIN IMMEDIATE`` write lock) by every operation
  that moves credits, always first, so concurrent writers serialise on it and never deadlock.
  The lock always reloads the row (``populate_existing``): a balance object the session already
  holds from an earlier read is never trusted.
* Credits live in lots whose ``remaining_amount`` is consumed oldest first. A reservation drains
  the ``sub`` pool before ``topup`` (subscription credits are spent first), FIFO within a pool,
  and records ``from_sub``/``from_topup`` on its USAGE transaction (and in ``usage_logs.metadata``
  for the platform). The USAGE row is the ledger's own record of the pools; the metadata is read
  only for a reservation the ledger never wrote (a platform's own).
* Every movement is an append-only transaction with a deterministic id: ``job-usage:{job}``,
  ``job-commit:{job}``, ``job-release:{job}``, ``job-refund:{job}``, and a deliberate re-charge
  after a refund ``job-recharge:{job}:usage`` + ``job-recharge:{job}:commit``; grants carry the
  caller's id. Repeating an operation is a no-op that returns False. The ``job-…:`` prefixes
  are the library's own: an imported legacy refund may not use them.
* Pools are conserved one by one (README, Design notes: Pools). A commit takes from the pools in the order the
  reservation consumed them (``sub`` first); each pool's release is what it reserved minus what
  it committed; a refund restores exactly each pool's unsettled remainder. Every COMMIT,
  RELEASE and REFUND row records per pool what moved.
* Legacy refunds (REFUND transactions for the job under ids other than ``job-refund:{job}``,
  partial ones included) count toward what is already refunded: a legacy refund ``p`` on a
  reservation ``a`` still ``reserved`` shrinks what it holds to ``a − p``. An import is bounded
  by what is still held and returns it in the reverse order of consumption (``topup`` first), so
  a legacy partial refund followed by a commit moves the pools exactly as a commit for less.

Credits are integers. Each function runs inside the caller's transaction and never commits.
The audit lives in :mod:`reconcile.audit`; :func:`audit` here is its entry point.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from reconcile.db.models import CreditAnomaly, CreditBalance, CreditLot, CreditTransaction, Job, UsageLog
from reconcile.errors import (
    BadUsageMetadata,
    InsufficientCredits,
    InvalidParam,
    LedgerError,
    LegacyRefundRefused,
)

if TYPE_CHECKING:
    from reconcile.audit import Discrepancy
    from .settings import Settings

POOLS = ("sub", "topup")
TERMINAL_JOB_STATUSES = ("completed", "failed", "cancelled")
LOT_PAGE = 32  # lots locked per FIFO page in reserve
# the library's own transaction-id prefixes: never accepted from outside (legacy imports)
RESERVED_PREFIXES = ("job-usage:", "job-commit:", "job-release:", "job-refund:", "job-recharge:")

Pools = tuple[int, int]  # (sub, topup)


def usage_txn_id(job_id: uuid.UUID) -> str:
    return f"job-usage:{job_id}"


def commit_txn_id(job_id: uuid.UUID) -> str:
    return f"job-commit:{job_id}"


def release_txn_id(job_id: uuid.UUID) -> str:
    return f"job-release:{job_id}"


def refund_txn_id(job_id: uuid.UUID) -> str:
    return f"job-refund:{job_id}"


def recharge_usage_txn_id(job_id: uuid.UUID) -> str:
    return f"job-recharge:{job_id}:usage"


def recharge_commit_txn_id(job_id: uuid.UUID) -> str:
    return f"job-recharge:{job_id}:commit"


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
    """``amount`` split between (sub, topup) in the ratio of the reservation; remainder to sub.

    Kept for callers; the ledger itself moves pools in order (:func:`take_in_order`)."""
    total = from_sub + from_topup
    if total <= 0:
        return amount, 0
    topup = amount * from_topup // total
    return amount - topup, topup


def take_in_order(amount: int, available: Pools, order: tuple[int, int] = (0, 1)) -> Pools:
    """``amount`` taken from ``available`` (sub, topup), the pool ``order[0]`` first."""
    taken = [0, 0]
    left = amount
    for index in order:
        taken[index] = min(left, max(0, available[index]))
        left -= taken[index]
    if left:
        raise LedgerError(f"cannot take {amount} from pools {available}")
    return taken[0], taken[1]


def lock_balance(session: Session, user_id: uuid.UUID) -> CreditBalance:
    """The user's balance row, created if absent, locked for this transaction, with its current
    values (``populate_existing``: a copy the session loaded earlier is overwritten)."""
    stmt = (select(CreditBalance).where(CreditBalance.user_id == user_id).with_for_update()
            .execution_options(populate_existing=True))
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
                     parts: Pools, now: datetime) -> None:
    """New lots (one per pool that gets something back) and the balance increments."""
    for pool, part in zip(POOLS, parts, strict=True):
        if part > 0:
            _add_lot(session, balance.user_id, pool, kind, f"{txn_id}:{pool}", part, now)
    balance.sub += parts[0]
    balance.topup += parts[1]
    balance.updated_at = now


def _add_txn(session: Session, txn_id: str, user_id: uuid.UUID, job_id: uuid.UUID | None,
             type_: str, parts: Pools, now: datetime) -> None:
    session.add(CreditTransaction(id=txn_id, user_id=user_id, job_id=job_id, type=type_,
                                  amount=parts[0] + parts[1], from_sub=parts[0],
                                  from_topup=parts[1], created_at=now))


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
    _add_txn(session, txn_id, user_id, None, "GRANT",
             (amount, 0) if pool == "sub" else (0, amount), now)
    _add_lot(session, user_id, pool, "GRANT", txn_id, amount, now)
    if pool == "sub":
        balance.sub += amount
    else:
        balance.topup += amount
    balance.updated_at = now
    session.flush()
    return True


def _consume(session: Session, balance: CreditBalance, amount: int, now: datetime) -> Pools:
    """Take ``amount`` from the user's open lots, ``sub`` first, FIFO; the balance follows."""
    user_id = balance.user_id
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
                .execution_options(populate_existing=True)
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
    return taken["sub"], taken["topup"]


def _check_funds(balance: CreditBalance, amount: int) -> None:
    if balance.sub + balance.topup < amount:
        raise InsufficientCredits(
            f"balance {balance.sub + balance.topup} is lower than the {amount} credits needed")


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
        sub, topup = reservation_pools(session, log)
        return Reservation(log.id, job_id, user_id, log.credits, sub, topup)
    _check_funds(balance, amount)
    taken = _consume(session, balance, amount, now)
    log_id = uuid.uuid4()
    session.add(UsageLog(id=log_id, job_id=job_id, user_id=user_id, status="reserved",
                         credits=amount, created_at=now,
                         metadata_={"from_sub": taken[0], "from_topup": taken[1]}))
    _add_txn(session, usage_txn_id(job_id), user_id, job_id, "USAGE", taken, now)
    session.flush()
    return Reservation(log_id, job_id, user_id, amount, taken[0], taken[1])


# ----------------------------------------------------------------------------- pools of a job


def _legacy_refund_filter(job_id: uuid.UUID) -> tuple[Any, ...]:
    """The one definition of a legacy refund (the audit uses the same): a REFUND for the job
    under any id but the library's exact ``job-refund:{job}``."""
    return (CreditTransaction.job_id == job_id, CreditTransaction.type == "REFUND",
            CreditTransaction.id != refund_txn_id(job_id))


def legacy_refunded(session: Session, job_id: uuid.UUID) -> int:
    """What legacy REFUND transactions (ids other than ``job-refund:{job}``) gave back."""
    return sum(legacy_refunded_pools(session, job_id))


def legacy_refunded_pools(session: Session, job_id: uuid.UUID) -> Pools:
    """Per pool (sub, topup), what legacy refunds of ``job_id`` gave back."""
    sub, topup = session.execute(
        select(func.coalesce(func.sum(CreditTransaction.from_sub), 0),
               func.coalesce(func.sum(CreditTransaction.from_topup), 0))
        .where(*_legacy_refund_filter(job_id))
    ).one()
    return int(sub), int(topup)


def _parse_pools(meta: Any, credits_: int) -> Pools | None:
    """(sub, topup) from a usage log's metadata, or None when it gives no usable pools. A JSON
    string holding the object (a platform that double-encoded it) is decoded."""
    if isinstance(meta, str):
        try:
            meta = json.loads(meta)
        except ValueError:
            return None
    if not isinstance(meta, dict):
        return None
    sub, topup = meta.get("from_sub", 0), meta.get("from_topup", 0)
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in (sub, topup)):
        return None
    if sub + topup != credits_:
        return None
    return sub, topup


def _note_bad_metadata(session: Session, log: UsageLog, used: str) -> None:
    """One ``bad_usage_metadata`` anomaly per job, written with the operation that met it."""
    exists = session.execute(select(CreditAnomaly.id).where(
        CreditAnomaly.job_id == log.job_id, CreditAnomaly.kind == "bad_usage_metadata")
        .limit(1)).first()
    if exists is None:
        session.add(CreditAnomaly(job_id=log.job_id, user_id=log.user_id, kind="bad_usage_metadata",
                                  detail={"metadata": repr(log.metadata_)[:200], "pools_from": used},
                                  created_at=datetime.now(UTC)))


def reservation_pools(session: Session, log: UsageLog) -> Pools:
    """What the reservation took from each pool (sub, topup).

    The ledger's USAGE row is authoritative; a platform that rewrote ``usage_logs.metadata``
    (a JSON string, a list, a number, null) changes nothing, and the first operation that meets
    it records one ``bad_usage_metadata`` anomaly. Only a reservation with no USAGE row (a
    platform's own) is read from the metadata: an object without pool keys counts as ``sub``
    (the documented rule), a double-encoded JSON object is decoded (with the anomaly), and
    anything else raises :class:`BadUsageMetadata` — the operator sets the pools with
    :func:`repair_usage_metadata`.
    """
    usage = session.get(CreditTransaction, usage_txn_id(log.job_id)) if log.job_id else None
    parsed = _parse_pools(log.metadata_, log.credits)
    if usage is not None:
        if not isinstance(log.metadata_, dict) or parsed is None:
            _note_bad_metadata(session, log, "usage_txn")
        return int(usage.from_sub), int(usage.from_topup)
    meta = log.metadata_
    if meta is None or (isinstance(meta, dict) and not ({"from_sub", "from_topup"} & meta.keys())):
        return log.credits, 0
    if parsed is None:
        raise BadUsageMetadata(
            f"job {log.job_id}: usage log metadata {repr(meta)[:80]} gives no pools and the ledger "
            f"has no USAGE row; set them with `reconcile repair-usage-metadata`")
    if not isinstance(meta, dict):
        _note_bad_metadata(session, log, "decoded_json")
    return parsed


def held_pools(session: Session, log: UsageLog) -> Pools:
    """Per pool, what the reservation still holds: reserved minus legacy refunds."""
    sub, topup = reservation_pools(session, log)
    if log.job_id is None:
        return sub, topup
    l_sub, l_topup = legacy_refunded_pools(session, log.job_id)
    return max(0, sub - l_sub), max(0, topup - l_topup)


def repair_usage_metadata(session: Session, job_id: uuid.UUID, from_sub: int, from_topup: int, *,
                          now: datetime | None = None) -> bool:
    """The operator's path for a usage log whose metadata gives no pools: set them.

    The two must add up to the log's credits. False: the metadata is already exactly this.
    Records a ``usage_metadata_repaired`` anomaly with the old value."""
    now = _now(now)
    log = session.execute(select(UsageLog).where(UsageLog.job_id == job_id)
                          .order_by(UsageLog.created_at).limit(1).with_for_update()
                          .execution_options(populate_existing=True)).scalar_one_or_none()
    if log is None:
        raise InvalidParam(f"job {job_id} has no usage log", param="job_id")
    for name, value in (("from_sub", from_sub), ("from_topup", from_topup)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise InvalidParam(f"{name} must be a non-negative integer", param=name)
    if from_sub + from_topup != log.credits:
        raise InvalidParam(f"from_sub + from_topup must equal the log's {log.credits} credits",
                           param="from_sub")
    new = {"from_sub": from_sub, "from_topup": from_topup}
    if log.metadata_ == new:
        return False
    session.add(CreditAnomaly(job_id=job_id, user_id=log.user_id, kind="usage_metadata_repaired",
                              detail={"old": repr(log.metadata_)[:200], "new": new}, created_at=now))
    log.metadata_ = new
    session.flush()
    return True


# ----------------------------------------------------------------------------- settle


def _reserved_log(session: Session, job_id: uuid.UUID) -> UsageLog | None:
    return session.execute(
        select(UsageLog).where(UsageLog.job_id == job_id, UsageLog.status == "reserved")
        .order_by(UsageLog.created_at).limit(1)
        .execution_options(populate_existing=True)
    ).scalar_one_or_none()


def _cas_log(session: Session, log_id: uuid.UUID, to: str) -> bool:
    changed = session.execute(
        update(UsageLog).where(UsageLog.id == log_id, UsageLog.status == "reserved")
        .values(status=to).returning(UsageLog.id)
    ).scalar_one_or_none()
    return changed is not None


def _pools_of(log: UsageLog) -> tuple[int, int]:
    """Deprecated (metadata only, no session): use :func:`reservation_pools`."""
    return _parse_pools(log.metadata_, log.credits) or (log.credits, 0)


def commit(session: Session, job_id: uuid.UUID, amount: int | None = None, *,
           now: datetime | None = None) -> bool:
    """CAS the job's reservation ``reserved`` → ``committed``.

    ``amount`` (default: all that is held) may be less than held; it is taken from the pools in
    the order the reservation consumed them (``sub`` first) and each pool's rest is released
    back to it. False: no reservation is held (already settled, or none).
    """
    now = _now(now)
    log = _reserved_log(session, job_id)
    if log is None:
        return False
    balance = lock_balance(session, log.user_id)
    if not _cas_log(session, log.id, "committed"):
        return False
    held = held_pools(session, log)
    if amount is None:
        amount = sum(held)
    if isinstance(amount, bool) or not isinstance(amount, int) or not 0 <= amount <= sum(held):
        raise LedgerError(f"cannot commit {amount!r} of the {sum(held)} credits held for job {job_id}",
                          reason="commit_exceeds_held")
    committed = take_in_order(amount, held)
    _add_txn(session, commit_txn_id(job_id), log.user_id, job_id, "COMMIT", committed, now)
    released = (held[0] - committed[0], held[1] - committed[1])
    if sum(released):
        _add_txn(session, release_txn_id(job_id), log.user_id, job_id, "RELEASE", released, now)
        _return_to_pools(session, balance, kind="RELEASE", txn_id=release_txn_id(job_id),
                         parts=released, now=now)
    session.flush()
    return True


def refund(session: Session, job_id: uuid.UUID, *, now: datetime | None = None) -> bool:
    """CAS the job's reservation ``reserved`` → ``refunded`` and return what it still holds.

    Adds only the difference legacy refunds left (``a − p``), per pool exactly what that pool
    still holds, as REFUND lots. False: nothing was reserved any more (already refunded or
    committed, or never).
    """
    now = _now(now)
    log = _reserved_log(session, job_id)
    if log is None:
        return False
    balance = lock_balance(session, log.user_id)
    if not _cas_log(session, log.id, "refunded"):
        return False
    if _txn_exists(session, refund_txn_id(job_id)):
        raise LedgerError(f"job {job_id} was refunded before but its log was still reserved",
                          reason="refunded_twice")
    parts = held_pools(session, log)
    _add_txn(session, refund_txn_id(job_id), log.user_id, job_id, "REFUND", parts, now)
    _return_to_pools(session, balance, kind="REFUND", txn_id=refund_txn_id(job_id),
                     parts=parts, now=now)
    session.flush()
    return True


def _refuse_legacy(job_id: uuid.UUID, reason: str, why: str) -> LegacyRefundRefused:
    return LegacyRefundRefused(f"legacy refund for job {job_id} refused: {why}", reason=reason)


def import_legacy_refund(session: Session, job_id: uuid.UUID, amount: int, txn_id: str, *,
                         now: datetime | None = None) -> bool:
    """Record a refund a platform made before the library (partial or whole) for ``job_id``.

    Bounded by what the reservation still holds: the job's usage log must still be ``reserved``
    and known to the ledger (its USAGE row), and ``amount`` at most what it holds net of earlier
    legacy refunds. It returns ``amount`` to the pools in the reverse order of consumption
    (``topup`` first) as lots, under ``txn_id``; the library then counts it toward what is
    already refunded. Idempotent on ``txn_id`` (the same refund again returns False). Anything
    else raises :class:`LegacyRefundRefused` and writes nothing.
    """
    _check_amount(amount, "amount")
    if txn_id.startswith(RESERVED_PREFIXES):
        raise _refuse_legacy(job_id, "legacy_refund_reserved_id",
                             f"{txn_id!r} is under the library's own prefixes {RESERVED_PREFIXES}")
    now = _now(now)
    first = session.execute(select(UsageLog).where(UsageLog.job_id == job_id)
                            .order_by(UsageLog.created_at).limit(1)).scalar_one_or_none()
    if first is None:
        raise InvalidParam(f"job {job_id} has no usage log", param="job_id")
    balance = lock_balance(session, first.user_id)
    existing = session.get(CreditTransaction, txn_id, populate_existing=True)
    if existing is not None:
        if existing.type == "REFUND" and existing.job_id == job_id and existing.amount == amount:
            return False
        raise _refuse_legacy(job_id, "legacy_refund_reserved_id",
                             f"{txn_id!r} already names another transaction")
    log = _reserved_log(session, job_id)  # re-read under the balance lock
    if log is None:
        statuses = set(session.execute(select(UsageLog.status)
                                       .where(UsageLog.job_id == job_id)).scalars())
        if "committed" in statuses:
            raise _refuse_legacy(job_id, "legacy_refund_after_commit", "its reservation was committed")
        raise _refuse_legacy(job_id, "legacy_refund_after_refund", "the job was already refunded")
    if not _txn_exists(session, usage_txn_id(job_id)):
        raise _refuse_legacy(job_id, "legacy_refund_not_in_ledger",
                             "the ledger has no USAGE row for it (import the reservation first)")
    held = held_pools(session, log)
    if amount > sum(held):
        raise _refuse_legacy(job_id, "legacy_refund_exceeds_held",
                             f"{amount} is more than the {sum(held)} credits still held")
    parts = take_in_order(amount, held, order=(1, 0))
    _add_txn(session, txn_id, log.user_id, job_id, "REFUND", parts, now)
    _return_to_pools(session, balance, kind="REFUND", txn_id=txn_id, parts=parts, now=now)
    session.flush()
    return True


def recharge(session: Session, job_id: uuid.UUID, amount: int, *,
             now: datetime | None = None) -> bool:
    """Charge a refunded job again, deliberately (an operator's choice for a job completed after
    its refund): a ``job-recharge:{job}:usage`` USAGE + ``job-recharge:{job}:commit`` COMMIT pair,
    taken from the balance like a reservation (``sub`` first, FIFO). The job's ``credits_actual``
    and ``display_cost`` become ``amount``; the audit's per-job identity counts the pair.

    Idempotent: False when the job was re-charged already. Raises :class:`LedgerError` unless
    the job's usage log was refunded by the library, :class:`InsufficientCredits` when the
    balance is too low (nothing written either way).
    """
    _check_amount(amount, "amount")
    now = _now(now)
    log = session.execute(select(UsageLog).where(UsageLog.job_id == job_id)
                          .order_by(UsageLog.created_at).limit(1)).scalar_one_or_none()
    if log is None:
        raise InvalidParam(f"job {job_id} has no usage log", param="job_id")
    balance = lock_balance(session, log.user_id)
    if _txn_exists(session, recharge_commit_txn_id(job_id)):
        return False
    session.refresh(log)
    if log.status != "refunded" or not _txn_exists(session, refund_txn_id(job_id)):
        raise LedgerError(f"job {job_id} can be re-charged only after the library refunded it "
                          f"(usage log {log.status})", reason="recharge_not_refunded")
    _check_funds(balance, amount)
    taken = _consume(session, balance, amount, now)
    _add_txn(session, recharge_usage_txn_id(job_id), log.user_id, job_id, "USAGE", taken, now)
    _add_txn(session, recharge_commit_txn_id(job_id), log.user_id, job_id, "COMMIT", taken, now)
    session.execute(update(Job).where(Job.id == job_id)
                    .values(credits_actual=amount, display_cost=amount))
    session.flush()
    return True


def settled_amount(session: Session, job_id: uuid.UUID) -> int | None:
    """What the job finally cost: the committed amount (plus a re-charge), 0 when refunded,
    None while reserved."""
    log = session.execute(select(UsageLog).where(UsageLog.job_id == job_id)
                          .order_by(UsageLog.created_at).limit(1)).scalar_one_or_none()
    if log is None:
        return 0
    if log.status == "reserved":
        return None
    recharged = session.get(CreditTransaction, recharge_commit_txn_id(job_id))
    extra = recharged.amount if recharged is not None else 0
    if log.status == "committed":
        txn = session.get(CreditTransaction, commit_txn_id(job_id))
        base = txn.amount if txn is not None else max(0, log.credits - legacy_refunded(session, job_id))
        return base + extra
    return extra


def history(session: Session, user_id: uuid.UUID) -> list[CreditTransaction]:
    """The user's own ledger transactions, oldest first."""
    return list(session.execute(
        select(CreditTransaction).where(CreditTransaction.user_id == user_id)
        .order_by(CreditTransaction.created_at, CreditTransaction.id)
    ).scalars())


# ----------------------------------------------------------------------------- audit


def audit(session: Session, *, now: datetime | None = None,
          grace: timedelta = timedelta(minutes=10), settings: Settings | None = None,
          since: datetime | None = None) -> list[Discrepancy]:
    """Every way the ledger is out of balance (an empty list means clean): see
    :mod:`reconcile.audit`. ``since`` runs the incremental audit (what was touched since)."""
    from reconcile.audit import run

    return run(session, now=_now(now), grace=grace, settings=settings, since=since)


def __getattr__(name: str) -> Any:  # ``credits.Discrepancy`` kept for callers
    if name == "Discrepancy":
        from reconcile.audit import Discrepancy

        return Discrepancy
    raise AttributeError(name)
