"""The commands of ``reconcile`` that change jobs, always through the lifecycle's compare-and-set
functions, never raw SQL: ``fail`` (with its refund), ``resolve`` (an uncertain submission, either
way), ``sweep`` (one tick inline) and ``repair-usage-metadata``."""

from __future__ import annotations

import uuid
from dataclasses import asdict
from typing import Any

import click

from ..runtime import Runtime
from ..states import IN_FLIGHT, TERMINAL, Status, Submission
from .app import JOB_ID, UNCLEAR, Cli, Failed, Refused, _load, json_option, main, pass_cli
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


@main.command()
@click.argument("job_id", type=JOB_ID)
@click.option("--reason", help="Why (stored in the job's error_detail).")
@pass_cli
def fail(cli: Cli, job_id: uuid.UUID, reason: str | None) -> None:
    """Fail an in-flight job and refund its credits (RECONCILE_NO_RECOVERY).

    Uncertain or submitting jobs are refused: the provider may have created them, so they need
    `reconcile resolve`. A platform row whose provider call is in flight (started, no result)
    is refused too, as a user's cancel is. Failing a job again does nothing.
    """
    from .. import jobstore, lifecycle
    from ..errors import ErrorCode

    rt = cli.runtime()
    with cli.session() as session:
        job = _load(session, job_id)
    if job.status == Status.COMPLETED:
        raise Refused(f"job {job_id} is completed: its credits were committed; nothing to fail")
    if job.status in TERMINAL:
        pending = ""
        if job.credits_actual is None:
            pending = (" (its refund is pending: the sweep settles it)" if jobstore.must_settle(job)
                       else " by the platform, not the library: its reservation is the "
                       "platform's to settle (`reconcile audit` reports it)")
        click.echo(f"job {job_id} is already {job.status}{pending}; nothing done", err=True)
        return
    # the rows a user's cancel answers 409 for (jobstore.is_outcome_unknown, one home)
    if jobstore.is_outcome_unknown(job.submission_state,
                                   call_started=job.provider_call_started_at is not None,
                                   task_id=job.provider_task_id):
        if job.submission_state is None:
            raise Refused(f"job {job_id} is a platform row whose provider call started at "
                          f"{_cell(job.provider_call_started_at)} and has no result yet: failing "
                          "it would throw a paid answer away. Wait for the call (the sweep fails "
                          "it past its kind's threshold)")
        raise Refused(f"job {job_id} is {job.submission_state}: the provider may have created it. "
                      f"Use `reconcile resolve {job_id} --upstream-id ID` or `--not-submitted`")
    done = lifecycle.fail_job(rt, job_id, ErrorCode.RECONCILE_NO_RECOVERY, "reconcile_no_recovery",
                              {"by": "operator", "reason": reason},
                              where=(jobstore.outcome_known(),))
    if not done:
        raise Failed(f"job {job_id} changed meanwhile; nothing done (see `reconcile show {job_id}`)")
    _report_failed(cli, job_id, "failed")
    if job.provider_task_id:
        click.echo(f"note: upstream task {_cell(job.provider_task_id)} may still run; a late result is "
                   "ignored", err=True)


@main.command()
@click.argument("job_id", type=JOB_ID)
@click.option("--upstream-id", metavar="ID", help="The provider created it: adopt this id and poll.")
@click.option("--not-submitted", is_flag=True, help="Nothing was created upstream: fail + refund.")
@pass_cli
def resolve(cli: Cli, job_id: uuid.UUID, upstream_id: str | None, not_submitted: bool) -> None:
    """Settle an uncertain submission one way or the other (exactly one option)."""
    from .. import lifecycle

    if upstream_id is not None:
        upstream_id = upstream_id.strip()
        if not upstream_id:
            raise click.BadParameter("must not be empty", param_hint="--upstream-id")
    if (upstream_id is None) == (not not_submitted):
        raise click.UsageError("give exactly one of --upstream-id ID or --not-submitted")
    rt = cli.runtime()
    now = rt.now()
    with cli.session() as session:
        job = _load(session, job_id)
    if job.status not in IN_FLIGHT or job.submission_state not in UNCLEAR:
        raise Refused(f"job {job_id} is {job.status}/{job.submission_state or 'no submission'}: "
                      "only uncertain submissions are resolved")
    if job.submission_state == Submission.SUBMITTING and job.claim_expires_at is not None \
            and job.claim_expires_at >= now:
        raise Refused(f"a worker holds the submission claim of job {job_id} until "
                      f"{_cell(job.claim_expires_at)}; wait for it to finish or expire")
    if upstream_id is not None:
        kind = rt.kind(job.provider_kind)
        if kind is None or kind.sync:
            raise Refused(f"job {job_id} is of kind {job.provider_kind!r}, which has no upstream id "
                          "to adopt; use --not-submitted")
        holder = _holder(cli, job_id, upstream_id)
        if holder is not None:
            raise Refused(f"upstream id {_cell(upstream_id)} is the task of job {holder}, not "
                          f"job {job_id}'s; nothing done (see `reconcile show {holder}`)")
        if not lifecycle.adopt_upstream_id(rt, job_id, upstream_id, source="operator"):
            raise Failed(f"job {job_id} changed meanwhile; nothing done")
        click.echo(f"job {job_id} adopted upstream id {upstream_id}: processing, polling resumed")
        return
    if not lifecycle.resolve_not_submitted(rt, job_id, reason="operator"):
        raise Failed(f"job {job_id} changed meanwhile; nothing done")
    _report_failed(cli, job_id, "failed as not submitted")


def _holder(cli: Cli, job_id: uuid.UUID, upstream_id: str) -> uuid.UUID | None:
    """The job already holding ``upstream_id`` (its own task, never this job's evidence)."""
    from ..jobstore import evidence

    with cli.session() as session:
        return evidence.holders(session, [upstream_id], job_id).get(upstream_id)


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
