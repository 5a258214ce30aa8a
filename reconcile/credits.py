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
* Pools are conserved one by one (DESIGN §2.2). A commit takes from the pools in the order the
  reservation consumed them (``sub`` first); each pool's release is what it reserved minus what
  it committed; a refund restores exactly each pool's unsettled remainder. Every COMMIT,
  RELEASE and REFUND row records per pool what moved.
* Legacy refunds (REFUND transactions for the job under ids other than ``job-refund:{job}``,
  partial ones included) count toward what is already refunded: a legacy refund ``p`` on a
  reservation ``a`` still ``reserved`` shrinks what it holds to ``a − p``. An import is bounded
  by what is still held and returns it in the reverse order of consumption (``topup`` first), so
  a legacy partial refund followed by a commit moves the pools exactly as a commit for less.

Credits are integers. Each function runs inside the caller's transaction and never commits. The
operations are SQLAlchemy Core (no ORM object graphs); every error is raised before the
operation's first write. On PostgreSQL reserve, commit and refund are each the balance lock plus
one statement of data-modifying CTEs (the FIFO walk, the ``ON CONFLICT`` USAGE insert, the CAS),
so they need no SAVEPOINT; :func:`settle_commit` returns the committed amount with the CAS. Writes
of more than one statement (grant, legacy imports, re-charges, the Core paths) run inside one
SAVEPOINT (:func:`_all_or_nothing`): an exception between two of them leaves nothing written.
The audit lives in :mod:`reconcile.audit`; :func:`audit` here is its entry point.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, bindparam, func, insert, select, update
from sqlalchemy.orm import Session

from . import jobstore
from .db.models import CreditAnomaly, CreditBalance, CreditLot, CreditTransaction, UsageLog
from .errors import (
    BadUsageMetadata,
    InsufficientCredits,
    InvalidParam,
    LedgerError,
    LegacyRefundRefused,
)

if TYPE_CHECKING:
    from .audit import Discrepancy
    from .settings import Settings

__all__ = [
    "POOLS", "Pools", "RESERVED_PREFIXES", "Reservation", "Settlement", "audit", "commit",
    "grant", "history", "import_legacy_refund", "recharge", "refund", "repair_usage_metadata",
    "reserve", "split_pro_rata",
]

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


def take_from_lots(amount: int, lots: Iterable[tuple[Any, Any]]) -> tuple[list[tuple[Any, int]], int]:
    """Pure FIFO: ``amount`` taken from ``lots`` ((lot id, remaining), oldest first), each lot
    drained before the next. Returns each touched lot's new ``remaining_amount`` (in order) and
    how much was taken (less than ``amount`` when the lots run out). Lots after the one that
    completes ``amount`` are not touched."""
    changes: list[tuple[Any, int]] = []
    taken = 0
    for lot_id, remaining in lots:
        if taken == amount:
            break
        take = min(int(remaining), amount - taken)
        changes.append((lot_id, int(remaining) - take))
        taken += take
    return changes, taken


def lock_balance(session: Session, user_id: uuid.UUID) -> CreditBalance:
    """The user's balance row, created if absent, locked for this transaction, with its current
    values (``populate_existing``: a copy the session loaded earlier is overwritten).

    The ORM object, for callers that want one; the ledger's own operations lock with
    :func:`_lock` (one Core statement, no object)."""
    stmt = (select(CreditBalance).where(CreditBalance.user_id == user_id).with_for_update()
            .execution_options(populate_existing=True))
    row = session.execute(stmt).scalar_one_or_none()
    if row is not None:
        return row
    session.execute(_insert_balance(session.get_bind().dialect.name, user_id))
    return session.execute(stmt).scalar_one()


# ----------------------------------------------------------------------------- Core helpers
#
# The operations below are SQLAlchemy Core (no ORM objects, no unit of work): each reads what it
# needs, raises every error before its first write, then writes. On PostgreSQL the hot paths are
# one locking read plus one statement (data-modifying CTEs), so an operation needs no SAVEPOINT
# for its all-or-nothing guarantee. Before the first statement the session is flushed (what the
# ORM queries' autoflush did), and ORM copies the session holds of rows an operation changed
# (balance, usage log, lots) are expired afterwards, so a later ORM read sees the new values.

