"""The ``reconcile`` operator command (DESIGN.md §7); also ``python -m reconcile``.

Listings (``stuck``, ``uncertain``, ``unsettled``) and ``show`` print aligned tables for people
and, with ``--json``, one JSON value on stdout for scripts. Changes go through the lifecycle's
compare-and-set functions, never raw SQL: ``fail`` fails a job *with* its refund (the seed's
``reconcile-jobs --fail`` forgot it), ``resolve`` settles an uncertain submission either way.

In JSON, times are ISO 8601 (UTC) and durations (``age``, ``threshold``, ``due_in``) seconds.

Exit codes: 0 done (or nothing to do), 1 an error or — for ``audit`` — discrepancies found,
2 a bad argument or a refused change (unknown job, an uncertain job given to ``fail``, …).

A platform can run the command with its own :class:`~reconcile.runtime.Runtime` (its hooks,
its enqueue functions): ``main(args, obj=runtime)``; tests do the same with ``CliRunner``.
"""

from __future__ import annotations

import json
import os
import sys
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import click
from sqlalchemy import exc as sa_exc
from sqlalchemy import func, or_, select
from sqlalchemy.orm import Session

from . import __version__
from .db.models import (
    Asset,
    CreditAnomaly,
    CreditTransaction,
    Job,
    UsageLog,
    WebhookDelivery,
)
from .runtime import Runtime
from .settings import Settings
from .states import IN_FLIGHT, LEGACY_AGE, TERMINAL, Status, Submission

# ----------------------------------------------------------------------------- plumbing


class Failed(click.ClickException):
    """An expected failure: a message on stderr, exit 1, no traceback."""

    exit_code = 1


class Refused(click.ClickException):
    """A bad argument or a change the job's state does not allow: exit 2."""

    exit_code = 2


class JobIdType(click.ParamType):
    name = "JOB_ID"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> uuid.UUID:
        if isinstance(value, uuid.UUID):
            return value
        try:
            return uuid.UUID(str(value).strip())
        except ValueError:
            self.fail(f"{value!r} is not a job id (a UUID)", param, ctx)


JOB_ID = JobIdType()
UNCLEAR = (Submission.UNCERTAIN.value, Submission.SUBMITTING.value)


NO_DATABASE = ("no database configured: set RECONCILE_DATABASE_URL or pass --database-url URL "
               "(e.g. postgresql+psycopg://app@db/app; the embedded SQLite file: "
               "--database-url sqlite:///reconcile.db)")


@dataclass
class Cli:
    """What the commands share: the database URL, and the runtime built on first use.

    The database is ``--database-url``, else ``RECONCILE_DATABASE_URL`` — never a silent
    default: without either a command that needs one fails with :data:`NO_DATABASE`. Every such
    command says on stderr which database it uses (password hidden), so ``--json`` stays clean.
    """

    database_url: str | None = None
    rt: Runtime | None = None
    announced: bool = False

    def settings(self) -> Settings:
        if self.rt is not None:
            return self.rt.settings
        return Settings(database_url=self._configured()[0])

    def _configured(self) -> tuple[str, str]:
        """(url, where it came from)."""
        if self.database_url:
            return self.database_url, "--database-url"
        env = os.environ.get("RECONCILE_DATABASE_URL")
        if env:
            return env, "RECONCILE_DATABASE_URL"
        raise Failed(NO_DATABASE)

    def url(self) -> str:
        if self.rt is not None:
            url = self.rt.sessions.kw["bind"].url.render_as_string(hide_password=False)
            self._announce(url, "the given runtime")
            return url
        url, source = self._configured()
        self._announce(url, source)
        return url

    def _announce(self, url: str, source: str) -> None:
        if not self.announced:
            self.announced = True
            click.echo(f"database: {_redacted(url)} (from {source})", err=True)

    def runtime(self) -> Runtime:
        if self.rt is None:
            settings = self.settings()
            self.url()
            self.rt = Runtime.from_settings(settings, enqueue_create=_enqueue_create,
                                            enqueue_poll=_enqueue_poll)
        else:
            self.url()
        return self.rt

    @contextmanager
    def session(self) -> Iterator[Session]:
        with self.runtime().sessions() as session:
            yield session


