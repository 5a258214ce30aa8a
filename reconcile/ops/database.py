"""``reconcile db upgrade|downgrade``: the library's migrations."""

from __future__ import annotations

import click

from .app import Cli, main, pass_cli


@main.group()
def db() -> None:
    """Apply or roll back the library's migrations."""


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
