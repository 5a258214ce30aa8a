"""The read-only commands of ``reconcile``: ``stuck``, ``uncertain``, ``unsettled`` (queries over
``jobs``), ``show`` (one job and everything that names it) and ``audit`` (the ledger check)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import asdict
from datetime import UTC, datetime, timedelta
from typing import Any

import click
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from .. import jobstore
from ..db.models import Asset, CreditAnomaly, CreditTransaction, Job, UsageLog, WebhookDelivery
from ..runtime import Runtime
from ..states import LEGACY_AGE
from .app import JOB_ID, Cli, Refused, _load, json_option, limit_option, main, pass_cli
from .output import _cell, _dump, _listing, _table


def _reserved(session: Session, job_ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, int]:
    """Credits each job still holds in a ``reserved`` usage log."""
    if not job_ids:
        return {}
    rows = session.execute(
        select(UsageLog.job_id, func.sum(UsageLog.credits))
        .where(UsageLog.job_id.in_(job_ids), UsageLog.status == "reserved")
        .group_by(UsageLog.job_id))
    return {job_id: int(total) for job_id, total in rows if job_id is not None}


# ----------------------------------------------------------------------------- listings


def _started() -> Any:
    # what the sweep ages a row by: the provider call, else (legacy rows) the dequeue or insert
    return func.coalesce(Job.provider_call_started_at, Job.started_at, Job.created_at)


def _threshold(rt: Runtime, job: Job) -> timedelta:
    kind = rt.kind(job.provider_kind)
    return rt.settings.scaled(kind.stale_threshold if kind is not None else LEGACY_AGE)


def stuck_rows(rt: Runtime, session: Session, *, now: datetime, limit: int,
               kind: str | None = None, older_than: timedelta | None = None) -> list[dict[str, Any]]:
    """In-flight jobs past their kind's stale threshold (legacy rows: past 5 minutes), oldest
    first; with ``older_than``, every in-flight job older than that. ``kind``: a kind, "legacy"
    (rows without one) or "*" (all). What ``reconcile stuck`` and the Django admin list."""
    from ..jobstore.adoption import ALL, LEGACY
    from ..kinds import all_kinds

    if older_than is not None:
        floor = older_than
    else:
        floor = rt.settings.scaled(min([LEGACY_AGE] + [k.stale_threshold for k in all_kinds()]))
    started = _started().label("started")
    stmt = select(Job, started).where(jobstore.in_flight(), started < now - floor)
    if kind == LEGACY:
        stmt = stmt.where(Job.provider_kind.is_(None))
    elif kind and kind != ALL:
        stmt = stmt.where(Job.provider_kind == kind)
    rows: list[dict[str, Any]] = []
    for job, since in session.execute(stmt.order_by(started)):
        threshold = floor if older_than is not None else _threshold(rt, job)
        if now - since < threshold or len(rows) >= limit:
            continue
        rows.append({
            "id": job.id, "job_type": job.job_type, "kind": job.provider_kind,
            "status": job.status, "submission": job.submission_state,
            "task_id": job.provider_task_id, "age": now - since, "threshold": threshold,
            "attempts": job.reconcile_attempts,
            "last_error": job.reconcile_last_error or job.error_code,
        })
    return rows


@main.command()
@click.option("--kind", help="Only this provider_kind ('legacy': rows without one; '*': all).")
@click.option("--older-than", type=click.FloatRange(min=0), metavar="MINUTES",
              help="Instead of each kind's stale threshold, list in-flight jobs older than this.")
@limit_option
@json_option
@pass_cli
def stuck(cli: Cli, kind: str | None, older_than: float | None, limit: int, as_json: bool) -> None:
    """In-flight jobs past their kind's stale threshold (legacy rows: past 5 minutes)."""
    from ..jobstore.adoption import LEGACY, SettingsError, check_observe_only

    if kind:
        try:  # the same names as OBSERVE_ONLY_KINDS: a kind, or "legacy" for rows without one
            check_observe_only([kind])
        except SettingsError as exc:
            raise Refused(f"unknown kind {kind!r}: a registered kind or {LEGACY!r}") from exc
    rt = cli.runtime()
    with cli.session() as session:
        rows = stuck_rows(rt, session, now=rt.now(), limit=limit, kind=kind,
                          older_than=timedelta(minutes=older_than) if older_than is not None
                          else None)
    _listing(rows, ("id", "kind", "status", "submission", "age", "attempts", "last_error"),
             as_json, "no stuck jobs")