def _redacted(url: str) -> str:
    from sqlalchemy.engine import make_url

    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # not a URL SQLAlchemy parses: say so rather than echo a secret
        return "<unparseable URL>"


# A resumed poll chain or a re-enqueued create goes to the workers through the broker. The
# database change is already committed when it is sent, so a broker that is down only delays the
# work: the sweep resumes a chain whose poll lease expired and re-enqueues a lost create.
def _enqueue_create(job_id: uuid.UUID, countdown: float = 0.0) -> None:
    _send("create", lambda t: t.enqueue_create(job_id, countdown), job_id)


def _enqueue_poll(job_id: uuid.UUID, generation: int, seq: int, countdown: float) -> None:
    _send("poll", lambda t: t.enqueue_poll(job_id, generation, seq, countdown), job_id)


def _send(what: str, send: Callable[[Any], None], job_id: uuid.UUID) -> None:
    # importing the app binds the shared tasks to the configured broker
    from . import celery_app, tasks  # noqa: F401

    try:
        send(tasks)
    except Exception as exc:  # the broker is down: the sweep recovers it later
        click.echo(f"warning: could not enqueue the {what} of job {job_id} ({exc}); "
                   "the sweep will pick it up", err=True)


class _Group(click.Group):
    """Turns database errors into one clear line (exit 1) instead of a traceback."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except sa_exc.DBAPIError as exc:
            first = str(exc.orig or exc).strip().splitlines()[0]
            hint = ""
            if "FATAL" in first and "database" in first and "does not exist" in first:
                hint = " (the database itself is missing: create it, or fix the URL above)"
            elif "does not exist" in first or "no such table" in first:
                hint = " (is the schema migrated? run `reconcile db upgrade`)"
            raise Failed(f"database error: {first}{hint}") from exc


def _as_json(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, uuid.UUID | Decimal):
        return str(value)
    if isinstance(value, timedelta):
        return value.total_seconds()
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def _dump(value: Any) -> None:
    click.echo(json.dumps(value, default=_as_json, indent=2))


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, datetime):
        return value.strftime("%Y-%m-%d %H:%M:%SZ")
    if isinstance(value, timedelta):
        return _duration(value)
    if isinstance(value, dict | list):
        text = json.dumps(value, default=_as_json, separators=(",", ":"))
        return text if len(text) <= 120 else text[:117] + "..."
    return str(value)


def _duration(delta: timedelta) -> str:
    """``3h05m``, ``12m30s``, ``45s``; negative durations get a leading ``-``."""
    seconds = int(delta.total_seconds())
    sign, seconds = ("-", -seconds) if seconds < 0 else ("", seconds)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{sign}{hours}h{minutes:02d}m"
    if minutes:
        return f"{sign}{minutes}m{secs:02d}s"
    return f"{sign}{secs}s"


def _table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> str:
    """Plain aligned columns under upper-case headers."""
    cells = [[_cell(row.get(c)) for c in columns] for row in rows]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]
    lines = ["  ".join(c.upper().ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip()]
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    return "\n".join(lines)


def _listing(rows: list[dict[str, Any]], columns: Sequence[str], as_json: bool, empty: str) -> None:
    if as_json:
        _dump(rows)
    elif rows:
        click.echo(_table(rows, columns))
    else:
        click.echo(empty)


json_option = click.option("--json", "as_json", is_flag=True, help="Machine output: JSON on stdout.")
limit_option = click.option("--limit", type=click.IntRange(min=1), default=200, show_default=True,
                            help="At most this many rows (oldest first).")
pass_cli = click.make_pass_decorator(Cli)


def _load(session: Session, job_id: uuid.UUID) -> Job:
    job = session.get(Job, job_id)
    if job is None:
        raise Refused(f"no job {job_id}")
    return job


def _reserved(session: Session, job_ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, int]:
    """Credits each job still holds in a ``reserved`` usage log."""
    if not job_ids:
        return {}
    rows = session.execute(
        select(UsageLog.job_id, func.sum(UsageLog.credits))
        .where(UsageLog.job_id.in_(job_ids), UsageLog.status == "reserved")
        .group_by(UsageLog.job_id))
    return {job_id: int(total) for job_id, total in rows}


# ----------------------------------------------------------------------------- the group


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--database-url", metavar="URL",
              help="Database to operate on (default: RECONCILE_DATABASE_URL).")
@click.version_option(__version__, prog_name="reconcile")
@click.pass_context
def main(ctx: click.Context, database_url: str | None) -> None:
    """Operate reconcile: find stuck, uncertain and unsettled jobs; fail, resolve, audit."""
    if isinstance(ctx.obj, Runtime):
        if database_url:
            raise Refused("--database-url cannot be combined with a given runtime")
        ctx.obj = Cli(rt=ctx.obj)
    elif not isinstance(ctx.obj, Cli):
        ctx.obj = Cli(database_url=database_url)


@main.group()
def db() -> None:
    """Apply or roll back the library's migrations."""


