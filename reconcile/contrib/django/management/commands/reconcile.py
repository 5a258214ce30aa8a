"""``manage.py reconcile <command> ...``: the ``reconcile`` CLI under the Django settings (the
database from ``DATABASES``, the settings from ``RECONCILE``); the same commands, options and
exit codes."""

from __future__ import annotations

import argparse
import os
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from reconcile.cli import Cli, main
from reconcile.settings import Settings

from ... import database_alias, database_url, settings as library_settings


class DjangoCli(Cli):
    """The CLI's shared state with the database and settings of the Django project."""

    def settings(self) -> Settings:
        if self.rt is not None:
            return self.rt.settings
        return library_settings()

    def _configured(self) -> tuple[str, str]:
        alias = database_alias()
        return database_url(alias), f"Django DATABASES[{alias!r}]"


def run(args: list[str], prog_name: str = "manage.py reconcile") -> int:
    """Run the CLI; returns its exit code."""
    if any(a == "--database-url" or a.startswith("--database-url=") for a in args):
        raise CommandError("--database-url: under Django the database is "
                           "DATABASES[RECONCILE['database_alias']]")
    try:
        main.main(args=args, prog_name=prog_name, obj=DjangoCli(), standalone_mode=True)
    except SystemExit as exc:
        code = exc.code
        if code is None:
            return 0
        if isinstance(code, int):
            return code
        print(code)
        return 1
    return 0


class Command(BaseCommand):
    help = "Run a reconcile CLI command (`manage.py reconcile --help`) under the Django settings."

    def run_from_argv(self, argv: list[str]) -> None:
        # every argument goes to the CLI as given (its own --help, --json, ...), not argparse
        args = [a for a in argv[2:] if not a.startswith(("--settings=", "--pythonpath="))]
        raise SystemExit(run(args, prog_name=f"{os.path.basename(argv[0])} {argv[1]}"))

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("args", nargs=argparse.REMAINDER, help="the reconcile command and its arguments")

    def handle(self, *args: str, **options: Any) -> None:  # call_command("reconcile", ...)
        code = run(list(args))
        if code:
            raise CommandError(f"reconcile {' '.join(args)}: exit {code}", returncode=code)


__all__ = ["Command", "DjangoCli", "run"]
