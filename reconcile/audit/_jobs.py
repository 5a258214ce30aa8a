"""Internal: the audit's per-job checks (each job's transactions per class against its usage
log and its row) and the in-flight horizon."""

from __future__ import annotations

from datetime import timedelta
from fractions import Fraction
from typing import Any

from sqlalchemy import (
    BigInteger,
    Numeric,
    Subquery,
    Text,
    and_,
    case,
    cast,
    false,
    func,
    literal,
    literal_column,
    null,
    or_,
    select,
)

from ..db.models import JobEvent, table_of
from ..jobstore.horizon import exhaustion_deadline
from ..kinds import get_kind
from ..settlement import CANCEL_REQUESTED_EVENT, RECORD_KEY, kept_of, refund_share, settlement_cause
from ..states import IN_FLIGHT, MAX_ATTEMPTS, TERMINAL
from ._base import (
    J,
    T,
    U,
    _Audit,
    _count,
)

E = table_of(JobEvent)

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
    committed = U.c.status == "committed"
    stmt = (select(U.c.job_id, func.count().label("n_logs"),
                   _count(U.c.status == "reserved").label("n_reserved"),
                   _count(committed).label("n_committed"),
                   _count(U.c.status == "refunded").label("n_refunded"),
                   func.min(U.c.credits).label("min_credits"),
                   func.max(U.c.credits).label("max_credits"),
                   # the settlement record of a committed log (text; parsed by the check)
                   func.max(case((committed, _record_text(a, "refund_share")), else_=null()))
                   .label("rec_share"),
                   func.max(case((committed, _record_text(a, "kept")), else_=null()))
                   .label("rec_kept"))
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
        lg.c.max_credits, status.label("log_status"), lg.c.n_committed, lg.c.rec_share,
        lg.c.rec_kept,
        (c.usage_s + c.r_usage_s).label("lhs_s"), (c.usage_t + c.r_usage_t).label("lhs_t"),
        (c.commit_s + c.r_commit_s + c.release_s + c.refund_s + c.legacy_s + held_s).label("rhs_s"),
        (c.commit_t + c.r_commit_t + c.release_t + c.refund_t + c.legacy_t + held_t).label("rhs_t"),
        (c.usage_s + c.usage_t).label("usage"), commit.label("commit"),
        (c.legacy_s + c.legacy_t).label("legacy"),
        (case((status == "committed", commit), else_=0) + c.r_commit_s + c.r_commit_t).label("cost"),
        (c.refund_s + c.refund_t + c.release_s + c.release_t).label("returned"), J.c.error_code,
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
        # a candidate: the share rule decides in Python (_kept_by_rule), never a copy in SQL
        "failed_job_committed": and_(known, d.job_status.in_(("failed", "cancelled")),
                                     d.log_status == "committed", ~_kept_by_record(a, d)),
        # a completion after a settlement that returned credits: a refund, or a partial one
        # (the library failed the job, kept part and released the rest: Ledger.refunded) — known
        # by the failure's error_code, or by the settlement's own record when the platform's
        # completion cleared its error fields (a priced completion's commit for less has neither)
        "completed_after_refund": and_(known, d.job_status == "completed", d.n_r_commit == 0, or_(
            d.log_status == "refunded",
            and_(d.log_status == "committed", d.returned > 0,
                 or_(d.error_code.is_not(None), d.rec_share.is_not(None))))),
        "terminal_job_reserved": and_(known, d.job_status.in_(TERMINAL), reserved,
                                      d.ended < a.now - a.grace),
        "credits_actual_mismatch": and_(known, d.credits_actual.is_not(None),
                                        or_(reserved, d.credits_actual != d.cost)),
    }
    flags = [case((cond, 1), else_=0).label(kind) for kind, cond in checks.items()]
    stmt = select(d.job_id, d.user_id, d.log_status, d.lhs_s, d.lhs_t, d.rhs_s, d.rhs_t,
                  d.n_reserved, d.min_credits, d.max_credits, d.usage, d.job_status,
                  d.credits_actual, d.cost, d.commit, d.legacy, d.returned,
                  d.rec_share, d.rec_kept, *flags).where(or_(*checks.values()))
    rows = list(a.session.execute(stmt))
    kept = _kept_by_rule(a, [r for r in rows if r._mapping["failed_job_committed"]])
    for r in rows:
        m = r._mapping
        for kind in checks:
            if not m[kind]:
                continue
            if kind == "failed_job_committed" and kept.get(r.job_id) == r.commit:
                continue  # exactly what the share rule keeps
            a.report(kind, r.user_id, r.job_id, _job_detail(kind, r, kept.get(r.job_id)))


