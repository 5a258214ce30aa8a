"""Internal: grants, deliberate re-charges, what a job finally cost, a user's history."""

from __future__ import annotations

import uuid
from datetime import datetime

from sqlalchemy import insert, select
from sqlalchemy.orm import Session

from .. import jobstore
from ..db.models import CreditBalance, CreditLot, CreditTransaction
from ..errors import (
    InvalidParam,
    LedgerError,
)
from ._base import (
    POOLS,
    RESERVED_PREFIXES,
    _check_amount,
    _check_funds,
    _now,
    commit_txn_id,
    recharge_commit_txn_id,
    recharge_usage_txn_id,
    refund_txn_id,
    release_txn_id,
)
from ._core import (
    _BALANCE_ADD,
    _L,
    _LOT_IDS_TAKEN,
    _TXN_EXISTS,
    _add_txn,
    _all_or_nothing,
    _apply_consume,
    _conn,
    _forget,
    _insert_txn_once,
    _lock,
    _lot_row,
    _plan_consume,
)
from ._pools import (
    _first_log,
    _require_log,
    legacy_refunded,
)


def grant(session: Session, user_id: uuid.UUID, pool: str, amount: int, txn_id: str, *,
          now: datetime | None = None) -> bool:
    """Add ``amount`` credits to ``pool`` as a new lot. Idempotent on ``txn_id``.

    Raises :class:`LedgerError` and writes nothing for an id under the library's own prefixes
    (``grant_reserved_id``: ``job-refund:{job}:sub`` is the lot id of that job's refund) or one
    another transaction's lot already has (``grant_id_taken``: a legacy refund ``x``'s lot
    ``x:sub``)."""
    if pool not in POOLS:
        raise InvalidParam(f"pool must be one of {POOLS}", param="pool")
    _check_amount(amount, "amount")
    if not isinstance(txn_id, str) or txn_id.startswith(RESERVED_PREFIXES):
        raise LedgerError(f"grant id {txn_id!r} is under the library's own prefixes "
                          f"{RESERVED_PREFIXES}", reason="grant_reserved_id")
    now = _now(now)
    conn = _conn(session)
    _lock(conn, user_id)
    if conn.execute(_LOT_IDS_TAKEN, {"ids": [txn_id], "kind": "GRANT"}).first() is not None:
        raise LedgerError(f"grant id {txn_id!r} is the lot id of another transaction",
                          reason="grant_id_taken")
    parts = (amount, 0) if pool == "sub" else (0, amount)
    with _all_or_nothing(session):
        added = conn.execute(_insert_txn_once(conn.dialect.name).values(
            id=txn_id, user_id=user_id, job_id=None, type="GRANT", amount=amount, from_sub=parts[0],
            from_topup=parts[1], created_at=now)).first()
        if added is None:
            return False
        conn.execute(insert(_L).values(**_lot_row(user_id, pool, "GRANT", txn_id, amount, now)))
        conn.execute(_BALANCE_ADD, {"u": user_id, "d_sub": parts[0], "d_topup": parts[1], "now": now})
    _forget(session, CreditBalance, user_id)
    return True


def recharge(session: Session, job_id: uuid.UUID, amount: int, *,
             now: datetime | None = None) -> bool:
    """Charge a job again, deliberately, after the library's settlement returned credits (an
    operator's choice for a job completed after it was failed and settled): a
    ``job-recharge:{job}:usage`` USAGE + ``job-recharge:{job}:commit`` COMMIT pair, taken from
    the balance like a reservation (``sub`` first, FIFO). The job's ``credits_actual`` and
    ``display_cost`` become what it now costs (what its settlement kept plus ``amount``); the
    audit's per-job identity counts the pair.

    Idempotent: False when the job was re-charged already. Raises :class:`LedgerError` unless
    the library's settlement returned credits — its refund, or the rest a commit for less
    released (a partial refund) — or when ``amount`` is more than it returned
    (``recharge_exceeds_returned``: :func:`returned`), and :class:`InsufficientCredits` when the balance is too low
    (nothing written either way).
    """
    _check_amount(amount, "amount")
    now = _now(now)
    log = _require_log(session, job_id)
    conn = _conn(session)
    balance = _lock(conn, log.user_id) or (0, 0)
    if conn.execute(_TXN_EXISTS, {"id": recharge_commit_txn_id(job_id)}).first() is not None:
        return False
    session.refresh(log)
    returned_by = {"refunded": refund_txn_id(job_id), "committed": release_txn_id(job_id)}
    if log.status not in returned_by or \
            conn.execute(_TXN_EXISTS, {"id": returned_by[log.status]}).first() is None:
        raise LedgerError(f"job {job_id} can be re-charged only after the library's settlement "
                          f"returned credits (usage log {log.status})",
                          reason="recharge_not_refunded")
    back = returned(session, job_id)
    if amount > back:  # the job never costs more than its reservation, as a price cannot
        raise LedgerError(f"job {job_id}: a re-charge of {amount} is more than the "
                          f"{back} credits its settlement returned",
                          reason="recharge_exceeds_returned")
    kept = 0
    if log.status == "committed":
        commit = session.get(CreditTransaction, commit_txn_id(job_id))
        kept = commit.amount if commit is not None else 0
    _check_funds(balance, amount)
    taken, changes = _plan_consume(conn, log.user_id, amount)
    with _all_or_nothing(session):
        _add_txn(conn, recharge_usage_txn_id(job_id), log.user_id, job_id, "USAGE", taken, now)
        _add_txn(conn, recharge_commit_txn_id(job_id), log.user_id, job_id, "COMMIT", taken, now)
        _apply_consume(conn, log.user_id, taken, changes, now)
        jobstore.record_recharge(session, job_id, kept + amount)
    _forget(session, CreditBalance, log.user_id)
    _forget(session, CreditLot, *(lot_id for lot_id, _ in changes))
    return True


def returned(session: Session, job_id: uuid.UUID) -> int:
    """What the library's own settlement of ``job_id`` gave back and the user still keeps: its
    refund, or the rest a commit for less released (a partial refund), net of an operator's
    re-charge (0: none). The one rule: ``BuiltinLedger.refunded`` answers with it, and
    :func:`recharge` never takes back more."""
    ids = {refund_txn_id(job_id): 1, release_txn_id(job_id): 1, recharge_commit_txn_id(job_id): -1}
    amounts = {row.id: int(row.amount) for row in session.execute(
        select(CreditTransaction.id, CreditTransaction.amount)
        .where(CreditTransaction.id.in_(list(ids))))}
    given = sum(amount for txn, amount in amounts.items() if ids[txn] > 0)
    if given == 0:
        return 0
    return max(0, given - amounts.get(recharge_commit_txn_id(job_id), 0))


def settled_amount(session: Session, job_id: uuid.UUID) -> int | None:
    """What the job finally cost: the committed amount (plus a re-charge), 0 when refunded,
    None while reserved."""
    log = _first_log(session, job_id)
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
