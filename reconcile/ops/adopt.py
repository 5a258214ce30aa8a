"""Adoption commands of ``reconcile`` (README: "Adopting on a live platform").

* ``adopt report`` — what the first enforcing tick would do, grouped by action, job type, kind,
  status and age, with the credits each action moves;
* ``credits import`` — the platform's balances and in-flight reservations into the built-in
  ledger (``--dry-run`` first; ``--only balances|reservations``);
* ``credits release-orphan`` — release a reservation whose job row was deleted;
* ``prune`` — retention for ``job_events`` and ``webhook_deliveries``.
"""

from __future__ import annotations

import uuid

import click

from ..runtime import Runtime
from .app import JOB_ID, Cli, Failed, Refused, json_option, main, pass_cli
from .output import _dump, _table


@main.group()
def adopt() -> None:
    """Adopting the library on a platform that already runs jobs."""


@adopt.command("report")
@click.option("--rows", "show_rows", is_flag=True, help="Also list every row, not just groups.")
@json_option
@pass_cli
def adopt_report(cli: Cli, show_rows: bool, as_json: bool) -> None:
    """What an enforcing tick would do now (LEGACY_SWEEP=enforce, nothing observe-only, every
    other setting as configured). Changes nothing."""
    from .adopt_report import as_json as report_json, build

    report = build(cli.runtime())
    if as_json:
        _dump(report_json(report))
        _failed_rows(report.errors)
        return
    click.echo(f"legacy sweep: {report.mode} (this report: enforce); cutoff "
               f"{report.cutoff.isoformat() if report.cutoff else 'unknown: no legacy candidates'}; "
               f"legacy age {report.legacy_age}; scanned {report.scanned}")
    if not report.groups:
        _failed_rows(report.errors)
        click.echo("an enforcing tick would do nothing")
        return
    click.echo(_table([g.__dict__ for g in report.groups],
                      ("action", "job_type", "kind", "status", "age", "jobs", "credits", "moves")))
    for action, t in sorted(report.totals().items()):
        click.echo(f"total {action}: {t['jobs']} jobs, {t['credits']} credits")
    if show_rows:
        click.echo("")
        click.echo(_table([r.__dict__ for r in report.rows],
                          ("job_id", "action", "row", "job_type", "kind", "status", "age",
                           "credits")))
    _failed_rows(report.errors)


def _failed_rows(errors: int) -> None:
    """A dry run that could not decide some rows is no answer: exit 1 (the log has the why)."""
    if errors:
        raise Failed(f"errors={errors}: the dry run could not decide every row (see the log "
                     "above); this report is incomplete")


@main.group("credits")
def credits_group() -> None:
    """The built-in credit ledger."""


@credits_group.command("import")
@click.option("--dry-run", is_flag=True, help="Report what would be imported; write nothing.")
@click.option("--table", "source", default="user_credits", show_default=True,
              help="The platform's balance table.")
@click.option("--user-column", default="user_id", show_default=True)
@click.option("--sub-column", default="sub", show_default=True)
@click.option("--topup-column", default="topup", show_default=True)
@click.option("--only", type=click.Choice(["balances", "reservations"]),
              help="Import this part alone (default: both).")
@json_option
@pass_cli
def credits_import(cli: Cli, dry_run: bool, source: str, user_column: str, sub_column: str,
                   topup_column: str, only: str | None, as_json: bool) -> None:
    """Import balances per pool and in-flight reservations (idempotent, re-runnable).

    A user the ledger already holds a balance for (granted under other ids) is not granted
    again; a reserved log made after its user's balance entered the ledger is not imported."""
    from dataclasses import asdict

    from ..credits.importer import import_credits

    rt = _builtin(cli, "nothing to import")
    with rt.sessions.begin() as session:
        summary = import_credits(session, now=rt.now(), dry_run=dry_run, source=source,
                                 user_column=user_column, sub_column=sub_column,
                                 topup_column=topup_column, only=only)
        if dry_run:
            session.rollback()
    if as_json:
        _dump({**asdict(summary), "line": summary.line()})
        return
    click.echo(summary.line())
    for row in summary.assumed:
        click.echo(f"assumed: usage log {row['usage_log_id']} (job {row['job_id']}, "
                   f"{row['credits']} credits) -> sub {row['from_sub']} topup "
                   f"{row['from_topup']}: {row['rule']}")
    for problem in summary.problems:
        click.echo(f"problem: {problem}", err=True)


def _builtin(cli: Cli, why: str) -> Runtime:
    from ..ledger import BuiltinLedger

    rt = cli.runtime()
    if not isinstance(rt.ledger, BuiltinLedger):
        raise Refused(f"this runtime uses the {rt.ledger.name!r} ledger: {why}")
    return rt


@credits_group.command("release-orphan")
@click.argument("job_id", type=JOB_ID)
@click.option("--reason", required=True, help="Why (recorded with the release in the ledger).")
@pass_cli
def credits_release_orphan(cli: Cli, job_id: uuid.UUID, reason: str) -> None:
    """Release the credits a job still holds after its job row was deleted (the audit's
    orphaned_reservation): the library's refund, with the reason recorded. Refused while the
    job row exists; releasing again does nothing."""
    from .actions import act

    done = act(cli, "release_orphan", job_id, reason)
    click.echo(done.message, err=not done.changed)


@main.command()
@click.option("--dry-run", is_flag=True, help="Count what would be deleted; delete nothing.")
@click.option("--events-days", type=float, metavar="DAYS",
              help="Keep published job events this long (default JOB_EVENTS_RETENTION_DAYS).")
@click.option("--webhooks-days", type=float, metavar="DAYS",
              help="Keep webhook deliveries this long (default WEBHOOK_DELIVERIES_RETENTION_DAYS).")
@json_option
@pass_cli
def prune(cli: Cli, dry_run: bool, events_days: float | None, webhooks_days: float | None,
          as_json: bool) -> None:
    """Delete published events and settled-job webhook deliveries past their retention.

    Never an unpublished event, never a delivery naming a job still in flight.
    """
    from dataclasses import asdict

    from ..jobstore.retention import days, prune as run

    rt = cli.runtime()
    s = rt.settings
    try:
        events = days(events_days if events_days is not None else s.job_events_retention_days)
        hooks = days(webhooks_days if webhooks_days is not None
                     else s.webhook_deliveries_retention_days)
    except ValueError as exc:
        raise Refused(str(exc)) from exc
    if events is None and hooks is None:
        raise Refused("no retention set: give --events-days / --webhooks-days or set "
                      "RECONCILE_JOB_EVENTS_RETENTION_DAYS / RECONCILE_WEBHOOK_DELIVERIES_RETENTION_DAYS")
    try:
        report = run(rt.sessions, now=rt.now(), events=events, deliveries=hooks, dry_run=dry_run)
    except ValueError as exc:
        raise Refused(str(exc)) from exc
    if as_json:
        _dump({**asdict(report), "line": report.line()})
    else:
        click.echo(report.line())


__all__ = ["adopt", "credits_group", "credits_release_orphan", "prune"]