def _kept_by_rule(a: _Audit, rows: list[Any]) -> dict[Any, int | None]:
    """Per failed/cancelled job whose commit carries no agreeing record: what the settlement
    rule keeps of what its reservation held (USAGE net of legacy refunds) — the share of
    :func:`reconcile.settlement.refund_share` for the (cause, accepted) that
    :func:`reconcile.settlement.settlement_cause` derives from its row, under the audit's
    policy; None where that share is 1 (a full refund: any commit is a finding)."""
    if not rows:
        return {}
    held = {r.job_id: max(0, int(r.usage - r.legacy)) for r in rows}
    ids = list(held)
    out: dict[Any, int | None] = {}
    for start in range(0, len(ids), 1000):
        chunk = ids[start:start + 1000]
        cancels = set(a.session.execute(select(E.c.job_id).where(
            E.c.job_id.in_(chunk), E.c.type == CANCEL_REQUESTED_EVENT)).scalars())
        for job in a.session.execute(select(
                J.c.id, J.c.status, J.c.error_code, J.c.error_detail, J.c.submission_state,
                J.c.provider_task_id, J.c.provider_kind).where(J.c.id.in_(chunk))):
            cause, accepted = settlement_cause(job, kind=get_kind(job.provider_kind),
                                               cancel_requested=job.id in cancels)
            share = refund_share(cause, accepted, a.policy)
            out[job.id] = None if share == 1 else kept_of(held[job.id], share)
    return out


