"""Internal: the PostgreSQL hot paths: reserve, commit and refund as the balance lock plus one
statement of data-modifying CTEs each, run by one PL/pgSQL function per operation (one round
trip; :mod:`._pg_functions` builds the functions from these statements)."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from sqlalchemy import Connection
from sqlalchemy.orm import Session

from ..db.contract import usage_log_ids_assigned
from ..db.models import CreditBalance, CreditLot
from ..errors import (
    LedgerError,
)
from ..settlement import RECORD_KEY
from ._base import (
    _NOT_DONE,
    Reservation,
    Settlement,
    _check_funds,
    commit_txn_id,
    pg_metadata_with_record,
    pg_metadata_without_record,
    refund_txn_id,
    release_txn_id,
    usage_txn_id,
)
from ._core import (
    _B,
    _L,
    _T,
    _U,
    _forget,
    _forget_settled,
)
from ._pools import (
    _bad_metadata,
    _note_anomaly_once,
    _replayed,
)

# ----------------------------------------------------------------------------- PostgreSQL
#
# The hot paths as two statements each: a locking read (the balance row, first: the lock order),
# then one statement of data-modifying CTEs that writes everything or nothing. Everything the
# operation decides (FIFO takes, what is held, the CAS) is gated inside that statement, so an
# error found in its result was raised before anything was written: no SAVEPOINT is needed.
# The statement runs after the lock is granted, so its snapshot sees every earlier writer of the
# user. Written with psycopg's ``%(name)s`` parameters; the statements are the bodies of the
# PL/pgSQL functions the operations call (one round trip each: _pg_functions, where each
# parameter becomes the function's ``p_name``), which are VOLATILE: under READ COMMITTED each
# statement inside one takes a fresh snapshot, so the statement after the lock still sees every
# earlier writer of the user.

_PG_MAX = 2**62  # amounts beyond this take the Core path (bigint arithmetic stays exact)


def pg_amount_ok(amount: int | None) -> bool:
    """Whether a commit of ``amount`` (None: all that is held) may take the PostgreSQL path."""
    return amount is None or (not isinstance(amount, bool) and isinstance(amount, int)
                              and -_PG_MAX < amount < _PG_MAX)

_PG_LOCK = f"SELECT sub, topup FROM {_B.name} WHERE user_id = %(u)s FOR UPDATE"

# the FIFO walk: open lots one at a time along reconcile_credit_lots_open_idx, ``sub`` first,
# until the running sum covers the amount (a user with thousands of open lots costs nothing).
# Each step picks the next ``sub`` lot and the next ``topup`` lot (one row each at most) and
# keeps the first by pool rank ``p``: ORDER BY p, never the UNION ALL's output order, which
# PostgreSQL does not promise (tests/integration/test_ledger_orphans_and_import.py swaps the branches)
_PG_WALK = f"""
walk(p, id, rem, cum) AS (
  SELECT * FROM (
    (SELECT 0 AS p, l.id, l.remaining_amount AS rem, l.remaining_amount AS cum FROM {_L.name} l
     WHERE l.user_id = %(u)s AND l.pool = 'sub' AND l.remaining_amount > 0 ORDER BY l.id LIMIT 1)
    UNION ALL
    (SELECT 1 AS p, l.id, l.remaining_amount AS rem, l.remaining_amount AS cum FROM {_L.name} l
     WHERE l.user_id = %(u)s AND l.pool = 'topup' AND l.remaining_amount > 0 ORDER BY l.id LIMIT 1)
    ORDER BY p LIMIT 1) AS first_lot
  UNION ALL
  SELECT n.p, n.id, n.rem, w.cum + n.rem FROM walk w CROSS JOIN LATERAL (
    (SELECT 0 AS p, l.id, l.remaining_amount AS rem FROM {_L.name} l
     WHERE w.p = 0 AND l.user_id = %(u)s AND l.pool = 'sub' AND l.remaining_amount > 0
       AND l.id > w.id ORDER BY l.id LIMIT 1)
    UNION ALL
    (SELECT 1 AS p, l.id, l.remaining_amount AS rem FROM {_L.name} l
     WHERE l.user_id = %(u)s AND l.pool = 'topup' AND l.remaining_amount > 0
       AND l.id > (CASE WHEN w.p = 1 THEN w.id ELSE 0 END) ORDER BY l.id LIMIT 1)
    ORDER BY p LIMIT 1) n
  WHERE w.cum < %(amount)s::bigint
)"""

# the lots the walk took are written through their primary key: ``l.id = ANY (ARRAY(…))`` gives
# the planner a small row count to probe with. Joined on ``take`` alone (a recursive CTE, which
# it estimates at ~30 rows), it chose a hash join over a sequential scan of every lot once the
# table held a few thousand: a reserve that slowed with each refund's lot (1.8 → 3.4 ms after
# 10,000 refunds of one user) until the table was large enough for the index to win again
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
  WHERE l.id = take.id AND l.id = ANY (ARRAY(SELECT id FROM take)) RETURNING l.id),
bal AS (
  UPDATE {_B.name} b SET sub = b.sub - ins.from_sub, topup = b.topup - ins.from_topup,
         updated_at = %(now)s FROM ins WHERE b.user_id = %(u)s RETURNING 1),
log AS (
  INSERT INTO {_U.name} (/*id*/job_id, user_id, status, credits, metadata, created_at)
  SELECT /*log_id*/%(j)s, %(u)s, 'reserved', %(amount)s::bigint,
         jsonb_build_object('from_sub', from_sub, 'from_topup', from_topup), %(now)s FROM ins
  RETURNING id)
SELECT tot.s, tot.tp, (SELECT count(*) FROM ins), (SELECT array_agg(id) FROM lots),
       (SELECT count(*) FROM bal) + (SELECT count(*) FROM log), (SELECT id FROM log) FROM tot
"""
# usage_logs.id: given by the library (a uuid column without a default), or left to the
# database (an identity, a serial, a default: the table contract, reconcile.db.contract)
_PG_RESERVE_GIVEN_ID = _PG_RESERVE.replace("/*id*/", "id, ").replace("/*log_id*/", "%(log_id)s, ")
_PG_RESERVE = _PG_RESERVE.replace("/*id*/", "").replace("/*log_id*/", "")