@db.command("upgrade")
@click.option("--revision", default="head", show_default=True)
@pass_cli
def db_upgrade(cli: Cli, revision: str) -> None:
    """Create or update the schema (what a deploy's `alembic upgrade head` does)."""
    from .db.migrate import upgrade

    upgrade(cli.url(), revision)
    click.echo(f"database upgraded to {revision}")


@db.command("downgrade")
@click.option("--revision", default="base", show_default=True)
@click.confirmation_option(prompt="Drop what the library created (its tables and columns)?")
@pass_cli
def db_downgrade(cli: Cli, revision: str) -> None:
    """Roll back the library's migrations (the platform's own objects are never dropped)."""
    from .db.migrate import downgrade

    downgrade(cli.url(), revision)
    click.echo(f"database downgraded to {revision}")


# ----------------------------------------------------------------------------- listings


def _started() -> Any:
    # what the sweep ages a row by: the provider call, else (legacy rows) the dequeue or insert
    return func.coalesce(Job.provider_call_started_at, Job.started_at, Job.created_at)


def _threshold(rt: Runtime, job: Job) -> timedelta:
    kind = rt.kind(job.provider_kind)
    return rt.settings.scaled(kind.stale_threshold if kind is not None else LEGACY_AGE)


@main.command()
@click.option("--kind", help="Only this provider_kind ('legacy': rows without one; '*': all).")
@click.option("--older-than", type=click.FloatRange(min=0), metavar="MINUTES",
              help="Instead of each kind's stale threshold, list in-flight jobs older than this.")
