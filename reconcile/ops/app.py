"""The ``reconcile`` command's plumbing: the root group, what every command shares (:class:`Cli`:
the database URL and the runtime built on first use), the exit-code exceptions, the shared
options, and the enqueue functions a runtime built here sends work with."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import click
from pydantic import ValidationError
from sqlalchemy import Engine, exc as sa_exc
from sqlalchemy.orm import Session

from .. import __version__
from ..db.models import Job
from ..runtime import Runtime
from ..settings import Settings

# ----------------------------------------------------------------------------- plumbing


class Failed(click.ClickException):
    """An expected failure: a message on stderr, exit 1, no traceback."""

    exit_code = 1


class Refused(click.ClickException):
    """A bad argument or a change the job's state does not allow: exit 2."""

    exit_code = 2


class JobIdType(click.ParamType[uuid.UUID]):
    name = "JOB_ID"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> uuid.UUID:
        if isinstance(value, uuid.UUID):
            return value
        try:
            return uuid.UUID(str(value).strip())
        except ValueError:
            self.fail(f"{value!r} is not a job id (a UUID)", param, ctx)


JOB_ID = JobIdType()


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
        url = self._configured()[0]
        try:
            return Settings(database_url=url)
        except ValidationError as exc:
            raise Failed(settings_refused(exc)) from None

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
            url: str = _engine_url(self.rt)
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
            from ..db.contract import SchemaMismatch

            settings = self.settings()
            self.url()
            try:
                self.rt = Runtime.from_settings(settings, enqueue_create=_enqueue_create,
                                                enqueue_poll=_enqueue_poll)
            # a stale schema; a start-up check's refusal (a kind missing, a sync deadline
            # that does not fit its timeouts): a configuration error, one message
            except (SchemaMismatch, ValueError) as exc:
                from ..core.redact import for_terminal

                raise Failed(for_terminal(str(exc))) from exc
        else:
            self.url()
        return self.rt

    @contextmanager
    def session(self) -> Iterator[Session]:
        with self.runtime().sessions() as session:
            yield session


def settings_refused(exc: ValidationError) -> str:
    """The message for settings that do not load: each refused variable by its name and why,
    never its value (a secret's value is never echoed)."""
    from ..core.redact import for_terminal

    lines = [f"{Settings.env_name(str(error['loc'][0]))}: {error['msg']}"
             if error.get("loc") else str(error["msg"]) for error in exc.errors()]
    return "the settings do not load: " + "; ".join(for_terminal(line) for line in lines)


def _engine_url(rt: Runtime) -> str:
    """The URL of the engine a given runtime's sessions use (a sessionmaker bound to an engine or
    a connection, or a Session class that picks its own bind)."""
    with rt.sessions() as session:
        bind = session.get_bind()
    engine = bind if isinstance(bind, Engine) else bind.engine
    return engine.url.render_as_string(hide_password=False)


def _redacted(url: str) -> str:
    """Every credential form libpq and SQLAlchemy accept masked (the one rule:
    :func:`reconcile.core.redact.database_url`), then escaped for the terminal."""
    from ..core.redact import database_url, for_terminal

    return for_terminal(database_url(url))


# A resumed poll chain or a re-enqueued create goes to the workers through the broker. The
# database change is already committed when it is sent, so a broker that is down only delays the
# work: the sweep resumes a chain whose poll lease expired and re-enqueues a lost create.
def _enqueue_create(job_id: uuid.UUID, countdown: float = 0.0) -> None:
    _send("create", lambda t: t.enqueue_create(job_id, countdown), job_id)


def _enqueue_poll(job_id: uuid.UUID, generation: int, seq: int, countdown: float,
                  status: str | None = None) -> None:
    _send("poll", lambda t: t.enqueue_poll(job_id, generation, seq, countdown, status), job_id)


def _send(what: str, send: Callable[[Any], None], job_id: uuid.UUID) -> None:
    # importing the app binds the shared tasks to the configured broker
    from .. import celery_app, tasks  # noqa: F401

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
            elif "does not exist" in first or "no such" in first:
                hint = _schema_hint(ctx)
            raise Failed(f"database error: {first}{hint}") from exc


def _schema_hint(ctx: click.Context) -> str:
    """A missing relation or column: migrate, or — the migrations at head already — find what
    the platform's table lacks (``reconcile db check``)."""
    from ..db.contract import at_head

    cli = ctx.find_object(Cli)
    try:
        migrated = cli is not None and at_head(cli.url())
    except Exception:  # the hint must not hide the error itself
        migrated = False
    if migrated:
        return (" (the library's migrations are at head: run `reconcile db check` for what "
                "the tables lack, and the fix)")
    return " (is the schema migrated? run `reconcile db upgrade`)"


json_option = click.option("--json", "as_json", is_flag=True, help="Machine output: JSON on stdout.")
limit_option = click.option("--limit", type=click.IntRange(min=1), default=200, show_default=True,
                            help="At most this many rows (oldest first).")
pass_cli = click.make_pass_decorator(Cli)


def _load(session: Session, job_id: uuid.UUID) -> Job:
    job = session.get(Job, job_id)
    if job is None:
        raise Refused(f"no job {job_id}")
    return job


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
