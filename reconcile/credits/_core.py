"""Internal: the ledger's shared SQLAlchemy Core helpers: the tables, the statements every
operation reuses, the balance lock, the SAVEPOINT, lots and the FIFO consume (the portable
paths SQLite and the PostgreSQL fallbacks run)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any, overload

from sqlalchemy import Connection, TextClause, bindparam, insert, select, text, update
from sqlalchemy.orm import Session

from ..db.models import (
    CreditAnomaly,
    CreditBalance,
    CreditLot,
    CreditTransaction,
    UsageLog,
    table_of,
)
from ..errors import (
    LedgerError,
)
from ..settlement import RECORD_KEY
from ._base import (
    LOT_PAGE,
    POOLS,
    Pools,
    pg_metadata_with_record,
    pg_metadata_without_record,
    take_from_lots,
)


@overload
def lock_balance(session: Session, user_id: uuid.UUID) -> CreditBalance: ...
@overload
def lock_balance(session: Session, user_id: uuid.UUID, *,
                 create: bool) -> CreditBalance | None: ...
def lock_balance(session: Session, user_id: uuid.UUID, *,
                 create: bool = True) -> CreditBalance | None:
    """The user's balance row, created if absent (``create=False``: None, nothing created — a
    platform's own ledger leaves the built-in tables untouched), locked for this transaction,
    with its current values (``populate_existing``: a copy the session loaded earlier is
    overwritten).

    The ORM object, for callers that want one; the ledger's own operations lock with
    :func:`_lock` (one Core statement, no object)."""
    stmt = (select(CreditBalance).where(CreditBalance.user_id == user_id).with_for_update()
            .execution_options(populate_existing=True))
    row = session.execute(stmt).scalar_one_or_none()
    if row is not None or not create:
        return row
    session.execute(_insert_balance(session.get_bind().dialect.name, user_id))
    return session.execute(stmt).scalar_one()


# ----------------------------------------------------------------------------- Core helpers
#
# The operations below are SQLAlchemy Core (no ORM objects, no unit of work): each reads what it
# needs, raises every error before its first write, then writes. On PostgreSQL the hot paths are
# one locking read plus one statement (data-modifying CTEs), both in one function call (_pg), so
# an operation needs no SAVEPOINT for its all-or-nothing guarantee. Before the first statement the session is flushed (what the
# ORM queries' autoflush did), and ORM copies the session holds of rows an operation changed
# (balance, usage log, lots) are expired afterwards, so a later ORM read sees the new values.

_B = table_of(CreditBalance)
_L = table_of(CreditLot)
_T = table_of(CreditTransaction)
_U = table_of(UsageLog)
_A = table_of(CreditAnomaly)


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
# lots whose source id is one of ``ids`` and not of kind ``kind`` (lot ids are unique: a GRANT's
# lot is its transaction id, a RELEASE/REFUND's ``{txn}:{pool}``, so a grant ``x:sub`` and a
# refund ``x`` could claim the same one)
_LOT_IDS_TAKEN = select(_L.c.source_txn_id).where(
    _L.c.source_txn_id.in_(bindparam("ids", expanding=True)), _L.c.kind != bindparam("kind"))
_JOB_TXNS = select(_T.c.id, _T.c.type, _T.c.from_sub, _T.c.from_topup).where(
    _T.c.job_id == bindparam("j"))
_LOG_STATUS = select(_U.c.status).where(_U.c.id == bindparam("id"))
_CAS = (update(_U).where(_U.c.id == bindparam("log_id"), _U.c.status == "reserved")
        .values(status=bindparam("to")).returning(_U.c.id))
# the commit's CAS that also merges a settlement record into the log's metadata (_settle), in
# SQL: the platform's metadata is never decoded and re-encoded in Python, where a number no
# float holds would come back as 0.3 or Infinity (not JSON: PostgreSQL refuses it, SQLite's
# audit no longer sees the record). An object gets the key, a null becomes an object with it,
# any other value (a platform's own non-object, SQLite text that is not JSON) is left as it is.
_PG_CORE_RECORD = f"""jsonb_build_object('{RECORD_KEY}', jsonb_build_object(
    'status', CAST(:rec_status AS text), 'refund_share', CAST(:rec_share AS text),
    'kept', CAST(:rec_kept AS numeric)))"""
_SQLITE_CORE_RECORD = """json_object('status', :rec_status, 'refund_share', :rec_share,
    'kept', :rec_kept)"""


def _typed_log_id(sql: str) -> TextClause:
    return text(sql).bindparams(bindparam("log_id", type_=_U.c.id.type))


_CAS_RECORD: dict[str, TextClause] = {
    "postgresql": _typed_log_id(f"""UPDATE {_U.name} SET status = 'committed',
    metadata = {pg_metadata_with_record("metadata", _PG_CORE_RECORD)}
  WHERE id = :log_id AND status = 'reserved' RETURNING id"""),
    # a CASE per step: json_type raises on text that is not JSON
    "sqlite": _typed_log_id(f"""UPDATE {_U.name} SET status = 'committed', metadata = CASE
    WHEN metadata IS NULL THEN json_object('{RECORD_KEY}', {_SQLITE_CORE_RECORD})
    WHEN json_valid(metadata) THEN CASE json_type(metadata)
      WHEN 'object' THEN json_set(metadata, '$.{RECORD_KEY}', {_SQLITE_CORE_RECORD})
      WHEN 'null' THEN json_object('{RECORD_KEY}', {_SQLITE_CORE_RECORD})
      ELSE metadata END
    ELSE metadata END
  WHERE id = :log_id AND status = 'reserved' RETURNING id"""),
}
# the commit's CAS without a record: a "settlement" key the log already carries is dropped (not
# the ledger's record of this commit; _pg._PG_DROP_RECORD)
_CAS_COMMIT: dict[str, TextClause] = {
    "postgresql": _typed_log_id(f"""UPDATE {_U.name} SET status = 'committed',
    metadata = {pg_metadata_without_record("metadata")}
  WHERE id = :log_id AND status = 'reserved' RETURNING id"""),
    "sqlite": _typed_log_id(f"""UPDATE {_U.name} SET status = 'committed', metadata = CASE
    WHEN json_valid(metadata) THEN CASE
      WHEN json_type(metadata) = 'object' AND json_type(metadata, '$.{RECORD_KEY}') IS NOT NULL
      THEN json_remove(metadata, '$.{RECORD_KEY}')
      ELSE metadata END
    ELSE metadata END
  WHERE id = :log_id AND status = 'reserved' RETURNING id"""),
}
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


def _forget_settled(session: Session, user_id: uuid.UUID, log_id: uuid.UUID | int) -> None:
    """Expire the session's copies of what a commit or refund changed: the balance, the log."""
    _forget(session, CreditBalance, user_id)
    _forget(session, UsageLog, log_id)


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


def _give_back(conn: Connection, txn_id: str, user_id: uuid.UUID, job_id: uuid.UUID, kind: str,
               parts: Pools, now: datetime) -> None:
    """A RELEASE or REFUND transaction ``txn_id`` and its lots and balance increments."""
    _add_txn(conn, txn_id, user_id, job_id, kind, parts, now)
    _return_to_pools(conn, user_id, kind=kind, txn_id=txn_id, parts=parts, now=now)


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
