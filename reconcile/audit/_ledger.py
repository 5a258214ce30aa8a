"""Internal: the audit's checks of the ledger's own rows: transactions, lots and users' balances
(per pool)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    and_,
    case,
    func,
    or_,
    select,
    union,
)

from ._base import (
    B,
    L,
    T,
    _Audit,
    _sum,
)
from ._jobs import (
    _job_txns,
)


def _transactions(a: _Audit) -> None:
    bad_split = or_(T.c.amount != T.c.from_sub + T.c.from_topup, T.c.from_sub < 0, T.c.from_topup < 0)
    stmt = a.scoped(select(T.c.id, T.c.user_id, T.c.job_id, T.c.amount, T.c.from_sub, T.c.from_topup)
                    .where(bad_split), T.c.user_id)
    for row in a.session.execute(stmt):
        a.report("txn_split_mismatch", row.user_id, row.job_id,
                 f"{row.id}: amount {row.amount} != sub {row.from_sub} + topup {row.from_topup}")
    stmt = a.scoped(select(T.c.id, T.c.user_id, T.c.type)
                    .where(T.c.job_id.is_(None), T.c.type != "GRANT"), T.c.user_id)
    for row in a.session.execute(stmt):
        a.report(_orphan_kind(row.type), row.user_id, None, f"{row.id} names no job")


def _orphan_kind(type_: str) -> str:
    return "refund_without_reservation" if type_ == "REFUND" else "settlement_without_reservation"


# ----------------------------------------------------------------------------- lots


def _lot_txn_id(a: _Audit) -> Any:
    """The transaction a lot came from: its source id, less ``:{pool}`` unless a GRANT's."""
    trimmed = func.substr(L.c.source_txn_id, 1,
                          func.length(L.c.source_txn_id) - func.length(L.c.pool) - 1)
    return case((L.c.kind == "GRANT", L.c.source_txn_id), else_=trimmed)


def _lots(a: _Audit) -> None:
    part = case((L.c.pool == "sub", T.c.from_sub), else_=T.c.from_topup)
    expected_source = case((T.c.type == "GRANT", T.c.id), else_=T.c.id + ":" + L.c.pool)
    joined = L.outerjoin(T, T.c.id == _lot_txn_id(a))
    wrong = or_(T.c.id.is_(None), T.c.type != L.c.kind, part != L.c.amount,
                expected_source != L.c.source_txn_id,
                and_(T.c.type == "GRANT", T.c.amount != L.c.amount))
    stmt = a.scoped(select(L.c.id, L.c.user_id, L.c.pool, L.c.kind, L.c.source_txn_id, L.c.amount,
                           L.c.remaining_amount, T.c.id.label("txn"), T.c.type, part.label("part"))
                    .select_from(joined)
                    .where(or_(L.c.remaining_amount < 0, L.c.remaining_amount > L.c.amount,
                               L.c.amount <= 0, L.c.pool.not_in(("sub", "topup")), wrong)),
                    L.c.user_id)
    for r in a.session.execute(stmt):
        where = f"lot {r.id} ({r.kind} {r.pool} {r.remaining_amount}/{r.amount})"
        if r.remaining_amount < 0:
            a.report("negative_lot", r.user_id, None, where)
        elif r.remaining_amount > r.amount or r.amount <= 0 or r.pool not in ("sub", "topup"):
            a.report("lot_out_of_range", r.user_id, None, where)
        if r.txn is None:
            a.report("lot_without_txn", r.user_id, None, f"{where} from {r.source_txn_id}")
        elif r.type != r.kind or r.part != r.amount:
            a.report(f"{r.type.lower()}_lot_mismatch", r.user_id, None,
                     f"{r.txn}: the transaction gives {r.part} to {r.pool}, {where} got {r.amount}")
    _missing_lots(a)


def _missing_lots(a: _Audit) -> None:
    """GRANT/RELEASE/REFUND transactions whose promised lot does not exist."""
    for pool, part in (("sub", T.c.from_sub), ("topup", T.c.from_topup)):
        source = case((T.c.type == "GRANT", T.c.id), else_=T.c.id + ":" + pool)
        joined = T.outerjoin(L, L.c.source_txn_id == source)
        stmt = a.scoped(select(T.c.id, T.c.user_id, T.c.job_id, T.c.type, part.label("part"))
                        .select_from(joined)
                        .where(T.c.type.in_(("GRANT", "RELEASE", "REFUND")), part > 0,
                               L.c.id.is_(None)), T.c.user_id)
        for r in a.session.execute(stmt):
            a.report(f"{r.type.lower()}_lot_mismatch", r.user_id, r.job_id,
                     f"{r.id}: the transaction gives {r.part} to {pool}, no lot got it")