# the job's reserved log with its user's balance row locked (the balance only: lock order).
# A commit of everything held takes it too, although it writes no balance: locking only the
# log would let a writer of the same job take the balance first and then wait on the log
# (its statement's snapshot older than the commit it waited for), and a transaction that
# calls the ledger again after the commit would deadlock against it
# (tests/integration/test_ledger_interleavings.py: the commit_j1_all pairs)
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


_SOME_RELEASED = "\n  WHERE rs + rt > 0"  # the RELEASE row only when something is released


def _pg_txn(name: str, txn_id: str, type_: str, sub: str, topup: str, where: str = "") -> str:
    """A CTE inserting one transaction per ``cas`` row: id parameter ``txn_id``, per pool the
    ``cas`` columns ``sub``/``topup`` (``where``: an extra condition)."""
    return f"""{name} AS (
  INSERT INTO {_T.name} {_TXN_COLS}
  SELECT %({txn_id})s, %(u)s, %(j)s, '{type_}', {sub} + {topup}, {sub}, {topup}, %(now)s FROM cas{where} RETURNING 1)"""


def _pg_back_to_pools(kind: str, source: str, sub: str, topup: str, when: str = "") -> str:
    """The pool-return tail of commit and refund: a lot per pool that gets something back (``sub``
    first; source ids from the parameters ``{source}_sub``/``{source}_topup``) and the balance
    increments (``when``: a condition on ``cas`` for the balance update)."""
    return f"""lo AS (
  INSERT INTO {_L.name} {_LOT_COLS}
  SELECT %(u)s, v.pool, '{kind}', v.src, v.n, v.n, %(now)s
  FROM cas CROSS JOIN LATERAL (VALUES (1, 'sub', %({source}_sub)s, cas.{sub}),
                                      (2, 'topup', %({source}_topup)s, cas.{topup})) AS v(o, pool, src, n)
  WHERE v.n > 0 ORDER BY v.o RETURNING 1),
bal AS (
  UPDATE {_B.name} b SET sub = b.sub + cas.{sub}, topup = b.topup + cas.{topup}, updated_at = %(now)s
  FROM cas WHERE b.user_id = %(u)s{when} RETURNING 1)"""


# the settlement record of a failed/cancelled job's partial refund (settlement.Decision.record),
# merged into the usage log's metadata by the CAS itself: written exactly when the commit is,
# with ``kept`` the amount this statement commits. A metadata that is not a JSON object (a
# platform's own value) is left as it is: the job then has no record.
_PG_RECORD = f"""jsonb_build_object('{RECORD_KEY}', jsonb_build_object(
    'status', %(rec_status)s::text, 'refund_share', %(rec_share)s::text, 'kept', p.amt))"""
_PG_SET_RECORD = f""",
    metadata = {pg_metadata_with_record("u.metadata", _PG_RECORD)}"""
# a commit without a record drops a "settlement" key the log already carries (_base)
_PG_DROP_RECORD = f""",
    metadata = {pg_metadata_without_record("u.metadata")}"""


