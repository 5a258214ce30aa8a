"""The read-only commands of ``reconcile``: ``stuck``, ``uncertain``, ``unsettled`` (queries over
``jobs``), ``show`` (one job and everything that names it) and ``audit`` (the ledger check)."""

from __future__ import annotations

import uuid
from dataclasses import asdict
from datetime import datetime, timedelta
from typing import Any

import click

from .app import JOB_ID, Cli, Refused, _load, json_option, limit_option, main, pass_cli
from .output import _cell, _dump, _listing, _table
from .queries import MAX_MINUTES


def _filters(kind: str | None, older_than: timedelta | None = None) -> Any:
    from .queries import Filters

    return Filters(kind=kind or None, older_than=older_than)


@main.command()
@click.option("--kind", help="Only this provider_kind ('legacy': rows without one; '*': all).")
@click.option("--older-than", type=click.FloatRange(min=0), metavar="MINUTES",
              help="Instead of each kind's stale threshold, list in-flight jobs older than this.")
@limit_option
@json_option
@pass_cli
def stuck(cli: Cli, kind: str | None, older_than: float | None, limit: int, as_json: bool) -> None:
    """In-flight jobs past their kind's stale threshold (legacy rows: past 5 minutes)."""
    from ..jobstore.adoption import ALL, SettingsError, check_observe_only
    from . import queries

    if kind:
        try:  # the same names as OBSERVE_ONLY_KINDS: a kind, or "legacy" for rows without one
            check_observe_only([kind])
        except SettingsError as exc:
            raise Refused(f"unknown kind {kind!r}: a registered kind or "
                          f"{queries.LEGACY!r}") from exc
    rt = cli.runtime()
    filters = _filters(None if kind == ALL else kind,
                       timedelta(minutes=older_than) if older_than is not None else None)
    with cli.session() as session:
        rows = queries.stuck(rt, session, now=rt.now(), limit=limit, filters=filters).rows
    _listing(rows, ("id", "kind", "status", "submission", "age", "attempts", "last_error"),
             as_json, "no stuck jobs")


@main.command()
@limit_option
@json_option
@pass_cli
def uncertain(cli: Cli, limit: int, as_json: bool) -> None:
    """Submissions whose outcome is unknown (uncertain, or submitting with an expired claim).

    They keep their reservation until an operator runs `reconcile resolve`.
    """
    from . import queries

    rt = cli.runtime()
    with cli.session() as session:
        rows = queries.uncertain(rt, session, now=rt.now(), limit=limit).rows
    for row in rows:
        row.pop("reserved_age")
    _listing(rows, ("id", "kind", "submission", "age", "attempts", "reserved", "deliveries",
                    "error_code"), as_json, "no uncertain submissions")


@main.command()
@limit_option
@json_option
@pass_cli
def unsettled(cli: Cli, limit: int, as_json: bool) -> None:
    """Failed or cancelled jobs whose refund has not settled yet (credits_actual NULL).

    Only rows the library failed are listed (they carry next_poll_at, the settlement retry
    time); a platform's old failed rows are the audit's business.
    """
    from . import queries

    rt = cli.runtime()
    with cli.session() as session:
        rows = queries.unsettled(rt, session, now=rt.now(), limit=limit).rows
    _listing(rows, ("id", "kind", "status", "error_code", "next_poll_at", "due_in",
                    "settle_attempts", "reserved"), as_json, "no unsettled refunds")


@main.command()
@click.argument("job_id", type=JOB_ID)
@json_option
@pass_cli
def show(cli: Cli, job_id: uuid.UUID, as_json: bool) -> None:
    """One job: its row (with ``credits_returned``: what its settlement gave back, a partial
    refund included), usage logs, ledger transactions, anomalies, webhooks and assets."""
    from .queries import SHOW_FIELDS, job_detail

    with cli.session() as session:
        out = job_detail(cli.runtime(), session, _load(session, job_id))
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
    """``--since``: :func:`.queries.parse_since`, a bad value refused (exit 2)."""
    from .queries import parse_since

    try:
        return parse_since(value, now)
    except ValueError as exc:
        raise Refused(str(exc)) from exc


@main.command()
@click.option("--grace-minutes", type=click.IntRange(min=0, max=MAX_MINUTES), default=10,
              show_default=True,
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