_B = CreditBalance.__table__
_L = CreditLot.__table__
_T = CreditTransaction.__table__
_U = UsageLog.__table__
_A = CreditAnomaly.__table__


def _insert_balance(dialect: str, user_id: uuid.UUID) -> Any:
    if dialect == "postgresql":
        from sqlalchemy.dialects.postgresql import insert
    else:
        from sqlalchemy.dialects.sqlite import insert  # type: ignore[assignment]
    return (insert(_B).values(user_id=user_id, sub=0, topup=0)
            .on_conflict_do_nothing(index_elements=["user_id"]))


def _insert_txn_once(dialect: str) -> Any:
    """INSERT of a transaction that writes nothing (and returns no row) when its id exists."""
    if dialect == "postgresql":
        from sqlalchemy.dialects.postgresql import insert
    else:
        from sqlalchemy.dialects.sqlite import insert  # type: ignore[assignment]
    return insert(_T).on_conflict_do_nothing(index_elements=["id"]).returning(_T.c.id)


_LOCK = (select(_B.c.sub, _B.c.topup).where(_B.c.user_id == bindparam("u")).with_for_update())
_TXN_EXISTS = select(_T.c.id).where(_T.c.id == bindparam("id"))
_JOB_TXNS = select(_T.c.id, _T.c.type, _T.c.from_sub, _T.c.from_topup).where(
    _T.c.job_id == bindparam("j"))
_LOG_STATUS = select(_U.c.status).where(_U.c.id == bindparam("id"))
_CAS = (update(_U).where(_U.c.id == bindparam("log_id"), _U.c.status == "reserved")
        .values(status=bindparam("to")).returning(_U.c.id))
_BALANCE_ADD = (update(_B).where(_B.c.user_id == bindparam("u"))
                .values(sub=_B.c.sub + bindparam("d_sub"), topup=_B.c.topup + bindparam("d_topup"),
                        updated_at=bindparam("now")))
_LOT_SET = (update(_L).where(_L.c.id == bindparam("lot_id"))
            .values(remaining_amount=bindparam("left")))


def _conn(session: Session) -> Connection:
    session.flush()  # what the ORM queries' autoflush did: the caller's pending rows first
    return session.connection()


def _forget(session: Session, model: type, *keys: Any) -> None:
    """Expire the session's copies (if any) of rows an operation changed with Core."""
    identity_map = session.identity_map
    for key in keys:
        obj = identity_map.get((model, (key,), None))
        if obj is not None:
            session.expire(obj)


@contextmanager
def _all_or_nothing(session: Session) -> Iterator[None]:
    """A SAVEPOINT around an operation's writes when they are more than one statement (grant,
    legacy imports, re-charges, and the Core path of reserve/commit/refund: SQLite, or a
    reservation the ledger has no USAGE row for): an exception between two of them (a Python
    error, a Celery soft time limit) leaves nothing of the operation even when the caller
    catches it and commits. The PostgreSQL hot paths are one statement and need none."""
    with session.begin_nested():
        # the session emits the SAVEPOINT only when it next asks for its connection; the writes
        # below go through the Connection directly, so ask now
        session.connection()
        yield


def _lock(conn: Connection, user_id: uuid.UUID, *, create: bool = True) -> Pools | None:
    """Lock the user's balance row (created if absent unless ``create`` is false) and read it."""
    row = conn.execute(_LOCK, {"u": user_id}).first()
    if row is None and create:
        conn.execute(_insert_balance(conn.dialect.name, user_id))
        row = conn.execute(_LOCK, {"u": user_id}).first()
    return None if row is None else (int(row[0]), int(row[1]))


def _txn_exists(session: Session, txn_id: str) -> bool:
    return _conn(session).execute(_TXN_EXISTS, {"id": txn_id}).first() is not None


def _add_txn(conn: Connection, txn_id: str, user_id: uuid.UUID, job_id: uuid.UUID | None,
             type_: str, parts: Pools, now: datetime) -> None:
    conn.execute(insert(_T).values(id=txn_id, user_id=user_id, job_id=job_id, type=type_,
                                   amount=parts[0] + parts[1], from_sub=parts[0],
                                   from_topup=parts[1], created_at=now))