def _pg_commit_sql(set_extra: str = "") -> str:
    return f"""
WITH {_PG_HELD.strip()},
c AS (SELECT hs, ht, COALESCE(%(amount)s::bigint, hs + ht) AS amt FROM h),
p AS (SELECT hs, ht, amt, LEAST(amt, hs) AS cs, amt - LEAST(amt, hs) AS ct FROM c
      WHERE amt BETWEEN 0 AND hs + ht),
cas AS (
  UPDATE {_U.name} u SET status = 'committed'{set_extra} FROM p
  WHERE u.id = %(log_id)s AND u.status = 'reserved'
  RETURNING p.cs, p.ct, p.hs - p.cs AS rs, p.ht - p.ct AS rt),
{_pg_txn("ci", "commit_id", "COMMIT", "cs", "ct")},
{_pg_txn("ri", "release_id", "RELEASE", "rs", "rt", _SOME_RELEASED)},
{_pg_back_to_pools("RELEASE", "release", "rs", "rt", " AND cas.rs + cas.rt > 0")}
SELECT (SELECT count(*) FROM h), (SELECT hs + ht FROM h), (SELECT cs + ct FROM cas),
       (SELECT status FROM {_U.name} WHERE id = %(log_id)s)
"""


_PG_COMMIT = _pg_commit_sql(_PG_DROP_RECORD)  # no record: a key already there is dropped
_PG_COMMIT_RECORDED = _pg_commit_sql(_PG_SET_RECORD)  # the same statement, with the record

_PG_REFUND = f"""
WITH {_PG_HELD.strip()},
cas AS (
  UPDATE {_U.name} u SET status = 'refunded' FROM h
  WHERE u.id = %(log_id)s AND u.status = 'reserved' AND NOT h.refunded
  RETURNING h.hs, h.ht),
{_pg_txn("ri", "refund_id", "REFUND", "hs", "ht")},
{_pg_back_to_pools("REFUND", "refund", "hs", "ht")}
SELECT (SELECT count(*) FROM h), (SELECT refunded FROM h), (SELECT count(*) FROM cas),
       (SELECT status FROM {_U.name} WHERE id = %(log_id)s)
"""


# a reserve that wrote nothing: is it a replay (the USAGE row exists)? A commit or refund whose
# lock found no reserved log with a balance row: has the job a reserved log at all (one of the
# platform's without a balance row, for the Core path)?
_PG_USAGE_EXISTS = f"SELECT EXISTS (SELECT FROM {_T.name} WHERE id = %(usage_id)s)"
_PG_RESERVED_EXISTS = (f"SELECT EXISTS (SELECT FROM {_U.name} "
                       f"WHERE job_id = %(j)s AND status = 'reserved')")

# ----------------------------------------------------------------------------- the functions
#
# One function per operation, its parameters in order (name, type): the call below and the
# function's definition (_pg_functions) are both built from these. Revision 0029 installs the
# functions (the table contract reports them missing or stale: reconcile.db.functions).

Params = tuple[tuple[str, str], ...]
RESERVE_FN = "reconcile_ledger_reserve"
COMMIT_FN = "reconcile_ledger_commit"
REFUND_FN = "reconcile_ledger_refund"
RESERVE_PARAMS: Params = (("u", "uuid"), ("j", "uuid"), ("amount", "bigint"),
                          ("usage_id", "text"), ("now", "timestamptz"), ("log_id", "uuid"))
_SETTLE_PARAMS: Params = (("j", "uuid"), ("now", "timestamptz"), ("usage_id", "text"),
                          ("refund_id", "text"))
COMMIT_PARAMS: Params = _SETTLE_PARAMS + (
    ("amount", "bigint"), ("commit_id", "text"), ("release_id", "text"), ("release_sub", "text"),
    ("release_topup", "text"), ("rec_status", "text"), ("rec_share", "text"))
REFUND_PARAMS: Params = _SETTLE_PARAMS + (("refund_sub", "text"), ("refund_topup", "text"))


def _call(name: str, params: Params) -> str:
    return f"SELECT * FROM {name}({', '.join(f'%({p})s::{t}' for p, t in params)})"


_CALL_RESERVE = _call(RESERVE_FN, RESERVE_PARAMS)
_CALL_COMMIT = _call(COMMIT_FN, COMMIT_PARAMS)
_CALL_REFUND = _call(REFUND_FN, REFUND_PARAMS)


def _log_id(text: str) -> uuid.UUID | int:
    """``usage_logs.id`` as the functions return it: text, the column being a uuid or an
    integer (the table contract); the value psycopg would have read from the column."""
    return int(text) if text.lstrip("-").isdigit() else uuid.UUID(text)


