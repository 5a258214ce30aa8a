"""Internal: :func:`reserve`, holding credits for a job (PostgreSQL one statement, else Core)."""

from __future__ import annotations

import uuid
from datetime import datetime

from sqlalchemy import insert
from sqlalchemy.orm import Session

from ..db.contract import usage_log_ids_assigned
from ..db.models import CreditBalance, CreditLot
from ..errors import (
    InsufficientCredits,
    LedgerError,
)
from ._base import (
    Reservation,
    _check_amount,
    _check_funds,
    _now,
    usage_txn_id,
)
from ._core import (
    _TXN_EXISTS,
    _U,
    _all_or_nothing,
    _apply_consume,
    _conn,
    _forget,
    _insert_txn_once,
    _lock,
    _plan_consume,
)
from ._pg import (
    _PG_MAX,
    _pg_reserve,
)
from ._pools import (
    _replayed,
)


def reserve(session: Session, user_id: uuid.UUID, job_id: uuid.UUID, amount: int, *,
            now: datetime | None = None) -> Reservation:
    """Hold ``amount`` credits for ``job_id`` (in the caller's job-insert transaction).

    Raises :class:`InsufficientCredits` (nothing changed) when the balance is too low. A
    second call for the same job returns the first reservation. The USAGE row is inserted
    with ``ON CONFLICT DO NOTHING``: no existence check on the common path.
    """
    _check_amount(amount)
    now = _now(now)
    conn = _conn(session)
    if conn.dialect.name == "postgresql" and amount < _PG_MAX:
        return _pg_reserve(session, conn, user_id, job_id, amount, now)
    balance = _lock(conn, user_id, create=False) or (0, 0)
    usage_id = usage_txn_id(job_id)
    try:
        _check_funds(balance, amount)
        taken, changes = _plan_consume(conn, user_id, amount)
    except (InsufficientCredits, LedgerError):  # a replay still returns the first reservation
        if conn.execute(_TXN_EXISTS, {"id": usage_id}).first() is not None:
            return _replayed(session, user_id, job_id)
        raise
    with _all_or_nothing(session):
        added = conn.execute(_insert_txn_once(conn.dialect.name).values(
            id=usage_id, user_id=user_id, job_id=job_id, type="USAGE", amount=amount,
            from_sub=taken[0], from_topup=taken[1], created_at=now)).first()
        if added is None:  # reserved before: nothing written, the first reservation
            return _replayed(session, user_id, job_id)
        _apply_consume(conn, user_id, taken, changes, now)
        log = {"job_id": job_id, "user_id": user_id, "status": "reserved", "credits": amount,
               "created_at": now, "metadata": {"from_sub": taken[0], "from_topup": taken[1]}}
        if not usage_log_ids_assigned(conn):  # a uuid column without a default
            log["id"] = uuid.uuid4()
        log_id = conn.execute(insert(_U).values(**log).returning(_U.c.id)).scalar_one()
    _forget(session, CreditBalance, user_id)
    _forget(session, CreditLot, *(lot_id for lot_id, _ in changes))
    return Reservation(log_id, job_id, user_id, amount, taken[0], taken[1])