def _lot_row(user_id: uuid.UUID, pool: str, kind: str, txn_id: str, amount: int,
             now: datetime) -> dict[str, Any]:
    return {"user_id": user_id, "pool": pool, "kind": kind, "source_txn_id": txn_id,
            "amount": amount, "remaining_amount": amount, "created_at": now}


def _return_to_pools(conn: Connection, user_id: uuid.UUID, *, kind: str, txn_id: str,
                     parts: Pools, now: datetime) -> None:
    """New lots (one per pool that gets something back, ``sub`` first) and the balance
    increments."""
    lots = [_lot_row(user_id, pool, kind, f"{txn_id}:{pool}", part, now)
            for pool, part in zip(POOLS, parts, strict=True) if part > 0]
    for lot in lots:  # one by one: ids in this order on every backend
        conn.execute(insert(_L).values(**lot))
    conn.execute(_BALANCE_ADD, {"u": user_id, "d_sub": parts[0], "d_topup": parts[1], "now": now})


def grant(session: Session, user_id: uuid.UUID, pool: str, amount: int, txn_id: str, *,
          now: datetime | None = None) -> bool:
    """Add ``amount`` credits to ``pool`` as a new lot. Idempotent on ``txn_id``."""
    if pool not in POOLS:
        raise InvalidParam(f"pool must be one of {POOLS}", param="pool")
    _check_amount(amount, "amount")
    now = _now(now)
    conn = _conn(session)
    _lock(conn, user_id)
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


_OPEN_LOTS = (select(_L.c.id, _L.c.remaining_amount)
              .where(_L.c.user_id == bindparam("u"), _L.c.pool == bindparam("pool"),
                     _L.c.remaining_amount > 0, _L.c.id > bindparam("after"))
              .order_by(_L.c.id).limit(LOT_PAGE).with_for_update())


def _plan_consume(conn: Connection, user_id: uuid.UUID, amount: int) -> tuple[Pools, list[tuple[int, int]]]:
    """What taking ``amount`` from the user's open lots (``sub`` first, FIFO) takes from each
    pool, and each touched lot's new ``remaining_amount``. Reads only (a page at a time: never
    every open lot of a user whose history left thousands of small REFUND/RELEASE lots)."""
    taken = [0, 0]
    changes: list[tuple[int, int]] = []
    left = amount
    for index, pool in enumerate(POOLS):
        after = 0
        while left:
            rows = conn.execute(_OPEN_LOTS, {"u": user_id, "pool": pool, "after": after}).all()
            page, took = take_from_lots(left, rows)
            changes.extend(page)
            taken[index] += took
            left -= took
            if page:
                after = page[-1][0]
            if len(rows) < LOT_PAGE:
                break
    if left:
        raise LedgerError(f"user {user_id}: balance row and lots disagree ({left} missing)")
    return (taken[0], taken[1]), changes


def _apply_consume(conn: Connection, user_id: uuid.UUID, taken: Pools,
                   changes: list[tuple[int, int]], now: datetime) -> None:
    conn.execute(_LOT_SET, [{"lot_id": lot_id, "left": left} for lot_id, left in changes])
    conn.execute(_BALANCE_ADD, {"u": user_id, "d_sub": -taken[0], "d_topup": -taken[1],
                                "now": now})


def _check_funds(balance: Pools, amount: int) -> None:
    if balance[0] + balance[1] < amount:
        raise InsufficientCredits(
            f"balance {balance[0] + balance[1]} is lower than the {amount} credits needed")


def _replayed(session: Session, user_id: uuid.UUID, job_id: uuid.UUID) -> Reservation:
    """The first reservation of a job reserved before (the idempotent replay)."""
    log = session.execute(select(UsageLog).where(UsageLog.job_id == job_id)
                          .order_by(UsageLog.created_at)).scalars().first()
    if log is None:
        raise LedgerError(f"job {job_id} has a usage transaction but no usage log")
    sub, topup = reservation_pools(session, log)
    return Reservation(log.id, job_id, user_id, log.credits, sub, topup)


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
        log_id = uuid.uuid4()
        conn.execute(insert(_U).values(id=log_id, job_id=job_id, user_id=user_id, status="reserved",
                                       credits=amount, created_at=now,
                                       metadata={"from_sub": taken[0], "from_topup": taken[1]}))
    _forget(session, CreditBalance, user_id)
    _forget(session, CreditLot, *(lot_id for lot_id, _ in changes))
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


