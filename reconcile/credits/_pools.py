"""Internal: what a job's reservation took and still holds per pool: the USAGE row, legacy
refunds, the usage log's metadata (and its repair), the reserved log."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Connection, func, select
from sqlalchemy.orm import Session

from .. import jobstore
from ..db.models import CreditTransaction, UsageLog
from ..errors import (
    BadUsageMetadata,
    InvalidParam,
    LedgerError,
)
from ._base import (
    Pools,
    Reservation,
    _now,
    refund_txn_id,
    usage_txn_id,
)
from ._core import (
    _JOB_TXNS,
)

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
    jobstore.record_anomaly(session, job_id=log.job_id, user_id=log.user_id,
                            kind="bad_usage_metadata",
                            detail={"metadata": repr(log.metadata_)[:200], "pools_from": used},
                            now=datetime.now(UTC), once=True)


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
    if usage is not None:
        if _bad_metadata(log.metadata_, log.credits):
            _note_bad_metadata(session, log, "usage_txn")
        return int(usage.from_sub), int(usage.from_topup)
    pools, note = _pools_without_usage(log)
    if note:
        _note_bad_metadata(session, log, note)
    return pools


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
    jobstore.record_anomaly(session, job_id=job_id, user_id=log.user_id,
                            kind="usage_metadata_repaired",
                            detail={"old": repr(log.metadata_)[:200], "new": new}, now=now)
    log.metadata_ = new
    session.flush()
    return True


def _reserved_log(session: Session, job_id: uuid.UUID) -> UsageLog | None:
    return session.execute(
        select(UsageLog).where(UsageLog.job_id == job_id, UsageLog.status == "reserved")
        .order_by(UsageLog.created_at).limit(1)
        .execution_options(populate_existing=True)
    ).scalar_one_or_none()


def _pools_of(log: UsageLog) -> tuple[int, int]:
    """Deprecated (metadata only, no session): use :func:`reservation_pools`."""
    return _parse_pools(log.metadata_, log.credits) or (log.credits, 0)


def _usage_and_legacy(conn: Connection, job_id: uuid.UUID) -> tuple[Pools | None, Pools, bool]:
    """One read of the job's transactions: the USAGE row's pools (None: the ledger has none),
    what legacy refunds gave back per pool, and whether the library's own refund exists."""
    usage: Pools | None = None
    l_sub = l_topup = 0
    refunded = False
    usage_id, refund_id = usage_txn_id(job_id), refund_txn_id(job_id)
    for txn_id, type_, sub, topup in conn.execute(_JOB_TXNS, {"j": job_id}):
        if txn_id == usage_id:
            usage = (int(sub), int(topup))
        elif txn_id == refund_id:
            refunded = True
        elif type_ == "REFUND":  # _legacy_refund_filter: any other REFUND id of the job
            l_sub += int(sub)
            l_topup += int(topup)
    return usage, (l_sub, l_topup), refunded


def _bad_metadata(meta: Any, credits_: int) -> bool:
    """The USAGE row exists but the log's metadata is not the pools object (an anomaly)."""
    return not isinstance(meta, dict) or _parse_pools(meta, credits_) is None


def _note_anomaly_once(conn: Connection, job_id: uuid.UUID, user_id: uuid.UUID, meta: Any,
                       used: str) -> None:
    """One ``bad_usage_metadata`` anomaly per job, written with the operation that met it."""
    jobstore.record_anomaly(conn, job_id=job_id, user_id=user_id, kind="bad_usage_metadata",
                            detail={"metadata": repr(meta)[:200], "pools_from": used},
                            now=datetime.now(UTC), once=True)


def _held_of(conn: Connection, log: UsageLog, *,
             refunding: bool = False) -> tuple[Pools, str | None]:
    """Per pool what the reservation still holds (reserved minus legacy refunds) and the
    anomaly to record (``pools_from``) if any. Raises :class:`BadUsageMetadata` as
    :func:`reservation_pools` does; ``refunding``: first ``refunded_twice`` when the library's
    refund exists already."""
    assert log.job_id is not None
    usage, legacy, refunded = _usage_and_legacy(conn, log.job_id)
    if refunding and refunded:
        raise LedgerError(f"job {log.job_id} was refunded before but its log was still reserved",
                          reason="refunded_twice")
    note: str | None = None
    if usage is not None:
        pools = usage
        if _bad_metadata(log.metadata_, log.credits):
            note = "usage_txn"
    else:
        pools, note = _pools_without_usage(log)
    return (max(0, pools[0] - legacy[0]), max(0, pools[1] - legacy[1])), note


def _pools_without_usage(log: UsageLog) -> tuple[Pools, str | None]:
    """The pools of a reservation the ledger has no USAGE row for (a platform's own), from its
    metadata, and the anomaly to record; see :func:`reservation_pools`."""
    meta = log.metadata_
    if meta is None or (isinstance(meta, dict) and not ({"from_sub", "from_topup"} & meta.keys())):
        return (log.credits, 0), None
    parsed = _parse_pools(meta, log.credits)
    if parsed is None:
        raise BadUsageMetadata(
            f"job {log.job_id}: usage log metadata {repr(meta)[:80]} gives no pools and the ledger "
            f"has no USAGE row; set them with `reconcile repair-usage-metadata`")
    return parsed, (None if isinstance(meta, dict) else "decoded_json")


def _replayed(session: Session, user_id: uuid.UUID, job_id: uuid.UUID) -> Reservation:
    """The first reservation of a job reserved before (the idempotent replay)."""
    log = session.execute(select(UsageLog).where(UsageLog.job_id == job_id)
                          .order_by(UsageLog.created_at)).scalars().first()
    if log is None:
        raise LedgerError(f"job {job_id} has a usage transaction but no usage log")
    sub, topup = reservation_pools(session, log)
    return Reservation(log.id, job_id, user_id, log.credits, sub, topup)


def _first_log(session: Session, job_id: uuid.UUID) -> UsageLog | None:
    """The job's first usage log (the one the ledger settles), whatever its status."""
    return session.execute(select(UsageLog).where(UsageLog.job_id == job_id)
                           .order_by(UsageLog.created_at).limit(1)).scalar_one_or_none()


def _require_log(session: Session, job_id: uuid.UUID) -> UsageLog:
    """:func:`_first_log`, or :class:`InvalidParam` when the job has none."""
    log = _first_log(session, job_id)
    if log is None:
        raise InvalidParam(f"job {job_id} has no usage log", param="job_id")
    return log
