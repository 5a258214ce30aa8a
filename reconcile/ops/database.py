"""``reconcile db upgrade|downgrade|repair|check``: the library's migrations and the table
contract."""

from __future__ import annotations

import click

from .app import Cli, Failed, json_option, main, pass_cli


@main.group()
def db() -> None:
    """Apply or roll back the library's migrations; check the table contract."""


@db.command("upgrade")
@click.option("--revision", default="head", show_default=True)
@pass_cli
def db_upgrade(cli: Cli, revision: str) -> None:
    """Create or update the schema (what a deploy's `alembic upgrade head` does)."""
    from ..db.migrate import upgrade

    upgrade(cli.url(), revision)
    click.echo(f"database upgraded to {revision}")


@db.command("downgrade")
@click.option("--revision", default="base", show_default=True)
@click.confirmation_option(prompt="Drop what the library created (its tables and columns)?")
@pass_cli
def db_downgrade(cli: Cli, revision: str) -> None:
    """Roll back the library's migrations (the platform's own objects are never dropped)."""
    from ..db.migrate import downgrade

    downgrade(cli.url(), revision)
    click.echo(f"database downgraded to {revision}")


@db.command("repair")
@pass_cli
def db_repair(cli: Cli) -> None:
    """Add back the library's columns, indexes and tables that are gone although its migrations
    are at head (a table rebuilt after them, as Django's SQLite AlterField does), and on
    PostgreSQL the ledger's functions that are missing or not its own. Nothing else that exists
    is changed; the values a rebuild dropped do not come back."""
    from sqlalchemy import exc

    from ..db.migrate import LOCK_TIMEOUT, repair

    try:
        done = repair(cli.url())
    except exc.OperationalError as error:
        if "lock timeout" not in str(error):
            raise
        raise Failed(f"the repair waited {LOCK_TIMEOUT} for a lock on a platform table that a "
                     "long transaction holds, and stopped (the columns are added all or none; "
                     "an index in progress is rebuilt by the next run): run it again") from error
    for statement in done:
        click.echo(statement)
    click.echo(f"repaired: {len(done)} statement(s)" if done else "nothing to repair")


@db.command("check")
@json_option
@pass_cli
def db_check(cli: Cli, as_json: bool) -> None:
    """Compare the database with the library's table contract: every mismatch with its fix
    (exit 1 on any; notes are types accepted as they are)."""
    from dataclasses import asdict

    from ..db.contract import NOTE, check
    from ..db.session import make_engine
    from .output import _cell, _dump

    engine = make_engine(cli.url())
    try:
        findings = check(engine)
    finally:
        engine.dispose()
    mismatches = [f for f in findings if f.level != NOTE]
    if as_json:
        _dump({"fits": not mismatches, "findings": [asdict(f) for f in findings]})
    else:
        for finding in findings:
            click.echo(finding.line(_cell))
    if mismatches:
        raise Failed(f"{len(mismatches)} mismatch(es) with the table contract (README: "
                     "\"The table contract\")")
    if not as_json:
        click.echo("the database fits the table contract")