# ----------------------------------------------------------------------------- PostgreSQL
#
# The hot paths as two statements each: a locking read (the balance row, first: the lock order),
# then one statement of data-modifying CTEs that writes everything or nothing. Everything the
# operation decides (FIFO takes, what is held, the CAS) is gated inside that statement, so an
# error found in its result was raised before anything was written: no SAVEPOINT is needed.
# The statement runs after the lock is granted, so its snapshot sees every earlier writer of the
# user. Written with psycopg's ``%(name)s`` parameters (``exec_driver_sql``: nothing to compile).

_PG_MAX = 2**62  # amounts beyond this take the Core path (bigint arithmetic stays exact)

_PG_LOCK = f"SELECT sub, topup FROM {_B.name} WHERE user_id = %(u)s FOR UPDATE"

# the FIFO walk: open lots one at a time along reconcile_credit_lots_open_idx, ``sub`` first,
# until the running sum covers the amount (a user with thousands of open lots costs nothing)
_PG_WALK = f"""
walk(p, id, rem, cum) AS (
  SELECT * FROM (
    (SELECT 0 AS p, l.id, l.remaining_amount AS rem, l.remaining_amount AS cum FROM {_L.name} l
     WHERE l.user_id = %(u)s AND l.pool = 'sub' AND l.remaining_amount > 0 ORDER BY l.id LIMIT 1)
    UNION ALL
    (SELECT 1, l.id, l.remaining_amount, l.remaining_amount FROM {_L.name} l
     WHERE l.user_id = %(u)s AND l.pool = 'topup' AND l.remaining_amount > 0 ORDER BY l.id LIMIT 1)
    LIMIT 1) AS first_lot
  UNION ALL
  SELECT n.p, n.id, n.rem, w.cum + n.rem FROM walk w CROSS JOIN LATERAL (
    (SELECT 0 AS p, l.id, l.remaining_amount AS rem FROM {_L.name} l
     WHERE w.p = 0 AND l.user_id = %(u)s AND l.pool = 'sub' AND l.remaining_amount > 0
       AND l.id > w.id ORDER BY l.id LIMIT 1)
    UNION ALL
    (SELECT 1, l.id, l.remaining_amount FROM {_L.name} l
     WHERE l.user_id = %(u)s AND l.pool = 'topup' AND l.remaining_amount > 0
       AND l.id > (CASE WHEN w.p = 1 THEN w.id ELSE 0 END) ORDER BY l.id LIMIT 1)
    LIMIT 1) n
  WHERE w.cum < %(amount)s::bigint
)"""

_PG_RESERVE = f"""
WITH RECURSIVE {_PG_WALK.strip()},
take AS (SELECT p, id, LEAST(rem, %(amount)s::bigint - (cum - rem)) AS t FROM walk),
tot AS (SELECT COALESCE(SUM(t) FILTER (WHERE p = 0), 0)::bigint AS s,
               COALESCE(SUM(t) FILTER (WHERE p = 1), 0)::bigint AS tp FROM take),
ins AS (
  INSERT INTO {_T.name} (id, user_id, job_id, type, amount, from_sub, from_topup, created_at)
  SELECT %(usage_id)s, %(u)s, %(j)s, 'USAGE', %(amount)s::bigint, s, tp, %(now)s FROM tot
  WHERE s + tp = %(amount)s::bigint
  ON CONFLICT (id) DO NOTHING RETURNING from_sub, from_topup),
lots AS (
  UPDATE {_L.name} l SET remaining_amount = l.remaining_amount - take.t FROM take, ins
  WHERE l.id = take.id RETURNING l.id),
bal AS (
  UPDATE {_B.name} b SET sub = b.sub - ins.from_sub, topup = b.topup - ins.from_topup,
         updated_at = %(now)s FROM ins WHERE b.user_id = %(u)s RETURNING 1),
log AS (
  INSERT INTO {_U.name} (id, job_id, user_id, status, credits, metadata, created_at)
  SELECT %(log_id)s, %(j)s, %(u)s, 'reserved', %(amount)s::bigint,
         jsonb_build_object('from_sub', from_sub, 'from_topup', from_topup), %(now)s FROM ins
  RETURNING 1)
SELECT tot.s, tot.tp, (SELECT count(*) FROM ins), (SELECT array_agg(id) FROM lots),
       (SELECT count(*) FROM bal) + (SELECT count(*) FROM log) FROM tot
"""