def uncertain_rows(rt: Runtime, session: Session, *, now: datetime,
                   limit: int) -> list[dict[str, Any]]:
    """Submissions whose outcome is unknown (``jobstore.uncertain_expired``), oldest first, with
    the credits they hold and the webhook deliveries that name them."""
    stmt = select(Job).where(jobstore.in_flight(), jobstore.uncertain_expired(now)
                             ).order_by(_started()).limit(limit)
    jobs = list(session.execute(stmt).scalars())
    ids = [j.id for j in jobs]
    held = _reserved(session, ids)
    evidence = dict(session.execute(
        select(WebhookDelivery.job_id, func.count()).where(WebhookDelivery.job_id.in_(ids))
        .group_by(WebhookDelivery.job_id)).all()) if ids else {}
    return [{
        "id": j.id, "user_id": j.user_id, "kind": j.provider_kind, "status": j.status,
        "submission": j.submission_state, "since": j.provider_call_started_at or j.created_at,
        "age": now - (j.provider_call_started_at or j.created_at),
        "attempts": j.reconcile_attempts, "error_code": j.error_code,
        "reserved": held.get(j.id), "deliveries": evidence.get(j.id, 0),
    } for j in jobs]


@main.command()
@limit_option
@json_option
@pass_cli
def uncertain(cli: Cli, limit: int, as_json: bool) -> None:
    """Submissions whose outcome is unknown (uncertain, or submitting with an expired claim).

    They keep their reservation until an operator runs `reconcile resolve`.
    """
    rt = cli.runtime()
    with cli.session() as session:
        rows = uncertain_rows(rt, session, now=rt.now(), limit=limit)
    _listing(rows, ("id", "kind", "submission", "age", "attempts", "reserved", "deliveries",
                    "error_code"), as_json, "no uncertain submissions")


def unsettled_rows(rt: Runtime, session: Session, *, now: datetime,
                   limit: int) -> list[dict[str, Any]]:
    """Failed or cancelled jobs the library failed whose refund has not settled
    (``jobstore.settlement_pending``), by their settlement's retry time."""
    stmt = select(Job).where(jobstore.settlement_pending()).order_by(Job.next_poll_at).limit(limit)
    jobs = list(session.execute(stmt).scalars())
    held = _reserved(session, [j.id for j in jobs])
    return [{
        "id": j.id, "user_id": j.user_id, "kind": j.provider_kind, "status": j.status,
        "error_code": j.error_code, "completed_at": j.completed_at,
        "next_poll_at": j.next_poll_at,
        "due_in": max(j.next_poll_at - now, timedelta(0)) if j.next_poll_at else None,
        "settle_attempts": j.settle_attempts, "reserved": held.get(j.id),
    } for j in jobs]


@main.command()
@limit_option
@json_option
@pass_cli
def unsettled(cli: Cli, limit: int, as_json: bool) -> None:
    """Failed or cancelled jobs whose refund has not settled yet (credits_actual NULL).

    Only rows the library failed are listed (they carry next_poll_at, the settlement retry
    time); a platform's old failed rows are the audit's business.
    """
    rt = cli.runtime()
    with cli.session() as session:
        rows = unsettled_rows(rt, session, now=rt.now(), limit=limit)
    _listing(rows, ("id", "kind", "status", "error_code", "next_poll_at", "due_in",
                    "settle_attempts", "reserved"), as_json, "no unsettled refunds")


SHOW_FIELDS = (
    "id", "user_id", "job_type", "status", "submission_state", "provider_kind", "provider_model",
    "provider_task_id", "provider", "progress", "created_at", "started_at",
    "provider_call_started_at", "completed_at", "claim_expires_at", "poll_generation", "poll_seq",
    "poll_lease_expires_at", "reconcile_attempts", "reconcile_last_attempt_at",
    "reconcile_last_error", "reconcile_last_error_code", "create_enqueue_count",
    "create_not_before", "error_code", "error_message", "error_detail", "credits_actual", "next_poll_at", "settle_attempts",
    "provider_cost", "display_cost", "workflow_execution_id", "node_id",
)


def _row(obj: Any, fields: Sequence[str]) -> dict[str, Any]:
    return {f: getattr(obj, f) for f in fields}


def _evidence_note(cli: Cli, session: Session, job: Job, delivery: WebhookDelivery) -> str:
    """What the sweep may do with a delivery for this job (reconcile.jobstore.evidence); where it may
    not, the operator decides with ``resolve --upstream-id``."""
    from ..jobstore import evidence
    from ..kinds import get_kind

    kind = get_kind(job.provider_kind)
    if kind is None or job.provider_task_id:
        return ""
    holder = evidence.holders(session, [delivery.upstream_id or ""], job.id)
    if holder:
        return f"never: the task of job {next(iter(holder.values()))}"
    judged = evidence.assess(delivery, str(job.id), kind, cli.settings())
    if not judged.usable:
        return f"operator only: {judged.reason}"
    return "adoptable once a read confirms it" if judged.needs_read else "adoptable (signed)"


