"""Internal: the PL/pgSQL functions of the ledger's PostgreSQL hot paths, built from the
statements of :mod:`._pg` (their one home): each runs the lock, then the one statement of
data-modifying CTEs, so an operation is one round trip.

:data:`FUNCTIONS` is what the code expects installed: ``name → (arguments, body)``. A revision
installs a copy of it (0029 the first), frozen as revisions are; the table contract compares
the database with the newest such copy (:mod:`reconcile.db.functions`), and
``tests/integration/test_ledger_functions.py`` keeps that copy equal to this one. A change of a
statement is therefore a new revision that replaces the functions.

The functions are VOLATILE: under READ COMMITTED each statement inside takes a fresh snapshot,
so the statement after the lock sees every writer of the user that committed before the lock
was granted, as the two round trips did. Each ``%(name)s`` parameter of a statement becomes the
function's argument ``p_name``, or a field of the locked log (its id, its user); results are
``OUT r_…`` columns, one row per call. ``usage_logs.id`` is returned as text (a uuid or an
integer: the table contract). No body holds a ``%`` (a ``%TYPE``): a revision's offline SQL
would print it doubled.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from ._pg import (
    _PG_COMMIT,
    _PG_COMMIT_RECORDED,
    _PG_LOCK,
    _PG_LOCK_LOG,
    _PG_REFUND,
    _PG_RESERVE,
    _PG_RESERVE_GIVEN_ID,
    _PG_RESERVED_EXISTS,
    _PG_USAGE_EXISTS,
    COMMIT_FN,
    COMMIT_PARAMS,
    REFUND_FN,
    REFUND_PARAMS,
    RESERVE_FN,
    RESERVE_PARAMS,
    Params,
)

_PARAM = re.compile(r"%\((\w+)\)s")


def _into(statement: str, targets: str, names: Mapping[str, str] | None = None) -> str:
    """``statement`` as a statement of a function body: each ``%(name)s`` the variable
    ``names[name]`` (default ``p_name``), its row ``INTO`` ``targets``."""
    names = names or {}
    sql = _PARAM.sub(lambda m: names.get(m.group(1), f"p_{m.group(1)}"), statement.strip())
    return f"{sql}\n  INTO {targets};"


def _arguments(params: Params, out: Params) -> str:
    return ", ".join([f"p_{name} {type_}" for name, type_ in params]
                     + [f"OUT r_{name} {type_}" for name, type_ in out])


_RESERVE_OUT: Params = (("bal_sub", "bigint"), ("bal_topup", "bigint"), ("sub", "bigint"),
                        ("topup", "bigint"), ("inserted", "bigint"), ("lots", "bigint[]"),
                        ("log_id", "text"), ("replay", "boolean"))
_RESERVE_INTO = "r_sub, r_topup, r_inserted, r_lots, v_written, r_log_id"


def reserve_body(reserve: str = _PG_RESERVE, reserve_given_id: str = _PG_RESERVE_GIVEN_ID) -> str:
    """The reserve function's body around the reserve statement (and its variant that gives
    usage_logs.id); a test builds it around a rewritten statement."""
    return f"""
DECLARE
  v_written bigint;
BEGIN
{_into(_PG_LOCK, "r_bal_sub, r_bal_topup")}
r_bal_sub := COALESCE(r_bal_sub, 0);
r_bal_topup := COALESCE(r_bal_topup, 0);
IF r_bal_sub + r_bal_topup < p_amount THEN  -- too little: nothing written (a replay?)
{_into(_PG_USAGE_EXISTS, "r_replay")}
  RETURN;
END IF;
IF p_log_id IS NULL THEN  -- the database assigns usage_logs.id
{_into(reserve, _RESERVE_INTO)}
ELSE
{_into(reserve_given_id, _RESERVE_INTO)}
END IF;
IF r_inserted = 0 THEN  -- nothing written: a replay, or lots short of the balance
{_into(_PG_USAGE_EXISTS, "r_replay")}
END IF;
END;
"""

# commit and refund: the job's reserved log with its user's balance row locked, then the
# statement (None of it found: whether the job has a reserved log at all)
_SETTLE_OUT: Params = (("log_id", "text"), ("user_id", "uuid"), ("credits", "bigint"),
                       ("meta", "jsonb"), ("reserved", "boolean"), ("has_usage", "bigint"))
# the commit's result columns, in the order :func:`._pg.commit_outcome` reads them
COMMIT_OUT: Params = _SETTLE_OUT + (("held", "bigint"), ("committed", "bigint"), ("status", "text"))
_LOCKED = {"u": "r_user_id", "log_id": "v_log.id"}  # the locked log's (v_log: _PG_LOCK_LOG's row)


def _settle_body(statement: str, recorded: str | None, targets: str) -> str:
    run = _into(statement, targets, _LOCKED)
    if recorded is not None:  # the commit: with a settlement record, or without
        run = (f"IF p_rec_status IS NULL THEN\n{run}\nELSE\n"
               f"{_into(recorded, targets, _LOCKED)}\nEND IF;")
    return f"""
DECLARE
  v_log record;
BEGIN
{_into(_PG_LOCK_LOG, "v_log")}
IF NOT FOUND THEN  -- no reserved log with its user's balance row
{_into(_PG_RESERVED_EXISTS, "r_reserved")}
  RETURN;
END IF;
r_log_id := v_log.id::text;
r_user_id := v_log.user_id;
r_credits := v_log.credits;
r_meta := v_log.metadata;
{run}
END;
"""


FUNCTIONS: dict[str, tuple[str, str]] = {
    RESERVE_FN: (_arguments(RESERVE_PARAMS, _RESERVE_OUT), reserve_body()),
    COMMIT_FN: (
        _arguments(COMMIT_PARAMS, COMMIT_OUT),
        _settle_body(_PG_COMMIT, _PG_COMMIT_RECORDED, "r_has_usage, r_held, r_committed, r_status")),
    REFUND_FN: (
        _arguments(REFUND_PARAMS, _SETTLE_OUT + (("refunded", "boolean"), ("done", "bigint"),
                                                 ("status", "text"))),
        _settle_body(_PG_REFUND, None, "r_has_usage, r_refunded, r_done, r_status")),
}
