"""The commands of ``reconcile`` that change jobs, always through :mod:`reconcile.operator` (the
one home of what an operator may do, shared with the console and the Django admin) and the
lifecycle's compare-and-set functions, never raw SQL: ``fail`` (with its refund), ``resolve`` (an
uncertain submission, either way), ``retry-settle``, ``operator-log`` (the operator record),
``sweep`` (one tick inline) and ``repair-usage-metadata``."""

from __future__ import annotations

import uuid
from dataclasses import asdict
from typing import Any

import click

from .. import operator
from ..runtime import Runtime
from .app import JOB_ID, Cli, Failed, Refused, _load, json_option, main, pass_cli
from .output import _cell, _dump, _table

_ROOT = __package__.rpartition(".")[0]  # "reconcile"


def _report_failed(cli: Cli, job_id: uuid.UUID, verb: str) -> None:
    with cli.session() as session:
        job = _load(session, job_id)
        returned = cli.runtime().ledger.refunded(session, job_id)  # what went back, partial too
    if job.credits_actual is None:
        click.echo(f"job {job_id} {verb}; its refund is pending (next try {_cell(job.next_poll_at)})"
                   " — the sweep settles it")
    else:
        kept = f", kept {job.credits_actual}" if job.credits_actual else ""
        click.echo(f"job {job_id} {verb} ({job.error_code}); refunded "
                   f"{returned} credits{kept}")


def _operator() -> Any:
    """Who runs the command: ``RECONCILE_OPERATOR``, else the login name (the operator record's
    identity for an action taken through the CLI)."""
    import getpass
    import os

    from ..operator import Operator

    try:
        who = os.environ.get("RECONCILE_OPERATOR") or getpass.getuser()
    except Exception:  # no login name (a container without a passwd entry)
        who = "unknown"
    return Operator(identity=who or "unknown", via="cli")


def act(cli: Cli, action: str, job_id: uuid.UUID, reason: str | None,
        upstream_id: str | None = None) -> Any:
    """Run an operator action (:mod:`reconcile.operator`, the one home of its rules) and map
    its refusals to the CLI's exit codes: refused 2, lost 1."""
    try:
        return operator.run(cli.runtime(), action, job_id, operator=_operator(),
                            reason=reason or "(no reason given on the command line)",
                            upstream_id=upstream_id)
    except operator.ActionRefused as exc:
        raise Refused(str(exc)) from exc
    except operator.ActionLost as exc:
        raise Failed(str(exc)) from exc


reason_option = click.option("--reason", help="Why (kept in the operator record).")


@main.command()
@click.argument("job_id", type=JOB_ID)
@reason_option
@pass_cli
def fail(cli: Cli, job_id: uuid.UUID, reason: str | None) -> None:
    """Fail an in-flight job and refund its credits (RECONCILE_NO_RECOVERY).

    Uncertain or submitting jobs are refused: the provider may have created them, so they need
    `reconcile resolve`. A platform row whose provider call is in flight (started, no result)
    is refused too, as a user's cancel is. Failing a job again does nothing.
    """
    from .. import jobstore

    with cli.session() as session:
        job = _load(session, job_id)
    done = act(cli, "fail", job_id, reason)
    if not done.changed:
        pending = ""
        if job.credits_actual is None:
            pending = (" (its refund is pending: the sweep settles it)" if jobstore.must_settle(job)
                       else " by the platform, not the library: its reservation is the "
                       "platform's to settle (`reconcile audit` reports it)")
        click.echo(f"job {job_id} is already {job.status}{pending}; nothing done", err=True)
        return
    _report_failed(cli, job_id, "failed")
    if job.provider_task_id:
        click.echo(f"note: upstream task {_cell(job.provider_task_id)} may still run; a late result is "
                   "ignored", err=True)


@main.command()
@click.argument("job_id", type=JOB_ID)
@click.option("--upstream-id", metavar="ID", help="The provider created it: adopt this id and poll.")
@click.option("--not-submitted", is_flag=True, help="Nothing was created upstream: fail + refund.")
@reason_option
@pass_cli
def resolve(cli: Cli, job_id: uuid.UUID, upstream_id: str | None, not_submitted: bool,
            reason: str | None) -> None:
    """Settle an uncertain submission one way or the other (exactly one option)."""
    if upstream_id is not None:
        upstream_id = upstream_id.strip()
        if not upstream_id:
            raise click.BadParameter("must not be empty", param_hint="--upstream-id")
    if (upstream_id is None) == (not not_submitted):
        raise click.UsageError("give exactly one of --upstream-id ID or --not-submitted")
    with cli.session() as session:
        _load(session, job_id)
    if upstream_id is not None:
        done = act(cli, "resolve_upstream", job_id, reason, upstream_id)
        click.echo(done.message)
        return
    act(cli, "resolve_not_submitted", job_id, reason)
    _report_failed(cli, job_id, "failed as not submitted")