# the job's reserved log with its user's balance row locked (the balance only: lock order)
_PG_LOCK_LOG = f"""
SELECT l.id, l.user_id, l.credits, l.metadata FROM {_U.name} l
JOIN {_B.name} b ON b.user_id = l.user_id
WHERE l.job_id = %(j)s AND l.status = 'reserved' ORDER BY l.created_at LIMIT 1 FOR UPDATE OF b
"""

# what the reservation holds, from one read of the job's transactions (its USAGE row and the
# legacy refunds: _legacy_refund_filter), and whether the library's refund exists
_PG_HELD = f"""
t AS (
  SELECT MAX(from_sub) FILTER (WHERE id = %(usage_id)s) AS us,
         MAX(from_topup) FILTER (WHERE id = %(usage_id)s) AS ut,
         COALESCE(SUM(from_sub) FILTER (WHERE type = 'REFUND' AND id <> %(refund_id)s), 0) AS ls,
         COALESCE(SUM(from_topup) FILTER (WHERE type = 'REFUND' AND id <> %(refund_id)s), 0) AS lt,
         COALESCE(BOOL_OR(id = %(refund_id)s), false) AS refunded
  FROM {_T.name} WHERE job_id = %(j)s),
h AS (
  SELECT GREATEST(0, us - ls)::bigint AS hs, GREATEST(0, ut - lt)::bigint AS ht, refunded
  FROM t WHERE us IS NOT NULL)"""

_TXN_COLS = "(id, user_id, job_id, type, amount, from_sub, from_topup, created_at)"
_LOT_COLS = "(user_id, pool, kind, source_txn_id, amount, remaining_amount, created_at)"

_PG_COMMIT = f"""
WITH {_PG_HELD.strip()},
c AS (SELECT hs, ht, COALESCE(%(amount)s::bigint, hs + ht) AS amt FROM h),
p AS (SELECT hs, ht, amt, LEAST(amt, hs) AS cs, amt - LEAST(amt, hs) AS ct FROM c
      WHERE amt BETWEEN 0 AND hs + ht),
cas AS (
  UPDATE {_U.name} u SET status = 'committed' FROM p
  WHERE u.id = %(log_id)s AND u.status = 'reserved'
  RETURNING p.cs, p.ct, p.hs - p.cs AS rs, p.ht - p.ct AS rt),
ci AS (
  INSERT INTO {_T.name} {_TXN_COLS}
  SELECT %(commit_id)s, %(u)s, %(j)s, 'COMMIT', cs + ct, cs, ct, %(now)s FROM cas RETURNING 1),
ri AS (
  INSERT INTO {_T.name} {_TXN_COLS}
  SELECT %(release_id)s, %(u)s, %(j)s, 'RELEASE', rs + rt, rs, rt, %(now)s FROM cas
  WHERE rs + rt > 0 RETURNING 1),
lo AS (
  INSERT INTO {_L.name} {_LOT_COLS}
  SELECT %(u)s, v.pool, 'RELEASE', v.src, v.n, v.n, %(now)s
  FROM cas CROSS JOIN LATERAL (VALUES (1, 'sub', %(release_sub)s, cas.rs),
                                      (2, 'topup', %(release_topup)s, cas.rt)) AS v(o, pool, src, n)
  WHERE v.n > 0 ORDER BY v.o RETURNING 1),
bal AS (
  UPDATE {_B.name} b SET sub = b.sub + cas.rs, topup = b.topup + cas.rt, updated_at = %(now)s
  FROM cas WHERE b.user_id = %(u)s AND cas.rs + cas.rt > 0 RETURNING 1)
SELECT (SELECT count(*) FROM h), (SELECT hs + ht FROM h), (SELECT cs + ct FROM cas),
       (SELECT status FROM {_U.name} WHERE id = %(log_id)s)
"""