@limit_option
@json_option
@pass_cli
def stuck(cli: Cli, kind: str | None, older_than: float | None, limit: int, as_json: bool) -> None:
    """In-flight jobs past their kind's stale threshold (legacy rows: past 5 minutes)."""
    from .adoption import ALL, LEGACY, SettingsError, check_observe_only
    from .kinds import all_kinds

    if kind:
        try:  # the same names as OBSERVE_ONLY_KINDS: a kind, or "legacy" for rows without one
            check_observe_only([kind])
        except SettingsError as exc:
            raise Refused(f"unknown kind {kind!r}: a registered kind or {LEGACY!r}") from exc
    rt = cli.runtime()
    now = rt.now()
    if older_than is not None:
        floor = timedelta(minutes=older_than)
    else:
        floor = rt.settings.scaled(min([LEGACY_AGE] + [k.stale_threshold for k in all_kinds()]))
    started = _started().label("started")
    stmt = select(Job, started).where(Job.status.in_(IN_FLIGHT), started < now - floor)
    if kind == LEGACY:
        stmt = stmt.where(Job.provider_kind.is_(None))
    elif kind and kind != ALL:
        stmt = stmt.where(Job.provider_kind == kind)
    rows: list[dict[str, Any]] = []
    with cli.session() as session:
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
    rt = cli.runtime()
    now = rt.now()
    expired = or_(Job.claim_expires_at.is_(None), Job.claim_expires_at < now)
    stmt = select(Job).where(
        Job.status.in_(IN_FLIGHT),
        or_(Job.submission_state == Submission.UNCERTAIN,
            (Job.submission_state == Submission.SUBMITTING) & expired),
    ).order_by(_started()).limit(limit)
    with cli.session() as session:
        jobs = list(session.execute(stmt).scalars())
        ids = [j.id for j in jobs]
        held = _reserved(session, ids)
        evidence = dict(session.execute(
            select(WebhookDelivery.job_id, func.count()).where(WebhookDelivery.job_id.in_(ids))
            .group_by(WebhookDelivery.job_id)).all()) if ids else {}
    rows = [{
        "id": j.id, "user_id": j.user_id, "kind": j.provider_kind, "status": j.status,
        "submission": j.submission_state, "since": j.provider_call_started_at or j.created_at,
        "age": now - (j.provider_call_started_at or j.created_at),
        "attempts": j.reconcile_attempts, "error_code": j.error_code,
        "reserved": held.get(j.id), "deliveries": evidence.get(j.id, 0),
    } for j in jobs]
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
    rt = cli.runtime()
    now = rt.now()
    stmt = select(Job).where(
        Job.status.in_((Status.FAILED, Status.CANCELLED)), Job.credits_actual.is_(None),
        Job.next_poll_at.is_not(None),
    ).order_by(Job.next_poll_at).limit(limit)
    with cli.session() as session:
        jobs = list(session.execute(stmt).scalars())
        held = _reserved(session, [j.id for j in jobs])
    rows = [{
        "id": j.id, "user_id": j.user_id, "kind": j.provider_kind, "status": j.status,
        "error_code": j.error_code, "completed_at": j.completed_at,
        "next_poll_at": j.next_poll_at, "due_in": max(j.next_poll_at - now, timedelta(0)),
        "settle_attempts": j.settle_attempts, "reserved": held.get(j.id),
    } for j in jobs]
    _listing(rows, ("id", "kind", "status", "error_code", "next_poll_at", "due_in",
                    "settle_attempts", "reserved"), as_json, "no unsettled refunds")


SHOW_FIELDS = (
    "id", "user_id", "job_type", "status", "submission_state", "provider_kind", "provider_model",
    "provider_task_id", "provider", "progress", "created_at", "started_at",
    "provider_call_started_at", "completed_at", "claim_expires_at", "poll_generation", "poll_seq",
    "poll_lease_expires_at", "reconcile_attempts", "reconcile_last_attempt_at",
    "reconcile_last_error", "create_enqueue_count", "create_not_before", "error_code",
    "error_message", "error_detail", "credits_actual", "next_poll_at", "settle_attempts",
    "provider_cost", "display_cost", "workflow_execution_id", "node_id",
)


def _row(obj: Any, fields: Sequence[str]) -> dict[str, Any]:
    return {f: getattr(obj, f) for f in fields}


def _evidence_note(cli: Cli, job: Job, delivery: WebhookDelivery) -> str:
    """What the sweep may do with a delivery for this job (reconcile.evidence); where it may
    not, the operator decides with ``resolve --upstream-id``."""
    from . import evidence
    from .kinds import get_kind

    kind = get_kind(job.provider_kind)
    if kind is None or job.provider_task_id:
        return ""
    judged = evidence.assess(delivery, str(job.id), kind, cli.settings)
    if not judged.usable:
        return f"operator only: {judged.reason}"
    return "adoptable once a read confirms it" if judged.needs_read else "adoptable (signed)"


@main.command()
@click.argument("job_id", type=JOB_ID)
@json_option
@pass_cli
def show(cli: Cli, job_id: uuid.UUID, as_json: bool) -> None:
    """One job: its row, usage logs, ledger transactions, anomalies, webhooks and assets."""
    with cli.session() as session:
        job = _load(session, job_id)
        delivery_match = WebhookDelivery.job_id == job_id
        if job.provider_task_id:
            delivery_match = delivery_match | (WebhookDelivery.upstream_id == job.provider_task_id)
        out: dict[str, Any] = {
            "job": _row(job, SHOW_FIELDS),
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
                 "evidence": _evidence_note(cli, job, w)}
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