def _action_command(command: str, spec: operator.Action) -> None:
    """``reconcile <command> JOB_ID --reason …`` for an action that declares its command
    (:data:`reconcile.operator.COMMANDS`); its help is the action's own docstring."""

    @click.argument("job_id", type=JOB_ID)
    @reason_option
    @pass_cli
    def run(cli: Cli, job_id: uuid.UUID, reason: str | None) -> None:
        with cli.session() as session:
            _load(session, job_id)
        click.echo(act(cli, spec.name, job_id, reason).message)

    main.command(command, help=spec.act.__doc__)(run)


for _command, _spec in operator.COMMANDS.items():
    _action_command(_command, _spec)


@main.command("operator-log")
@click.option("--job", "job_id", type=JOB_ID, help="Only this job's actions.")
@click.option("--since", type=click.DateTime(), help="Only actions since (UTC).")
@click.option("--limit", type=click.IntRange(min=1), default=200, show_default=True)
@json_option
@pass_cli
def operator_log(cli: Cli, job_id: uuid.UUID | None, since: Any, limit: int,
                 as_json: bool) -> None:
    """The operator record: who did what to which job, through which surface, and why."""
    from datetime import UTC

    from ..operator import records

    if since is not None and since.tzinfo is None:
        since = since.replace(tzinfo=UTC)
    with cli.session() as session:
        rows = records(session, job_id=job_id, since=since, limit=limit)
    if as_json:
        _dump(rows)
        return
    click.echo(_table(rows, ["at", "operator", "via", "action", "job_id", "reason"]))


# ----------------------------------------------------------------------------- runs


@main.command()
@click.option("--dry-run", is_flag=True, help="Log what the tick would do; change nothing.")
@json_option
@pass_cli
def sweep(cli: Cli, dry_run: bool, as_json: bool) -> None:
    """Run one reconcile tick inline and print its tick line."""
    try:
        from ..sweep import sweep as run
    except ModuleNotFoundError as exc:
        if exc.name != f"{_ROOT}.sweep":
            raise
        raise Failed("this install has no reconcile.sweep") from exc
    rt = cli.runtime()
    report = run(rt, dry_run=dry_run)
    if as_json:
        _dump({**asdict(report), "line": report.line()})
    else:
        click.echo(report.line())
        if dry_run:
            _list_by_action(rt, report)
    if report.errors:
        raise Failed(f"errors={report.errors}: the tick could not handle every row (see the log)")


def _list_by_action(rt: Runtime, report: Any) -> None:
    """A dry run's rows, one table per action (observe-only rows under ``observe_only``)."""
    from .adopt_report import rows_of

    outcome = {a.job_id: a.outcome for a in report.actions}
    groups: dict[str, list[dict[str, Any]]] = {}
    for row in rows_of(rt, report.actions, rt.now()):
        label = "observe_only " + row.action if outcome[row.job_id] == "observe_only" else row.action
        groups.setdefault(label, []).append(row.__dict__)
    for label, rows in sorted(groups.items()):
        click.echo(f"\n{label} ({len(rows)})")
        click.echo(_table(rows, ("job_id", "row", "job_type", "kind", "status", "age", "credits")))


@main.command("repair-usage-metadata")
@click.argument("job_id", type=JOB_ID)
@click.option("--from-sub", type=click.IntRange(min=0), required=True)
@click.option("--from-topup", type=click.IntRange(min=0), required=True)
@pass_cli
def repair_usage_metadata(cli: Cli, job_id: uuid.UUID, from_sub: int, from_topup: int) -> None:
    """Set the pools of a usage log whose metadata is unusable (a BadUsageMetadata refusal),
    so its refund or commit can settle; the old value is kept in an anomaly."""
    from ..credits import repair_usage_metadata as repair
    from ..errors import InvalidParam

    try:
        with cli.runtime().sessions.begin() as session:
            changed = repair(session, job_id, from_sub, from_topup, now=cli.runtime().now())
    except InvalidParam as exc:
        raise Refused(exc.message) from exc
    click.echo(f"usage log of {job_id}: pools set to sub {from_sub}, topup {from_topup}"
               if changed else f"usage log of {job_id}: already so")