def _pg_reserve(session: Session, conn: Connection, user_id: uuid.UUID, job_id: uuid.UUID,
                amount: int, now: datetime) -> Reservation:
    usage_id = usage_txn_id(job_id)
    params = {"u": user_id, "j": job_id, "amount": amount, "usage_id": usage_id, "now": now,
              "log_id": None if usage_log_ids_assigned(conn) else uuid.uuid4()}
    bal_sub, bal_topup, sub, topup, inserted, lots, log_id, replay = conn.exec_driver_sql(
        _CALL_RESERVE, params).one()
    balance = (int(bal_sub), int(bal_topup))  # the locked balance row's, or (0, 0)
    if balance[0] + balance[1] < amount:  # nothing written; a replay still returns the first
        if replay:
            return _replayed(session, user_id, job_id)
        _check_funds(balance, amount)
    if not inserted:  # nothing written: a replay, or lots that do not cover the balance
        if sub + topup == amount or replay:
            return _replayed(session, user_id, job_id)
        raise LedgerError(f"user {user_id}: balance row and lots disagree "
                          f"({amount - sub - topup} missing)")
    _forget(session, CreditBalance, user_id)
    _forget(session, CreditLot, *(lots or ()))
    return Reservation(_log_id(log_id), job_id, user_id, amount, int(sub), int(topup))


def _pg_params(job_id: uuid.UUID, now: datetime) -> dict[str, Any]:
    return {"j": job_id, "now": now, "usage_id": usage_txn_id(job_id),
            "refund_id": refund_txn_id(job_id)}


def _pg_settled(session: Session, conn: Connection, job_id: uuid.UUID, user_id: uuid.UUID,
                log_id: uuid.UUID | int, credits_: int, meta: Any) -> None:
    """After a commit or refund statement wrote: the anomaly a rewritten usage-log metadata
    owes (once per job), and the session's stale copies forgotten."""
    if _bad_metadata(meta, credits_):
        _note_anomaly_once(conn, job_id, user_id, meta, "usage_txn")
    _forget_settled(session, user_id, log_id)


def commit_params(job_id: uuid.UUID, amount: int | None, now: datetime,
                  record: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The commit function's arguments, by name (:data:`COMMIT_PARAMS`): one home for the call
    below and for a caller's statement that runs the function inline (:mod:`.inline`)."""
    release_id = release_txn_id(job_id)
    params = _pg_params(job_id, now)
    params.update(amount=amount, commit_id=commit_txn_id(job_id), release_id=release_id,
                  release_sub=f"{release_id}:sub", release_topup=f"{release_id}:topup",
                  rec_status=None, rec_share=None)
    if record is not None:
        params.update(rec_status=record["status"], rec_share=record["refund_share"])
    return params


def commit_outcome(session: Session, conn: Connection, job_id: uuid.UUID, amount: int | None,
                   row: Any) -> Settlement | None:
    """What the commit function's row (its ``OUT`` columns in order) means: the settlement, or
    None when the Core path decides; :class:`LedgerError` for an amount above what is held
    (nothing was written)."""
    (log_id, user_id, credits_, meta, reserved, has_usage, held, committed, status) = row
    if log_id is None:  # no reserved log with a balance row (the lock found none)
        return None if reserved else _NOT_DONE
    if not has_usage:
        return None
    if committed is None:  # nothing written
        if status != "reserved":
            return _NOT_DONE
        raise LedgerError(f"cannot commit {amount!r} of the {held} credits held for job {job_id}",
                          reason="commit_exceeds_held")
    _pg_settled(session, conn, job_id, user_id, _log_id(log_id), credits_, meta)
    return Settlement(True, int(committed))


def _pg_commit(session: Session, conn: Connection, job_id: uuid.UUID, amount: int | None,
               now: datetime, record: Mapping[str, str] | None = None) -> Settlement | None:
    """None: the Core path decides (a reserved log without the user's balance row, or without
    the ledger's USAGE row). ``record``: the settlement record the CAS merges into the log's
    metadata (with ``kept``)."""
    row = conn.exec_driver_sql(_CALL_COMMIT, commit_params(job_id, amount, now, record)).one()
    return commit_outcome(session, conn, job_id, amount, row)


def _pg_refund(session: Session, conn: Connection, job_id: uuid.UUID,
               now: datetime) -> bool | None:
    """None: the Core path decides (as :func:`_pg_commit`)."""
    params = _pg_params(job_id, now)
    params.update(refund_sub=f"{params['refund_id']}:sub",
                  refund_topup=f"{params['refund_id']}:topup")
    (log_id, user_id, credits_, meta, reserved, has_usage, refunded, done,
     status) = conn.exec_driver_sql(_CALL_REFUND, params).one()
    if log_id is None:
        return None if reserved else False
    if not has_usage:
        return None
    if not done:  # nothing written
        if status != "reserved":
            return False
        if refunded:
            raise LedgerError(f"job {job_id} was refunded before but its log was still reserved",
                              reason="refunded_twice")
        raise LedgerError(f"job {job_id}: its reservation could not be refunded")
    _pg_settled(session, conn, job_id, user_id, _log_id(log_id), credits_, meta)
    return True