# ----------------------------------------------------------------------------- changes


def _report_failed(cli: Cli, job_id: uuid.UUID, verb: str) -> None:
    with cli.session() as session:
        job = _load(session, job_id)
        refunded = cli.runtime().ledger.refunded(session, job_id)
    if job.credits_actual is None:
        click.echo(f"job {job_id} {verb}; its refund is pending (next try {_cell(job.next_poll_at)})"
                   " — the sweep settles it")
    else:
        click.echo(f"job {job_id} {verb} ({job.error_code}); refunded "
                   f"{refunded} credits")


@main.command()
@click.argument("job_id", type=JOB_ID)
@click.option("--reason", help="Why (stored in the job's error_detail).")
@pass_cli
def fail(cli: Cli, job_id: uuid.UUID, reason: str | None) -> None:
    """Fail an in-flight job and refund its credits (RECONCILE_NO_RECOVERY).

    Uncertain or submitting jobs are refused: the provider may have created them, so they need
    `reconcile resolve`. Failing a job again does nothing.
    """
    from . import lifecycle
    from .errors import ErrorCode

    rt = cli.runtime()
    with cli.session() as session:
        job = _load(session, job_id)
    if job.status == Status.COMPLETED:
        raise Refused(f"job {job_id} is completed: its credits were committed; nothing to fail")
    if job.status in TERMINAL:
        pending = " (its refund is pending: the sweep settles it)" if job.credits_actual is None else ""
        click.echo(f"job {job_id} is already {job.status}{pending}; nothing done", err=True)
        return
    if job.submission_state in UNCLEAR:
        raise Refused(f"job {job_id} is {job.submission_state}: the provider may have created it. "
                      f"Use `reconcile resolve {job_id} --upstream-id ID` or `--not-submitted`")
    clear = or_(Job.submission_state.is_(None), Job.submission_state.not_in(UNCLEAR))
    done = lifecycle.fail_job(rt, job_id, ErrorCode.RECONCILE_NO_RECOVERY, "reconcile_no_recovery",
                              {"by": "operator", "reason": reason}, where=(clear,))
    if not done:
        raise Failed(f"job {job_id} changed meanwhile; nothing done (see `reconcile show {job_id}`)")
    _report_failed(cli, job_id, "failed")
    if job.provider_task_id:
        click.echo(f"note: upstream task {job.provider_task_id} may still run; a late result is "
                   "ignored", err=True)


@main.command()
@click.argument("job_id", type=JOB_ID)
@click.option("--upstream-id", metavar="ID", help="The provider created it: adopt this id and poll.")
@click.option("--not-submitted", is_flag=True, help="Nothing was created upstream: fail + refund.")
@pass_cli
def resolve(cli: Cli, job_id: uuid.UUID, upstream_id: str | None, not_submitted: bool) -> None:
    """Settle an uncertain submission one way or the other (exactly one option)."""
    from . import lifecycle

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
        if not lifecycle.adopt_upstream_id(rt, job_id, upstream_id, source="operator"):
            raise Failed(f"job {job_id} changed meanwhile; nothing done")
        click.echo(f"job {job_id} adopted upstream id {upstream_id}: processing, polling resumed")
        return
    if not lifecycle.resolve_not_submitted(rt, job_id, reason="operator"):
        raise Failed(f"job {job_id} changed meanwhile; nothing done")
    _report_failed(cli, job_id, "failed as not submitted")


# ----------------------------------------------------------------------------- runs