@main.command()
@click.argument("job_id", type=JOB_ID)
@json_option
@pass_cli
def show(cli: Cli, job_id: uuid.UUID, as_json: bool) -> None:
    """One job: its row (with ``credits_returned``: what its settlement gave back, a partial
    refund included), usage logs, ledger transactions, anomalies, webhooks and assets."""
    with cli.session() as session:
        job = _load(session, job_id)
        settled = job.credits_actual is not None
        returned = cli.runtime().ledger.refunded(session, job_id) if settled else None
        delivery_match = WebhookDelivery.job_id == job_id
        if job.provider_task_id:
            delivery_match = delivery_match | (WebhookDelivery.upstream_id == job.provider_task_id)
        out: dict[str, Any] = {
            "job": {**_row(job, SHOW_FIELDS), "credits_returned": returned},
            "usage_logs": [
                {**_row(u, ("id", "status", "credits", "created_at")), "metadata": u.metadata_}
                for u in session.execute(select(UsageLog).where(UsageLog.job_id == job_id)
                                         .order_by(UsageLog.created_at)).scalars()],
            "transactions": [
                _row(t, ("id", "type", "amount", "from_sub", "from_topup", "created_at"))
                for t in session.execute(
                    select(CreditTransaction).where(CreditTransaction.job_id == job_id)
                    .order_by(CreditTransaction.created_at, CreditTransaction.id)).scalars()],
            "anomalies": [
                _row(a, ("id", "kind", "detail", "created_at"))
                for a in session.execute(select(CreditAnomaly).where(CreditAnomaly.job_id == job_id)
                                         .order_by(CreditAnomaly.id)).scalars()],
            "webhook_deliveries": [
                {**_row(w, ("provider", "delivery_id", "upstream_id", "status", "received_at")),
                 "evidence": _evidence_note(cli, session, job, w)}
                for w in session.execute(select(WebhookDelivery).where(delivery_match)
                                         .order_by(WebhookDelivery.received_at)).scalars()],
            "assets": [
                _row(a, ("index", "storage_key", "media_type", "is_public", "watermarked"))
                for a in session.execute(select(Asset).where(Asset.job_id == job_id)
                                         .order_by(Asset.index)).scalars()],
        }
    if as_json:
        _dump(out)
        return
    width = max(len(f) for f in SHOW_FIELDS)
    click.echo("\n".join(f"{k.ljust(width)}  {_cell(v)}" for k, v in out["job"].items()))
    for section, rows in out.items():
        if section == "job":
            continue
        click.echo(f"\n{section.replace('_', ' ')} ({len(rows)})")
        if rows:
            click.echo(_table(rows, list(rows[0])))


def _since(value: str | None, now: datetime) -> datetime | None:
    """``--since``: an ISO 8601 time (UTC if naive) or a duration back from now (90s, 15m, 2h, 1d)."""
    if value is None:
        return None
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    if value[-1:] in units and value[:-1].isdigit():
        return now - timedelta(seconds=int(value[:-1]) * units[value[-1]])
    try:
        at = datetime.fromisoformat(value)
    except ValueError as exc:
        raise Refused(f"--since {value!r}: an ISO 8601 time or a duration such as 15m, 2h") from exc
    return at if at.tzinfo is not None else at.replace(tzinfo=UTC)


@main.command()
@click.option("--grace-minutes", type=click.IntRange(min=0), default=10, show_default=True,
              help="A terminal job may hold a reserved usage log this long.")
@click.option("--since", "since_arg", metavar="TIME|DURATION",
              help="Incremental: only users touched since then (e.g. 15m, 2026-12-01T08:00Z), "
                   "plus every user with a job in flight. Fast, for frequent runs; it cannot "
                   "replace the full audit (lots change in place).")
@json_option
@pass_cli
def audit(cli: Cli, grace_minutes: int, since_arg: str | None, as_json: bool) -> None:
    """Check the credit ledger; exit 1 when it is out of balance."""
    from ..ledger import audit as run_audit

    rt = cli.runtime()
    now = rt.now()
    since = _since(since_arg, now)
    with cli.session() as session:
        found = run_audit(rt.ledger, session, now=now, grace=timedelta(minutes=grace_minutes),
                          settings=rt.settings, since=since, policy=rt.settlement_policy)
    rows = [asdict(d) for d in found]
    _listing(rows, ("kind", "user_id", "job_id", "detail"), as_json, "ledger clean")
    if found:
        click.get_current_context().exit(1)