_PG_REFUND = f"""
WITH {_PG_HELD.strip()},
cas AS (
  UPDATE {_U.name} u SET status = 'refunded' FROM h
  WHERE u.id = %(log_id)s AND u.status = 'reserved' AND NOT h.refunded
  RETURNING h.hs, h.ht),
ri AS (
  INSERT INTO {_T.name} {_TXN_COLS}
  SELECT %(refund_id)s, %(u)s, %(j)s, 'REFUND', hs + ht, hs, ht, %(now)s FROM cas RETURNING 1),
lo AS (
  INSERT INTO {_L.name} {_LOT_COLS}
  SELECT %(u)s, v.pool, 'REFUND', v.src, v.n, v.n, %(now)s
  FROM cas CROSS JOIN LATERAL (VALUES (1, 'sub', %(refund_sub)s, cas.hs),
                                      (2, 'topup', %(refund_topup)s, cas.ht)) AS v(o, pool, src, n)
  WHERE v.n > 0 ORDER BY v.o RETURNING 1),
bal AS (
  UPDATE {_B.name} b SET sub = b.sub + cas.hs, topup = b.topup + cas.ht, updated_at = %(now)s
  FROM cas WHERE b.user_id = %(u)s RETURNING 1)
SELECT (SELECT count(*) FROM h), (SELECT refunded FROM h), (SELECT count(*) FROM cas),
       (SELECT status FROM {_U.name} WHERE id = %(log_id)s)
"""


def _pg_reserve(session: Session, conn: Connection, user_id: uuid.UUID, job_id: uuid.UUID,
                amount: int, now: datetime) -> Reservation:
    row = conn.exec_driver_sql(_PG_LOCK, {"u": user_id}).first()
    balance = (0, 0) if row is None else (int(row[0]), int(row[1]))
    usage_id = usage_txn_id(job_id)
    if balance[0] + balance[1] < amount:  # nothing written; a replay still returns the first
        if conn.execute(_TXN_EXISTS, {"id": usage_id}).first() is not None:
            return _replayed(session, user_id, job_id)
        _check_funds(balance, amount)
    log_id = uuid.uuid4()
    sub, topup, inserted, lots, _ = conn.exec_driver_sql(_PG_RESERVE, {
        "u": user_id, "j": job_id, "amount": amount, "usage_id": usage_id, "log_id": log_id,
        "now": now}).one()
    if not inserted:  # nothing written: a replay, or lots that do not cover the balance
        if sub + topup == amount or conn.execute(_TXN_EXISTS, {"id": usage_id}).first():
            return _replayed(session, user_id, job_id)
        raise LedgerError(f"user {user_id}: balance row and lots disagree "
                          f"({amount - sub - topup} missing)")
    _forget(session, CreditBalance, user_id)
    _forget(session, CreditLot, *(lots or ()))
    return Reservation(log_id, job_id, user_id, amount, int(sub), int(topup))


def _pg_params(job_id: uuid.UUID, user_id: uuid.UUID, log_id: uuid.UUID,
               now: datetime) -> dict[str, Any]:
    refund_id = refund_txn_id(job_id)
    return {"j": job_id, "u": user_id, "log_id": log_id, "now": now,
            "usage_id": usage_txn_id(job_id), "refund_id": refund_id}


def _pg_commit(session: Session, conn: Connection, job_id: uuid.UUID, amount: int | None,
               now: datetime, log_id: uuid.UUID, user_id: uuid.UUID, credits_: int,
               meta: Any) -> Settlement | None:
    """None: the ledger has no USAGE row for this reservation (the Core path decides)."""
    release_id = release_txn_id(job_id)
    params = _pg_params(job_id, user_id, log_id, now)
    params.update(amount=amount, commit_id=commit_txn_id(job_id), release_id=release_id,
                  release_sub=f"{release_id}:sub", release_topup=f"{release_id}:topup")
    has_usage, held, committed, status = conn.exec_driver_sql(_PG_COMMIT, params).one()
    if not has_usage:
        return None
    if committed is None:  # nothing written
        if status != "reserved":
            return _NOT_DONE
        raise LedgerError(f"cannot commit {amount!r} of the {held} credits held for job {job_id}",
                          reason="commit_exceeds_held")
    if _bad_metadata(meta, credits_):
        _note_anomaly_once(conn, job_id, user_id, meta, "usage_txn")
    _forget(session, CreditBalance, user_id)
    _forget(session, UsageLog, log_id)
    return Settlement(True, int(committed))