@main.command()
@click.option("--dry-run", is_flag=True, help="Log what the tick would do; change nothing.")
@json_option
@pass_cli
def sweep(cli: Cli, dry_run: bool, as_json: bool) -> None:
    """Run one reconcile tick inline and print its tick line."""
    try:
        from .sweep import sweep as run
    except ModuleNotFoundError as exc:
        if exc.name != f"{__package__}.sweep":
            raise
        raise Failed("this install has no reconcile.sweep") from exc
    rt = cli.runtime()
    report = run(rt, dry_run=dry_run)
    if as_json:
        _dump({**asdict(report), "line": report.line()})
        return
    click.echo(report.line())
    if dry_run:
        _list_by_action(rt, report)


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
    from .ledger import audit as run_audit

    rt = cli.runtime()
    now = rt.now()
    since = _since(since_arg, now)
    with cli.session() as session:
        found = run_audit(rt.ledger, session, now=now, grace=timedelta(minutes=grace_minutes),
                          settings=rt.settings, since=since)
    rows = [asdict(d) for d in found]
    _listing(rows, ("kind", "user_id", "job_id", "detail"), as_json, "ledger clean")
    if found:
        click.get_current_context().exit(1)


@main.command("repair-usage-metadata")
@click.argument("job_id", type=JOB_ID)
@click.option("--from-sub", type=click.IntRange(min=0), required=True)
@click.option("--from-topup", type=click.IntRange(min=0), required=True)
@pass_cli
def repair_usage_metadata(cli: Cli, job_id: uuid.UUID, from_sub: int, from_topup: int) -> None:
    """Set the pools of a usage log whose metadata is unusable (a BadUsageMetadata refusal),
    so its refund or commit can settle; the old value is kept in an anomaly."""
    from .credits import repair_usage_metadata as repair
    from .errors import InvalidParam

    try:
        with cli.runtime().sessions.begin() as session:
            changed = repair(session, job_id, from_sub, from_topup, now=cli.runtime().now())
    except InvalidParam as exc:
        raise Refused(exc.message) from exc
    click.echo(f"usage log of {job_id}: pools set to sub {from_sub}, topup {from_topup}"
               if changed else f"usage log of {job_id}: already so")


@main.command()
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", type=int, default=8765, show_default=True, help="0 picks a free port.")
@click.option("--seed", type=int, help="Seed for ids and chaos.")
@click.option("--time-scale", type=float, default=1.0, show_default=True,
              help="Real seconds per timeline second.")
def simulator(host: str, port: int, seed: int | None, time_scale: float) -> None:
    """Serve the loopback provider simulator until interrupted."""
    from .testing.simulator import main as sim_main

    argv = ["--host", host, "--port", str(port), "--time-scale", str(time_scale)]
    if seed is not None:
        argv += ["--seed", str(seed)]
    raise SystemExit(sim_main(argv))


@main.command(context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
              add_help_option=False)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def demo(args: tuple[str, ...]) -> None:
    """Run the end-to-end demo (arguments go to it; `reconcile demo --help`)."""
    try:
        from .demo import main as demo_main
    except ModuleNotFoundError as exc:
        if exc.name != f"{__package__}.demo":
            raise
        raise Failed("this install has no reconcile.demo") from exc
    raise SystemExit(demo_main(list(args)))


@main.command()
@click.option("--port", type=int, default=9808, show_default=True, help="0 picks a free port.")
@click.option("--address", default="127.0.0.1", show_default=True,
              help="Listen address (0.0.0.0 for a Prometheus on another host).")
@click.option("--once", is_flag=True, help="Print one scrape to stdout and exit.")
@pass_cli
def metrics(cli: Cli, port: int, address: str, once: bool) -> None:
    """Serve Prometheus metrics read from the database at scrape time (extra: metrics)."""
    from . import metrics as m

    try:
        if once:
            click.echo(m.exposition(cli.runtime()), nl=False)
            return
        server, _thread = m.serve(cli.runtime(), port, address)
    except m.MetricsUnavailable as exc:
        raise Failed(str(exc)) from exc
    except OSError as exc:  # port taken, address not ours
        raise Failed(f"cannot listen on {address}:{port}: {exc.strerror or exc}") from exc
    click.echo(f"serving metrics on http://{address}:{server.server_port}/metrics (Ctrl-C stops)",
               err=True)
    _wait_for_signal()


def _wait_for_signal() -> None:
    import signal
    import threading

    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    while not stop.wait(0.5):
        pass


from . import cli_adopt  # noqa: E402,F401  (registers adopt, credits, prune)

if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