def _user_figures(a: _Audit) -> tuple[Any, Any]:
    """Each user's figures, per pool (balance, open lots, what the lots gave up, USAGE taken,
    held, granted, committed) and the condition that the user's identities fail: the one
    statement of the per-user checks, which :func:`identity` also reads for one user."""
    usage_like = T.c.type == "USAGE"
    ut = a.scoped(select(
        T.c.user_id,
        _sum(T.c.type == "GRANT", T.c.amount).label("granted"),
        _sum(T.c.type == "COMMIT", T.c.amount).label("committed"),
        _sum(usage_like, T.c.from_sub).label("used_s"),
        _sum(usage_like, T.c.from_topup).label("used_t"),
    ).group_by(T.c.user_id), T.c.user_id).subquery("ut")
    lt = a.scoped(select(
        L.c.user_id,
        _sum(L.c.pool == "sub", L.c.remaining_amount).label("rem_s"),
        _sum(L.c.pool == "topup", L.c.remaining_amount).label("rem_t"),
        _sum(L.c.pool == "sub", L.c.amount - L.c.remaining_amount).label("gave_s"),
        _sum(L.c.pool == "topup", L.c.amount - L.c.remaining_amount).label("gave_t"),
    ).group_by(L.c.user_id), L.c.user_id).subquery("lt")
    jt = _job_txns(a, only_reserved=True)  # held: jobs with a reserved log only (few)
    ht = (select(jt.c.user_id, func.sum(jt.c.usage_s + jt.c.usage_t - jt.c.legacy_s
                                        - jt.c.legacy_t).label("held"))
          .where(jt.c.n_usage > 0).group_by(jt.c.user_id).subquery("ht"))
    everyone = union(*(a.scoped(select(col), col)
                       for col in (T.c.user_id, L.c.user_id, B.c.user_id))).subquery("au")
    au = everyone.c.user_id
    rem_s, rem_t = func.coalesce(lt.c.rem_s, 0), func.coalesce(lt.c.rem_t, 0)
    used_s, used_t = func.coalesce(ut.c.used_s, 0), func.coalesce(ut.c.used_t, 0)
    gave_s, gave_t = func.coalesce(lt.c.gave_s, 0), func.coalesce(lt.c.gave_t, 0)
    held = func.coalesce(ht.c.held, 0)
    granted, committed = func.coalesce(ut.c.granted, 0), func.coalesce(ut.c.committed, 0)
    balance = func.coalesce(B.c.sub + B.c.topup, rem_s + rem_t)
    has_any = or_(ut.c.user_id.is_not(None), lt.c.user_id.is_not(None))
    stmt = (select(au.label("user_id"), B.c.user_id.label("has_balance"), B.c.sub, B.c.topup,
                   rem_s.label("rem_s"), rem_t.label("rem_t"), used_s.label("used_s"),
                   used_t.label("used_t"), gave_s.label("gave_s"), gave_t.label("gave_t"),
                   held.label("held"), granted.label("granted"), committed.label("committed"),
                   balance.label("balance"), has_any.label("has_any"))
            .select_from(everyone.outerjoin(B, B.c.user_id == au).outerjoin(ut, ut.c.user_id == au)
                         .outerjoin(lt, lt.c.user_id == au).outerjoin(ht, ht.c.user_id == au)))
    failing = or_(and_(B.c.user_id.is_(None), has_any), B.c.sub != rem_s, B.c.topup != rem_t,
                  B.c.sub < 0, B.c.topup < 0, gave_s != used_s, gave_t != used_t,
                  granted != balance + held + committed)
    return stmt, failing


def _users(a: _Audit) -> None:
    stmt, failing = _user_figures(a)
    for r in a.session.execute(stmt.where(failing)):
        _user_row(a, r)


def identity(a: _Audit) -> dict[str, Any] | None:
    """The per-user identity of the one user ``a`` is scoped to (``a.users``): its figures per
    pool, and what the checks of :func:`_users` find for it (an empty list: it holds). None: the
    ledger has nothing of that user."""
    stmt, _ = _user_figures(a)
    row = a.session.execute(stmt).first()
    if row is None:
        return None
    found_before = len(a.found)
    _user_row(a, row)
    return {**row._asdict(), "findings": a.found[found_before:]}


def _user_row(a: _Audit, r: Any) -> None:
    user = r.user_id
    if r.has_balance is None:
        if r.has_any:
            a.report("balance_missing", user, None, f"no balance row; lots hold {(r.rem_s, r.rem_t)}")
    else:
        for pool, have, lots in (("sub", r.sub, r.rem_s), ("topup", r.topup, r.rem_t)):
            if have != lots:
                a.report("balance_mismatch", user, None, f"{pool}: balance {have} != lots {lots}")
            if have < 0:
                a.report("negative_balance", user, None, f"{pool}: {have}")
    for pool, gave, used in (("sub", r.gave_s, r.used_s), ("topup", r.gave_t, r.used_t)):
        if gave != used:
            a.report("lot_consumption_mismatch", user, None,
                     f"{pool}: lots gave up {gave}, USAGE took {used}")
    if r.granted != r.balance + r.held + r.committed:
        a.report("unbalanced", user, None, f"granted {r.granted} != balance {r.balance} + reserved "
                                           f"{r.held} + committed {r.committed}")