def _floor_part(held: Any, n: Any, den: Any, type_: Any) -> Any:
    """``⌊max(held, 0) × n / den⌋`` for ``0 ≤ n`` and ``den ≥ 1``, exactly, as
    ``(h div den) × n + (h mod den) × n div den`` in ``type_`` arithmetic (the first term never
    exceeds ``h``; the second stays below ``den × n``)."""
    h = cast(case((held > 0, held), else_=0), type_)
    return (h // den) * n + ((h % den) * n) // den


# ----------------------------------------------------------------------------- the record
#
# A failed/cancelled job settled with a partial refund carries the settlement's own record in
# its usage log's metadata, written by the ledger's CAS (reconcile.settlement.Decision.record):
# {"settlement": {"status": …, "refund_share": "n/d", "kept": k}}. The audit accepts its commit
# when the record parses, its kept is the commit, and the share recomputed over what the
# reservation held (USAGE net of legacy refunds) keeps exactly that commit. The bounds on the
# digits keep the arithmetic exact: PostgreSQL computes in numeric (exact at any size; the
# bounds only cap the work), SQLite in 64-bit integers, where (h mod d) × n < d² must fit.
_SHARE_DIGITS = {"postgresql": 18, "sqlite": 9}
_KEPT_DIGITS = {"postgresql": 19, "sqlite": 19}


def _record_text(a: _Audit, key: str) -> Any:
    """A usage log's ``metadata -> 'settlement' ->> key`` as text (NULL: absent, or metadata
    that is not an object holding one; never an error, whatever a platform wrote there)."""
    meta = U.c.metadata
    if not a.sqlite:  # -> and ->> work on jsonb and json alike, and yield NULL on a non-object
        # (a JSON true or 1.5 comes out as 'true' / '1.5': the check's patterns refuse them)
        return meta.op("->")(literal_column(f"'{RECORD_KEY}'")).op(
            "->>", return_type=Text)(literal_column(f"'{key}'"))
    # SQLite: only a text or integer value (json_extract would turn a JSON true into 1); a
    # CASE per step, as json_type raises on text that is not JSON
    path = f"$.{RECORD_KEY}.{key}"
    value = case((func.json_type(meta, path).in_(("text", "integer")),
                  cast(func.json_extract(meta, path), Text)), else_=null())
    return case((func.json_valid(meta) == 1, value), else_=null())


def _kept_by_record(a: _Audit, d: Any) -> Any:
    """A failed/cancelled job's commit is exactly what its recorded refund share keeps of what
    its reservation held, and the record's own ``kept`` says that commit (one committed log;
    digits only, ``0 ≤ n ≤ d``, ``d ≥ 1``). Never NULL: a malformed or absent record is false."""
    dialect = "sqlite" if a.sqlite else "postgresql"
    digits, kept_digits = _SHARE_DIGITS[dialect] - 1, _KEPT_DIGITS[dialect] - 1
    # \A … \Z: the whole text (Python's $, SQLite's REGEXP, would allow a trailing newline)
    share_ok = d.rec_share.regexp_match(
        f"\\A(0|[1-9][0-9]{{0,{digits}}})/[1-9][0-9]{{0,{digits}}}\\Z")
    kept_ok = d.rec_kept.regexp_match(f"\\A(0|[1-9][0-9]{{0,{kept_digits}}})\\Z")
    if a.sqlite:
        slash = func.instr(d.rec_share, "/")
        num_text, den_text = func.substr(d.rec_share, 1, slash - 1), func.substr(d.rec_share, slash + 1)
        type_: Any = BigInteger
    else:
        num_text, den_text = func.split_part(d.rec_share, "/", 1), func.split_part(d.rec_share, "/", 2)
        type_ = Numeric
    num, den = cast(num_text, type_), cast(den_text, type_)
    if a.sqlite:
        recomputed = _floor_part(d.usage - d.legacy, den - num, den, BigInteger)
        # compared as text: a 19-digit kept above 2⁶³ would be clamped by CAST AS INTEGER
        kept_is_commit = cast(d.commit, Text) == d.rec_kept
    else:  # exact numeric: div() truncates, which is the floor for h ≥ 0
        h = cast(case((d.usage - d.legacy > 0, d.usage - d.legacy), else_=0), Numeric)
        recomputed = func.div(h * (den - num), den, type_=Numeric)
        kept_is_commit = cast(d.rec_kept, Numeric) == d.commit
    agrees = and_(num <= den, kept_is_commit, recomputed == d.commit)
    return func.coalesce(case((and_(d.n_committed == 1, share_ok, kept_ok), agrees),
                              else_=false()), false())


def _job_detail(kind: str, r: Any, kept: int | None = None) -> str:
    pools = (f"USAGE {(r.lhs_s, r.lhs_t)} vs COMMIT + RELEASE + REFUND + legacy + held "
             f"{(r.rhs_s, r.rhs_t)} (sub, topup)")
    return {
        "usage_amount_mismatch": f"USAGE {r.usage} != usage log credits {r.min_credits}..{r.max_credits}",
        "duplicate_reserved_log": f"{r.n_reserved} reserved usage logs",
        "credits_actual_mismatch": f"credits_actual {r.credits_actual} != ledger "
                                   f"{'(still reserved)' if r.log_status == 'reserved' else r.cost}",
        "failed_job_committed": f"job {r.job_status}, reservation committed"
                                + ("" if kept is None else f" {r.commit} (the settlement "
                                   f"policy keeps {kept} of {r.usage - r.legacy})")
                                + _record_detail(r),
        "completed_after_refund": f"job completed after the library's settlement returned "
                                  f"{r.returned} credits (keep them, or re-charge: "
                                  "credits.recharge)",
        "terminal_job_reserved": f"job {r.job_status} still holds a reserved usage log",
        "reserved_but_settled": "usage log reserved, a settlement exists",
        "settlement_missing": f"usage log {r.log_status} without its transaction",
        "settled_twice": "both job-commit and job-refund exist",
    }.get(kind, pools)


def _record_detail(r: Any) -> str:
    """What a flagged job's settlement record says, and what its share would keep (exact)."""
    if r.rec_share is None and r.rec_kept is None:
        return ""
    out = f"; recorded refund share {r.rec_share!s}, kept {r.rec_kept!s}"
    try:
        num, den = (int(part) for part in str(r.rec_share).split("/"))
        share = Fraction(num, den)
    except (ValueError, ZeroDivisionError):
        return out + " (not a share)"
    held = max(0, int(r.usage - r.legacy))
    if not 0 <= share <= 1:
        return out + " (not a share)"
    return out + f" (that share keeps {kept_of(held, share)} of {held})"


# ----------------------------------------------------------------------------- in flight


def _in_flight(a: _Audit) -> None:
    """In-flight jobs the ledger knows (their USAGE row) past their kind's horizon."""
    usage_id = literal("job-usage:") + a.job_text(J.c.id)
    stmt = a.scoped(
        select(J.c.id, J.c.user_id, J.c.status, J.c.submission_state, J.c.provider_kind,
               J.c.provider_call_started_at, J.c.started_at, J.c.created_at,
               J.c.reconcile_attempts, J.c.reconcile_last_attempt_at, J.c.poll_lease_expires_at,
               J.c.claim_expires_at, J.c.storing_until, J.c.storing_count)
        .where(J.c.status.in_(IN_FLIGHT),
               select(T.c.id).where(T.c.id == usage_id, T.c.job_id == J.c.id).exists()),
        J.c.user_id)
    for row in a.session.execute(stmt):
        late = _past_horizon(a, row)
        if late is not None:
            a.report("in_flight_past_horizon", row.user_id, row.id, late)


def _past_horizon(a: _Audit, row: Any) -> str | None:
    """Why an in-flight job is past its kind's exhaustion horizon, or None (module docstring)."""
    if row.provider_kind in (a.settings.observe_only_kinds or ()):
        return None
    deadline = exhaustion_deadline(a.settings, row)  # the one rule (jobstore.horizon)
    if deadline is None:
        return None
    scaled = a.settings.scaled
    slack = a.grace + scaled(timedelta(seconds=a.settings.sweep_interval))
    if a.now <= deadline + slack:
        return None
    return (f"{row.provider_kind} job {row.status} ({row.submission_state}), attempts "
            f"{row.reconcile_attempts}/{MAX_ATTEMPTS}, exhausted by {deadline.isoformat()}")
