"""Internal: what each read-only page shows — needs attention (the five lists), one list paged,
a user's ledger, the audit and health — built from :mod:`reconcile.ops.queries`, the audit and
the ledger's own tables. Every function reads; none writes."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import asdict
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import case, func, select, text

from .. import jobstore
from ..db.models import (
    CreditAnomaly,
    CreditBalance,
    CreditLot,
    CreditTransaction,
    Job,
    SweepTick,
)
from ..ops import queries
from ..runtime import Runtime
from . import _charts

FIRST_PAGE = 20  # rows per list on "needs attention"
PAGE = 50  # rows per page of one list
MAX_MINUTES = queries.MAX_MINUTES  # a minutes parameter's bound
TICKS_SHOWN = 20  # the health page's newest sweep ticks
DELAY_SAMPLE = 5000  # the health page's completion delays: the newest completions
TITLES = {
    "uncertain": "Uncertain submissions",
    "stuck": "Stuck: in flight past their kind's threshold",
    "past_horizon": "Past their horizon: should have been failed by now",
    "unsettled": "Unsettled: failed or cancelled, refund pending",
    "anomalies": "Open anomalies",
}
COLUMNS = {
    "uncertain": ("id", "kind", "submission", "age", "reserved", "reserved_age", "deliveries",
                  "user_id"),
    "stuck": ("id", "kind", "status", "submission", "age", "threshold", "attempts",
              "last_error"),
    "past_horizon": ("id", "kind", "status", "submission", "age", "deadline", "late",
                     "attempts"),
    "unsettled": ("id", "kind", "status", "error_code", "next_poll_at", "settle_attempts",
                  "reserved", "user_id"),
    "anomalies": ("job_id", "kind", "age", "detail", "user_id"),
}


class BadRequest(ValueError):
    """A query parameter that is not what the page takes (400)."""


def minutes(value: str, name: str, *, whole: bool = False) -> timedelta:
    """A page's minutes parameter: a number (``whole``: an integer) from 0 to
    :data:`MAX_MINUTES` (BadRequest for anything else: a time that far back does not exist)."""
    try:
        number = int(value) if whole else float(value)
    except ValueError as exc:
        raise BadRequest(f"{name} is minutes ({'an integer' if whole else 'a number'})") from exc
    if not 0 <= number <= MAX_MINUTES:  # NaN fails it too
        raise BadRequest(f"{name} is minutes, from 0 to {MAX_MINUTES}")
    return timedelta(minutes=number)


def filters(params: Mapping[str, str]) -> tuple[queries.Filters, queries.Filters, dict[str, str]]:
    """The job lists' filters, the anomaly list's, and the values to echo into the form."""
    echo = {k: params.get(k, "").strip() for k in ("kind", "older_than", "user", "anomaly")}
    older = minutes(echo["older_than"], "older_than") if echo["older_than"] else None
    try:
        user = uuid.UUID(echo["user"]) if echo["user"] else None
    except ValueError as exc:
        raise BadRequest("user is a user id (UUID)") from exc
    if echo["anomaly"] and not (echo["anomaly"].isprintable() and len(echo["anomaly"]) <= 100):
        raise BadRequest("anomaly is an anomaly kind (printable, at most 100 characters)")
    kind = echo["kind"] or None
    if kind is not None:
        from ..kinds import all_kinds

        if kind != queries.LEGACY and kind not in {k.name for k in all_kinds()}:
            raise BadRequest(f"unknown kind {kind!r}")
    return (queries.Filters(kind, older, user),
            queries.Filters(echo["anomaly"] or None, older, user), echo)


def kinds() -> list[str]:
    from ..kinds import all_kinds

    return sorted(k.name for k in all_kinds()) + [queries.LEGACY]


def one_list(rt: Runtime, name: str, params: Mapping[str, str], limit: int) -> queries.Page:
    if name not in queries.LISTS:
        raise KeyError(name)
    jobs_f, anomaly_f, _ = filters(params)
    after = params.get("after") or None
    now = rt.now()
    with rt.sessions() as session:
        try:
            if name == "anomalies":
                return queries.anomalies(session, now=now, limit=limit, after=after,
                                         filters=anomaly_f)
            read = getattr(queries, name)
            return read(rt, session, now=now, limit=limit, after=after,  # type: ignore[no-any-return]
                        filters=jobs_f)
        except ValueError as exc:  # a cursor that is not one of ours
            raise BadRequest(f"bad page cursor: {exc}") from exc


def attention(rt: Runtime, params: Mapping[str, str]) -> dict[str, Any]:
    _, _, echo = filters(params)
    lists = {name: one_list(rt, name, params, FIRST_PAGE) for name in queries.LISTS}
    return {"lists": lists, "titles": TITLES, "columns": COLUMNS, "filters": echo,
            "kinds": kinds()}


def user(rt: Runtime, user_id: uuid.UUID) -> dict[str, Any]:
    from ..audit import user_identity

    now = rt.now()
    with rt.sessions() as session:
        balance = session.get(CreditBalance, user_id)
        lots = list(session.execute(
            select(CreditLot).where(CreditLot.user_id == user_id,
                                    text("reconcile_credit_lots.remaining_amount > 0"))
            .order_by(CreditLot.pool, CreditLot.id)).scalars())
        txns = list(session.execute(
            select(CreditTransaction).where(CreditTransaction.user_id == user_id)
            .order_by(CreditTransaction.created_at.desc(), CreditTransaction.id.desc())
            .limit(PAGE * 4)).scalars())
        in_flight = list(session.execute(
            select(Job).where(jobstore.in_flight(), Job.user_id == user_id)
            .order_by(Job.created_at).limit(PAGE)).scalars())
        open_anomalies = queries.anomalies(session, now=now, limit=PAGE,
                                           filters=queries.Filters(user=user_id)).rows
        identity = user_identity(session, user_id, now=now)
    return {"user_id": user_id, "balance": balance, "lots": lots, "transactions": txns,
            "in_flight": in_flight, "anomalies": open_anomalies, "identity": identity,
            "page": PAGE * 4}


def audit(rt: Runtime, params: Mapping[str, str]) -> dict[str, Any]:
    """The audit as ``reconcile audit`` runs it (full, or ``--since``), when asked to run."""
    from ..ledger import audit as run_audit

    mode = params.get("run", "")
    since_text = params.get("since", "").strip()
    out: dict[str, Any] = {"ran": False, "since": since_text, "mode": mode}
    if mode not in ("full", "since"):
        return out
    now = rt.now()
    try:
        since = queries.parse_since(since_text, now) if mode == "since" else None
    except ValueError as exc:
        raise BadRequest(str(exc)) from exc
    grace = minutes(params.get("grace_minutes") or "10", "grace_minutes", whole=True)
    if mode == "since" and since is None:
        raise BadRequest("give --since: a duration such as 15m or an ISO 8601 time")
    started = datetime.now().astimezone()
    with rt.sessions() as session:
        found = run_audit(rt.ledger, session, now=now, grace=grace, settings=rt.settings,
                          since=since, policy=rt.settlement_policy)
    took = datetime.now().astimezone() - started
    return {**out, "ran": True, "found": [asdict(d) for d in found], "took": took,
            "at": now}


def health(rt: Runtime) -> dict[str, Any]:
    now = rt.now()
    day = now - timedelta(hours=24)
    with rt.sessions() as session:
        in_flight = session.execute(
            select(Job.provider_kind, Job.status, func.count()).where(jobstore.in_flight())
            .group_by(Job.provider_kind, Job.status).order_by(Job.provider_kind, Job.status)
        ).all()
        completed_today = (text("jobs.status = 'completed'"), Job.completed_at >= day)
        completed = session.execute(select(func.count()).select_from(Job)
                                    .where(*completed_today)).scalar_one()
        delays = session.execute(  # the distribution of the newest DELAY_SAMPLE
            select(Job.completed_at, queries.started()).where(*completed_today)
            .order_by(Job.completed_at.desc()).limit(DELAY_SAMPLE)).all()
        hours = [(now - timedelta(hours=h)).replace(minute=0, second=0, microsecond=0)
                 for h in range(23, -1, -1)]
        # every refund of the day, counted per hour in the database (one pass of its index)
        at, amount = CreditTransaction.created_at, CreditTransaction.amount
        slots = [(at >= h) & (at < h + timedelta(hours=1)) for h in hours]
        counted = session.execute(
            select(*[func.sum(case((slot, 1), else_=0)) for slot in slots],
                   *[func.sum(case((slot, amount), else_=0)) for slot in slots])
            .where(text("reconcile_credit_transactions.type = 'REFUND'"), at >= hours[0])
        ).one()
        anomalies = session.execute(
            select(CreditAnomaly.kind, func.count()).where(CreditAnomaly.resolved_at.is_(None))
            .group_by(CreditAnomaly.kind).order_by(CreditAnomaly.kind)).all()
        unsettled = session.execute(select(func.count()).select_from(Job)
                                    .where(jobstore.settlement_pending())).scalar_one()
        ticks = session.execute(select(SweepTick).order_by(SweepTick.started_at.desc())
                                .limit(TICKS_SHOWN)).scalars().all()
    seconds = [max((done - began).total_seconds(), 0.0) for done, began in delays
               if done and began]
    per_hour = {h: int(n or 0) for h, n in zip(hours, counted[:24], strict=True)}
    credits_per_hour = {h: int(n or 0) for h, n in zip(hours, counted[24:], strict=True)}
    edges = [0, 5, 15, 30, 60, 120, 300, 600, 1800, 3600]
    return {
        "in_flight": in_flight, "unsettled": unsettled, "anomalies": anomalies,
        "ticks": [{"at": t.started_at, "elapsed_ms": t.elapsed_ms, "scanned": t.scanned,
                   "recovered": t.recovered, "failed": t.failed,
                   "still_running": t.still_running, "errors": t.errors,
                   "decisions": sorted((t.decisions or {}).items())} for t in ticks],
        "completed": completed, "sampled": len(seconds),
        "delay_chart": _charts.histogram(seconds, edges,
                                         title="Completion delay, jobs completed in the last 24 h"),
        "refund_chart": _charts.bars([(h.strftime("%H:00"), per_hour[h]) for h in hours],
                                     title="Refunds per hour, last 24 h"),
        "refund_credits": sum(credits_per_hour.values()), "refund_count": sum(per_hour.values()),
        "median": sorted(seconds)[len(seconds) // 2] if seconds else None,
    }
