"""Internal: the library's own mechanics, not an import path for platforms (may move).

The ledger audit: a proof of conservation, per job, per pool and per user.

An empty list means the ledger balances. The audit reads the library's tables (and the jobs it
knows) and never writes. What it proves:

* **Per transaction**: ``amount = from_sub + from_topup``, nothing negative, and an id under the
  library's own prefixes (``job-usage:`` …) names its type and job (``txn_split_mismatch``,
  ``txn_id_mismatch``).
* **Per job** the ledger knows (it has a ``job-usage:{job}`` USAGE row, written or imported),
  per pool: ``USAGE (+ re-charge USAGE) = COMMIT (+ re-charge COMMIT) + RELEASE + REFUND +
  legacy refunds + what is still held`` (``commit_exceeds_reservation``, ``job_unbalanced``,
  ``pool_mismatch``, ``legacy_refund_exceeds_reservation``); the usage log agrees (one log, one
  ``reserved`` at most, its credits = the USAGE amount, its status = the settlement:
  ``usage_log_missing``, ``duplicate_reserved_log``, ``usage_amount_mismatch``,
  ``settled_twice``, ``reserved_but_settled``, ``settlement_missing``); and the job row agrees
  (``failed_job_committed``, ``completed_after_refund`` unless re-charged,
  ``credits_actual_mismatch``, ``terminal_job_reserved`` past the grace,
  ``in_flight_past_horizon``). A COMMIT/RELEASE/REFUND for a job with no USAGE row is
  ``refund_without_reservation`` / ``settlement_without_reservation``.
* **Per lot**: ``0 ≤ remaining ≤ amount`` (``negative_lot``, ``lot_out_of_range``); every GRANT,
  RELEASE and REFUND transaction has exactly the lots it says, per pool
  (``grant_lot_mismatch``, ``release_lot_mismatch``, ``refund_lot_mismatch``), and no lot lacks
  its transaction (``lot_without_txn``).
* **Per user**, per pool: balance = Σ open lots (``balance_mismatch``, ``negative_balance``,
  ``balance_missing`` when lots or transactions exist without a balance row); what the lots gave
  up = Σ USAGE (``lot_consumption_mismatch``: credits taken from a lot with no transaction);
  and granted = balance + held + committed (``unbalanced``).

Legacy refunds are counted exactly as the ledger counts them: a REFUND for the job under any id
but ``job-refund:{job}`` (:func:`reconcile.credits.legacy_refunded`). Platform rows from before
adoption without a USAGE row are outside the per-job classes until imported.

**The in-flight horizon.** A job still ``pending``/``processing`` must be failed by the time its
kind allows (DESIGN §6): a sync kind at its threshold; an async kind once its attempts are spent,
``max(start + threshold, last attempt) + (MAX_ATTEMPTS − attempts) × 5 min`` (all scaled by
``TIME_SCALE``; attempts beyond the maximum move it back), plus the grace and one sweep interval of slack. An ``uncertain`` job (held on
purpose), an observe-only kind and a kind this process does not know are excepted.

**Incremental mode** (``since``): the users touched since the watermark (a transaction, a usage
log, a balance update or a job finishing since then), plus every user with a job in flight or a
reservation held, and everything of theirs, checked with the same rules. It cannot replace the
full audit: lots change in place (``remaining_amount`` carries no time), and a platform can
rewrite a usage log or a job without any timestamp moving, so damage to a user untouched since
the watermark is invisible to it. Run it often; run the full audit as the proof. (Finding the
touched users scans the transactions' ``created_at``, which has no index; past
``INCREMENTAL_MAX_USERS`` touched users the full audit runs instead.)
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Select,
    Subquery,
    Text,
    and_,
    case,
    cast,
    func,
    literal,
    null,
    or_,
    select,
    text,
    union,
)
from sqlalchemy.orm import Session

from .db.models import CreditBalance, CreditLot, CreditTransaction, Job, UsageLog
from .kinds import get_kind
from .settings import Settings
from .states import ATTEMPT_SPACING, IN_FLIGHT, MAX_ATTEMPTS, TERMINAL, Submission

# Every check is one SQL statement that returns only the rows in breach (PostgreSQL and SQLite):
# the ledger is aggregated where it lives, so the full audit costs a few scans, not a Python loop
# over every row.

INCREMENTAL_MAX_USERS = 20_000  # more touched users than this: the full audit runs instead
T = CreditTransaction.__table__
L = CreditLot.__table__
B = CreditBalance.__table__
U = UsageLog.__table__
J = Job.__table__


@dataclass(frozen=True)
class Discrepancy:
    kind: str
    user_id: uuid.UUID | None
    job_id: uuid.UUID | None
    detail: str


def run(session: Session, *, now: datetime, grace: timedelta = timedelta(minutes=10),
        settings: Settings | None = None, since: datetime | None = None) -> list[Discrepancy]:
    """The full audit, or with ``since`` the incremental one (see the module docstring)."""
    a = _Audit(session, now, grace, settings or Settings.model_construct(), since)
    if not a.sqlite:
        # PostgreSQL's JIT compiles these wide aggregates for tens of seconds before the first
        # row (measured: 25 s of a 26 s audit on 100k rows); off for this transaction only
        session.execute(text("SET LOCAL jit = off"))
    for check in (_transactions, _lots, _users, _jobs, _in_flight):
        check(a)
    return a.found


@dataclass
class _Audit:
    session: Session
    now: datetime
    grace: timedelta
    settings: Settings
    since: datetime | None

    def __post_init__(self) -> None:
        self.found: list[Discrepancy] = []
        self.sqlite = self.session.get_bind().dialect.name == "sqlite"
        # the incremental mode's users, found once; so many that the full audit is cheaper → full
        self.users: list[uuid.UUID] | None = None
        if self.since is not None:
            users = touched_users(self.session, self.since)
            if len(users) <= INCREMENTAL_MAX_USERS:
                self.users = sorted(users)

    def report(self, kind: str, user_id: Any, job_id: Any, detail: str) -> None:
        self.found.append(Discrepancy(kind, user_id, job_id, detail))

    def scoped(self, stmt: Select[Any], user_col: Any) -> Select[Any]:
        """``stmt`` limited to the touched users in the incremental mode."""
        if self.users is None:
            return stmt
        return stmt.where(user_col.in_(self.users))

    def job_text(self, col: Any) -> ColumnElement[str]:
        """A job id as the text inside a deterministic transaction id (``8-4-4-4-12``)."""
        if not self.sqlite:
            return cast(col, Text)
        h = func.lower(col)  # SQLite stores a Uuid as 32 hex characters
        parts = [func.substr(h, 1, 8), func.substr(h, 9, 4), func.substr(h, 13, 4),
                 func.substr(h, 17, 4), func.substr(h, 21, 12)]
        out: Any = parts[0]
        for part in parts[1:]:
            out = out + "-" + part
        return out  # type: ignore[no-any-return]


def touched_users_query(since: datetime) -> Any:
    """Users with a transaction, usage log or balance change since ``since``, a job finished
    since then, a job in flight, or a reservation held."""
    return union(
        select(T.c.user_id).where(T.c.created_at >= since),
        select(B.c.user_id).where(B.c.updated_at >= since),
        select(U.c.user_id).where(or_(U.c.created_at >= since, U.c.status == "reserved")),
        select(J.c.user_id).where(or_(J.c.completed_at >= since, J.c.status.in_(IN_FLIGHT))),
    )


def touched_users(session: Session, since: datetime) -> set[uuid.UUID]:
    return set(session.execute(select(touched_users_query(since).subquery().c.user_id)).scalars())


def _sum(cond: Any, col: Any) -> Any:
    return func.coalesce(func.sum(case((cond, col), else_=0)), 0)


def _count(cond: Any) -> Any:
    return func.coalesce(func.sum(case((cond, 1), else_=0)), 0)


# ----------------------------------------------------------------------------- transactions


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


# ----------------------------------------------------------------------------- jobs


_CLASSES = ("usage", "r_usage", "commit", "r_commit", "release", "refund", "legacy")


def _job_classes(a: _Audit, t: Any) -> dict[str, Any]:
    """Each job-level transaction class as a condition on its exact id (the ledger's rules);
    ``t`` has ``id``, ``type`` and ``jid`` (the job id as text)."""

    def exact(prefix: str, type_: str, suffix: str = "") -> Any:
        target = literal(prefix) + t.jid + suffix if suffix else literal(prefix) + t.jid
        return and_(t.id == target, t.type == type_)

    return {
        "usage": exact("job-usage:", "USAGE"),
        "r_usage": exact("job-recharge:", "USAGE", ":usage"),
        "commit": exact("job-commit:", "COMMIT"),
        "r_commit": exact("job-recharge:", "COMMIT", ":commit"),
        "release": exact("job-release:", "RELEASE"),
        "refund": exact("job-refund:", "REFUND"),
        # any other REFUND id, prefixed or not: credits.legacy_refunded counts the same rows
        "legacy": and_(t.type == "REFUND", t.id != literal("job-refund:") + t.jid),
    }


def _job_txns(a: _Audit, only_reserved: bool = False) -> Subquery:
    """Per job: per class and pool what moved, and how many rows (one scan, one class each)."""
    base = select(T.c.id, T.c.type, T.c.job_id, T.c.user_id, T.c.from_sub, T.c.from_topup,
                  a.job_text(T.c.job_id).label("jid")).where(T.c.job_id.is_not(None))
    if only_reserved:
        base = base.where(T.c.job_id.in_(select(U.c.job_id).where(U.c.status == "reserved")))
    inner = a.scoped(base, T.c.user_id).subquery("tx")
    classes = _job_classes(a, inner.c)
    cls = case(*((cond, literal(name)) for name, cond in classes.items()), else_=literal("odd"))
    # grouped by class first: the class is computed once per row (a flattened subquery would
    # recompute it inside every one of the 24 aggregates below)
    tagged = (select(inner.c.job_id, inner.c.user_id, cls.label("cls"),
                     func.sum(inner.c.from_sub).label("s"), func.sum(inner.c.from_topup).label("t"),
                     func.count().label("n"))
              .group_by(inner.c.job_id, inner.c.user_id, cls)).subquery("tagged")
    cols: list[Any] = [tagged.c.job_id, tagged.c.user_id]
    for name in (*classes, "odd"):
        cond = tagged.c.cls == name
        cols += [func.coalesce(func.sum(col).filter(cond), 0).label(label)
                 for col, label in ((tagged.c.s, f"{name}_s"), (tagged.c.t, f"{name}_t"),
                                    (tagged.c.n, f"n_{name}"))]
    return (select(*cols).group_by(tagged.c.job_id, tagged.c.user_id)).subquery("jt")


def _job_logs(a: _Audit, jt: Subquery) -> Subquery:
    stmt = (select(U.c.job_id, func.count().label("n_logs"),
                   _count(U.c.status == "reserved").label("n_reserved"),
                   _count(U.c.status == "committed").label("n_committed"),
                   _count(U.c.status == "refunded").label("n_refunded"),
                   func.min(U.c.credits).label("min_credits"),
                   func.max(U.c.credits).label("max_credits"))
            .group_by(U.c.job_id))
    if a.users is not None:
        stmt = stmt.where(U.c.job_id.in_(select(jt.c.job_id)))
    return stmt.subquery("lg")


def _job_facts(a: _Audit) -> Subquery:
    """One row per job: its transactions per class, its usage logs and its row, with the
    derived sums computed once (``OFFSET 0`` keeps PostgreSQL from inlining them into every
    check)."""
    jt = _job_txns(a)
    lg = _job_logs(a, jt)
    c = jt.c
    n_reserved = func.coalesce(lg.c.n_reserved, 0)
    reserved = n_reserved > 0
    status = case((reserved, "reserved"), (lg.c.n_committed > 0, "committed"),
                  (lg.c.n_refunded > 0, "refunded"), else_=null())
    held_s = case((reserved, c.usage_s - c.legacy_s), else_=0)
    held_t = case((reserved, c.usage_t - c.legacy_t), else_=0)
    commit = c.commit_s + c.commit_t
    return (select(
        c.job_id, c.user_id, c.n_usage, c.n_odd, c.n_commit, c.n_refund, c.n_r_commit,
        (c.n_refund + c.n_legacy).label("n_refunds"),
        (c.n_commit + c.n_release + c.n_r_commit + c.n_r_usage).label("n_settles"),
        c.usage_s, c.usage_t, c.legacy_s, c.legacy_t,
        lg.c.job_id.label("log_job"), n_reserved.label("n_reserved"), lg.c.min_credits,
        lg.c.max_credits, status.label("log_status"),
        (c.usage_s + c.r_usage_s).label("lhs_s"), (c.usage_t + c.r_usage_t).label("lhs_t"),
        (c.commit_s + c.r_commit_s + c.release_s + c.refund_s + c.legacy_s + held_s).label("rhs_s"),
        (c.commit_t + c.r_commit_t + c.release_t + c.refund_t + c.legacy_t + held_t).label("rhs_t"),
        (c.usage_s + c.usage_t).label("usage"), commit.label("commit"),
        (c.legacy_s + c.legacy_t).label("legacy"),
        (case((status == "committed", commit), else_=0) + c.r_commit_s + c.r_commit_t).label("cost"),
        J.c.status.label("job_status"), J.c.credits_actual,
        func.coalesce(J.c.completed_at, J.c.created_at).label("ended"),
    ).select_from(jt.outerjoin(lg, lg.c.job_id == c.job_id).outerjoin(J, J.c.id == c.job_id))
        .offset(0).subquery("d"))


def _jobs(a: _Audit) -> None:
    d = _job_facts(a).c
    known, reserved = d.n_usage > 0, d.n_reserved > 0
    unbalanced = d.lhs_s + d.lhs_t != d.rhs_s + d.rhs_t
    checks: dict[str, Any] = {
        "txn_id_mismatch": d.n_odd > 0,
        "refund_without_reservation": and_(~known, d.n_refunds > 0),
        "settlement_without_reservation": and_(~known, d.n_settles > 0),
        "usage_log_missing": and_(known, d.log_job.is_(None)),
        "duplicate_reserved_log": and_(known, d.n_reserved > 1),
        "usage_amount_mismatch": and_(known, or_(d.min_credits != d.usage, d.max_credits != d.usage)),
        "legacy_refund_exceeds_reservation": and_(known, reserved, or_(
            d.usage_s < d.legacy_s, d.usage_t < d.legacy_t)),
        "commit_exceeds_reservation": and_(known, unbalanced, d.commit > d.usage - d.legacy),
        "job_unbalanced": and_(known, unbalanced, d.commit <= d.usage - d.legacy),
        "pool_mismatch": and_(known, ~unbalanced, d.lhs_s != d.rhs_s),
        "settled_twice": and_(known, d.n_commit > 0, d.n_refund > 0),
        "reserved_but_settled": and_(known, reserved, d.n_commit + d.n_refund > 0),
        "settlement_missing": and_(known, or_(and_(d.log_status == "committed", d.n_commit == 0),
                                              and_(d.log_status == "refunded", d.n_refund == 0))),
        "failed_job_committed": and_(known, d.job_status.in_(("failed", "cancelled")),
                                     d.log_status == "committed"),
        "completed_after_refund": and_(known, d.job_status == "completed",
                                       d.log_status == "refunded", d.n_r_commit == 0),
        "terminal_job_reserved": and_(known, d.job_status.in_(TERMINAL), reserved,
                                      d.ended < a.now - a.grace),
        "credits_actual_mismatch": and_(known, d.credits_actual.is_not(None),
                                        or_(reserved, d.credits_actual != d.cost)),
    }
    flags = [case((cond, 1), else_=0).label(kind) for kind, cond in checks.items()]
    stmt = select(d.job_id, d.user_id, d.log_status, d.lhs_s, d.lhs_t, d.rhs_s, d.rhs_t,
                  d.n_reserved, d.min_credits, d.max_credits, d.usage, d.job_status,
                  d.credits_actual, d.cost, *flags).where(or_(*checks.values()))
    for r in a.session.execute(stmt):
        m = r._mapping
        for kind in checks:
            if m[kind]:
                a.report(kind, r.user_id, r.job_id, _job_detail(kind, r))


def _job_detail(kind: str, r: Any) -> str:
    pools = (f"USAGE {(r.lhs_s, r.lhs_t)} vs COMMIT + RELEASE + REFUND + legacy + held "
             f"{(r.rhs_s, r.rhs_t)} (sub, topup)")
    return {
        "usage_amount_mismatch": f"USAGE {r.usage} != usage log credits {r.min_credits}..{r.max_credits}",
        "duplicate_reserved_log": f"{r.n_reserved} reserved usage logs",
        "credits_actual_mismatch": f"credits_actual {r.credits_actual} != ledger "
                                   f"{'(still reserved)' if r.log_status == 'reserved' else r.cost}",
        "failed_job_committed": f"job {r.job_status}, reservation committed",
        "completed_after_refund": "job completed and its reservation refunded (keep the refund, "
                                  "or re-charge: credits.recharge)",
        "terminal_job_reserved": f"job {r.job_status} still holds a reserved usage log",
        "reserved_but_settled": "usage log reserved, a settlement exists",
        "settlement_missing": f"usage log {r.log_status} without its transaction",
        "settled_twice": "both job-commit and job-refund exist",
    }.get(kind, pools)


# ----------------------------------------------------------------------------- users


def _users(a: _Audit) -> None:
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
                         .outerjoin(lt, lt.c.user_id == au).outerjoin(ht, ht.c.user_id == au))
            .where(or_(and_(B.c.user_id.is_(None), has_any), B.c.sub != rem_s, B.c.topup != rem_t,
                       B.c.sub < 0, B.c.topup < 0, gave_s != used_s, gave_t != used_t,
                       granted != balance + held + committed)))
    for r in a.session.execute(stmt):
        _user_row(a, r)


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


# ----------------------------------------------------------------------------- in flight


def _in_flight(a: _Audit) -> None:
    """In-flight jobs the ledger knows (their USAGE row) past their kind's horizon."""
    usage_id = literal("job-usage:") + a.job_text(J.c.id)
    stmt = a.scoped(
        select(J.c.id, J.c.user_id, J.c.status, J.c.submission_state, J.c.provider_kind,
               J.c.provider_call_started_at, J.c.started_at, J.c.created_at,
               J.c.reconcile_attempts, J.c.reconcile_last_attempt_at, J.c.poll_lease_expires_at)
        .where(J.c.status.in_(IN_FLIGHT),
               select(T.c.id).where(T.c.id == usage_id, T.c.job_id == J.c.id).exists()),
        J.c.user_id)
    for row in a.session.execute(stmt):
        late = _past_horizon(a, row)
        if late is not None:
            a.report("in_flight_past_horizon", row.user_id, row.id, late)


def _past_horizon(a: _Audit, row: Any) -> str | None:
    """Why an in-flight job is past its kind's exhaustion horizon, or None (module docstring)."""
    kind = get_kind(row.provider_kind)
    if kind is None or row.submission_state == Submission.UNCERTAIN \
            or kind.name in (a.settings.observe_only_kinds or ()):
        return None
    scaled = a.settings.scaled
    start = row.provider_call_started_at or row.started_at or row.created_at
    base = start + scaled(kind.stale_threshold)
    if kind.sync:
        deadline = base
    else:
        last = row.reconcile_last_attempt_at
        if last is None and row.poll_lease_expires_at is not None:
            last = row.poll_lease_expires_at  # adopted or resumed: attempts start over
        if last is not None:
            base = max(base, last)
        # attempts beyond MAX_ATTEMPTS (hole 2: 39 of 18) move the deadline back, not forward
        deadline = base + scaled(ATTEMPT_SPACING) * (MAX_ATTEMPTS - (row.reconcile_attempts or 0))
    slack = a.grace + scaled(timedelta(seconds=a.settings.sweep_interval))
    if a.now <= deadline + slack:
        return None
    return (f"{kind.name} job {row.status} ({row.submission_state}), attempts "
            f"{row.reconcile_attempts}/{MAX_ATTEMPTS}, exhausted by {deadline.isoformat()}")