def _pg_refund(session: Session, conn: Connection, job_id: uuid.UUID, now: datetime,
               log_id: uuid.UUID, user_id: uuid.UUID, credits_: int, meta: Any) -> bool | None:
    """None: the ledger has no USAGE row for this reservation (the Core path decides)."""
    params = _pg_params(job_id, user_id, log_id, now)
    params.update(refund_sub=f"{params['refund_id']}:sub",
                  refund_topup=f"{params['refund_id']}:topup")
    has_usage, refunded, done, status = conn.exec_driver_sql(_PG_REFUND, params).one()
    if not has_usage:
        return None
    if not done:  # nothing written
        if status != "reserved":
            return False
        if refunded:
            raise LedgerError(f"job {job_id} was refunded before but its log was still reserved",
                              reason="refunded_twice")
        raise LedgerError(f"job {job_id}: its reservation could not be refunded")
    if _bad_metadata(meta, credits_):
        _note_anomaly_once(conn, job_id, user_id, meta, "usage_txn")
    _forget(session, CreditBalance, user_id)
    _forget(session, UsageLog, log_id)
    return True


# ----------------------------------------------------------------------------- settle


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


@dataclass(frozen=True)
class Settlement:
    """What :func:`settle_commit` did: ``done`` is the CAS (what :func:`commit` returns) and
    ``amount`` what the job finally cost when ``done`` (the committed amount; no re-read)."""

    done: bool
    amount: int | None = None

    def __bool__(self) -> bool:
        return self.done


_NOT_DONE = Settlement(False)


def commit(session: Session, job_id: uuid.UUID, amount: int | None = None, *,
           now: datetime | None = None) -> bool:
    """CAS the job's reservation ``reserved`` → ``committed``.

    ``amount`` (default: all that is held) may be less than held; it is taken from the pools in
    the order the reservation consumed them (``sub`` first) and each pool's rest is released
    back to it. False: no reservation is held (already settled, or none).
    """
    done = settle_commit(session, job_id, amount, now=now)
    if done.done:  # for BuiltinLedger.commit_settled: the amount without a re-read
        session.info[SETTLED_KEY] = (job_id, done.amount)
    return done.done


SETTLED_KEY = "reconcile.credits.settled"  # session.info: (job id, amount) of the last commit


def settle_commit(session: Session, job_id: uuid.UUID, amount: int | None = None, *,
                  now: datetime | None = None) -> Settlement:
    """:func:`commit`, returning the committed amount with the CAS (:class:`Settlement`)."""
    now = _now(now)
    conn = _conn(session)
    pg_ok = amount is None or (not isinstance(amount, bool) and isinstance(amount, int)
                               and -_PG_MAX < amount < _PG_MAX)
    if conn.dialect.name == "postgresql" and pg_ok:
        found = conn.exec_driver_sql(_PG_LOCK_LOG, {"j": job_id}).first()
        if found is not None:
            done = _pg_commit(session, conn, job_id, amount, now, *found)
            if done is not None:
                return done
    log = _reserved_log(session, job_id)
    if log is None:
        return _NOT_DONE
    _lock(conn, log.user_id)
    if conn.execute(_LOG_STATUS, {"id": log.id}).scalar() != "reserved":
        return _NOT_DONE
    held, note = _held_of(conn, log)
    if amount is None:
        amount = sum(held)
    if isinstance(amount, bool) or not isinstance(amount, int) or not 0 <= amount <= sum(held):
        raise LedgerError(f"cannot commit {amount!r} of the {sum(held)} credits held for job {job_id}",
                          reason="commit_exceeds_held")
    committed = take_in_order(amount, held)
    with _all_or_nothing(session):
        if conn.execute(_CAS, {"log_id": log.id, "to": "committed"}).first() is None:
            return _NOT_DONE
        _add_txn(conn, commit_txn_id(job_id), log.user_id, job_id, "COMMIT", committed, now)
        released = (held[0] - committed[0], held[1] - committed[1])
        if sum(released):
            _add_txn(conn, release_txn_id(job_id), log.user_id, job_id, "RELEASE", released, now)
            _return_to_pools(conn, log.user_id, kind="RELEASE", txn_id=release_txn_id(job_id),
                             parts=released, now=now)
        if note:
            _note_anomaly_once(conn, job_id, log.user_id, log.metadata_, note)
    _forget(session, CreditBalance, log.user_id)
    _forget(session, UsageLog, log.id)
    return Settlement(True, amount)


