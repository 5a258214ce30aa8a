"""Internal: settling a reservation: :func:`commit` (for less: the rest released),
:func:`refund`, and :func:`release_orphan` (a reservation whose job row was deleted)."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from datetime import datetime

from sqlalchemy import Connection, select
from sqlalchemy.orm import Session

from .. import jobstore
from ..db.models import Job, UsageLog
from ..errors import (
    LedgerError,
)
from ._base import (
    _NOT_DONE,
    SETTLED_KEY,
    Settlement,
    _now,
    commit_txn_id,
    refund_txn_id,
    release_txn_id,
    take_in_order,
    usage_txn_id,
)
from ._core import (
    _CAS,
    _CAS_COMMIT,
    _CAS_RECORD,
    _LOG_STATUS,
    _TXN_EXISTS,
    _add_txn,
    _all_or_nothing,
    _conn,
    _forget_settled,
    _give_back,
    _lock,
)
from ._pg import (
    _pg_commit,
    _pg_refund,
    pg_amount_ok,
)
from ._pools import (
    _held_of,
    _note_anomaly_once,
    _reserved_log,
)


def _locked_reserved_log(session: Session, conn: Connection, job_id: uuid.UUID) -> UsageLog | None:
    """The Core path's start of commit and refund: the job's reserved log, its user's balance
    locked, re-checked still ``reserved`` under the lock (None: nothing to settle)."""
    log = _reserved_log(session, job_id)
    if log is None:
        return None
    _lock(conn, log.user_id)
    if conn.execute(_LOG_STATUS, {"id": log.id}).scalar() != "reserved":
        return None
    return log


def commit(session: Session, job_id: uuid.UUID, amount: int | None = None, *,
           now: datetime | None = None, record: Mapping[str, str] | None = None) -> bool:
    """CAS the job's reservation ``reserved`` → ``committed``.

    ``amount`` (default: all that is held) may be less than held; it is taken from the pools in
    the order the reservation consumed them (``sub`` first) and each pool's rest is released
    back to it. False: no reservation is held (already settled, or none).

    ``record`` (:attr:`reconcile.settlement.Decision.record`: a failed/cancelled job's partial
    refund) is merged into the usage log's metadata under ``"settlement"``, with ``kept`` the
    committed amount, by the same write as the CAS (nothing recorded when the CAS does not
    happen; a metadata that is not a JSON object is left as it is). Without a record, the CAS
    drops a ``"settlement"`` key the log already carries: a committed log's record is always
    its own commit's (:mod:`reconcile.settlement`).
    """
    done = settle_commit(session, job_id, amount, now=now, record=record)
    if done.done:  # for BuiltinLedger.commit_settled: the amount without a re-read
        session.info[SETTLED_KEY] = (job_id, done.amount)
    return done.done


def settle_commit(session: Session, job_id: uuid.UUID, amount: int | None = None, *,
                  now: datetime | None = None,
                  record: Mapping[str, str] | None = None) -> Settlement:
    """:func:`commit`, returning the committed amount with the CAS (:class:`Settlement`)."""
    now = _now(now)
    record = _checked_record(record)
    conn = _conn(session)
    if conn.dialect.name == "postgresql" and pg_amount_ok(amount):
        done = _pg_commit(session, conn, job_id, amount, now, record)
        if done is not None:
            return done
    log = _locked_reserved_log(session, conn, job_id)
    if log is None:
        return _NOT_DONE
    held, note = _held_of(conn, log)
    if amount is None:
        amount = sum(held)
    if isinstance(amount, bool) or not isinstance(amount, int) or not 0 <= amount <= sum(held):
        raise LedgerError(f"cannot commit {amount!r} of the {sum(held)} credits held for job {job_id}",
                          reason="commit_exceeds_held")
    committed = take_in_order(amount, held)
    with _all_or_nothing(session):
        dialect = "postgresql" if conn.dialect.name == "postgresql" else "sqlite"
        if record is None:  # a "settlement" key already on the log is dropped by the CAS
            cas = conn.execute(_CAS_COMMIT[dialect], {"log_id": log.id}).first()
        else:  # the record merged into the log's metadata by the CAS itself, in SQL
            cas = conn.execute(_CAS_RECORD[dialect], {"log_id": log.id,
                                                      "rec_status": record["status"],
                                                      "rec_share": record["refund_share"],
                                                      "rec_kept": amount}).first()
        if cas is None:
            return _NOT_DONE
        _add_txn(conn, commit_txn_id(job_id), log.user_id, job_id, "COMMIT", committed, now)
        released = (held[0] - committed[0], held[1] - committed[1])
        if sum(released):
            _give_back(conn, release_txn_id(job_id), log.user_id, job_id, "RELEASE", released, now)
        if note:
            _note_anomaly_once(conn, job_id, log.user_id, log.metadata_, note)
    _forget_settled(session, log.user_id, log.id)
    return Settlement(True, amount)


def _checked_record(record: Mapping[str, str] | None) -> dict[str, str] | None:
    """The record as the ledger writes it: exactly ``status`` and ``refund_share``, strings."""
    if record is None:
        return None
    out = {key: record.get(key) for key in ("status", "refund_share")}
    if not all(isinstance(v, str) for v in out.values()) or set(record) - set(out):
        raise ValueError(f"a settlement record is {{'status': str, 'refund_share': str}}, "
                         f"not {dict(record)!r}")
    return out  # type: ignore[return-value]


def refund(session: Session, job_id: uuid.UUID, *, now: datetime | None = None) -> bool:
    """CAS the job's reservation ``reserved`` → ``refunded`` and return what it still holds.

    Adds only the difference legacy refunds left (``a − p``), per pool exactly what that pool
    still holds, as REFUND lots. False: nothing was reserved any more (already refunded or
    committed, or never).
    """
    now = _now(now)
    conn = _conn(session)
    if conn.dialect.name == "postgresql":
        done = _pg_refund(session, conn, job_id, now)
        if done is not None:
            return done
    log = _locked_reserved_log(session, conn, job_id)
    if log is None:
        return False
    parts, note = _held_of(conn, log, refunding=True)
    with _all_or_nothing(session):
        if conn.execute(_CAS, {"log_id": log.id, "to": "refunded"}).first() is None:
            return False
        _give_back(conn, refund_txn_id(job_id), log.user_id, job_id, "REFUND", parts, now)
        if note:
            _note_anomaly_once(conn, job_id, log.user_id, log.metadata_, note)
    _forget_settled(session, log.user_id, log.id)
    return True


def release_orphan(session: Session, job_id: uuid.UUID, reason: str, *,
                   now: datetime | None = None) -> bool:
    """Release a reservation whose job row the platform deleted (the audit's
    ``orphaned_reservation``): the library's own refund ``job-refund:{job}`` of what it still
    holds, with an ``orphan_released`` anomaly holding the operator's ``reason`` in the same
    transaction (the ledger's record of why).

    Idempotent: False when nothing is held any more (released before, or settled). Raises
    :class:`LedgerError` and writes nothing when the job row exists (``orphan_job_exists``: settle
    it through its lifecycle, e.g. ``reconcile fail``), when the ledger has no USAGE row for it
    (``orphan_not_in_ledger``: its credits never left the ledger's balance), or for a blank
    ``reason`` (``orphan_reason_missing``).
    """
    if not isinstance(reason, str) or not reason.strip():
        raise LedgerError(f"releasing job {job_id}: give the reason", reason="orphan_reason_missing")
    now = _now(now)
    if session.get(Job, job_id, populate_existing=True) is not None:
        raise LedgerError(f"job {job_id} exists: settle it through its lifecycle "
                          f"(reconcile fail), not as an orphan", reason="orphan_job_exists")
    conn = _conn(session)
    if _reserved_log(session, job_id) is None:
        return False
    if conn.execute(_TXN_EXISTS, {"id": usage_txn_id(job_id)}).first() is None:
        raise LedgerError(f"job {job_id}: the ledger has no USAGE row for its reservation",
                          reason="orphan_not_in_ledger")
    with _all_or_nothing(session):
        if not refund(session, job_id, now=now):
            return False
        user_id = session.execute(select(UsageLog.user_id).where(
            UsageLog.job_id == job_id)).scalars().first()
        jobstore.record_anomaly(conn, job_id=job_id, user_id=user_id, kind="orphan_released",
                                detail={"reason": reason.strip(), "by": "operator"}, now=now)
    return True
