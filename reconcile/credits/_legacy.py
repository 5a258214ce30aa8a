"""Internal: importing a refund a platform made before the library (:func:`import_legacy_refund`)."""

from __future__ import annotations

import uuid
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from ..db.models import CreditBalance, CreditTransaction, UsageLog
from ..errors import (
    LegacyRefundRefused,
)
from ._base import (
    POOLS,
    RESERVED_PREFIXES,
    _check_amount,
    _now,
    take_in_order,
    usage_txn_id,
)
from ._core import (
    _LOT_IDS_TAKEN,
    _TXN_EXISTS,
    _all_or_nothing,
    _conn,
    _forget,
    _give_back,
    _lock,
)
from ._pools import (
    _held_of,
    _note_anomaly_once,
    _require_log,
    _reserved_log,
)


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
    first = _require_log(session, job_id)
    conn = _conn(session)
    _lock(conn, first.user_id)
    existing = session.get(CreditTransaction, txn_id, populate_existing=True)
    if existing is not None:
        if existing.type == "REFUND" and existing.job_id == job_id and existing.amount == amount:
            return False
        raise _refuse_legacy(job_id, "legacy_refund_reserved_id",
                             f"{txn_id!r} already names another transaction")
    lot_ids = [f"{txn_id}:{pool}" for pool in POOLS]
    if conn.execute(_LOT_IDS_TAKEN, {"ids": lot_ids, "kind": ""}).first() is not None:
        raise _refuse_legacy(job_id, "legacy_refund_lot_id_taken",
                             f"another transaction's lot is named {' or '.join(lot_ids)}")
    log = _reserved_log(session, job_id)  # re-read under the balance lock
    if log is None:
        statuses = set(session.execute(select(UsageLog.status)
                                       .where(UsageLog.job_id == job_id)).scalars())
        if "committed" in statuses:
            raise _refuse_legacy(job_id, "legacy_refund_after_commit", "its reservation was committed")
        raise _refuse_legacy(job_id, "legacy_refund_after_refund", "the job was already refunded")
    if conn.execute(_TXN_EXISTS, {"id": usage_txn_id(job_id)}).first() is None:
        raise _refuse_legacy(job_id, "legacy_refund_not_in_ledger",
                             "the ledger has no USAGE row for it (import the reservation first)")
    held, note = _held_of(conn, log)
    if amount > sum(held):
        raise _refuse_legacy(job_id, "legacy_refund_exceeds_held",
                             f"{amount} is more than the {sum(held)} credits still held")
    parts = take_in_order(amount, held, order=(1, 0))
    with _all_or_nothing(session):
        _give_back(conn, txn_id, log.user_id, job_id, "REFUND", parts, now)
        if note:
            _note_anomaly_once(conn, job_id, log.user_id, log.metadata_, note)
    _forget(session, CreditBalance, log.user_id)
    return True