def refund(session: Session, job_id: uuid.UUID, *, now: datetime | None = None) -> bool:
    """CAS the job's reservation ``reserved`` → ``refunded`` and return what it still holds.

    Adds only the difference legacy refunds left (``a − p``), per pool exactly what that pool
    still holds, as REFUND lots. False: nothing was reserved any more (already refunded or
    committed, or never).
    """
    now = _now(now)
    conn = _conn(session)
    if conn.dialect.name == "postgresql":
        found = conn.exec_driver_sql(_PG_LOCK_LOG, {"j": job_id}).first()
        if found is not None:
            done = _pg_refund(session, conn, job_id, now, *found)
            if done is not None:
                return done
    log = _reserved_log(session, job_id)
    if log is None:
        return False
    _lock(conn, log.user_id)
    if conn.execute(_LOG_STATUS, {"id": log.id}).scalar() != "reserved":
        return False
    parts, note = _held_of(conn, log, refunding=True)
    with _all_or_nothing(session):
        if conn.execute(_CAS, {"log_id": log.id, "to": "refunded"}).first() is None:
            return False
        _add_txn(conn, refund_txn_id(job_id), log.user_id, job_id, "REFUND", parts, now)
        _return_to_pools(conn, log.user_id, kind="REFUND", txn_id=refund_txn_id(job_id),
                         parts=parts, now=now)
        if note:
            _note_anomaly_once(conn, job_id, log.user_id, log.metadata_, note)
    _forget(session, CreditBalance, log.user_id)
    _forget(session, UsageLog, log.id)
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
    conn = _conn(session)
    _lock(conn, first.user_id)
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
    if conn.execute(_TXN_EXISTS, {"id": usage_txn_id(job_id)}).first() is None:
        raise _refuse_legacy(job_id, "legacy_refund_not_in_ledger",
                             "the ledger has no USAGE row for it (import the reservation first)")
    held, note = _held_of(conn, log)
    if amount > sum(held):
        raise _refuse_legacy(job_id, "legacy_refund_exceeds_held",
                             f"{amount} is more than the {sum(held)} credits still held")
    parts = take_in_order(amount, held, order=(1, 0))
    with _all_or_nothing(session):
        _add_txn(conn, txn_id, log.user_id, job_id, "REFUND", parts, now)
        _return_to_pools(conn, log.user_id, kind="REFUND", txn_id=txn_id, parts=parts, now=now)
        if note:
            _note_anomaly_once(conn, job_id, log.user_id, log.metadata_, note)
    _forget(session, CreditBalance, log.user_id)
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
    conn = _conn(session)
    balance = _lock(conn, log.user_id) or (0, 0)
    if conn.execute(_TXN_EXISTS, {"id": recharge_commit_txn_id(job_id)}).first() is not None:
        return False
    session.refresh(log)
    if log.status != "refunded" or \
            conn.execute(_TXN_EXISTS, {"id": refund_txn_id(job_id)}).first() is None:
        raise LedgerError(f"job {job_id} can be re-charged only after the library refunded it "
                          f"(usage log {log.status})", reason="recharge_not_refunded")
    _check_funds(balance, amount)
    taken, changes = _plan_consume(conn, log.user_id, amount)
    with _all_or_nothing(session):
        _add_txn(conn, recharge_usage_txn_id(job_id), log.user_id, job_id, "USAGE", taken, now)
        _add_txn(conn, recharge_commit_txn_id(job_id), log.user_id, job_id, "COMMIT", taken, now)
        _apply_consume(conn, log.user_id, taken, changes, now)
        jobstore.record_recharge(session, job_id, amount)
    _forget(session, CreditBalance, log.user_id)
    _forget(session, CreditLot, *(lot_id for lot_id, _ in changes))
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
    from .audit import run

    return run(session, now=_now(now), grace=grace, settings=settings, since=since)


def __getattr__(name: str) -> Any:  # ``credits.Discrepancy`` kept for callers
    if name == "Discrepancy":
        from .audit import Discrepancy

        return Discrepancy
    raise AttributeError(name)
